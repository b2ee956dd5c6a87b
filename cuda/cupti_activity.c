/* CUPTI activity buffers in, gpuprof GPU records out.
 *
 * CUPTI asks for empty buffers and hands back full ones on its own threads
 * (a worker thread, or the thread that calls cuptiActivityFlushAll). Each
 * completed buffer is decoded into GpGpuRecords, staged on the stack, and
 * appended under cuda_lock to one growable array that gp_cuda_take_records
 * hands to the aggregator. Kernel names are copied into a string table we
 * own, since CUPTI's name pointers die with the buffer.
 *
 * Lock rule (STYLE.md section 8): CUPTI is never called while cuda_lock is
 * held. Decoding calls cuptiActivityGetNextRecord, so it runs unlocked into
 * a stack batch; only the append takes the lock.
 */
#include "cupti_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../csrc/clock.h"
#include "../csrc/strtab.h"

/* CUPTI fills whole buffers; 8 MiB holds ~30k kernel records, so a buffer
 * completes every few thousand launches at most, not per launch. */
#define BUFFER_BYTES ((size_t)8 << 20)
#define FREE_BUFFERS_MAX 4        /* cached empty buffers; more are freed */
#define PREFAULTED_BUFFERS 2      /* mapped and faulted in at session begin */
#define STAGE_RECORDS 64          /* records decoded per lock acquisition */
#define MAX_RECORDS ((size_t)1 << 23) /* ~1 GiB of records between takes; beyond: dropped */
#define MAX_STRINGS ((uint32_t)1 << 20)
#define EVENT_MAP_MAX ((size_t)1 << 16) /* event-record entries kept; then the map restarts */
#define CTX_MAP_MAX 64

/* CUPTI's "not applicable" ids (CUPTI_INVALID_CONTEXT_ID, _STREAM_ID,
 * CUPTI_SYNCHRONIZATION_INVALID_VALUE) all share this value. */
#define CUPTI_INVALID_ID 0xFFFFFFFFu
#define NO_SYNC_ID UINT64_MAX

/* Protects every variable below up to `dropped`. Taken on CUPTI's threads
 * (buffer callbacks) and on the control thread (take, strings, session). */
static pthread_mutex_t cuda_lock = PTHREAD_MUTEX_INITIALIZER;

/* Records delivered since the last take. */
static GpGpuRecord *records;
static size_t n_records, cap_records;

/* Stream-wait-event records whose wait_stream is looked up in the event map
 * at take time: the CUDA_EVENT record of the cudaEventRecord may arrive in a
 * later buffer than the wait that refers to it. */
typedef struct PendingWait {
    size_t index;     /* into records */
    uint64_t sync_id; /* cudaEventSyncId */
} PendingWait;
static PendingWait *pending;
static size_t n_pending, cap_pending;

/* cudaEventSyncId + 1 (0 = empty slot) -> stream that recorded the event.
 * Open addressing; cleared when it reaches EVENT_MAP_MAX entries. */
static uint64_t *ev_keys;
static uint32_t *ev_streams;
static size_t ev_cap, ev_n;

/* CUPTI context id -> device, learnt from device records, used to give
 * synchronization records (which carry no device id) their device. */
static uint32_t ctx_ids[CTX_MAP_MAX];
static int16_t ctx_devs[CTX_MAP_MAX];
static int n_ctx;

/* Kernel names (key 0). */
static GpStrTab strings;

/* Empty CUPTI buffers kept for reuse. */
static uint8_t *free_buffers[FREE_BUFFERS_MAX];
static int n_free_buffers;

/* Records lost this session: CUPTI's dropped counts plus records we could
 * not decode or store. Atomic: added on CUPTI threads, read anywhere. */
static atomic_uint_fast64_t dropped;

/* Decoding cost, for the benchmarks' per-record figure (gp_cuda_stats).
 * Atomic: added on CUPTI threads. */
static atomic_uint_fast64_t decode_ns, decoded_records, completed_buffers;

