/* The CUDA side of gpuprof as the C core sees it: no CUPTI types here.
 *
 * Implemented by cuda/cupti_*.c when CUPTI headers were found at build time
 * (GPUPROF_HAVE_CUPTI=1), else by cuda/cuda_stub.c, whose functions report
 * "built without CUPTI headers". libcupti is never linked: it is dlopen'ed
 * by gp_cuda_load and every entry point comes from cupti_symbols.h.
 *
 * Threads: gp_cuda_load/session/window functions are called on the
 * interpreter thread (GIL held, except the blocking ones noted below, which
 * the caller calls with the GIL released). CUPTI calls back on threads we do
 * not own; those paths never touch Python and hand data over under
 * cuda_lock (private to cuda/).
 */
#ifndef GPUPROF_CUDA_GP_CUDA_H
#define GPUPROF_CUDA_GP_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "nvtx.h" /* NVTX in and out: csrc/record/nvtx.c, in every build */

/* GpGpuRecord.kind */
enum {
    GP_GPU_KERNEL = 1,
    GP_GPU_MEMCPY = 2,
    GP_GPU_MEMSET = 3,
    GP_GPU_SYNC = 4,
    GP_GPU_MALLOC = 5, /* device memory allocated (cudaMalloc, pools, cuMem*) */
    GP_GPU_FREE = 6,   /* device memory released */
    GP_GPU_API = 7,    /* a runtime/driver API call seen as an activity record
                          (activity-only fallback mode) */
};

/* GpGpuRecord.subkind for GP_GPU_MEMCPY: the direction (trace-format 6.6). */
enum {
    GP_COPY_UNKNOWN = 0,
    GP_COPY_HTOD,
    GP_COPY_DTOH,
    GP_COPY_HTOA,
    GP_COPY_ATOH,
    GP_COPY_ATOA,
    GP_COPY_ATOD,
    GP_COPY_DTOA,
    GP_COPY_DTOD,
    GP_COPY_HTOH,
    GP_COPY_PTOP,
};

/* src_mem / dst_mem: memory kinds (trace-format 6.6 names, in this order). */
enum {
    GP_MEM_UNKNOWN = 0,
    GP_MEM_PAGEABLE,
    GP_MEM_PINNED,
    GP_MEM_DEVICE,
    GP_MEM_ARRAY,
    GP_MEM_MANAGED,
    GP_MEM_DEVICE_STATIC,
    GP_MEM_MANAGED_STATIC,
};

/* GpGpuRecord.subkind for GP_GPU_SYNC (trace-format 6.8 names). */
enum {
    GP_SYNC_UNKNOWN = 0,
    GP_SYNC_EVENT,
    GP_SYNC_STREAM_WAIT_EVENT,
    GP_SYNC_STREAM,
    GP_SYNC_CONTEXT,
};

/* API domains in GP_API_KEY (csrc/record/buffer.h). */
enum { GP_API_RUNTIME = 1, GP_API_DRIVER = 2 };

/* One GPU activity on the profiler clock (csrc/record/clock.h). Plain data. */
typedef struct GpGpuRecord {
    uint64_t start_ns;      /* profiler clock */
    uint64_t end_ns;        /* profiler clock; == start_ns for instants (malloc/free) */
    uint64_t bytes;         /* memcpy/memset/malloc/free */
    uint64_t address;       /* malloc/free: device address */
    uint64_t graph_node_id; /* kernels replayed from a CUDA graph, else 0 */
    uint32_t correlation;   /* CUPTI correlation id; 0 when none */
    uint32_t name_id;       /* GP_GPU_KERNEL: gp_cuda_string id; GP_GPU_API: api key */
    uint32_t stream;        /* CUPTI stream id; 0 unknown */
    uint32_t context;       /* CUPTI context id */
    uint32_t graph_id;      /* CUDA graph id, else 0 */
    uint32_t thread_id;     /* GP_GPU_API: the calling thread as CUPTI reports it */
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t registers;     /* per thread */
    uint32_t static_smem;   /* bytes per block */
    uint32_t dynamic_smem;  /* bytes per block */
    uint32_t wait_stream; /* GP_SYNC_STREAM_WAIT_EVENT: stream that recorded the event, else 0 */
    int16_t device; /* CUDA device index; -1 unknown */
    int16_t src_device; /* peer copies, else -1 */
    int16_t dst_device; /* peer copies, else -1 */
    uint8_t kind; /* GP_GPU_* */
    uint8_t subkind; /* GP_COPY_* / GP_SYNC_* / api domain for GP_GPU_API */
    uint8_t src_mem; /* GP_MEM_* (memcpy) */
    uint8_t dst_mem; /* GP_MEM_* (memcpy, memset, malloc/free) */
    uint8_t pad[6];
} GpGpuRecord;

/* Static properties of one device, for the trace's deviceProperties and
 * occupancy. Filled through the CUDA driver API (dlopen'ed libcuda). */
typedef struct GpDeviceProps {
    int id;
    char name[96];
    uint64_t total_global_mem;
    int compute_major, compute_minor;
    int max_threads_per_block, max_threads_per_sm;
    int regs_per_block, regs_per_sm;
    int warp_size;
    int shared_mem_per_block, shared_mem_per_block_optin, shared_mem_per_sm;
    int max_blocks_per_sm;
    int num_sms;
} GpDeviceProps;

/* 1 when built with CUPTI headers, else 0. */
int gp_cuda_compiled(void);

