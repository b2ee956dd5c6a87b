/* CUPTI activity buffers: the pool of empty buffers handed to CUPTI, and
 * CUPTI's buffer callbacks.
 *
 * CUPTI asks for empty buffers and hands back full ones on its own threads
 * (a worker thread, or the thread that calls cuptiActivityFlushAll). Each
 * completed buffer is decoded (cupti_decode.c) into the session's records
 * (cupti_store.c), which gp_cuda_take_records hands to the aggregator; the
 * emptied buffer goes back to the pool.
 *
 * Lock rule (docs/development.md, "Threads, locks and CUPTI"): CUPTI is
 * never called while pool_lock is held.
 */
#include "cupti_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "clock.h"

/* CUPTI fills whole buffers; 8 MiB holds ~30k kernel records, so a buffer
 * completes every few thousand launches at most, not per launch. */
#define BUFFER_BYTES ((size_t)8 << 20)
#define FREE_BUFFERS_MAX 4        /* cached empty buffers; more are freed */
#define PREFAULTED_BUFFERS 2      /* mapped and faulted in at session begin */

/* Protects free_buffers and n_free_buffers. Taken on CUPTI's threads
 * (buffer callbacks) and on the control thread (register, session end). */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;

/* Empty CUPTI buffers kept for reuse. */
static uint8_t *free_buffers[FREE_BUFFERS_MAX];
static int n_free_buffers;

/* Decoding cost, for the benchmarks' per-record figure (gp_cuda_stats).
 * Atomic: added on CUPTI threads. */
static atomic_uint_fast64_t decode_ns, decoded_records, completed_buffers;

/* GPUPROF_CUPTI_RAWBUF=1 (benchmarks only): buffers as before the zeroed
 * pool (neither cleared by us nor faulted in ahead), to measure what the
 * pool saves. Read at session begin, on the control thread, before CUPTI
 * can complete a buffer of the session. */
static int raw_buffers;

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
    pthread_mutex_lock(&pool_lock);
    if (n_free_buffers > 0)
        b = free_buffers[--n_free_buffers];
    pthread_mutex_unlock(&pool_lock);
    if (b == NULL)
        b = buffer_alloc(0);
    /* NULL declines the request; CUPTI then drops records and counts them,
     * and bufferCompleted adds that count to `dropped` (cupti_store.c). */
    *buffer = b;
    *size = b ? BUFFER_BYTES : 0;
    *max_records = 0; /* as many as fit */
}

static void CUPTIAPI
buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t *buffer, size_t size,
                 size_t valid_bytes)
{
    (void)size;
    if (buffer != NULL && valid_bytes > 0 && gp_cupti_store_accepting()) {
        uint64_t t0 = gp_clock_now();
        uint64_t count = gp_cupti_decode_buffer(buffer, valid_bytes);
        atomic_fetch_add(&decode_ns, gp_clock_now() - t0);
        atomic_fetch_add(&decoded_records, count);
        atomic_fetch_add(&completed_buffers, 1);
    }

    size_t lost = 0;
    if (gp_cupti.cuptiActivityGetNumDroppedRecords(ctx, stream_id, &lost) == CUPTI_SUCCESS &&
        lost > 0 && gp_cupti_store_accepting())
        gp_cupti_store_drop((uint64_t)lost);

    if (buffer == NULL)
        return;
    int keep = gp_cupti_store_accepting();
    if (keep && !raw_buffers)
        buffer_clear(buffer, valid_bytes);
    int kept = 0;
    pthread_mutex_lock(&pool_lock);
    if (keep && n_free_buffers < FREE_BUFFERS_MAX) {
        free_buffers[n_free_buffers++] = buffer;
        kept = 1;
    }
    pthread_mutex_unlock(&pool_lock);
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
    pthread_mutex_lock(&pool_lock);
    int i = 0;
    while (i < n && n_free_buffers < FREE_BUFFERS_MAX)
        free_buffers[n_free_buffers++] = fresh[i++];
    pthread_mutex_unlock(&pool_lock);
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

/* ---- Session -------------------------------------------------------------- */

void
gp_cupti_activity_session_begin(void)
{
    gp_cupti_store_session_begin();
}

void
gp_cupti_activity_after_fork_child(void)
{
    pthread_mutex_init(&pool_lock, NULL);
    gp_cupti_store_after_fork_child();
}

void
gp_cupti_activity_session_end(void)
{
    gp_cupti_store_session_end();
    pthread_mutex_lock(&pool_lock);
    uint8_t *bufs[FREE_BUFFERS_MAX];
    int n = n_free_buffers;
    memcpy(bufs, free_buffers, sizeof bufs);
    n_free_buffers = 0;
    pthread_mutex_unlock(&pool_lock);
    for (int i = 0; i < n; i++)
        buffer_free(bufs[i]);
}
