/* Aggregation of one window: replay each thread's events against a stack,
 * join GPU records to the ops that launched them, and build the tables.
 *
 * Time accounting: the time between two consecutive events of a thread is
 * charged as self time to the entry on top of that thread's stack. An
 * entry's total time is its end minus its start; a recursive op's total is
 * counted only for its outermost entry (as cProfile does). Entries may be
 * removed from the middle of the stack (a user range that outlives the
 * frame that opened it), which this scheme handles without special cases.
 * Hidden entries (gpuprof's own frames) have no row: their self time goes to
 * the entry below them when they end.
 */
#include "aggregate.h"

#include "aggregate_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "demangle.h"
#include "opkinds.h"

/* Reserve room for n items up front when large: the span table of a
 * ten-million-event window is ~250 MB, and growing it by doubling costs
 * copies and touches twice the pages. Untouched pages cost nothing. */
static int
vec_reserve_huge(void **v, size_t *cap, size_t n, size_t item)
{
    const size_t huge = 2u << 20;
    size_t bytes = n * item;
    if (n <= *cap)
        return 0;
    if (bytes < 4 * huge || *v != NULL)
        return vec_grow(v, cap, n, item) ? 0 : -1;
    bytes = (bytes + huge - 1) / huge * huge;
    void *p = aligned_alloc(huge, bytes);
    if (p == NULL)
        return -1;
    *v = p;
    *cap = bytes / item;
    return 0;
}

static int
cmp_gpu_start(const void *x, const void *y)
{
    const GpGpuRecord *a = x, *b = y;
    return (a->start_ns > b->start_ns) - (a->start_ns < b->start_ns);
}

static int
cmp_gpu_row_start(const void *x, const void *y)
{
    const GpGpuEventRow *a = x, *b = y;
    return (a->start_ns > b->start_ns) - (a->start_ns < b->start_ns);
}