/* Open libcupti at `path` (a file name or soname for dlopen) and resolve every
 * entry point of cupti_symbols.h. Idempotent once it succeeded; never unloads.
 * On failure returns GP_ERR_CUDA_UNAVAIL and gp_cuda_reason() says why (the
 * path, dlerror(), or the missing symbol, or a runtime older than the headers). */
GpStatus gp_cuda_load(const char *path);

/* 1 once gp_cuda_load succeeded. */
int gp_cuda_loaded(void);

/* Why CUDA capture is off or degraded; "" when all is well. Static storage. */
const char *gp_cuda_reason(void);

/* The capture mode: "off", "callbacks" (callbacks + activity, the normal one)
 * or "activity-only" (another CUPTI subscriber holds the callback API; API
 * calls come as GP_GPU_API records and are joined to threads by time). */
const char *gp_cuda_mode(void);

/* The CUPTI parts a session switches on (the open session's, else the next
 * one's), comma-separated: rtcb, drvcb (API callbacks), kernels, serial,
 * memcpy, memset, sync, events (activity records). "" without CUPTI.
 * Static storage, interpreter thread. */
const char *gp_cuda_parts(void);

/* CUPTI's version (cuptiGetVersion) once loaded, else 0. */
uint32_t gp_cuda_version(void);

/* Session options. GP_CUDA_SYNC_RECORDS: CUPTI's SYNCHRONIZATION and
 * CUDA_EVENT records (every sync's CUPTI kind and, for stream-wait-event,
 * the stream that recorded the event) instead of sync records made from the
 * API callbacks; they cost ~1.5 us on every launch. */
enum { GP_CUDA_SYNC_RECORDS = 1 };

/* Start a session: subscribe to callbacks (falling back to activity-only
 * when another subscriber exists), register the buffer and timestamp
 * callbacks. Nothing is enabled yet. */
GpStatus gp_cuda_session_begin(unsigned options);

/* Enable the callbacks and activity kinds for a window (WARMUP or ACTIVE).
 * `memory` also enables device-memory records. */
GpStatus gp_cuda_window_begin(int memory);

/* Disable callbacks and activity kinds, wait for the device's outstanding
 * work (cuCtxSynchronize on every context we saw), and flush CUPTI's buffers
 * so that every record of the window has been delivered. Blocking: call with
 * the GIL released. */
GpStatus gp_cuda_window_end(void);

/* End the session: disable everything, unsubscribe and, where CUPTI allows,
 * detach (cuptiFinalize) so that no cost lingers after profiling. Blocking:
 * call with the GIL released. */
GpStatus gp_cuda_session_end(void);

/* Take the records delivered so far: returns a malloc'ed array (caller
 * frees) and sets *n; NULL with *n == 0 when none. */
GpGpuRecord *gp_cuda_take_records(size_t *n);

/* Kernel name for a GpGpuRecord.name_id, as CUPTI reported it (mangled);
 * NULL for an unknown id. Valid until the next gp_cuda_clear_strings. */
const char *gp_cuda_string(uint32_t id);

/* Forget kernel names (at the end of a profiling session, after every table
 * that needed them has been built). */
void gp_cuda_clear_strings(void);

/* CUPTI records lost: CUPTI's own dropped count plus records we could not
 * store. Cumulative for the session. */
uint64_t gp_cuda_dropped(void);

/* What decoding CUPTI's buffers has cost since the extension was loaded,
 * for the benchmarks (cumulative; any thread). */
typedef struct GpCudaStats {
    uint64_t decode_ns; /* inside the buffer-completed callback, decoding */
    uint64_t decoded_records; /* CUPTI records walked */
    uint64_t completed_buffers; /* buffers CUPTI handed back */
} GpCudaStats;
void gp_cuda_stats(GpCudaStats *out);

/* Name of a CUDA API for an api key (GP_API_KEY), e.g. "cudaLaunchKernel";
 * static storage; "cuda_api" when unknown. */
const char *gp_cuda_api_name(uint32_t api_key);

/* What an API call does, for attribution and the sync/launch findings. */
enum {
    GP_APICLASS_OTHER = 0,
    GP_APICLASS_LAUNCH, /* kernel launches (runtime, driver, cooperative, Ex) */
    GP_APICLASS_GRAPH, /* graph launches */
    GP_APICLASS_MEMCPY, /* asynchronous copies */
    GP_APICLASS_MEMCPY_SYNC, /* copies that block the host (cudaMemcpy, cuMemcpyDtoH, ...) */
    GP_APICLASS_MEMSET,
    GP_APICLASS_SYNC, /* stream/device/context/event synchronize, event query loops */
    GP_APICLASS_ALLOC, /* cudaMalloc*, cuMemAlloc*, cuMemCreate, pools */
    GP_APICLASS_FREE, /* cudaFree*, cuMemFree*, cuMemRelease */
};
int gp_cuda_api_class(uint32_t api_key);

/* In a child process right after fork(): forget the parent's session
 * without calling CUPTI or CUDA (neither works in a forked child). */
void gp_cuda_after_fork_child(void);

/* Number of CUDA devices (0 when the driver is absent) and their properties. */
int gp_cuda_device_count(void);
GpStatus gp_cuda_device_props(int device, GpDeviceProps *out);

/* capture="cudaProfilerApi": switch the cudaProfilerStart/Stop (and
 * cuProfilerStart/Stop) callbacks on or off for the open CUDA session; they
 * call gp_nvtx_capture_notify. GP_ERR_CUDA_UNAVAIL (reason set) without a
 * session or in activity-only mode. Interpreter thread. */
GpStatus gp_cuda_capture_profiler_api(int on);

#endif /* GPUPROF_CUDA_GP_CUDA_H */