/* GPUPROF_CUPTI_RAWBUF=1 (benchmarks only): buffers as before the zeroed
 * pool (neither cleared by us nor faulted in ahead), to measure what the
 * pool saves. Read at session begin, on the control thread, before CUPTI
 * can complete a buffer of the session. */
static int raw_buffers;

/* 1 between session begin and end. A buffer completed outside a session (in
 * activity-only mode CUPTI keeps our callbacks after we leave) is discarded. */
static atomic_int accepting;

/* ---- Small helpers ----------------------------------------------------- */

static int16_t
device16(uint32_t d)
{
    return d <= INT16_MAX ? (int16_t)d : -1;
}

static uint32_t
valid_id(uint32_t v)
{
    return v == CUPTI_INVALID_ID ? 0 : v;
}

static uint8_t
copy_kind(uint32_t k)
{
    switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
        return GP_COPY_HTOD;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
        return GP_COPY_DTOH;
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA:
        return GP_COPY_HTOA;
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH:
        return GP_COPY_ATOH;
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA:
        return GP_COPY_ATOA;
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD:
        return GP_COPY_ATOD;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA:
        return GP_COPY_DTOA;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
        return GP_COPY_DTOD;
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
        return GP_COPY_HTOH;
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
        return GP_COPY_PTOP;
    default:
        return GP_COPY_UNKNOWN;
    }
}

static uint8_t
mem_kind(uint32_t k)
{
    switch (k) {
    case CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE:
        return GP_MEM_PAGEABLE;
    case CUPTI_ACTIVITY_MEMORY_KIND_PINNED:
        return GP_MEM_PINNED;
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE:
        return GP_MEM_DEVICE;
    case CUPTI_ACTIVITY_MEMORY_KIND_ARRAY:
        return GP_MEM_ARRAY;
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED:
        return GP_MEM_MANAGED;
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE_STATIC:
        return GP_MEM_DEVICE_STATIC;
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED_STATIC:
        return GP_MEM_MANAGED_STATIC;
    default:
        return GP_MEM_UNKNOWN;
    }
}

static uint8_t
sync_kind(CUpti_ActivitySynchronizationType t)
{
    switch (t) {
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE:
        return GP_SYNC_EVENT;
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT:
        return GP_SYNC_STREAM_WAIT_EVENT;
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE:
        return GP_SYNC_STREAM;
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE:
        return GP_SYNC_CONTEXT;
    default:
        return GP_SYNC_UNKNOWN;
    }
}

int
gp_cupti_activity_traced(CUpti_CallbackDomain domain, uint32_t cbid)
{
#define GP_TRACED_CASE(id, cls)                                                                    \
    case id:                                                                                       \
        return 1;
    if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
        switch (cbid) {
            GP_CUPTI_RUNTIME_APIS(GP_TRACED_CASE)
        default:
            return 0;
        }
    }
    if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
        switch (cbid) {
            GP_CUPTI_DRIVER_APIS(GP_TRACED_CASE)
        default:
            return 0;
        }
    }
    return 0;
#undef GP_TRACED_CASE
}

/* ---- String table (cuda_lock) ------------------------------------------ */

/* Id of `name`, adding a copy when new; 0 when it cannot be stored. */
static uint32_t
intern_locked(const char *name)
{
    if (name == NULL)
        return 0;
    size_t len = strlen(name);
    uint64_t h = gp_strtab_hash(0, name, len);
    uint32_t id = gp_strtab_find(&strings, 0, name, len, h);
    if (id == 0 && strings.n < MAX_STRINGS)
        id = gp_strtab_add(&strings, 0, name, len, h);
    return id;
}

const char *
gp_cuda_string(uint32_t id)
{
    pthread_mutex_lock(&cuda_lock);
    const GpStr *s = gp_strtab_get(&strings, id);
    pthread_mutex_unlock(&cuda_lock);
    return s != NULL ? s->text : NULL;
}

