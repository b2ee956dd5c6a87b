/* One thread's events in time order: its CUDA API records and the NVTX ends
 * other threads recorded merged in, and the fast path that replays the calls
 * and returns making up nearly every window (aggregate_internal.h). */
#include "aggregate_internal.h"

#include <stdlib.h>
#include <string.h>

/* API records from activity-only mode for one thread, as events sorted by
 * time (enter at start, exit at end; ns). */
static GpEvent *
api_events_for_thread(const GpAggInput *in, const GpWindowThread *tb, uint8_t *used, size_t *n_out)
{
    size_t n = 0;
    for (size_t i = 0; i < in->n_gpu; i++)
        if (in->gpu[i].kind == GP_GPU_API && (in->gpu[i].thread_id == (uint32_t)tb->os_tid ||
                                              in->gpu[i].thread_id == (uint32_t)tb->ident))
            n++;
    *n_out = 0;
    if (n == 0)
        return NULL;
    GpEvent *ev = malloc(2 * n * sizeof(GpEvent));
    if (ev == NULL)
        return NULL;
    size_t k = 0;
    /* in->gpu is sorted by start, and one thread's API calls do not overlap,
     * so enter/exit pairs come out in time order. */
    for (size_t i = 0; i < in->n_gpu; i++) {
        const GpGpuRecord *g = &in->gpu[i];
        if (g->kind != GP_GPU_API ||
            (g->thread_id != (uint32_t)tb->os_tid && g->thread_id != (uint32_t)tb->ident))
            continue;
        if (used)
            used[i] = 1;
        ev[k].ts = g->start_ns;
        ev[k].arg = g->correlation;
        ev[k].kind = GP_EV_MAKE(GP_EV_API_ENTER, g->name_id);
        k++;
        ev[k].ts = g->end_ns;
        ev[k].arg = g->correlation;
        ev[k].kind = GP_EV_MAKE(GP_EV_API_EXIT, 0);
        k++;
    }
    *n_out = k;
    return ev;
}

static int
cmp_event_ts(const void *x, const void *y)
{
    const GpEvent *a = x, *b = y;
    return (a->ts > b->ts) - (a->ts < b->ts);
}

/* NVTX ends recorded on another thread than their start, with ns
 * timestamps, sorted by time: each is replayed on the thread that started
 * the range. */
int
gp_replay_thread_foreign_ends(Agg *a, const GpClockMap *clock)
{
    size_t n = 0, cap = 0;
    GpEvent *v = NULL;
    const GpAggInput *in = a->in;
    for (uint32_t t = 0; t < in->n_threads; t++) {
        const GpWindowThread *tb = &in->threads[t];
        GpClockCursor cur;
        gp_clock_cursor_init(&cur, clock);
        for (const GpChunk *c = tb->head; c; c = c->next) {
            for (uint32_t k = 0; k < c->n; k++) {
                const GpEvent *ev = &c->ev[k];
                if (GP_EV_KIND(ev->kind) != GP_EV_NVTX_END || ev->arg == tb->index)
                    continue;
                if (vec_grow((void **)&v, &cap, n + 1, sizeof(GpEvent)) == NULL) {
                    free(v);
                    return -1;
                }
                v[n] = *ev;
                v[n].ts = gp_clock_ns(&cur, ev->ts);
                n++;
            }
        }
    }
    if (n > 1)
        qsort(v, n, sizeof(GpEvent), cmp_event_ts);
    a->foreign_ends = v;
    a->n_foreign_ends = n;
    return 0;
}

/* Merge the foreign ends of ranges `tb` started into its sorted extra
 * events (*evp)[0..*n), replacing *evp. 0, or -1 when out of memory. */
static int
merge_foreign_ends(const Agg *a, const GpWindowThread *tb, GpEvent **evp, size_t *n)
{
    GpEvent *ev = *evp;
    size_t k = 0;
    for (size_t i = 0; i < a->n_foreign_ends; i++)
        k += a->foreign_ends[i].arg == tb->index;
    if (k == 0)
        return 0;
    GpEvent *out = malloc((*n + k) * sizeof(GpEvent));
    if (out == NULL)
        return -1;
    size_t i = 0, j = 0, o = 0;
    while (i < *n || j < a->n_foreign_ends) {
        if (j < a->n_foreign_ends && a->foreign_ends[j].arg != tb->index) {
            j++;
        } else if (j < a->n_foreign_ends && (i == *n || a->foreign_ends[j].ts < ev[i].ts)) {
            out[o++] = a->foreign_ends[j++];
        } else {
            out[o++] = ev[i++];
        }
    }
    free(ev);
    *evp = out;
    *n = o;
    return 0;
}

/* Advance the thread's clock to ts: the time since the previous event is
 * self time of the entry on top of the stack. */
