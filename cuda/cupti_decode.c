/* CUPTI activity records decoded into gpuprof GPU records.
 *
 * A completed buffer is walked on the CUPTI thread that completed it; each
 * record is decoded into a GpGpuRecord, staged on the stack, and appended
 * to the session's records (cupti_store.c) a batch at a time.
 *
 * Lock rule (docs/development.md, "Threads, locks and CUPTI"): CUPTI is
 * never called while cuda_lock is held. Decoding calls
 * cuptiActivityGetNextRecord, so it runs unlocked into a stack batch; only
 * the append takes the lock.
 */
#include "cupti_internal.h"

#include <string.h>

#define STAGE_RECORDS 64          /* records decoded per lock acquisition */

/* CUPTI's "not applicable" ids (CUPTI_INVALID_CONTEXT_ID, _STREAM_ID,
 * CUPTI_SYNCHRONIZATION_INVALID_VALUE) all share this value. */
#define CUPTI_INVALID_ID 0xFFFFFFFFu

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
gp_cupti_decode_traced(CUpti_CallbackDomain domain, uint32_t cbid)
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
/* ---- Decoding ------------------------------------------------------------ */

/* Records decoded from one buffer before they are appended under the lock. */
typedef struct Stage {
    size_t n;
    GpGpuRecord rec[STAGE_RECORDS];
    const char *name[STAGE_RECORDS]; /* kernel name (CUPTI's, valid during the callback) */
    uint64_t wait_sync[STAGE_RECORDS]; /* stream-wait-event sync id, else GP_CUPTI_NO_SYNC_ID */
    size_t n_ev;
    uint64_t ev_sync[STAGE_RECORDS]; /* CUDA_EVENT records: sync id -> recording stream */
    uint32_t ev_stream[STAGE_RECORDS];
} Stage;
/* Append the staged records and events to the session's records. */
static void
stage_flush(Stage *s)
{
    if (s->n == 0 && s->n_ev == 0)
        return;
    gp_cupti_store_append(s->rec, s->name, s->wait_sync, s->n, s->ev_sync, s->ev_stream, s->n_ev);
    s->n = 0;
    s->n_ev = 0;
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
    GpGpuRecord *r = stage_add(s, GP_GPU_KERNEL, k->name, GP_CUPTI_NO_SYNC_ID);
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
    GpGpuRecord *r = stage_add(s, GP_GPU_MEMCPY, NULL, GP_CUPTI_NO_SYNC_ID);
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
    GpGpuRecord *r = stage_add(s, GP_GPU_MEMCPY, NULL, GP_CUPTI_NO_SYNC_ID);
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
    GpGpuRecord *r = stage_add(s, GP_GPU_MEMSET, NULL, GP_CUPTI_NO_SYNC_ID);
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
    uint64_t wait = GP_CUPTI_NO_SYNC_ID;
    if (y->type == CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT &&
        y->cudaEventSyncId != (uint64_t)CUPTI_SYNCHRONIZATION_INVALID_VALUE &&
        y->cudaEventSyncId != GP_CUPTI_NO_SYNC_ID)
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
        e->cudaEventSyncId == GP_CUPTI_NO_SYNC_ID)
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
    GpGpuRecord *r = stage_add(s, kind, NULL, GP_CUPTI_NO_SYNC_ID);
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
    if (!gp_cupti_decode_traced(domain, a->cbid))
        return;
    uint32_t gp_domain = domain == CUPTI_CB_DOMAIN_RUNTIME_API ? GP_API_RUNTIME : GP_API_DRIVER;
    GpGpuRecord *r = stage_add(s, GP_GPU_API, NULL, GP_CUPTI_NO_SYNC_ID);
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

uint64_t
gp_cupti_decode_buffer(uint8_t *buffer, size_t valid_bytes)
{
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
            gp_cupti_store_drop(1);
        break;
    }
    stage_flush(&stage);
    return count;
}
