/* Aggregation: one window's events and GPU records -> tables.
 *
 * Pure C (no Python API): it runs with the GIL held but could run without.
 * Inputs are the thread buffers (buffer.h), the op kinds and flags (copied
 * from the intern table) and the GPU records (gp_cuda.h). Outputs are plain
 * row arrays that arrays.c turns into NumPy structured arrays.
 */
#ifndef GPUPROF_CSRC_AGGREGATE_H
#define GPUPROF_CSRC_AGGREGATE_H

#include <stddef.h>
#include <stdint.h>

#include "gp_cuda.h"
#include "buffer.h"
#include "common.h"

/* Kernel-table categories (the `category` column). */
enum {
    GP_CAT_COMPUTE = 0,
    GP_CAT_MEMCPY = 1,
    GP_CAT_MEMSET = 2,
    GP_CAT_COMMUNICATION = 3,
    GP_CAT_SYNC = 4,
};

/* GpGpuEventRow.flags */
enum {
    GP_GF_ATTRIBUTED = 1,      /* joined to a launch on a Python thread */
    GP_GF_BLOCKED_THREAD = 2,  /* launched off-Python; charged to the thread blocked on it */
    GP_GF_ROLLED_UP = 4,       /* launched by Python on another thread for a blocked call:
                                * also in that call's CUDA totals */
};

/* GpSpanRow.flags */
enum {
    GP_SF_ENTERED = 1, /* entered before the window (snapshot frame) */
};

/* One row per op (Python function, C function, label, step, CUDA API). */
typedef struct GpOpRow {
    uint32_t op;           /* intern op id; api key for GP_OP_CUDA_API */
    uint8_t kind;          /* GP_OP_* */
    uint8_t flags;         /* GP_OPF_*; for GP_OP_CUDA_API the GP_APICLASS_* */
    uint8_t pad[2];
    int64_t calls;
    int64_t cpu_total_ns;  /* outermost calls only (recursion counted once) */
    int64_t cpu_self_ns;
    int64_t cpu_min_ns;
    int64_t cpu_max_ns;
    int64_t cuda_total_ns; /* GPU time of work launched under this op (incl. descendants) */
    int64_t cuda_self_ns;  /* GPU time of work launched while this op was innermost */
    int64_t kernels;       /* GPU activities launched while innermost */
    int64_t cuda_mem_self_bytes;  /* device bytes allocated minus freed while innermost */
    int64_t cuda_mem_total_bytes; /* the same under this op (each outermost call once) */
    int64_t cpu_mem_self_bytes;
} GpOpRow;

/* Call tree: one row per (thread, path of ops). */
typedef struct GpNodeRow {
    int32_t id;
    int32_t parent; /* -1 for a thread's root frames */
    uint32_t op_row;
    uint32_t thread;
    int64_t calls;
    int64_t total_ns;
    int64_t self_ns;
    int64_t cuda_total_ns;
    int64_t cuda_self_ns;
    int64_t cuda_mem_self_bytes;  /* device bytes allocated minus freed while innermost */
    int64_t cuda_mem_total_bytes; /* the same in this node and below it */
} GpNodeRow;

/* One row per GPU activity name and device. */
typedef struct GpKernelRow {
    uint32_t name;   /* index into the tables' string pool */
    int32_t device;
    int64_t calls;
    int64_t total_ns;
    int64_t min_ns;
    int64_t max_ns;
    int64_t bytes;   /* memcpy/memset */
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t registers;
    uint32_t shared_mem;
    uint8_t category; /* GP_CAT_* */
    uint8_t pad[7];
} GpKernelRow;

/* One row per GPU activity (kernel, copy, set, sync, alloc, free). */
typedef struct GpGpuEventRow {
    int64_t start_ns;
    int64_t end_ns;
    int64_t bytes;
    int64_t address;
    uint32_t correlation;
    uint32_t kernel_row; /* row of the kernels table (UINT32_MAX for alloc/free) */
    int32_t op_row;      /* op that launched it, -1 when unknown */
    int32_t node;        /* call-tree node, -1 when unknown */
    int32_t thread;      /* launching thread's index, -1 when unknown */
    uint32_t stream;
    int32_t device;
    uint32_t graph_id;
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t registers;
    uint32_t shared_mem;
    uint32_t wait_stream;
    uint8_t kind;        /* GP_GPU_* */
    uint8_t subkind;
    uint8_t src_mem;
    uint8_t dst_mem;
    uint8_t flags;       /* GP_GF_* */
    uint8_t pad[3];
} GpGpuEventRow;

/* One row per recorded step. */
typedef struct GpStepRow {
    int64_t step;
    int64_t start_ns;
    int64_t end_ns;
    int64_t cpu_ns;
    int64_t gpu_busy_ns;
    int64_t gpu_idle_ns;
    int64_t comm_ns;
    int64_t memcpy_ns;
    int64_t sync_wait_ns;
    int64_t kernels;
    uint32_t thread;
    uint32_t pad;
} GpStepRow;

