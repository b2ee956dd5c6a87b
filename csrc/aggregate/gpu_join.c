/* GPU records joined to the launches that made them: activity names and
 * categories, kernel and GPU event rows, GPU time charged to the launching op
 * and its ancestors, and the step rows' GPU figures (aggregate_internal.h). */
#include "aggregate_internal.h"

#include "demangle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- GPU side ------------------------------------------------------------ */

static const char *copy_kind_names[] = {
    "Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP",
};
static const char *mem_kind_names[] = {
    "Unknown", "Pageable", "Pinned",        "Device",
    "Array",   "Managed",  "Device Static", "Managed Static",
};
static const char *sync_kind_names[] = {
    "Unknown Sync", "Event Sync", "Stream Wait Event", "Stream Sync", "Context Sync",
};

#define NAME_OF(table, i) ((size_t)(i) < GP_ARRAY_LEN(table) ? table[i] : table[0])

static char *
activity_name(const GpAggInput *in, const GpGpuRecord *g)
{
    char buf[128];
    switch (g->kind) {
    case GP_GPU_KERNEL:
        return gp_demangle(in->kernel_name ? in->kernel_name(g->name_id) : NULL);
    case GP_GPU_MEMCPY:
        snprintf(buf, sizeof(buf), "Memcpy %s (%s -> %s)", NAME_OF(copy_kind_names, g->subkind),
                 NAME_OF(mem_kind_names, g->src_mem), NAME_OF(mem_kind_names, g->dst_mem));
        return strdup(buf);
    case GP_GPU_MEMSET:
        snprintf(buf, sizeof(buf), "Memset (%s)", NAME_OF(mem_kind_names, g->dst_mem));
        return strdup(buf);
    case GP_GPU_SYNC:
        return strdup(NAME_OF(sync_kind_names, g->subkind));
    default:
        return strdup("<gpu activity>");
    }
}

static uint8_t
category_of(const GpGpuRecord *g, const char *name)
{
    switch (g->kind) {
    case GP_GPU_MEMCPY:
        return GP_CAT_MEMCPY;
    case GP_GPU_MEMSET:
        return GP_CAT_MEMSET;
    case GP_GPU_SYNC:
        return GP_CAT_SYNC;
    default:
        return strncmp(name, "nccl", 4) == 0 ? GP_CAT_COMMUNICATION : GP_CAT_COMPUTE;
    }
}

static uint64_t
activity_key(const GpGpuRecord *g)
{
    uint64_t dev = (uint64_t)(uint16_t)g->device;
    uint64_t detail;
    switch (g->kind) {
    case GP_GPU_KERNEL:
        detail = g->name_id;
        break;
    case GP_GPU_MEMCPY:
        detail = (uint64_t)g->subkind << 16 | (uint64_t)g->src_mem << 8 | g->dst_mem;
        break;
    case GP_GPU_MEMSET:
        detail = g->dst_mem;
        break;
    default:
        detail = g->subkind;
        break;
    }
    return (uint64_t)g->kind << 56 | dev << 40 | (detail & 0xffffffffffull);
}

/* Find the innermost span of `thread` open at ts (spans [lo, hi) are that
 * thread's, sorted by start). -1 when none. */
static int64_t
open_span_at(const GpTables *t, size_t lo, size_t hi, int64_t ts)
{
    if (lo >= hi)
        return -1;
    /* last span with start <= ts */
    size_t l = lo, h = hi;
    while (l < h) {
        size_t m = l + (h - l) / 2;
        if (t->spans.v[m].start_ns <= ts)
            l = m + 1;
        else
            h = m;
    }
    if (l == lo)
        return -1;
    /* The innermost span containing ts is the latest-started one or one of
     * its ancestors (spans nest). */
    int64_t s = (int64_t)l - 1;
    while (s >= 0) {
        const GpSpanRow *sp = &t->spans.v[s];
        if (sp->end_ns >= ts && sp->kind != GP_OP_CUDA_API)
            return s;
        s = sp->parent;
    }
    return -1;
}

/* What charge_up adds up the tree. */
typedef enum Charge { CHARGE_GPU_NS, CHARGE_DEVICE_BYTES } Charge;