void
gp_cuda_clear_strings(void)
{
    pthread_mutex_lock(&cuda_lock);
    gp_strtab_clear(&strings);
    pthread_mutex_unlock(&cuda_lock);
}

/* ---- Event and context maps (cuda_lock) -------------------------------- */

static void
ev_clear_locked(void)
{
    free(ev_keys);
    free(ev_streams);
    ev_keys = NULL;
    ev_streams = NULL;
    ev_cap = ev_n = 0;
}

static void
ev_put_locked(uint64_t sync_id, uint32_t stream)
{
    if (ev_n >= EVENT_MAP_MAX)
        ev_clear_locked(); /* bounded: waits on much older events lose wait_stream */
    if ((ev_n + 1) * 2 > ev_cap) {
        size_t cap = ev_cap ? ev_cap * 2 : 1024;
        uint64_t *keys = calloc(cap, sizeof *keys);
        uint32_t *streams = calloc(cap, sizeof *streams);
        if (keys == NULL || streams == NULL) {
            free(keys);
            free(streams);
            return;
        }
        for (size_t j = 0; j < ev_cap; j++) {
            if (ev_keys[j] == 0)
                continue;
            size_t i = (size_t)(ev_keys[j] * 0x9E3779B97F4A7C15ull) & (cap - 1);
            while (keys[i] != 0)
                i = (i + 1) & (cap - 1);
            keys[i] = ev_keys[j];
            streams[i] = ev_streams[j];
        }
        free(ev_keys);
        free(ev_streams);
        ev_keys = keys;
        ev_streams = streams;
        ev_cap = cap;
    }
    uint64_t key = sync_id + 1;
    size_t i = (size_t)(key * 0x9E3779B97F4A7C15ull) & (ev_cap - 1);
    while (ev_keys[i] != 0 && ev_keys[i] != key)
        i = (i + 1) & (ev_cap - 1);
    if (ev_keys[i] == 0)
        ev_n++;
    ev_keys[i] = key;
    ev_streams[i] = stream;
}

static uint32_t
ev_get_locked(uint64_t sync_id)
{
    if (ev_cap == 0)
        return 0;
    uint64_t key = sync_id + 1;
    size_t i = (size_t)(key * 0x9E3779B97F4A7C15ull) & (ev_cap - 1);
    for (; ev_keys[i] != 0; i = (i + 1) & (ev_cap - 1)) {
        if (ev_keys[i] == key)
            return ev_streams[i];
    }
    return 0;
}

static void
ctx_learn_locked(uint32_t ctx, int16_t dev)
{
    if (ctx == 0 || dev < 0)
        return;
    for (int i = 0; i < n_ctx; i++) {
        if (ctx_ids[i] == ctx) {
            ctx_devs[i] = dev;
            return;
        }
    }
    if (n_ctx < CTX_MAP_MAX) {
        ctx_ids[n_ctx] = ctx;
        ctx_devs[n_ctx] = dev;
        n_ctx++;
    }
}

static int16_t
ctx_device_locked(uint32_t ctx)
{
    for (int i = 0; i < n_ctx; i++) {
        if (ctx_ids[i] == ctx)
            return ctx_devs[i];
    }
    return -1;
}

/* Fill wait_stream and missing devices from the maps; done at take time
 * (and at session end, before the maps go) when every buffer is in. */
static void
resolve_locked(void)
{
    for (size_t i = 0; i < n_pending; i++) {
        if (pending[i].index < n_records)
            records[pending[i].index].wait_stream = ev_get_locked(pending[i].sync_id);
    }
    n_pending = 0;
    for (size_t i = 0; i < n_records; i++) {
        GpGpuRecord *r = &records[i];
        if (r->device < 0 && r->context != 0 && r->kind != GP_GPU_API)
            r->device = ctx_device_locked(r->context);
    }
}

/* ---- Decoding ------------------------------------------------------------ */

