/* Private declarations shared by cuda/cupti_*.c; csrc/ never includes this
 * (it sees only gp_cuda.h, free of CUPTI types). No Python API here or in
 * any file that includes it (docs/development.md, "C headers").
 */
#ifndef GPUPROF_CUDA_CUPTI_INTERNAL_H
#define GPUPROF_CUDA_CUPTI_INTERNAL_H

#include <stdint.h>

#include "buffer.h" /* GP_API_KEY, GP_API_DOMAIN, GP_API_CBID */
#include "cupti_symbols.h"
#include "gp_cuda.h"

/* ---- Resolved entry points (cupti_loader.c) ---------------------------- */

typedef struct GpCuptiApi {
#define GP_CUPTI_FIELD(name, ret, args) ret(CUPTIAPI *name) args;
    GP_CUPTI_SYMBOLS(GP_CUPTI_FIELD)
#undef GP_CUPTI_FIELD
} GpCuptiApi;

/* libcupti's entry points. Written once by gp_cuda_load before it publishes
 * gp_cuda_loaded() with a release store; read-only afterwards, so any thread
 * that saw gp_cuda_loaded() == 1 (or runs inside a CUPTI callback, which
 * needs a session, which needs a load) may call through it without a lock. */
extern GpCuptiApi gp_cupti;

typedef struct GpCudaDriverApi {
#define GP_CUDA_DRIVER_FIELD(name, ret, args) ret(CUDAAPI *name) args;
    GP_CUDA_DRIVER_SYMBOLS(GP_CUDA_DRIVER_FIELD)
#undef GP_CUDA_DRIVER_FIELD
} GpCudaDriverApi;

/* The CUDA driver API, opened and cuInit'ed on first use (pthread_once), or
 * NULL when there is no usable driver; then *why (if non-NULL) points to a
 * static reason string. Never unloads. Any thread. */
const GpCudaDriverApi *gp_cupti_loader_driver(const char **why);

/* cuptiGetResultString's text for r, or "unknown CUPTI result" when libcupti
 * is not loaded or does not know r. Static storage. Any thread. */
const char *gp_cupti_loader_result_text(CUptiResult r);

/* cuGetErrorString's text for r, or "unknown CUDA driver error". Any thread. */
const char *gp_cupti_loader_driver_text(CUresult r);

/* Replace gp_cuda_reason() with a printf-style message and return `status`
 * (so callers write `return gp_cupti_loader_fail(...)`); ("%s", "") clears
 * it. Any thread (reason_lock in cupti_loader.c). */