/* Add `v` (GPU time, or device bytes allocated minus freed) to the totals of node
 * and all its ancestors, and of each distinct op row on that path (stamp prevents
 * double counting under recursion). */
static void
charge_up(GpTables *t, int32_t node, Charge what, int64_t v, uint32_t *stamp, uint32_t mark)
{
    for (int32_t n = node; n >= 0; n = t->nodes.v[n].parent) {
        GpNodeRow *nr = &t->nodes.v[n];
        GpOpRow *op = &t->ops.v[nr->op_row];
        int first = stamp[nr->op_row] != mark;
        stamp[nr->op_row] = mark;
        if (what == CHARGE_GPU_NS) {
            nr->cuda_total_ns += v;
            op->cuda_total_ns += first ? v : 0;
        } else {
            nr->cuda_mem_total_bytes += v;
            op->cuda_mem_total_bytes += first ? v : 0;
        }
    }
}

/* The node that a launch from another thread's Python code rolls up under, or
 * -1: the innermost span open on the stepping thread when the launch began,
 * if the launching thread's outermost open span began inside it. That is how
 * work done on behalf of a blocked call looks: autograd's device threads
 * enter Python (a custom autograd.Function's backward, Inductor's compiled
 * backward) while the stepping thread waits in loss.backward(). A thread that
 * was already running Python when the call began (a data loader's) is not
 * working for it. */
static int32_t
blocked_call_node(const GpTables *t, const size_t *span_lo, const size_t *span_hi,
                  uint32_t step_thread, const Launch *l)
{
    if (step_thread == UINT32_MAX || l->thread == step_thread)
        return -1;
    int64_t own = open_span_at(t, span_lo[l->thread], span_hi[l->thread], l->enter_ns);
    int64_t blocked = open_span_at(t, span_lo[step_thread], span_hi[step_thread], l->enter_ns);
    if (own < 0 || blocked < 0)
        return -1;
    while (t->spans.v[own].parent >= 0)
        own = t->spans.v[own].parent;
    if (t->spans.v[own].start_ns < t->spans.v[blocked].start_ns)
        return -1;
    return t->spans.v[blocked].node;
}

typedef struct Interval {
    int64_t s, e;
} Interval;

static int
cmp_interval(const void *x, const void *y)
{
    const Interval *a = x, *b = y;
    return (a->s > b->s) - (a->s < b->s);
}

/* Sort and merge intervals in place; returns the merged count. */
static size_t
merge_intervals(Interval *v, size_t n)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof(Interval), cmp_interval);
    size_t k = 0;
    for (size_t i = 1; i < n; i++) {
        if (v[i].s <= v[k].e) {
            if (v[i].e > v[k].e)
                v[k].e = v[i].e;
        } else {
            v[++k] = v[i];
        }
    }
    return k + 1;
}

/* Overlap of merged intervals v[0..n) with [s, e). */
static int64_t
overlap(const Interval *v, size_t n, int64_t s, int64_t e)
{
    size_t l = 0, h = n;
    while (l < h) { /* first interval ending after s */
        size_t m = l + (h - l) / 2;
        if (v[m].e <= s)
            l = m + 1;
        else
            h = m;
    }
    int64_t total = 0;
    for (size_t i = l; i < n && v[i].s < e; i++) {
        int64_t a = v[i].s > s ? v[i].s : s;
        int64_t b = v[i].e < e ? v[i].e : e;
        if (b > a)
            total += b - a;
    }
    return total;
}