/* Records decoded from one buffer before they are appended under the lock. */
typedef struct Stage {
    size_t n;
    GpGpuRecord rec[STAGE_RECORDS];
    const char *name[STAGE_RECORDS]; /* kernel name (CUPTI's, valid during the callback) */
    uint64_t wait_sync[STAGE_RECORDS]; /* stream-wait-event sync id, else NO_SYNC_ID */
    size_t n_ev;
    uint64_t ev_sync[STAGE_RECORDS]; /* CUDA_EVENT records: sync id -> recording stream */
    uint32_t ev_stream[STAGE_RECORDS];
} Stage;

/* Append one record; 0, or -1 when the array is at MAX_RECORDS or cannot
 * grow (the caller counts the loss). */
static int
append_locked(const GpGpuRecord *rec, const char *name, uint64_t wait_sync)
{
    if (n_records == cap_records) {
        size_t cap = cap_records ? cap_records * 2 : 65536;
        if (cap > MAX_RECORDS)
            cap = MAX_RECORDS;
        GpGpuRecord *grown = cap > cap_records ? realloc(records, cap * sizeof *grown) : NULL;
        if (grown == NULL)
            return -1;
        records = grown;
        cap_records = cap;
    }
    GpGpuRecord *r = &records[n_records];
    *r = *rec;
    if (name != NULL)
        r->name_id = intern_locked(name);
    if (wait_sync != NO_SYNC_ID) {
        if (n_pending == cap_pending) {
            size_t cap = cap_pending ? cap_pending * 2 : 256;
            PendingWait *grown = realloc(pending, cap * sizeof *grown);
            if (grown != NULL) {
                pending = grown;
                cap_pending = cap;
            }
        }
        if (n_pending < cap_pending)
            pending[n_pending++] = (PendingWait){n_records, wait_sync};
    }
    ctx_learn_locked(r->context, r->device);
    n_records++;
    return 0;
}

static void
stage_flush(Stage *s)
{
    if (s->n == 0 && s->n_ev == 0)
        return;
    uint64_t lost = 0;
    pthread_mutex_lock(&cuda_lock);
    for (size_t j = 0; j < s->n_ev; j++)
        ev_put_locked(s->ev_sync[j], s->ev_stream[j]);
    for (size_t j = 0; j < s->n; j++) {
        if (append_locked(&s->rec[j], s->name[j], s->wait_sync[j]) < 0) {
            lost += s->n - j;
            break;
        }
    }
    pthread_mutex_unlock(&cuda_lock);
    if (lost)
        atomic_fetch_add(&dropped, lost);
    s->n = 0;
    s->n_ev = 0;
}

void
gp_cupti_activity_add(const GpGpuRecord *r)
{
    if (!atomic_load(&accepting))
        return;
    pthread_mutex_lock(&cuda_lock);
    int rc = append_locked(r, NULL, NO_SYNC_ID);
    pthread_mutex_unlock(&cuda_lock);
    if (rc < 0)
        atomic_fetch_add(&dropped, 1);
}

/* A zeroed record in the stage (flushing it first when full). */
static GpGpuRecord *
stage_add(Stage *s, uint8_t kind, const char *name, uint64_t wait_sync)
{
    if (s->n == STAGE_RECORDS)
        stage_flush(s);
    size_t j = s->n++;
    GpGpuRecord *r = &s->rec[j];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->device = r->src_device = r->dst_device = -1;
    s->name[j] = name;
    s->wait_sync[j] = wait_sync;
    return r;
}

static void
decode_kernel(Stage *s, const CUpti_ActivityKernel10 *k)
{
    GpGpuRecord *r = stage_add(s, GP_GPU_KERNEL, k->name, NO_SYNC_ID);
    r->start_ns = k->start;
    r->end_ns = k->end;
    r->device = device16(k->deviceId);
    r->context = valid_id(k->contextId);
    r->stream = valid_id(k->streamId);
    r->correlation = k->correlationId;
    r->grid[0] = (uint32_t)k->gridX;
    r->grid[1] = (uint32_t)k->gridY;
    r->grid[2] = (uint32_t)k->gridZ;
    r->block[0] = (uint32_t)k->blockX;
    r->block[1] = (uint32_t)k->blockY;
    r->block[2] = (uint32_t)k->blockZ;
    r->registers = k->registersPerThread;
    r->static_smem = (uint32_t)k->staticSharedMemory;
    r->dynamic_smem = (uint32_t)k->dynamicSharedMemory;
    r->graph_id = k->graphId;
    r->graph_node_id = k->graphNodeId;
}