GpStatus gp_cupti_loader_fail(GpStatus status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Capture modes behind gp_cuda_mode(). */
enum { GP_CUPTI_MODE_OFF = 0, GP_CUPTI_MODE_CALLBACKS, GP_CUPTI_MODE_ACTIVITY_ONLY };
void gp_cupti_loader_set_mode(int mode);
int gp_cupti_loader_get_mode(void);

/* ---- Activity buffers (cupti_activity.c) ------------------------------- */

/* Register the buffer callbacks with CUPTI. Control thread, at session begin
 * (again after every cuptiFinalize, which forgets them). */
CUptiResult gp_cupti_activity_register(void);

/* Session begin: forget untaken records, the dropped count and the
 * event/context maps, and start accepting buffers. Control thread. */
void gp_cupti_activity_session_begin(void);

/* Session end (after the final flush): stop accepting records, free the
 * cached buffers and the maps; records not yet taken stay for
 * gp_cuda_take_records. Control thread. */
void gp_cupti_activity_session_end(void);

/* In a forked child: a CUPTI thread of the parent may have held the locks at
 * fork; the child gets fresh ones and accepts no records (its CUDA is not
 * the parent's). */
void gp_cupti_activity_after_fork_child(void);

/* ---- Decoding (cupti_decode.c) ----------------------------------------- */

/* Decode the valid_bytes of a completed activity buffer into the session's
 * records (gp_cupti_store_append); a record that cannot be read ends the
 * walk and counts as dropped. Returns the number of records walked. On the
 * CUPTI thread that completed the buffer; takes no lock while calling
 * CUPTI. */
uint64_t gp_cupti_decode_buffer(uint8_t *buffer, size_t valid_bytes);

/* 1 when (domain, cbid) is one of the traced APIs below. Any thread. */
int gp_cupti_decode_traced(CUpti_CallbackDomain domain, uint32_t cbid);

/* ---- The session's records (cupti_store.c) ----------------------------- */

/* Sync id of a record that waits on no event. */
#define GP_CUPTI_NO_SYNC_ID UINT64_MAX

/* Append n decoded records (rec[j], with CUPTI's kernel name name[j] or
 * NULL, and the stream-wait-event sync id wait_sync[j] or
 * GP_CUPTI_NO_SYNC_ID) after learning n_ev event records (sync id ->
 * recording stream). Names are copied. Records that cannot be stored are
 * counted as dropped. Any thread; takes cuda_lock. */
void gp_cupti_store_append(const GpGpuRecord *rec, const char *const *name,
                           const uint64_t *wait_sync, size_t n, const uint64_t *ev_sync,
                           const uint32_t *ev_stream, size_t n_ev);

/* Append a record made on the host (a sync from the API callbacks) to the
 * session's records, as if it came in a buffer. Any thread; takes
 * cuda_lock; dropped (and counted) outside a session or when full. */
void gp_cupti_store_add(const GpGpuRecord *r);

/* Add n to the records lost this session (gp_cuda_dropped). Any thread. */
void gp_cupti_store_drop(uint64_t n);

/* 1 between session begin and end, when completed buffers are decoded and
 * kept. Any thread (atomic). */
int gp_cupti_store_accepting(void);

/* Session begin: forget untaken records, the dropped count and the
 * event/context maps, and start accepting records. Control thread. */
void gp_cupti_store_session_begin(void);

/* Session end: stop accepting records, resolve the untaken ones and free
 * the maps. Control thread. */
void gp_cupti_store_session_end(void);

/* In a forked child: a fresh cuda_lock, and no records accepted. */
void gp_cupti_store_after_fork_child(void);

/* ---- Traced CUDA APIs -------------------------------------------------- */

/* The runtime and driver API entry points gpuprof follows, each with its
 * GP_APICLASS_*. One list drives the per-cbid callback enables
 * (cupti_callback.c), the activity-only filter (cupti_decode.c) and
 * gp_cuda_api_class (cupti_loader.c). Only cbids present in the CUDA 13.0
 * headers (CUPTI_API_VERSION 130001); whole domains are never enabled.
 * Entries are full enum names so that no cuda.h macro (cuMemcpyHtoD ->
 * cuMemcpyHtoD_v2) can rewrite them. The legacy non-_v2 driver ids are kept:
 * drivers still report them for binaries built against old headers. */
#define GP_CUPTI_RUNTIME_APIS(X)                                                                   \
    /* kernel launches; __cudaLaunchKernel is what <<<>>> calls from CUDA 13 */                    \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, GP_APICLASS_LAUNCH)                         \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000, GP_APICLASS_LAUNCH)                    \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060, GP_APICLASS_LAUNCH)                     \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060, GP_APICLASS_LAUNCH)                \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000, GP_APICLASS_LAUNCH)              \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000, GP_APICLASS_LAUNCH)         \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernelMultiDevice_v9000, GP_APICLASS_LAUNCH)   \
    X(CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000, GP_APICLASS_LAUNCH)                      \
    X(CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000, GP_APICLASS_LAUNCH)                 \
    /* graph launches */                                                                           \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000, GP_APICLASS_GRAPH)                          \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000, GP_APICLASS_GRAPH)                     \
    /* copies that return once the copy is done (or staged) */                                     \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020, GP_APICLASS_MEMCPY_SYNC)                          \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2D_v3020, GP_APICLASS_MEMCPY_SYNC)                        \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyToArray_v3020, GP_APICLASS_MEMCPY_SYNC)                   \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DToArray_v3020, GP_APICLASS_MEMCPY_SYNC)                 \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyFromArray_v3020, GP_APICLASS_MEMCPY_SYNC)                 \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DFromArray_v3020, GP_APICLASS_MEMCPY_SYNC)               \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyArrayToArray_v3020, GP_APICLASS_MEMCPY_SYNC)              \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DArrayToArray_v3020, GP_APICLASS_MEMCPY_SYNC)            \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyToSymbol_v3020, GP_APICLASS_MEMCPY_SYNC)                  \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyFromSymbol_v3020, GP_APICLASS_MEMCPY_SYNC)                \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3D_v3020, GP_APICLASS_MEMCPY_SYNC)                        \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyPeer_v4000, GP_APICLASS_MEMCPY_SYNC)                      \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3DPeer_v4000, GP_APICLASS_MEMCPY_SYNC)                    \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_ptds_v7000, GP_APICLASS_MEMCPY_SYNC)                     \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2D_ptds_v7000, GP_APICLASS_MEMCPY_SYNC)                   \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyToArray_ptds_v7000, GP_APICLASS_MEMCPY_SYNC)              \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DToArray_ptds_v7000, GP_APICLASS_MEMCPY_SYNC)            \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyFromArray_ptds_v7000, GP_APICLASS_MEMCPY_SYNC)            \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DFromArray_ptds_v7000, GP_APICLASS_MEMCPY_SYNC)          \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyArrayToArray_ptds_v7000, GP_APICLASS_MEMCPY_SYNC)         \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DArrayToArray_ptds_v7000, GP_APICLASS_MEMCPY_SYNC)       \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyToSymbol_ptds_v7000, GP_APICLASS_MEMCPY_SYNC)             \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyFromSymbol_ptds_v7000, GP_APICLASS_MEMCPY_SYNC)           \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3D_ptds_v7000, GP_APICLASS_MEMCPY_SYNC)                   \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3DPeer_ptds_v7000, GP_APICLASS_MEMCPY_SYNC)               \
    /* asynchronous copies */                                                                      \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020, GP_APICLASS_MEMCPY)                          \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyToArrayAsync_v3020, GP_APICLASS_MEMCPY)                   \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyFromArrayAsync_v3020, GP_APICLASS_MEMCPY)                 \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DAsync_v3020, GP_APICLASS_MEMCPY)                        \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DToArrayAsync_v3020, GP_APICLASS_MEMCPY)                 \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DFromArrayAsync_v3020, GP_APICLASS_MEMCPY)               \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyToSymbolAsync_v3020, GP_APICLASS_MEMCPY)                  \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyFromSymbolAsync_v3020, GP_APICLASS_MEMCPY)                \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3DAsync_v3020, GP_APICLASS_MEMCPY)                        \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyPeerAsync_v4000, GP_APICLASS_MEMCPY)                      \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3DPeerAsync_v4000, GP_APICLASS_MEMCPY)                    \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000, GP_APICLASS_MEMCPY)                     \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyToArrayAsync_ptsz_v7000, GP_APICLASS_MEMCPY)              \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyFromArrayAsync_ptsz_v7000, GP_APICLASS_MEMCPY)            \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DAsync_ptsz_v7000, GP_APICLASS_MEMCPY)                   \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DToArrayAsync_ptsz_v7000, GP_APICLASS_MEMCPY)            \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DFromArrayAsync_ptsz_v7000, GP_APICLASS_MEMCPY)          \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyToSymbolAsync_ptsz_v7000, GP_APICLASS_MEMCPY)             \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyFromSymbolAsync_ptsz_v7000, GP_APICLASS_MEMCPY)           \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3DAsync_ptsz_v7000, GP_APICLASS_MEMCPY)                   \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3DPeerAsync_ptsz_v7000, GP_APICLASS_MEMCPY)               \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyBatchAsync_v12080, GP_APICLASS_MEMCPY)                    \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyBatchAsync_ptsz_v12080, GP_APICLASS_MEMCPY)               \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3DBatchAsync_v12080, GP_APICLASS_MEMCPY)                  \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3DBatchAsync_ptsz_v12080, GP_APICLASS_MEMCPY)             \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyBatchAsync_v13000, GP_APICLASS_MEMCPY)                    \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyBatchAsync_ptsz_v13000, GP_APICLASS_MEMCPY)               \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3DBatchAsync_v13000, GP_APICLASS_MEMCPY)                  \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy3DBatchAsync_ptsz_v13000, GP_APICLASS_MEMCPY)             \
    /* memsets */                                                                                  \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemset_v3020, GP_APICLASS_MEMSET)                               \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemset2D_v3020, GP_APICLASS_MEMSET)                             \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemset3D_v3020, GP_APICLASS_MEMSET)                             \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020, GP_APICLASS_MEMSET)                          \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemset2DAsync_v3020, GP_APICLASS_MEMSET)                        \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemset3DAsync_v3020, GP_APICLASS_MEMSET)                        \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemset_ptds_v7000, GP_APICLASS_MEMSET)                          \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemset2D_ptds_v7000, GP_APICLASS_MEMSET)                        \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemset3D_ptds_v7000, GP_APICLASS_MEMSET)                        \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_ptsz_v7000, GP_APICLASS_MEMSET)                     \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemset2DAsync_ptsz_v7000, GP_APICLASS_MEMSET)                   \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMemset3DAsync_ptsz_v7000, GP_APICLASS_MEMSET)                   \
    /* synchronization */                                                                          \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020, GP_APICLASS_SYNC)                      \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020, GP_APICLASS_SYNC)                      \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_ptsz_v7000, GP_APICLASS_SYNC)                 \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaEventSynchronize_v3020, GP_APICLASS_SYNC)                       \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaStreamWaitEvent_v3020, GP_APICLASS_SYNC)                        \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaStreamWaitEvent_ptsz_v7000, GP_APICLASS_SYNC)                   \
    /* allocation */                                                                               \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020, GP_APICLASS_ALLOC)                                \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMallocPitch_v3020, GP_APICLASS_ALLOC)                           \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMallocArray_v3020, GP_APICLASS_ALLOC)                           \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMallocHost_v3020, GP_APICLASS_ALLOC)                            \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMalloc3D_v3020, GP_APICLASS_ALLOC)                              \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMalloc3DArray_v3020, GP_APICLASS_ALLOC)                         \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMallocMipmappedArray_v5000, GP_APICLASS_ALLOC)                  \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000, GP_APICLASS_ALLOC)                         \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020, GP_APICLASS_ALLOC)                          \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_ptsz_v11020, GP_APICLASS_ALLOC)                     \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_v11020, GP_APICLASS_ALLOC)                  \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_ptsz_v11020, GP_APICLASS_ALLOC)             \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020, GP_APICLASS_FREE)                                   \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaFreeArray_v3020, GP_APICLASS_FREE)                              \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaFreeHost_v3020, GP_APICLASS_FREE)                               \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaFreeMipmappedArray_v5000, GP_APICLASS_FREE)                     \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020, GP_APICLASS_FREE)                             \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_ptsz_v11020, GP_APICLASS_FREE)