int
gp_gpu_join_build(Agg *a, size_t *span_lo, size_t *span_hi, uint32_t step_thread)
{
    const GpAggInput *in = a->in;
    GpTables *t = a->t;
    GpU64Map kmap;
    if (gp_u64map_init(&kmap, 256) < 0)
        return -1;
    uint32_t *stamp = calloc(t->ops.n + 1, sizeof(uint32_t));
    if (stamp == NULL) {
        gp_u64map_free(&kmap);
        return -1;
    }
    int rc = -1;
    for (size_t i = 0; i < in->n_gpu; i++) {
        const GpGpuRecord *g = &in->gpu[i];
        if (g->kind == GP_GPU_API)
            continue;
        uint32_t li = g->correlation ? gp_u64map_get(&a->corr, g->correlation) : UINT32_MAX;
        if (li == UINT32_MAX &&
            (g->start_ns < in->window_start_ns || g->start_ns > in->window_end_ns))
            continue; /* warm-up leftovers and work from outside the window */
        GpGpuEventRow *r = VEC_PUSH(t->gpu);
        if (r == NULL)
            goto done;
        int64_t dur = (int64_t)(g->end_ns - g->start_ns);
        r->start_ns = (int64_t)g->start_ns;
        r->end_ns = (int64_t)g->end_ns;
        r->bytes = (int64_t)g->bytes;
        r->address = (int64_t)g->address;
        r->correlation = g->correlation;
        r->stream = g->stream;
        r->device = g->device;
        r->graph_id = g->graph_id;
        memcpy(r->grid, g->grid, sizeof(r->grid));
        memcpy(r->block, g->block, sizeof(r->block));
        r->registers = g->registers;
        r->shared_mem = g->static_smem + g->dynamic_smem;
        r->wait_stream = g->wait_stream;
        r->kind = g->kind;
        r->subkind = g->subkind;
        r->src_mem = g->src_mem;
        r->dst_mem = g->dst_mem;
        r->op_row = -1;
        r->node = -1;
        r->thread = -1;
        r->kernel_row = UINT32_MAX;

        /* Who launched it. */
        uint32_t row = UINT32_MAX;
        int32_t node = -1, rolled = -1;
        if (li != UINT32_MAX) {
            const Launch *l = &a->launches.v[li];
            r->thread = (int32_t)l->thread;
            if (l->owner_row != UINT32_MAX) {
                row = l->owner_row;
                node = l->owner_node;
                r->flags |= GP_GF_ATTRIBUTED;
                rolled = blocked_call_node(t, span_lo, span_hi, step_thread, l);
                if (rolled >= 0)
                    r->flags |= GP_GF_ROLLED_UP;
            } else if (step_thread != UINT32_MAX) {
                int64_t s =
                    open_span_at(t, span_lo[step_thread], span_hi[step_thread], l->enter_ns);
                if (s >= 0) {
                    row = t->spans.v[s].op_row;
                    node = t->spans.v[s].node;
                    r->flags |= GP_GF_ATTRIBUTED | GP_GF_BLOCKED_THREAD;
                }
            }
        }
        r->op_row = row == UINT32_MAX ? -1 : (int32_t)row;
        r->node = node;

        if (g->kind == GP_GPU_MALLOC || g->kind == GP_GPU_FREE) {
            int64_t bytes = g->kind == GP_GPU_MALLOC ? (int64_t)g->bytes : -(int64_t)g->bytes;
            if (row != UINT32_MAX)
                t->ops.v[row].cuda_mem_self_bytes += bytes;
            if (node >= 0) {
                t->nodes.v[node].cuda_mem_self_bytes += bytes;
                charge_up(t, node, CHARGE_DEVICE_BYTES, bytes, stamp, (uint32_t)(i + 1));
            }
            continue;
        }

        /* Kernel table row. */
        uint64_t key = activity_key(g);
        uint32_t kr = gp_u64map_get(&kmap, key);
        if (kr == UINT32_MAX) {
            char *name = activity_name(in, g);
            char **slot = VEC_PUSH(t->strings);
            GpKernelRow *k = VEC_PUSH(t->kernels);
            if (name == NULL || slot == NULL || k == NULL) {
                free(name);
                goto done;
            }
            *slot = name;
            kr = (uint32_t)(t->kernels.n - 1);
            k->name = (uint32_t)(t->strings.n - 1);
            k->device = g->device;
            k->min_ns = INT64_MAX;
            memcpy(k->grid, g->grid, sizeof(k->grid));
            memcpy(k->block, g->block, sizeof(k->block));
            k->registers = g->registers;
            k->shared_mem = g->static_smem + g->dynamic_smem;
            k->category = category_of(g, name);
            if (gp_u64map_put(&kmap, key, kr) < 0)
                goto done;
        }
        r->kernel_row = kr;
        GpKernelRow *k = &t->kernels.v[kr];
        k->calls++;
        k->total_ns += dur;
        k->bytes += (int64_t)g->bytes;
        if (dur < k->min_ns)
            k->min_ns = dur;
        if (dur > k->max_ns)
            k->max_ns = dur;

        if (g->kind == GP_GPU_SYNC)
            continue; /* a wait, not work: no CUDA time for the op */
        if (row != UINT32_MAX) {
            t->ops.v[row].cuda_self_ns += dur;
            t->ops.v[row].kernels++;
            t->nodes.v[node].cuda_self_ns += dur;
            charge_up(t, node, CHARGE_GPU_NS, dur, stamp, (uint32_t)(i + 1));
            if (rolled >= 0) /* also in the blocked call's totals (same mark: an op
                              * on both paths counts the kernel once) */
                charge_up(t, rolled, CHARGE_GPU_NS, dur, stamp, (uint32_t)(i + 1));
            t->attributed_gpu_ns += dur;
        } else {
            t->unattributed_gpu_ns += dur;
        }
    }
    for (size_t i = 0; i < t->kernels.n; i++)
        if (t->kernels.v[i].min_ns == INT64_MAX)
            t->kernels.v[i].min_ns = 0;
    rc = 0;
done:
    free(stamp);
    gp_u64map_free(&kmap);
    return rc;
}