static void
decode_memcpy(Stage *s, const CUpti_ActivityMemcpy6 *m)
{
    GpGpuRecord *r = stage_add(s, GP_GPU_MEMCPY, NULL, NO_SYNC_ID);
    r->start_ns = m->start;
    r->end_ns = m->end;
    r->bytes = m->bytes;
    r->device = device16(m->deviceId);
    r->context = valid_id(m->contextId);
    r->stream = valid_id(m->streamId);
    /* correlationId is the driver call's; a runtime copy (cudaMemcpy*) was
     * recorded by the callback under the runtime call's id, which CUPTI
     * keeps in runtimeCorrelationId (0 for copies issued through cuMemcpy*). */
    r->correlation = m->runtimeCorrelationId ? m->runtimeCorrelationId : m->correlationId;
    r->subkind = copy_kind(m->copyKind);
    r->src_mem = mem_kind(m->srcKind);
    r->dst_mem = mem_kind(m->dstKind);
    r->graph_id = m->graphId;
    r->graph_node_id = m->graphNodeId;
}

static void
decode_peer(Stage *s, const CUpti_ActivityMemcpyPtoP4 *m)
{
    GpGpuRecord *r = stage_add(s, GP_GPU_MEMCPY, NULL, NO_SYNC_ID);
    r->start_ns = m->start;
    r->end_ns = m->end;
    r->bytes = m->bytes;
    r->device = device16(m->deviceId);
    r->src_device = device16(m->srcDeviceId);
    r->dst_device = device16(m->dstDeviceId);
    r->context = valid_id(m->contextId);
    r->stream = valid_id(m->streamId);
    r->correlation = m->correlationId;
    r->subkind = copy_kind(m->copyKind);
    r->src_mem = mem_kind(m->srcKind);
    r->dst_mem = mem_kind(m->dstKind);
    r->graph_id = m->graphId;
    r->graph_node_id = m->graphNodeId;
}

static void
decode_memset(Stage *s, const CUpti_ActivityMemset4 *m)
{
    GpGpuRecord *r = stage_add(s, GP_GPU_MEMSET, NULL, NO_SYNC_ID);
    r->start_ns = m->start;
    r->end_ns = m->end;
    r->bytes = m->bytes;
    r->device = device16(m->deviceId);
    r->context = valid_id(m->contextId);
    r->stream = valid_id(m->streamId);
    r->correlation = m->correlationId;
    r->dst_mem = mem_kind(m->memoryKind);
    r->graph_id = m->graphId;
    r->graph_node_id = m->graphNodeId;
}

static void
decode_sync(Stage *s, const CUpti_ActivitySynchronization2 *y)
{
    uint64_t wait = NO_SYNC_ID;
    if (y->type == CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT &&
        y->cudaEventSyncId != (uint64_t)CUPTI_SYNCHRONIZATION_INVALID_VALUE &&
        y->cudaEventSyncId != NO_SYNC_ID)
        wait = y->cudaEventSyncId;
    GpGpuRecord *r = stage_add(s, GP_GPU_SYNC, NULL, wait);
    r->start_ns = y->start;
    r->end_ns = y->end;
    r->context = valid_id(y->contextId);
    r->stream = valid_id(y->streamId); /* the waiting stream for stream-wait-event */
    r->correlation = y->correlationId;
    r->subkind = sync_kind(y->type);
}