#define GP_CUPTI_DRIVER_APIS(X)                                                                    \
    /* kernel launches */                                                                          \
    X(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, GP_APICLASS_LAUNCH)                                  \
    X(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz, GP_APICLASS_LAUNCH)                             \
    X(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, GP_APICLASS_LAUNCH)                                \
    X(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz, GP_APICLASS_LAUNCH)                           \
    X(CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel, GP_APICLASS_LAUNCH)                       \
    X(CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz, GP_APICLASS_LAUNCH)                  \
    X(CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernelMultiDevice, GP_APICLASS_LAUNCH)            \
    /* graph launches */                                                                           \
    X(CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch, GP_APICLASS_GRAPH)                                    \
    X(CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz, GP_APICLASS_GRAPH)                               \
    /* copies that block the host */                                                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy, GP_APICLASS_MEMCPY_SYNC)                                   \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD, GP_APICLASS_MEMCPY_SYNC)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH, GP_APICLASS_MEMCPY_SYNC)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD, GP_APICLASS_MEMCPY_SYNC)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoA, GP_APICLASS_MEMCPY_SYNC)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoD, GP_APICLASS_MEMCPY_SYNC)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoA, GP_APICLASS_MEMCPY_SYNC)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoH, GP_APICLASS_MEMCPY_SYNC)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoA, GP_APICLASS_MEMCPY_SYNC)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy2D, GP_APICLASS_MEMCPY_SYNC)                                 \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DUnaligned, GP_APICLASS_MEMCPY_SYNC)                        \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy3D, GP_APICLASS_MEMCPY_SYNC)                                 \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeer, GP_APICLASS_MEMCPY_SYNC)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DPeer, GP_APICLASS_MEMCPY_SYNC)                             \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy_v2, GP_APICLASS_MEMCPY_SYNC)                                \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2, GP_APICLASS_MEMCPY_SYNC)                            \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2, GP_APICLASS_MEMCPY_SYNC)                            \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2, GP_APICLASS_MEMCPY_SYNC)                            \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoA_v2, GP_APICLASS_MEMCPY_SYNC)                            \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoD_v2, GP_APICLASS_MEMCPY_SYNC)                            \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoA_v2, GP_APICLASS_MEMCPY_SYNC)                            \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoH_v2, GP_APICLASS_MEMCPY_SYNC)                            \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoA_v2, GP_APICLASS_MEMCPY_SYNC)                            \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy2D_v2, GP_APICLASS_MEMCPY_SYNC)                              \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DUnaligned_v2, GP_APICLASS_MEMCPY_SYNC)                     \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy3D_v2, GP_APICLASS_MEMCPY_SYNC)                              \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy_ptds, GP_APICLASS_MEMCPY_SYNC)                              \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2_ptds, GP_APICLASS_MEMCPY_SYNC)                       \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2_ptds, GP_APICLASS_MEMCPY_SYNC)                       \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2_ptds, GP_APICLASS_MEMCPY_SYNC)                       \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoA_v2_ptds, GP_APICLASS_MEMCPY_SYNC)                       \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoD_v2_ptds, GP_APICLASS_MEMCPY_SYNC)                       \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoA_v2_ptds, GP_APICLASS_MEMCPY_SYNC)                       \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoH_v2_ptds, GP_APICLASS_MEMCPY_SYNC)                       \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoA_v2_ptds, GP_APICLASS_MEMCPY_SYNC)                       \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy2D_v2_ptds, GP_APICLASS_MEMCPY_SYNC)                         \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DUnaligned_v2_ptds, GP_APICLASS_MEMCPY_SYNC)                \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy3D_v2_ptds, GP_APICLASS_MEMCPY_SYNC)                         \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeer_ptds, GP_APICLASS_MEMCPY_SYNC)                          \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DPeer_ptds, GP_APICLASS_MEMCPY_SYNC)                        \
    /* asynchronous copies */                                                                      \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync, GP_APICLASS_MEMCPY)                                   \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync, GP_APICLASS_MEMCPY)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync, GP_APICLASS_MEMCPY)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync, GP_APICLASS_MEMCPY)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoAAsync, GP_APICLASS_MEMCPY)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoHAsync, GP_APICLASS_MEMCPY)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DAsync, GP_APICLASS_MEMCPY)                                 \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DAsync, GP_APICLASS_MEMCPY)                                 \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeerAsync, GP_APICLASS_MEMCPY)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DPeerAsync, GP_APICLASS_MEMCPY)                             \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2, GP_APICLASS_MEMCPY)                            \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2, GP_APICLASS_MEMCPY)                            \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2, GP_APICLASS_MEMCPY)                            \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoAAsync_v2, GP_APICLASS_MEMCPY)                            \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoHAsync_v2, GP_APICLASS_MEMCPY)                            \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DAsync_v2, GP_APICLASS_MEMCPY)                              \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DAsync_v2, GP_APICLASS_MEMCPY)                              \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync_ptsz, GP_APICLASS_MEMCPY)                              \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2_ptsz, GP_APICLASS_MEMCPY)                       \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2_ptsz, GP_APICLASS_MEMCPY)                       \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoDAsync_v2_ptsz, GP_APICLASS_MEMCPY)                       \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoAAsync_v2_ptsz, GP_APICLASS_MEMCPY)                       \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyAtoHAsync_v2_ptsz, GP_APICLASS_MEMCPY)                       \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DAsync_v2_ptsz, GP_APICLASS_MEMCPY)                         \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DAsync_v2_ptsz, GP_APICLASS_MEMCPY)                         \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyPeerAsync_ptsz, GP_APICLASS_MEMCPY)                          \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DPeerAsync_ptsz, GP_APICLASS_MEMCPY)                        \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyBatchAsync, GP_APICLASS_MEMCPY)                              \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyBatchAsync_ptsz, GP_APICLASS_MEMCPY)                         \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DBatchAsync, GP_APICLASS_MEMCPY)                            \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DBatchAsync_ptsz, GP_APICLASS_MEMCPY)                       \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyBatchAsync_v2, GP_APICLASS_MEMCPY)                           \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyBatchAsync_v2_ptsz, GP_APICLASS_MEMCPY)                      \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DBatchAsync_v2, GP_APICLASS_MEMCPY)                         \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DBatchAsync_v2_ptsz, GP_APICLASS_MEMCPY)                    \
    /* memsets */                                                                                  \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD8, GP_APICLASS_MEMSET)                                      \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD16, GP_APICLASS_MEMSET)                                     \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD32, GP_APICLASS_MEMSET)                                     \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D8, GP_APICLASS_MEMSET)                                    \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D16, GP_APICLASS_MEMSET)                                   \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D32, GP_APICLASS_MEMSET)                                   \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async, GP_APICLASS_MEMSET)                                 \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async, GP_APICLASS_MEMSET)                                \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async, GP_APICLASS_MEMSET)                                \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D8Async, GP_APICLASS_MEMSET)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D16Async, GP_APICLASS_MEMSET)                              \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D32Async, GP_APICLASS_MEMSET)                              \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2, GP_APICLASS_MEMSET)                                   \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD16_v2, GP_APICLASS_MEMSET)                                  \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2, GP_APICLASS_MEMSET)                                  \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D8_v2, GP_APICLASS_MEMSET)                                 \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D16_v2, GP_APICLASS_MEMSET)                                \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D32_v2, GP_APICLASS_MEMSET)                                \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD8_v2_ptds, GP_APICLASS_MEMSET)                              \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD16_v2_ptds, GP_APICLASS_MEMSET)                             \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD32_v2_ptds, GP_APICLASS_MEMSET)                             \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D8_v2_ptds, GP_APICLASS_MEMSET)                            \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D16_v2_ptds, GP_APICLASS_MEMSET)                           \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D32_v2_ptds, GP_APICLASS_MEMSET)                           \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD8Async_ptsz, GP_APICLASS_MEMSET)                            \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD16Async_ptsz, GP_APICLASS_MEMSET)                           \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD32Async_ptsz, GP_APICLASS_MEMSET)                           \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D8Async_ptsz, GP_APICLASS_MEMSET)                          \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D16Async_ptsz, GP_APICLASS_MEMSET)                         \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemsetD2D32Async_ptsz, GP_APICLASS_MEMSET)                         \
    /* synchronization */                                                                          \
    X(CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize, GP_APICLASS_SYNC)                                  \
    X(CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize_v2, GP_APICLASS_SYNC)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize, GP_APICLASS_SYNC)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize_ptsz, GP_APICLASS_SYNC)                          \
    X(CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize, GP_APICLASS_SYNC)                                \
    X(CUPTI_DRIVER_TRACE_CBID_cuStreamWaitEvent, GP_APICLASS_SYNC)                                 \
    X(CUPTI_DRIVER_TRACE_CBID_cuStreamWaitEvent_ptsz, GP_APICLASS_SYNC)                            \
    /* allocation */                                                                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemAlloc, GP_APICLASS_ALLOC)                                       \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, GP_APICLASS_ALLOC)                                    \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch, GP_APICLASS_ALLOC)                                  \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2, GP_APICLASS_ALLOC)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost, GP_APICLASS_ALLOC)                                   \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2, GP_APICLASS_ALLOC)                                \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged, GP_APICLASS_ALLOC)                                \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync, GP_APICLASS_ALLOC)                                  \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz, GP_APICLASS_ALLOC)                             \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync, GP_APICLASS_ALLOC)                          \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz, GP_APICLASS_ALLOC)                     \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemCreate, GP_APICLASS_ALLOC)                                      \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemFree, GP_APICLASS_FREE)                                         \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2, GP_APICLASS_FREE)                                      \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost, GP_APICLASS_FREE)                                     \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync, GP_APICLASS_FREE)                                    \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz, GP_APICLASS_FREE)                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemRelease, GP_APICLASS_FREE)

/* Classified for the sync findings but not traced: a polling loop of queries
 * would flood the buffers, and a query never blocks. */
#define GP_CUPTI_RUNTIME_CLASS_ONLY(X)                                                             \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaStreamQuery_v3020, GP_APICLASS_SYNC)                            \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaStreamQuery_ptsz_v7000, GP_APICLASS_SYNC)                       \
    X(CUPTI_RUNTIME_TRACE_CBID_cudaEventQuery_v3020, GP_APICLASS_SYNC)

#define GP_CUPTI_DRIVER_CLASS_ONLY(X)                                                              \
    X(CUPTI_DRIVER_TRACE_CBID_cuStreamQuery, GP_APICLASS_SYNC)                                     \
    X(CUPTI_DRIVER_TRACE_CBID_cuStreamQuery_ptsz, GP_APICLASS_SYNC)                                \
    X(CUPTI_DRIVER_TRACE_CBID_cuEventQuery, GP_APICLASS_SYNC)

#endif /* GPUPROF_CUDA_CUPTI_INTERNAL_H */