GpStatus
gp_aggregate_run(const GpAggInput *in, GpTables *out)
{
    Agg a;
    memset(&a, 0, sizeof(a));
    memset(out, 0, sizeof(*out));
    a.in = in;
    a.t = out;
    /* Blocked-thread attribution of GPU work looks spans up: with GPU
     * records the spans are always built. */
    a.want_spans = in->want_spans || in->n_gpu > 0;
    GpClockMap clock;
    GpStatus st = gp_clock_map_init(&clock, in->anchors, in->n_anchors);
    if (st != GP_OK)
        return st;
    st = GP_ERR_NOMEM;
    size_t n_threads = in->n_threads;
    size_t *span_lo = calloc(n_threads + 1, sizeof(size_t));
    size_t *span_hi = calloc(n_threads + 1, sizeof(size_t));
    a.row_of_op = malloc((in->n_ops + 1) * sizeof(int32_t));
    a.fast_row = malloc((in->n_ops + 1) * sizeof(int32_t));
    a.n_fast = in->n_ops;
    if (!span_lo || !span_hi || !a.row_of_op || !a.fast_row ||
        gp_replay_nodemap_init(&a.nodes, 1024) < 0 || gp_u64map_init(&a.corr, 1024) < 0 ||
        gp_u64map_init(&a.nvtx_rows, 64) < 0)
        goto done;
    if (in->nvtx_cross_thread_ends && gp_replay_thread_foreign_ends(&a, &clock) < 0)
        goto done;
    memset(a.row_of_op, 0xff, (in->n_ops + 1) * sizeof(int32_t));
    memset(a.fast_row, 0xff, (in->n_ops + 1) * sizeof(int32_t));
    a.api_used = calloc(in->n_gpu + 1, 1);
    if (a.api_used == NULL)
        goto done;
    out->window_start_ns = (int64_t)in->window_start_ns;
    out->window_end_ns = (int64_t)in->window_end_ns;
    if (in->n_gpu > 1)
        qsort(in->gpu, in->n_gpu, sizeof(GpGpuRecord), cmp_gpu_start);
    if (gp_shapes_reuse(in, out) < 0)
        goto done;
    if (a.want_spans) {
        /* Every span starts with an event: the event count bounds the spans. */
        size_t n_events = 0;
        for (size_t t = 0; t < n_threads; t++)
            n_events += in->threads[t].n_events;
        for (size_t i = 0; i < in->n_gpu; i++)
            n_events += in->gpu[i].kind == GP_GPU_API;
        if (vec_reserve_huge((void **)&out->spans.v, &out->spans.cap, n_events + 16,
                             sizeof(GpSpanRow)) < 0)
            goto done;
    }

    uint32_t step_thread = UINT32_MAX;
    uint32_t ti = 0;
    for (size_t k = 0; k < n_threads; k++) {
        const GpWindowThread *tb = &in->threads[k];
        if (tb->ignored)
            continue;
        GpThreadRow *tr = VEC_PUSH(out->threads);
        if (tr == NULL)
            goto done;
        tr->ident = tb->ident;
        tr->os_tid = tb->os_tid;
        tr->events = (int64_t)tb->n_events;
        tr->dropped = (int64_t)tb->dropped;
        out->dropped_events += (int64_t)tb->dropped;
        if (tb->ident == in->step_thread_ident)
            step_thread = ti;
        a.thread = ti;
        span_lo[ti] = out->spans.n;
        if (gp_replay_thread_run(&a, tb, tr, &clock) < 0)
            goto done;
        span_hi[ti] = out->spans.n;
        ti++;
    }
    /* Activity-only mode: API calls from threads that never ran Python (the
     * autograd engine's device threads) have no stream to join; they become
     * launches without an owner, charged to the blocked thread like the
     * callbacks' off-Python launches. */
    for (size_t i = 0; a.api_used && i < in->n_gpu; i++) {
        const GpGpuRecord *g = &in->gpu[i];
        if (g->kind != GP_GPU_API || a.api_used[i] || g->correlation == 0)
            continue;
        Launch *l = VEC_PUSH(a.launches);
        if (l == NULL)
            goto done;
        l->enter_ns = (int64_t)g->start_ns;
        l->exit_ns = (int64_t)g->end_ns;
        l->correlation = g->correlation;
        l->api_key = g->name_id;
        l->owner_row = UINT32_MAX;
        l->owner_node = -1;
        l->thread = UINT32_MAX;
        if (gp_u64map_put(&a.corr, g->correlation, (uint32_t)(a.launches.n - 1)) < 0)
            goto done;
    }
    if (gp_gpu_join_build(&a, span_lo, span_hi, step_thread) < 0)
        goto done;
    if (out->gpu.n > 1)
        qsort(out->gpu.v, out->gpu.n, sizeof(GpGpuEventRow), cmp_gpu_row_start);
    if (gp_gpu_join_steps(&a) < 0)
        goto done;
    for (size_t i = 0; i < out->ops.n; i++)
        if (out->ops.v[i].cpu_min_ns == INT64_MAX)
            out->ops.v[i].cpu_min_ns = 0;
    out->has_spans = a.want_spans;
    st = GP_OK;
done:
    gp_clock_map_free(&clock);
    free(span_lo);
    free(span_hi);
    free(a.row_of_op);
    free(a.fast_row);
    free(a.api_used);
    free(a.active.v);
    free(a.api_rows.v);
    free(a.stack.v);
    free(a.launches.v);
    free(a.stepmarks.v);
    free(a.carry.v);
    free(a.nodes.s);
    gp_u64map_free(&a.corr);
    gp_u64map_free(&a.nvtx_rows);
    free(a.foreign_ends);
    if (st != GP_OK)
        gp_aggregate_free(out);
    return st;
}

void
gp_aggregate_free(GpTables *t)
{
    for (size_t i = 0; i < t->strings.n; i++)
        free(t->strings.v[i]);
    free(t->strings.v);
    free(t->ops.v);
    free(t->nodes.v);
    free(t->kernels.v);
    free(t->gpu.v);
    free(t->steps.v);
    free(t->spans.v);
    free(t->threads.v);
    free(t->seqs.v);
    memset(t, 0, sizeof(*t));
}