static void
decode_event(Stage *s, const CUpti_ActivityCudaEvent2 *e)
{
    if (e->cudaEventSyncId == (uint64_t)CUPTI_SYNCHRONIZATION_INVALID_VALUE ||
        e->cudaEventSyncId == NO_SYNC_ID)
        return;
    if (s->n_ev == STAGE_RECORDS)
        stage_flush(s);
    s->ev_sync[s->n_ev] = e->cudaEventSyncId;
    s->ev_stream[s->n_ev] = valid_id(e->streamId);
    s->n_ev++;
}

static void
decode_memory(Stage *s, const CUpti_ActivityMemory4 *m)
{
    uint8_t kind;
    if (m->memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION)
        kind = GP_GPU_MALLOC;
    else if (m->memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE)
        kind = GP_GPU_FREE;
    else
        return;
    /* Host allocations (cudaMallocHost, cudaHostAlloc) also come as MEMORY2
     * records; the device memory curve must not count them. */
    if (m->memoryKind == CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE ||
        m->memoryKind == CUPTI_ACTIVITY_MEMORY_KIND_PINNED)
        return;
    GpGpuRecord *r = stage_add(s, kind, NULL, NO_SYNC_ID);
    r->start_ns = r->end_ns = m->timestamp;
    r->address = m->address;
    r->bytes = m->bytes;
    r->device = device16(m->deviceId);
    r->context = valid_id(m->contextId);
    r->stream = valid_id(m->streamId);
    r->correlation = m->correlationId;
    r->dst_mem = mem_kind(m->memoryKind);
}

static void
decode_api(Stage *s, const CUpti_ActivityAPI *a, CUpti_CallbackDomain domain)
{
    /* Activity-only mode: CUPTI reports every API; keep the traced ones,
     * the rest are not losses and are not counted as dropped. */
    if (!gp_cupti_activity_traced(domain, a->cbid))
        return;
    uint32_t gp_domain = domain == CUPTI_CB_DOMAIN_RUNTIME_API ? GP_API_RUNTIME : GP_API_DRIVER;
    GpGpuRecord *r = stage_add(s, GP_GPU_API, NULL, NO_SYNC_ID);
    r->start_ns = a->start;
    r->end_ns = a->end;
    r->correlation = a->correlationId;
    r->name_id = GP_API_KEY(gp_domain, a->cbid);
    r->subkind = (uint8_t)gp_domain;
    r->thread_id = a->threadId;
}

static void
decode(Stage *s, const CUpti_Activity *a)
{
    switch (a->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        decode_kernel(s, (const CUpti_ActivityKernel10 *)a);
        break;
    case CUPTI_ACTIVITY_KIND_MEMCPY:
        decode_memcpy(s, (const CUpti_ActivityMemcpy6 *)a);
        break;
    case CUPTI_ACTIVITY_KIND_MEMCPY2:
        decode_peer(s, (const CUpti_ActivityMemcpyPtoP4 *)a);
        break;
    case CUPTI_ACTIVITY_KIND_MEMSET:
        decode_memset(s, (const CUpti_ActivityMemset4 *)a);
        break;
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
        decode_sync(s, (const CUpti_ActivitySynchronization2 *)a);
        break;
    case CUPTI_ACTIVITY_KIND_CUDA_EVENT:
        decode_event(s, (const CUpti_ActivityCudaEvent2 *)a);
        break;
    case CUPTI_ACTIVITY_KIND_MEMORY2:
        decode_memory(s, (const CUpti_ActivityMemory4 *)a);
        break;
    case CUPTI_ACTIVITY_KIND_RUNTIME:
        decode_api(s, (const CUpti_ActivityAPI *)a, CUPTI_CB_DOMAIN_RUNTIME_API);
        break;
    case CUPTI_ACTIVITY_KIND_DRIVER:
        decode_api(s, (const CUpti_ActivityAPI *)a, CUPTI_CB_DOMAIN_DRIVER_API);
        break;
    default:
        break; /* kinds we did not enable (another client's, in activity-only mode) */
    }
}

