/* What the files of the trace writer share (csrc/trace/trace_json.c: inputs,
 * metadata and the whole file; trace_host.c: host events; trace_gpu.c: GPU
 * events, flows and the GPU projections of user annotations). Internal. */
#ifndef GPUPROF_CSRC_TRACE_INTERNAL_H
#define GPUPROF_CSRC_TRACE_INTERNAL_H

#include "trace_out.h"

#include "aggregate.h"

#include <stddef.h>
#include <stdint.h>

#define SYNC_LANE_OFFSET 1000000    /* trace-format 5: Stream Sync rows */
#define DEVICE_SORT_OFFSET 5000000  /* trace-format 5: device process_sort_index */

/* Everything the pure-C part needs. */
typedef struct Ctx {
    const GpSpanRow *spans;
    size_t n_spans;
    const GpGpuEventRow *gpu;
    size_t n_gpu;
    const GpOpRow *ops;
    size_t n_ops;
    const GpStepRow *steps;
    size_t n_steps;
    const GpThreadRow *threads;
    size_t n_threads;
    int64_t base;       /* profiler-clock ns of ts == 0 (window start, or meta base_ns) */
    int64_t window_end;
    int64_t pid;
    int64_t sort_index; /* process_sort_index of the host lane (meta, default pid) */
    uint32_t id_base;   /* added to Python ids, External ids and Ev Idx (meta id_base) */
    int part;           /* PART_*: which pieces of the file this call writes */
    Str header, trace_name, process_name;
    Str *names;         /* per op row */
    size_t n_names;
    Str *files;         /* per op row */
    size_t n_files;
    Str *kernel_names;  /* per kernels row */
    size_t n_kernel_names;
    Str *thread_names;  /* per threads row */
    size_t n_thread_names;
    int64_t *sm_counts, *warp_sizes;
    size_t n_sm_counts, n_warp_sizes;
    /* fwdbwd flows (meta.fwdbwd): per flow, the forward call's thread row and
     * start, then the autograd node's; ns on the profiler clock */
    const int64_t *fwdbwd;
    size_t n_fwdbwd;
    Str *module_names;  /* per module instance (meta.module_names): module call slices */
    size_t n_module_names;
} Ctx;

/* One slice in lane order: lane, start ascending, then longest first. */
typedef struct Key {
    int64_t start; /* relative ns, >= 0 */
    int64_t end;   /* relative ns, >= start; clamped into the enclosing slice */
    uint64_t lane;
    uint32_t idx;
    uint32_t api;  /* GPU slice: 1 + the API span that launched it, 0 none */
} Key;

/* An open slice during the host sweep. */
typedef struct Frame {
    int64_t end;
    uint32_t span;   /* its span row */
    uint32_t py_id;  /* Python id of the innermost python_function at or above, 0 none */
    int32_t py_span; /* innermost Python-function span (CallFrom), -1 none */
    uint32_t ext;    /* External id of the innermost user_annotation, 0 none */
    uint32_t ann;    /* its number in the Anns list, 0 none */
} Frame;

/* The record_function ranges in host sweep order, so that a range comes
 * after the range enclosing it: the GPU side projects each one, with the
 * ranges around it, onto the streams its launches ran on (trace-format 6.7).
 * ProfilerStep#N is not projected: torch.profiler draws steps on the host
 * only, and readers that take every ProfilerStep#N slice for a step (the
 * TensorBoard plugin) would count each step once per stream. Owned by
 * write_all. */
typedef struct Ann {
    uint32_t span;   /* span row */
    uint32_t parent; /* number (index + 1) of the enclosing range, 0 none */
} Ann;

typedef struct Anns {
    Ann *v; /* capacity n_spans */
    uint32_t n;
} Anns;

/* What the GPU side needs of each CUDA API span: the innermost projected
 * range around it, and the External id it carries (its innermost
 * user_annotation, steps included), which its GPU work carries too. */
typedef struct ApiUp {
    uint32_t ann; /* number of the range in Anns, 0 none */
    uint32_t ext; /* External id, 0 none */
} ApiUp;

/* Per device: the id that stands in for stream 0 (an unused positive id). */
typedef struct DevLane {
    int32_t device;
    uint32_t zero_sub;
    int64_t allocated; /* running device-memory total */
} DevLane;