GP_INLINE void
advance(Agg *a, int64_t ts, int64_t *last)
{
    if (ts > *last) {
        if (a->stack.n > 0) {
            a->stack.v[a->stack.n - 1].self += ts - *last;
            a->busy += ts - *last;
        }
        *last = ts;
    }
}

/* Replay events [ev, stop) of a thread that has no extra events to merge.
 * The calls and returns that make up nearly every window are handled here
 * with the hot state in locals: a return from the frame on top, and a call
 * of a known, shown op from a shown Python or C frame whose (parent, op)
 * node exists. They do exactly what gp_replay_event would do (which handles
 * every other event, with the state written back around it). *last is the
 * thread's clock, -1 before its first event. 0, or -1 when out of memory. */
static int
replay_run(Agg *a, const GpEvent *ev, const GpEvent *stop, GpClockCursor *cur, int64_t end,
           int64_t *last_io, GpThreadRow *tr)
{
    const uint8_t *kinds = a->in->op_kinds;
    const int want_spans = a->want_spans;
    int64_t last = *last_io;
    if (last < 0 && ev < stop) {
        int64_t ts = (int64_t)gp_clock_ns(cur, ev->ts);
        last = ts > end ? end : ts;
        tr->first_ns = last;
    }
    const uint64_t thread_key = 0x80000000ull | a->thread;
    /* The hot state, in locals; `p` is one past the stack's top entry. */
    Entry *sv = a->stack.v;
    Entry *p = sv + a->stack.n;
    Entry *cap_end = sv + a->stack.cap;
    const int32_t *fast_row = a->fast_row;
    uint32_t n_fast = a->n_fast;
    GpOpRow *ops = a->t->ops.v;
    GpNodeRow *nodes = a->t->nodes.v;
    int32_t *active = a->active.v;
    const NodeSlot *slots = a->nodes.s;
    size_t slot_mask = a->nodes.mask;
    unsigned slot_shift = a->nodes.shift;
    int64_t busy = a->busy, self_sum = a->self_sum;
    uint32_t pushes = a->pushes;
    for (; ev < stop; ev++) {
        /* 4 KiB ahead: on the VMs measured, the hardware prefetcher alone
         * left a third of the replay waiting for memory. */
        __builtin_prefetch(ev + 256);
        int64_t ts = (int64_t)gp_clock_ns(cur, ev->ts);
        if (GP_UNLIKELY(ts > end))
            ts = end;
        if (ts > last) {
            if (p > sv) {
                p[-1].self += ts - last;
                busy += ts - last;
            }
            last = ts;
        }
        uint32_t kind = GP_EV_KIND(ev->kind);
        if (kind == GP_EV_RETURN || kind == GP_EV_CRETURN) {
            if (p > sv && p[-1].kind == (kind == GP_EV_RETURN ? E_PY : E_C)) {
                Entry *e = --p;
                if (e->hidden) {
                    if (p > sv)
                        p[-1].self += e->self;
                } else {
                    close_entry_stats(ops, nodes, active, a->t->spans.v, e, last, &self_sum);
                }
                continue;
            }
        } else if (kind == GP_EV_CALL || kind == GP_EV_CCALL) {
            uint32_t op = ev->arg;
            int32_t row = op < n_fast ? fast_row[op] : -1;
            if (row >= 0 && p > sv && p < cap_end && !p[-1].hidden &&
                (p[-1].kind == E_PY || p[-1].kind == E_C)) {
                const Entry *top = p - 1;
                /* nodemap_get, on the local copy of the table */
                uint64_t pkey = top->node >= 0 ? (uint64_t)top->node : thread_key;
                uint64_t key = (pkey << 32) | (uint32_t)row;
                size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> slot_shift);
                while (slots[i].key != key && slots[i].val != UINT32_MAX)
                    i = (i + 1) & slot_mask;
                uint32_t node = slots[i].val;
                if (node < NODE_GONE) {
                    Entry *e = p++;
                    e->start = last;
                    e->origin = last;
                    e->self = 0;
                    e->row = (uint32_t)row;
                    e->node = (int32_t)node;
                    e->span = -1;
                    e->seq = ++pushes;
                    e->op = op;
                    e->kind = kind == GP_EV_CCALL ? E_C : E_PY;
                    e->hidden = 0;
                    e->outermost = active[row]++ == 0;
                    ops[row].calls++;
                    nodes[node].calls++;
                    if (want_spans) {
                        if (push_span(a, e, last, kinds[op], top->span, 0) < 0) {
                            a->stack.n = (size_t)(p - sv);
                            return -1;
                        }
                        a->t->spans.v[e->span].site = GP_EV_PAYLOAD(ev->kind);
                    }
                    continue;
                }
            }
        }
        /* Anything else: the general path, on the state written back. */
        if (GP_UNLIKELY(kind == GP_EV_STEP_END))
            a->step_follows = ev + 1 < stop && GP_EV_KIND(ev[1].kind) == GP_EV_STEP_BEGIN;
        a->stack.n = (size_t)(p - sv);
        a->busy = busy;
        a->self_sum = self_sum;
        a->pushes = pushes;
        if (gp_replay_event(a, ev, last) < 0)
            return -1;
        sv = a->stack.v;
        p = sv + a->stack.n;
        cap_end = sv + a->stack.cap;
        fast_row = a->fast_row;
        n_fast = a->n_fast;
        ops = a->t->ops.v;
        nodes = a->t->nodes.v;
        active = a->active.v;
        slots = a->nodes.s;
        slot_mask = a->nodes.mask;
        slot_shift = a->nodes.shift;
        busy = a->busy;
        self_sum = a->self_sum;
        pushes = a->pushes;
    }
    a->stack.n = (size_t)(p - sv);
    a->busy = busy;
    a->self_sum = self_sum;
    a->pushes = pushes;
    *last_io = last;
    return 0;
}