/* ---- CUPTI buffer callbacks ----------------------------------------------- */

/* Buffers are mapped, not malloc'ed (a mapping is page-aligned, which meets
 * CUPTI's 8-byte rule). CUPTI asks for them on its own threads, and glibc,
 * once an 8 MiB block has been freed, serves blocks of that size from
 * per-thread arenas that it seldom returns to the system. With malloc, RSS
 * rose by ~0.4 MiB for every profile started and stopped on an H200 while
 * malloc's live bytes fell. A mapping goes back when it is unmapped.
 *
 * Every buffer handed to CUPTI is all zeros (CUPTI_ACTIVITY_ATTR_ZEROED_OUT_
 * ACTIVITY_BUFFER is set): a fresh mapping is, and a used one is cleared on
 * completion, on the thread that completes it (CUPTI's worker, or the flush
 * at window end), so that CUPTI never clears 8 MiB on the thread that asked
 * for a buffer, which may be the training thread inside a launch.
 * `populate` faults the pages in now rather than when CUPTI first writes. */
static uint8_t *
buffer_alloc(int populate)
{
    void *b = mmap(NULL, BUFFER_BYTES, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0), -1, 0);
    return b == MAP_FAILED ? NULL : b;
}

static void
buffer_free(uint8_t *b)
{
    if (b != NULL)
        munmap(b, BUFFER_BYTES);
}

/* Clear what CUPTI wrote: the valid records, plus the page after them in
 * case a record was cut off at a forced flush. */
static void
buffer_clear(uint8_t *b, size_t valid_bytes)
{
    size_t page = 4096;
    size_t n = (valid_bytes + 2 * page - 1) / page * page;
    memset(b, 0, n < BUFFER_BYTES ? n : BUFFER_BYTES);
}

static void CUPTIAPI
buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    uint8_t *b = NULL;
    pthread_mutex_lock(&cuda_lock);
    if (n_free_buffers > 0)
        b = free_buffers[--n_free_buffers];
    pthread_mutex_unlock(&cuda_lock);
    if (b == NULL)
        b = buffer_alloc(0);
    /* NULL declines the request; CUPTI then drops records and counts them,
     * and bufferCompleted adds that count to `dropped`. */
    *buffer = b;
    *size = b ? BUFFER_BYTES : 0;
    *max_records = 0; /* as many as fit */
}

static void CUPTIAPI
buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t *buffer, size_t size,
                 size_t valid_bytes)
{
    (void)size;
    if (buffer != NULL && valid_bytes > 0 && atomic_load(&accepting)) {
        uint64_t t0 = gp_clock_now();
        Stage stage;
        stage.n = stage.n_ev = 0;
        uint64_t count = 0;
        CUpti_Activity *rec = NULL;
        for (;;) {
            CUptiResult r = gp_cupti.cuptiActivityGetNextRecord(buffer, valid_bytes, &rec);
            if (r == CUPTI_SUCCESS) {
                decode(&stage, rec);
                count++;
                continue;
            }
            /* MAX_LIMIT_REACHED is the normal end. Anything else (an
             * incomplete record after a forced flush) stops the walk: the
             * iterator cannot step past a record it could not read. */
            if (r != CUPTI_ERROR_MAX_LIMIT_REACHED)
                atomic_fetch_add(&dropped, 1);
            break;
        }
        stage_flush(&stage);
        atomic_fetch_add(&decode_ns, gp_clock_now() - t0);
        atomic_fetch_add(&decoded_records, count);
        atomic_fetch_add(&completed_buffers, 1);
    }

    size_t lost = 0;
    if (gp_cupti.cuptiActivityGetNumDroppedRecords(ctx, stream_id, &lost) == CUPTI_SUCCESS &&
        lost > 0 && atomic_load(&accepting))
        atomic_fetch_add(&dropped, (uint64_t)lost);

    if (buffer == NULL)
        return;
    int keep = atomic_load(&accepting);
    if (keep && !raw_buffers)
        buffer_clear(buffer, valid_bytes);
    int kept = 0;
    pthread_mutex_lock(&cuda_lock);
    if (keep && n_free_buffers < FREE_BUFFERS_MAX) {
        free_buffers[n_free_buffers++] = buffer;
        kept = 1;
    }
    pthread_mutex_unlock(&cuda_lock);
    if (!kept)
        buffer_free(buffer);
}

