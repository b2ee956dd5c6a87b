/* The CUPTI floor: what the CUPTI parts that gpuprof switches on cost by
 * themselves, with handlers that do nothing. benchmarks/bench_gpu.py builds
 * this into a shared library and loads it with ctypes in "floor:BITS" mode.
 *
 * BITS is a sum of parts, matching gpuprof's (cuda/cupti_callback.c):
 *    1  CONCURRENT_KERNEL records
 *    2  runtime-API callbacks on the ids gpuprof traces
 *    4  driver-API callbacks on the ids gpuprof traces
 *   32  MEMCPY and MEMCPY2 records
 *  128  MEMSET records
 *  256  SYNCHRONIZATION records
 *  512  KERNEL records (serialized) instead of CONCURRENT_KERNEL
 * 1024  MEMORY2 records (profile_memory=True)
 * 2048  a timestamp callback (CLOCK_MONOTONIC), as gpuprof registers
 * The callback counts its calls; the buffer handler walks the records and
 * counts them. Buffers are 8 MiB mappings, as gpuprof's. floor_stop detaches
 * CUPTI (cuptiFinalize), as gpuprof's stop does, so that one process can
 * measure several modes in turn. Linked against libcupti (a benchmark tool,
 * not the library, which never links it).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "../cuda/cupti_internal.h"

#define FLOOR_BUFFER_BYTES ((size_t)8 << 20)

static unsigned long long n_callbacks, n_records, n_dropped;
static CUpti_SubscriberHandle floor_subscriber;

static const uint32_t floor_runtime_ids[] = {
#define FLOOR_ID(id, cls) id,
    GP_CUPTI_RUNTIME_APIS(FLOOR_ID)};
static const uint32_t floor_driver_ids[] = {GP_CUPTI_DRIVER_APIS(FLOOR_ID)
#undef FLOOR_ID
};

static void CUPTIAPI
floor_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    void *b = mmap(NULL, FLOOR_BUFFER_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    *buffer = b == MAP_FAILED ? NULL : b;
    *size = b == MAP_FAILED ? 0 : FLOOR_BUFFER_BYTES;
    *max_records = 0;
}

static void CUPTIAPI
floor_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
    (void)size;
    CUpti_Activity *rec = NULL;
    while (buffer != NULL && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS)
        n_records++;
    size_t lost = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &lost) == CUPTI_SUCCESS)
        n_dropped += lost;
    if (buffer != NULL)
        munmap(buffer, FLOOR_BUFFER_BYTES);
}

static void CUPTIAPI
floor_callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
               const void *data)
{
    (void)userdata;
    (void)domain;
    (void)cbid;
    (void)data;
    n_callbacks++;
}

static int
check(CUptiResult r, const char *what)
{
    if (r == CUPTI_SUCCESS || r == CUPTI_ERROR_INVALID_PARAMETER)
        return 0;
    const char *text = "?";
    cuptiGetResultString(r, &text);
    fprintf(stderr, "cupti_floor: %s failed: %s\n", what, text);
    return -1;
}

static int
enable_ids(CUpti_CallbackDomain domain, const uint32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (check(cuptiEnableCallback(1, floor_subscriber, domain, ids[i]), "cuptiEnableCallback"))
            return -1;
    return 0;
}

static const struct {
    int bit;
    CUpti_ActivityKind kind;
} floor_kinds[] = {
        {1, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL}, {512, CUPTI_ACTIVITY_KIND_KERNEL},
        {32, CUPTI_ACTIVITY_KIND_MEMCPY},           {32, CUPTI_ACTIVITY_KIND_MEMCPY2},
        {128, CUPTI_ACTIVITY_KIND_MEMSET},          {256, CUPTI_ACTIVITY_KIND_SYNCHRONIZATION},
        {1024, CUPTI_ACTIVITY_KIND_MEMORY2},
};
static int floor_parts;

/* Bit 2048: CUPTI's timestamps from a callback reading CLOCK_MONOTONIC, as
 * gpuprof registers one to put GPU records on its own clock. */
static uint64_t
floor_timestamp(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int
kind_on(int parts, size_t i)
{
    /* serial KERNEL records replace CONCURRENT_KERNEL ones */
    return (parts & floor_kinds[i].bit) && !((parts & 512) && floor_kinds[i].bit == 1);
}

int
floor_start(int parts)
{
    floor_parts = parts;
    if ((parts & 2048) && check(cuptiActivityRegisterTimestampCallback(floor_timestamp),
                                "cuptiActivityRegisterTimestampCallback"))
        return -1;
    if ((parts & (1 | 32 | 128 | 256 | 512 | 1024)) &&
        check(cuptiActivityRegisterCallbacks(floor_requested, floor_completed),
              "cuptiActivityRegisterCallbacks"))
        return -1;
    for (size_t i = 0; i < sizeof floor_kinds / sizeof *floor_kinds; i++) {
        if (kind_on(parts, i) && check(cuptiActivityEnable(floor_kinds[i].kind),
                                       "cuptiActivityEnable"))
            return -1;
    }
    if (parts & (2 | 4)) {
        if (check(cuptiSubscribe(&floor_subscriber, floor_callback, NULL), "cuptiSubscribe"))
            return -1;
        if ((parts & 2) && enable_ids(CUPTI_CB_DOMAIN_RUNTIME_API, floor_runtime_ids,
                                      sizeof floor_runtime_ids / sizeof *floor_runtime_ids))
            return -1;
        if ((parts & 4) && enable_ids(CUPTI_CB_DOMAIN_DRIVER_API, floor_driver_ids,
                                      sizeof floor_driver_ids / sizeof *floor_driver_ids))
            return -1;
    }
    return 0;
}

/* Switch everything off, flush, report what was seen, and detach. */
int
floor_stop(void)
{
    if (floor_subscriber != NULL) {
        cuptiUnsubscribe(floor_subscriber);
        floor_subscriber = NULL;
    }
    for (size_t i = 0; i < sizeof floor_kinds / sizeof *floor_kinds; i++)
        if (kind_on(floor_parts, i))
            cuptiActivityDisable(floor_kinds[i].kind);
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    printf("FLOOR callbacks=%llu records=%llu dropped=%llu\n", n_callbacks, n_records, n_dropped);
    fflush(stdout);
    n_callbacks = n_records = n_dropped = 0;
    return check(cuptiFinalize(), "cuptiFinalize");
}