int
gp_replay_thread_run(Agg *a, const GpWindowThread *tb, GpThreadRow *tr, const GpClockMap *clock)
{
    size_t n_api = 0;
    GpEvent *api = api_events_for_thread(a->in, tb, a->api_used, &n_api);
    if (a->n_foreign_ends > 0 && merge_foreign_ends(a, tb, &api, &n_api) < 0) {
        free(api);
        return -1;
    }
    a->buf_index = tb->index;
    a->carry.n = 0;
    a->step_follows = 0;
    a->stack.n = 0;
    a->busy = 0;
    a->self_sum = 0;
    a->lingering = 0;
    if (vec_grow((void **)&a->stack.v, &a->stack.cap, 64, sizeof(Entry)) == NULL) {
        free(api);
        return -1;
    }
    GpClockCursor cur;
    gp_clock_cursor_init(&cur, clock);
    int64_t end =
        tb->drop_ts ? (int64_t)gp_clock_ns(&cur, tb->drop_ts) : (int64_t)a->in->window_end_ns;
    gp_clock_cursor_init(&cur, clock);
    int64_t last = -1;
    size_t ai = 0;
    int rc = 0;
    for (const GpChunk *c = tb->head; c && rc == 0; c = c->next) {
        if (n_api == 0 && !a->in->general_only) {
            rc = replay_run(a, c->ev, c->ev + c->n, &cur, end, &last, tr);
            continue;
        }
        const GpEvent *ev = c->ev, *stop = c->ev + c->n;
        for (; ev < stop; ev++) {
            int64_t ts = (int64_t)gp_clock_ns(&cur, ev->ts);
            /* Extra events (activity API records, foreign NVTX ends) due first. */
            while (ai < n_api && (int64_t)api[ai].ts < ts) {
                int64_t ets = (int64_t)api[ai].ts > end ? end : (int64_t)api[ai].ts;
                if (last < 0) {
                    last = ets;
                    tr->first_ns = ets;
                }
                advance(a, ets, &last);
                if (gp_replay_event(a, &api[ai++], last) < 0) {
                    rc = -1;
                    break;
                }
            }
            if (rc < 0)
                break;
            if (ts > end)
                ts = end;
            if (last < 0) {
                last = ts;
                tr->first_ns = ts;
            }
            advance(a, ts, &last);
            if (GP_EV_KIND(ev->kind) == GP_EV_STEP_END)
                a->step_follows = ev + 1 < stop && GP_EV_KIND(ev[1].kind) == GP_EV_STEP_BEGIN &&
                                  (ai == n_api || (int64_t)api[ai].ts >= ts);
            if (gp_replay_event(a, ev, last) < 0) {
                rc = -1;
                break;
            }
        }
    }
    for (; rc == 0 && ai < n_api; ai++) {
        int64_t ets = (int64_t)api[ai].ts > end ? end : (int64_t)api[ai].ts;
        if (last < 0) {
            last = ets;
            tr->first_ns = ets;
        }
        advance(a, ets, &last);
        if (gp_replay_event(a, &api[ai], last) < 0)
            rc = -1;
    }
    free(api);
    if (rc == 0 && a->lingering)
        gp_replay_close_linger(a, last);
    if (rc < 0 || gp_replay_flush_carry(a, last >= 0 ? last : end) < 0)
        return -1;
    if (last >= 0 && end > last && a->stack.n > 0) {
        a->stack.v[a->stack.n - 1].self += end - last;
        a->busy += end - last;
    }
    while (a->stack.n > 0)
        gp_replay_remove_entry(a, a->stack.n - 1, end);
    tr->last_ns = last >= 0 ? end : 0;
    tr->busy_ns = a->busy;
    tr->self_sum_ns = a->self_sum;
    return 0;
}