CUptiResult
gp_cupti_activity_register(void)
{
    const char *raw = getenv("GPUPROF_CUPTI_RAWBUF");
    raw_buffers = raw != NULL && strcmp(raw, "1") == 0;
    if (raw_buffers)
        return gp_cupti.cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    /* Before the callbacks, as CUPTI asks; a CUPTI that refuses it clears
     * buffers itself, which costs time but loses nothing. */
    uint8_t zeroed = 1;
    size_t len = sizeof zeroed;
    gp_cupti.cuptiActivitySetAttribute(CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER, &len,
                                       &zeroed);
    /* The first buffers are faulted in here, on the thread starting the
     * profile, instead of page by page inside the first launches. */
    uint8_t *fresh[PREFAULTED_BUFFERS];
    int n = 0;
    while (n < PREFAULTED_BUFFERS && (fresh[n] = buffer_alloc(1)) != NULL)
        n++;
    pthread_mutex_lock(&cuda_lock);
    int i = 0;
    while (i < n && n_free_buffers < FREE_BUFFERS_MAX)
        free_buffers[n_free_buffers++] = fresh[i++];
    pthread_mutex_unlock(&cuda_lock);
    while (i < n)
        buffer_free(fresh[i++]);
    return gp_cupti.cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
}

void
gp_cuda_stats(GpCudaStats *out)
{
    out->decode_ns = atomic_load(&decode_ns);
    out->decoded_records = atomic_load(&decoded_records);
    out->completed_buffers = atomic_load(&completed_buffers);
}

/* ---- Session and hand-over ---------------------------------------------- */

static void
forget_records_locked(void)
{
    free(records);
    records = NULL;
    n_records = cap_records = 0;
    free(pending);
    pending = NULL;
    n_pending = cap_pending = 0;
}

void
gp_cupti_activity_session_begin(void)
{
    pthread_mutex_lock(&cuda_lock);
    forget_records_locked();
    ev_clear_locked();
    n_ctx = 0;
    pthread_mutex_unlock(&cuda_lock);
    atomic_store(&dropped, 0);
    atomic_store(&accepting, 1);
}

void
gp_cupti_activity_after_fork_child(void)
{
    pthread_mutex_init(&cuda_lock, NULL);
    atomic_store(&accepting, 0);
}

void
gp_cupti_activity_session_end(void)
{
    atomic_store(&accepting, 0);
    pthread_mutex_lock(&cuda_lock);
    resolve_locked(); /* the event map goes now; untaken records keep their answers */
    free(pending);
    pending = NULL;
    n_pending = cap_pending = 0;
    ev_clear_locked();
    n_ctx = 0;
    uint8_t *bufs[FREE_BUFFERS_MAX];
    int n = n_free_buffers;
    memcpy(bufs, free_buffers, sizeof bufs);
    n_free_buffers = 0;
    pthread_mutex_unlock(&cuda_lock);
    for (int i = 0; i < n; i++)
        buffer_free(bufs[i]);
}

GpGpuRecord *
gp_cuda_take_records(size_t *n)
{
    pthread_mutex_lock(&cuda_lock);
    resolve_locked();
    GpGpuRecord *out = records;
    size_t count = n_records;
    records = NULL;
    n_records = cap_records = 0;
    pthread_mutex_unlock(&cuda_lock);
    if (count == 0) {
        free(out);
        out = NULL;
    }
    if (n != NULL)
        *n = count;
    return out;
}

uint64_t
gp_cuda_dropped(void)
{
    return atomic_load(&dropped);
}