typedef struct Devices {
    DevLane *v;
    size_t n;
} Devices;

static inline DevLane *
dev_find(const Devices *d, int32_t device)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->v[i].device == device)
            return &d->v[i];
    return NULL;
}

static inline int32_t
dev_pid(int32_t device)
{
    return device < 0 ? 0 : device;
}

static inline int
is_slice_kind(uint8_t kind)
{
    return kind >= GP_GPU_KERNEL && kind <= GP_GPU_SYNC;
}

/* Lane id (tid) of a GPU slice. */
static inline int64_t
gpu_tid(const GpGpuEventRow *g, const DevLane *d)
{
    int64_t stream = g->stream ? (int64_t)g->stream : (int64_t)d->zero_sub;
    return g->kind == GP_GPU_SYNC ? stream + SYNC_LANE_OFFSET : stream;
}

/* ---- shared helpers ---------------------------------------------------- */

static inline int64_t
rel(const Ctx *c, int64_t t)
{
    int64_t r = t - c->base;
    return r < 0 ? 0 : r;
}

static inline int64_t
thread_tid(const Ctx *c, uint32_t thread)
{
    if (thread >= c->n_threads)
        return 0;
    const GpThreadRow *t = &c->threads[thread];
    if (t->os_tid != 0 && t->os_tid <= (uint64_t)INT64_MAX)
        return (int64_t)t->os_tid;
    return (int64_t)(t->ident & 0x7fffffffu);
}

static const Str unknown_name = {"<unknown>", 9};

static inline const Str *
name_of(const Ctx *c, uint32_t op_row)
{
    return op_row < c->n_names ? &c->names[op_row] : &unknown_name;
}

static inline void
begin_event(Out *o)
{
    if (o->first) {
        PUT(o, "\n");
        o->first = 0;
    } else {
        PUT(o, ",\n");
    }
    o->events++;
}

/* "pid": P, "tid": T, "ts": S */
static inline void
put_lane_ts(Out *o, int64_t pid, int64_t tid, int64_t ts)
{
    PUT(o, ",\"pid\":");
    put_i64(o, pid);
    PUT(o, ",\"tid\":");
    put_i64(o, tid);
    PUT(o, ",\"ts\":");
    put_us(o, ts);
}

static inline void
put_slice_head(Out *o, const char *cat, size_t cat_len, const Str *name, int64_t pid, int64_t tid,
               int64_t ts, int64_t dur)
{
    begin_event(o);
    PUT(o, "{\"ph\":\"X\",\"cat\":\"");
    out_bytes(o, cat, cat_len);
    PUT(o, "\",\"name\":");
    put_str(o, name);
    put_lane_ts(o, pid, tid, ts);
    PUT(o, ",\"dur\":");
    put_us(o, dur);
}

#define CAT(s) (s), sizeof(s) - 1

static inline int
cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a > b) - (a < b);
}

/* ---- trace_host.c ------------------------------------------------------ */

/* Sort keys into lane order (a no-op when they already are). */
void gp_trace_sort_keys(Key *k, size_t n);

/* One step of a host sweep: see trace_host.c. Returns the depth under key, or
 * -1 when the stack cannot grow. */
ptrdiff_t gp_trace_open_slice(Frame **stack, size_t *cap, size_t depth, Key *key);

/* The spans as keys in lane order (malloc'ed; NULL when out of memory). */
Key *gp_trace_span_keys(const Ctx *c);

/* Write every span. Fills anns, and api_up for each API span. 0, or -1 when
 * out of memory. */
int gp_trace_host_write(const Ctx *c, Out *o, ApiUp *api_up, Anns *anns);

/* ---- trace_gpu.c ------------------------------------------------------- */

/* Find the devices and their stream-0 substitutes. 0, or -1 when out of memory. */
int gp_trace_gpu_devices(const Ctx *c, Devices *d);

/* Write every GPU record, its flows and the projected annotations. */
int gp_trace_gpu_write(const Ctx *c, Out *o, Devices *devs, const ApiUp *api_up, const Anns *anns,
                       int64_t *max_end);

/* Write the fwdbwd flows: from each forward call to the autograd node it made. */
void gp_trace_fwdbwd_write(const Ctx *c, Out *o);

#endif /* GPUPROF_CSRC_TRACE_INTERNAL_H */