int
gp_gpu_join_steps(Agg *a)
{
    GpTables *t = a->t;
    size_t ng = t->gpu.n;
    Interval *busy = malloc((ng + 1) * sizeof(Interval));
    Interval *copy = malloc((ng + 1) * sizeof(Interval));
    Interval *comm = malloc((ng + 1) * sizeof(Interval));
    Interval *sync = malloc((a->launches.n + 1) * sizeof(Interval));
    int rc = -1;
    if (!busy || !copy || !comm || !sync)
        goto done;
    size_t nb = 0, nc = 0, nm = 0, ns = 0;
    for (size_t i = 0; i < ng; i++) {
        const GpGpuEventRow *g = &t->gpu.v[i];
        if (g->kind != GP_GPU_KERNEL && g->kind != GP_GPU_MEMCPY && g->kind != GP_GPU_MEMSET)
            continue;
        Interval iv = {g->start_ns, g->end_ns};
        busy[nb++] = iv;
        if (g->kind == GP_GPU_MEMCPY)
            copy[nc++] = iv;
        if (g->kernel_row != UINT32_MAX &&
            t->kernels.v[g->kernel_row].category == GP_CAT_COMMUNICATION)
            comm[nm++] = iv;
    }
    for (size_t i = 0; i < a->launches.n; i++) {
        const Launch *l = &a->launches.v[i];
        int cls = gp_cuda_api_class(l->api_key);
        if (cls == GP_APICLASS_SYNC || cls == GP_APICLASS_MEMCPY_SYNC)
            sync[ns++] = (Interval){l->enter_ns, l->exit_ns};
    }
    nb = merge_intervals(busy, nb);
    nc = merge_intervals(copy, nc);
    nm = merge_intervals(comm, nm);
    ns = merge_intervals(sync, ns);
    for (size_t i = 0; i < a->stepmarks.n; i++) {
        const StepMark *m = &a->stepmarks.v[i];
        if (m->end_ns < 0)
            continue;
        GpStepRow *r = VEC_PUSH(t->steps);
        if (r == NULL)
            goto done;
        r->step = m->step;
        r->start_ns = m->start_ns;
        r->end_ns = m->end_ns;
        r->thread = m->thread;
        r->cpu_ns = m->end_ns - m->start_ns;
        r->gpu_busy_ns = overlap(busy, nb, m->start_ns, m->end_ns);
        r->gpu_idle_ns = r->cpu_ns - r->gpu_busy_ns;
        r->memcpy_ns = overlap(copy, nc, m->start_ns, m->end_ns);
        r->comm_ns = overlap(comm, nm, m->start_ns, m->end_ns);
        r->sync_wait_ns = overlap(sync, ns, m->start_ns, m->end_ns);
        for (size_t k = 0; k < ng; k++) {
            const GpGpuEventRow *g = &t->gpu.v[k];
            if (g->kind == GP_GPU_KERNEL && g->start_ns >= m->start_ns && g->start_ns < m->end_ns)
                r->kernels++;
        }
    }
    rc = 0;
done:
    free(busy);
    free(copy);
    free(comm);
    free(sync);
    return rc;
}