/* Spans: every call, range and API call of the window, for traces. */
typedef struct GpSpanRow {
    int64_t start_ns;
    int64_t end_ns;
    uint32_t op_row;
    int32_t parent; /* enclosing span index, -1 at a thread's root */
    uint32_t thread;
    uint32_t correlation; /* CUDA API spans */
    int32_t node;
    uint32_t site;  /* call site: caller's f_lasti + 1 (0 unknown; hook.c says which calls) */
    int32_t line;   /* the call site's line in the caller, filled when results are built */
    uint16_t depth;
    uint8_t kind;   /* GP_OP_* of its op */
    uint8_t flags;  /* GP_SF_* */
    /* The sequence number of PyTorch's range (the autograd node's, or the op's
     * under emit_nvtx) mod 2^31, from the range's message (csrc/record/nvtx.c); -1
     * for every other span. */
    int32_t seq;
    /* The torch.nn.Module instance a call of Module.__call__ ran on, + 1 (0 for
     * every other span): an index into the session's instances (hook.c). */
    uint32_t module;
} GpSpanRow;

/* The autograd nodes a forward call made (hook.c, "autograd sequence
 * numbers"): those numbered [lo, hi) on `thread`, made while `node` (and its
 * span) was the innermost open Python or C call there; -1 when none was. */
typedef struct GpSeqRow {
    int64_t ts;    /* when the hook saw the counter moved */
    int32_t lo;
    int32_t hi;
    int32_t node;
    int32_t span;  /* -1 when spans are not built */
    uint32_t thread;
    uint32_t pad;
} GpSeqRow;

/* One row per thread that recorded in the window. */
typedef struct GpThreadRow {
    uint64_t ident;
    uint64_t os_tid;
    int64_t events;
    int64_t dropped;
    int64_t first_ns;
    int64_t last_ns;
    int64_t self_sum_ns; /* sum of self time charged on this thread */
    int64_t busy_ns;     /* time with a non-empty stack */
} GpThreadRow;

#define GP_VEC(type)                                                                               \
    struct {                                                                                       \
        type *v;                                                                                   \
        size_t n, cap;                                                                             \
    }

typedef struct GpTables {
    GP_VEC(GpOpRow) ops;
    GP_VEC(GpNodeRow) nodes;
    GP_VEC(GpKernelRow) kernels;
    GP_VEC(GpGpuEventRow) gpu;
    GP_VEC(GpStepRow) steps;
    GP_VEC(GpSpanRow) spans;
    GP_VEC(GpThreadRow) threads;
    GP_VEC(GpSeqRow) seqs;
    GP_VEC(char *) strings; /* kernel-table names, owned */
    int64_t window_start_ns;
    int64_t window_end_ns;
    int64_t dropped_events;     /* CPU events dropped in the window */
    int64_t dropped_gpu;        /* GPU records lost (CUPTI + ours) */
    int64_t unattributed_gpu_ns;/* GPU time with no launching op */
    int64_t attributed_gpu_ns;
    int has_spans;              /* spans were built (GpAggInput.want_spans or GPU records) */
    /* Input shapes reuse (shapes.c): steps whose ATen ops carried their input sizes,
     * steps given the sizes of such a step they matched, and steps without sizes
     * that matched none (their ATen rows have no shapes). */
    int64_t shapes_sampled_steps;
    int64_t shapes_reused_steps;
    int64_t shapes_unmatched_steps;
} GpTables;

/* One window's inputs. */
typedef struct GpAggInput {
    const GpWindowThread *threads; /* the window's events per thread (buffer.h) */
    uint32_t n_threads;
    const GpClockAnchor *anchors;  /* raw -> ns of the events; NULL: ts are already ns */
    size_t n_anchors;
    const uint8_t *op_kinds; /* indexed by op id */
    const uint8_t *op_flags;
    uint32_t n_ops;
    GpGpuRecord *gpu;        /* borrowed; sorted in place by start time */
    size_t n_gpu;
    uint64_t window_start_ns;
    uint64_t window_end_ns;
    uint64_t step_thread_ident; /* thread that calls step(): blocked-thread attribution */
    /* Step number + 1 of the step that stop() ended (0 = none): step() never
     * closed it, so it is no step: no ProfilerStep entry, no steps() row. */
    int64_t unclosed_step;
    const char *(*kernel_name)(uint32_t name_id); /* gp_cuda_string or a test's */
    int want_spans;          /* build the span table too (always with GPU records) */
    int general_only;        /* tests: every event through the general replay path */
    int nvtx_cross_thread_ends; /* some NVTX range ended on another thread than it began */
    /* Input shapes reuse (shapes.c): into *key the hash of an NVTX name id's name
     * without its input sizes; 1 when it had sizes, 0 when not, -1 unknown id
     * (gp_nvtx_base_key). NULL: no name carried sizes, nothing to reuse. The
     * events of the steps given sizes are rewritten in place (in->threads). */
    int (*nvtx_base)(uint32_t id, uint64_t *key);
} GpAggInput;

/* Build the tables of one window from its events (in->threads) and GPU
 * records. The spans, the largest table (one row per call), are built only
 * when asked for or when GPU records need them; the other tables do not
 * depend on them, and a second run over the same events with want_spans
 * gives the same op rows and nodes. *out must be zeroed or freed. GP_OK or
 * GP_ERR_NOMEM (out is then freed). */
GpStatus gp_aggregate_run(const GpAggInput *in, GpTables *out);

/* Release every array of *t and zero it. */
void gp_aggregate_free(GpTables *t);

#endif /* GPUPROF_CSRC_AGGREGATE_H */
