/* The replay state of the aggregation: op rows, call-tree nodes, the stack of
 * open entries, and the general path for one event (aggregate_internal.h).
 * The time accounting is described in aggregate.c. */
#include "aggregate_internal.h"

#include "demangle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- replay state -------------------------------------------------------- */

int
gp_replay_nodemap_init(NodeMap *m, size_t cap)
{
    size_t c = 1024;
    unsigned bits = 10;
    while (c < cap * 2) {
        c *= 2;
        bits++;
    }
    m->s = malloc(c * sizeof(NodeSlot));
    if (m->s == NULL)
        return -1;
    memset(m->s, 0xff, c * sizeof(NodeSlot));
    m->mask = c - 1;
    m->used = 0;
    m->shift = 64 - bits;
    return 0;
}

static int
nodemap_put(NodeMap *m, uint64_t key, uint32_t val)
{
    if ((m->used + 1) * 2 > m->mask + 1) {
        NodeMap bigger;
        if (gp_replay_nodemap_init(&bigger, m->mask + 1) < 0)
            return -1;
        for (size_t i = 0; i <= m->mask; i++)
            if (m->s[i].val != UINT32_MAX)
                nodemap_put(&bigger, m->s[i].key, m->s[i].val);
        free(m->s);
        *m = bigger;
    }
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> m->shift);
    while (m->s[i].val != UINT32_MAX) {
        if (m->s[i].key == key) {
            m->s[i].val = val;
            return 0;
        }
        i = (i + 1) & m->mask;
    }
    m->s[i].key = key;
    m->s[i].val = val;
    m->used++;
    return 0;
}

static int64_t
op_row_slow(Agg *a, uint32_t op, uint8_t kind)
{
    if (kind == GP_OP_CUDA_API) {
        for (size_t i = 0; i + 1 < a->api_rows.n; i += 2)
            if (a->api_rows.v[i] == op)
                return a->api_rows.v[i + 1];
    } else if (kind == GP_OP_NVTX) {
        uint32_t hit = gp_u64map_get(&a->nvtx_rows, op);
        if (hit != UINT32_MAX)
            return hit;
    } else if (op >= a->in->n_ops) {
        return -1;
    }
    GpOpRow *r = VEC_PUSH(a->t->ops);
    int32_t *act = VEC_PUSH(a->active);
    if (r == NULL || act == NULL)
        return -2;
    uint32_t row = (uint32_t)(a->t->ops.n - 1);
    r->op = op;
    r->kind = kind == GP_OP_NVTX ? GP_OP_USER : kind;
    r->flags = kind == GP_OP_CUDA_API ? (uint8_t)gp_cuda_api_class(op)
               : kind == GP_OP_NVTX   ? GP_OPF_NVTX
                                      : a->in->op_flags[op];
    r->cpu_min_ns = INT64_MAX;
    if (kind == GP_OP_NVTX) {
        if (gp_u64map_put(&a->nvtx_rows, op, row) < 0)
            return -2;
    } else if (kind == GP_OP_CUDA_API) {
        uint32_t *k = VEC_PUSH(a->api_rows);
        uint32_t *v = VEC_PUSH(a->api_rows);
        if (k == NULL || v == NULL)
            return -2;
        *k = op;
        *v = row;
    } else {
        a->row_of_op[op] = (int32_t)row;
        if (!(a->in->op_flags[op] & GP_OPF_HIDDEN))
            a->fast_row[op] = (int32_t)row;
    }
    return row;
}

/* Op row of an op, made on first sight; -1 for an unknown op id, -2 when
 * out of memory. */
GP_INLINE int64_t
op_row_for(Agg *a, uint32_t op, uint8_t kind)
{
    if (GP_LIKELY(kind != GP_OP_CUDA_API && kind != GP_OP_NVTX && op < a->in->n_ops &&
                  a->row_of_op[op] >= 0))
        return a->row_of_op[op];
    return op_row_slow(a, op, kind);
}

static int32_t
node_new(Agg *a, int32_t parent, uint32_t row, uint64_t key)
{
    GpNodeRow *n = VEC_PUSH(a->t->nodes);
    if (n == NULL)
        return -2;
    uint32_t id = (uint32_t)(a->t->nodes.n - 1);
    n->id = (int32_t)id;
    n->parent = parent;
    n->op_row = row;
    n->thread = a->thread;
    if (nodemap_put(&a->nodes, key, id) < 0)
        return -2;
    return (int32_t)id;
}

/* Call-tree node of `row` under `parent` (-1: a root of this thread), made
 * on first sight; -2 when out of memory. */
GP_INLINE int32_t
node_for(Agg *a, int32_t parent, uint32_t row)
{
    uint64_t key = node_key(parent, row, a->thread);
    uint32_t id = nodemap_get(&a->nodes, key);
    if (GP_LIKELY(id < NODE_GONE))
        return (int32_t)id;
    return node_new(a, parent, row, key);
}

/* Nearest non-hidden entry at or below index i, or -1. */
GP_INLINE int64_t
visible_below(const Agg *a, int64_t i)
{
    for (; i >= 0; i--)
        if (!a->stack.v[i].hidden)
            return i;
    return -1;
}

/* Nearest entry that can own GPU work (not hidden, not an API call), or -1. */
static int64_t
owner_below(const Agg *a, int64_t i)
{
    for (; i >= 0; i--)
        if (!a->stack.v[i].hidden && a->stack.v[i].kind != E_API)
            return i;
    return -1;
}

/* Room for one more stack entry; NULL when out of memory. */
GP_INLINE Entry *
stack_slot(Agg *a)
{
    if (GP_UNLIKELY(a->stack.n == a->stack.cap) &&
        vec_grow((void **)&a->stack.v, &a->stack.cap, a->stack.n + 1, sizeof(Entry)) == NULL)
        return NULL;
    return &a->stack.v[a->stack.n];
}

GP_INLINE int
push_entry(Agg *a, int64_t ts, uint8_t ekind, uint8_t opkind, uint32_t op, int hidden, int count,
           int snapshot)
{
    int64_t below = visible_below(a, (int64_t)a->stack.n - 1);
    Entry *e = stack_slot(a);
    if (e == NULL)
        return -1;
    a->stack.n++;
    e->start = ts;
    e->origin = ts;
    e->self = 0;
    e->kind = ekind;
    e->op = op;
    e->hidden = (uint8_t)hidden;
    e->outermost = 0;
    e->span = -1;
    e->node = -1;
    e->row = UINT32_MAX;
    e->launch = 0;
    e->nvtx = 0;
    e->seq = 0;
    e->engine = 0;
    if (hidden)
        return 0;
    int64_t row = op_row_for(a, op, opkind);
    if (GP_UNLIKELY(row < 0)) {
        if (row == -2)
            return -1;
        e->hidden = 1; /* unknown op id: treat as hidden rather than invent a row */
        return 0;
    }
    e->row = (uint32_t)row;
    const Entry *b = below >= 0 ? &a->stack.v[below] : NULL;
    int32_t node = node_for(a, b ? b->node : -1, (uint32_t)row);
    if (GP_UNLIKELY(node < 0))
        return -1;
    e->node = node;
    e->seq = ++a->pushes;
    if (a->want_spans && push_span(a, e, ts, opkind, b ? b->span : -1, snapshot) < 0)
        return -1;
    if (count) {
        a->t->ops.v[row].calls++;
        a->t->nodes.v[node].calls++;
    }
    e->outermost = a->active.v[row]++ == 0;
    return 0;
}

static void
close_step(Agg *a, uint32_t step, int64_t ts)
{
    for (size_t k = a->stepmarks.n; k-- > 0;) {
        StepMark *m = &a->stepmarks.v[k];
        if (m->step == (int64_t)step && m->thread == a->thread && m->end_ns < 0) {
            m->end_ns = ts;
            break;
        }
    }
}

/* Close and remove stack entry i at time ts. */
GP_INLINE void
remove_entry(Agg *a, size_t i, int64_t ts)
{
    Entry *e = &a->stack.v[i];
    if (e->hidden) {
        if (i > 0)
            a->stack.v[i - 1].self += e->self;
    } else {
        close_entry_stats(a->t->ops.v, a->t->nodes.v, a->active.v, a->t->spans.v, e, ts,
                          &a->self_sum);
        if (GP_UNLIKELY(e->kind == E_API))
            a->launches.v[e->launch].exit_ns = ts;
        if (GP_UNLIKELY(e->kind == E_STEP))
            close_step(a, e->op, ts);
    }
    if (i + 1 < a->stack.n)
        memmove(&a->stack.v[i], &a->stack.v[i + 1], (a->stack.n - i - 1) * sizeof(Entry));
    a->stack.n--;
}

/* Topmost entry of one of the given kinds, stopping (returning -1) at a
 * `barrier` kind; pass 0 for no barrier. */
GP_INLINE int64_t
find_top(const Agg *a, uint8_t kind, uint8_t barrier, int match_op, uint32_t op)
{
    for (int64_t i = (int64_t)a->stack.n - 1; i >= 0; i--) {
        const Entry *e = &a->stack.v[i];
        if (e->kind == kind && (!match_op || e->op == op))
            return i;
        if (barrier && e->kind == barrier)
            return -1;
    }
    return -1;
}

static int
on_api_enter(Agg *a, int64_t ts, uint32_t corr, uint32_t key)
{
    int64_t own = owner_below(a, (int64_t)a->stack.n - 1);
    Launch *l = VEC_PUSH(a->launches);
    if (l == NULL)
        return -1;
    l->enter_ns = ts;
    l->exit_ns = ts;
    l->correlation = corr;
    l->api_key = key;
    l->thread = a->thread;
    l->owner_row = own >= 0 ? a->stack.v[own].row : UINT32_MAX;
    l->owner_node = own >= 0 ? a->stack.v[own].node : -1;
    uint32_t li = (uint32_t)(a->launches.n - 1);
    if (corr != 0 && gp_u64map_put(&a->corr, corr, li) < 0)
        return -1;
    if (push_entry(a, ts, E_API, GP_OP_CUDA_API, key, 0, 1, 0) < 0)
        return -1;
    Entry *e = &a->stack.v[a->stack.n - 1];
    e->launch = li;
    if (e->span >= 0)
        a->t->spans.v[e->span].correlation = corr;
    return 0;
}

/* Whether the innermost Python or C call on the stack (ranges, steps and
 * API calls above it do not count) is one of gpuprof's hidden frames. */
GP_INLINE int
caller_is_hidden(const Agg *a)
{
    for (int64_t i = (int64_t)a->stack.n - 1; i >= 0; i--) {
        const Entry *e = &a->stack.v[i];
        if (e->kind == E_PY || e->kind == E_C)
            return e->hidden && e->kind == E_PY;
    }
    return 0;
}

/* Topmost NVTX entry of kind `kind` whose domain (E_NVTX) or tag
 * (E_NVTX_SE) is `key`, or -1. */
static int64_t
find_nvtx(const Agg *a, uint8_t kind, uint32_t key)
{
    for (int64_t i = (int64_t)a->stack.n - 1; i >= 0; i--)
        if (a->stack.v[i].kind == kind && a->stack.v[i].nvtx == key)
            return i;
    return -1;
}

/* An NVTX range opened inside a call (torch.cuda.nvtx.range_push and its C
 * binding, nvtx.push_range) and still open when that call returns belongs
 * to the call's caller: move it there while nothing was recorded under it.
 * A range that ends inside the call stays its child. i: the call's entry. */
static int
reparent_nvtx(Agg *a, size_t i)
{
    GpTables *t = a->t;
    Entry *e = &a->stack.v[i + 1];
    const Entry *c = &a->stack.v[i];
    if ((e->kind != E_NVTX && e->kind != E_NVTX_SE) || e->hidden || c->hidden || e->node < 0 ||
        e->seq != a->pushes || t->nodes.v[e->node].parent != c->node)
        return 0;
    int64_t below = visible_below(a, (int64_t)i - 1);
    int32_t pnode = below >= 0 ? a->stack.v[below].node : -1;
    int32_t pspan = below >= 0 ? a->stack.v[below].span : -1;
    GpNodeRow *old = &t->nodes.v[e->node];
    old->calls--;
    if (old->calls == 0 && (size_t)e->node == t->nodes.n - 1) {
        /* Made by this push: take it back, so no empty node stays behind. */
        if (nodemap_put(&a->nodes, node_key(c->node, e->row, a->thread), NODE_GONE) < 0)
            return -1;
        t->nodes.n--;
    }
    int32_t node = node_for(a, pnode, e->row);
    if (node < 0)
        return -1;
    e->node = node;
    t->nodes.v[node].calls++;
    if (e->span >= 0) {
        GpSpanRow *sp = &t->spans.v[e->span];
        sp->parent = pspan;
        sp->node = node;
        sp->depth = (uint16_t)(pspan >= 0 ? t->spans.v[pspan].depth + 1 : 0);
    }
    return 0;
}

/* ---- step boundaries ------------------------------------------------------
 *
 * A step is the time between two prof.step() calls, and its entry must sit in
 * the stack below everything that runs in it: steps are siblings, each one
 * under the frames that stay open through it (the loop's function), as when
 * prof.step() is written in the loop. prof.step() is often called deeper, from
 * inside the optimizer's step (gpuprof run, the integrations, a capture): the
 * frames between the loop and that call (train_step, Optimizer.step, its hook)
 * straddle the boundary. They are cut there: the piece before ends with the
 * old step, and the call goes on as a new piece (not a new call) inside the
 * new one. How many Python frames below the step's begin returned before its
 * end, the hook writes into the begin event's payload, plus one, when the step
 * ends (hook.c, gp_hook_marker); 0 (a step begun or ended elsewhere, events
 * dropped, a test's events) puts the step on top of the stack. */

/* End the piece of stack entry i at ts without ending the call (min and max
 * per call wait for its last piece). A piece in which nothing happened (a
 * frame of the window's first snapshot, right before the first step) is taken
 * back: its span and a node made for it alone. */
static int
cut_entry(Agg *a, size_t i, int64_t ts)
{
    Entry *e = &a->stack.v[i];
    if (e->hidden) {
        if (i > 0)
            a->stack.v[i - 1].self += e->self;
        e->self = 0;
        return 0;
    }
    GpTables *t = a->t;
    if (e->start == ts && e->self == 0) {
        a->active.v[e->row]--;
        if (e->span >= 0 && (size_t)e->span + 1 == t->spans.n)
            t->spans.n--;
        else if (e->span >= 0)
            t->spans.v[e->span].end_ns = ts;
        GpNodeRow *n = &t->nodes.v[e->node];
        if ((size_t)e->node + 1 == t->nodes.n && n->calls == 0 && n->total_ns == 0) {
            if (nodemap_put(&a->nodes, node_key(n->parent, e->row, a->thread), NODE_GONE) < 0)
                return -1;
            t->nodes.n--;
        }
        return 0;
    }
    close_piece_stats(t->ops.v, t->nodes.v, a->active.v, t->spans.v, e, ts, &a->self_sum);
    e->self = 0;
    return 0;
}

/* Cut entries [from, top) at ts and move them, in order, to the front of
 * a->carry (they go on above what is pushed next). 0, or -1 when out of memory. */
static int
cut_to_carry(Agg *a, size_t from, int64_t ts)
{
    size_t k = a->stack.n - from;
    if (k == 0)
        return 0;
    for (size_t i = a->stack.n; i-- > from;)
        if (cut_entry(a, i, ts) < 0)
            return -1;
    if (vec_grow((void **)&a->carry.v, &a->carry.cap, a->carry.n + k, sizeof(Entry)) == NULL)
        return -1;
    memmove(&a->carry.v[k], a->carry.v, a->carry.n * sizeof(Entry));
    memcpy(a->carry.v, &a->stack.v[from], k * sizeof(Entry));
    a->carry.n += k;
    a->stack.n = from;
    return 0;
}

/* Push the continuation of a cut entry at ts: the same op, kind and call
 * site, under whatever is now below it; no new call. */
static int
continue_entry(Agg *a, const Entry *old, int64_t ts)
{
    int64_t below = visible_below(a, (int64_t)a->stack.n - 1);
    Entry *e = stack_slot(a);
    if (e == NULL)
        return -1;
    a->stack.n++;
    *e = *old;
    e->start = ts;
    e->self = 0;
    e->span = -1;
    if (e->hidden)
        return 0;
    const Entry *b = below >= 0 ? &a->stack.v[below] : NULL;
    int32_t node = node_for(a, b ? b->node : -1, e->row);
    if (node < 0)
        return -1;
    e->node = node;
    e->seq = ++a->pushes;
    e->outermost = a->active.v[e->row]++ == 0;
    if (a->want_spans && old->span >= 0) {
        GpSpanRow was = a->t->spans.v[old->span];
        if (push_span(a, e, ts, was.kind, b ? b->span : -1, 0) < 0)
            return -1;
        GpSpanRow *s = &a->t->spans.v[e->span];
        s->kind = was.kind;
        s->site = was.site;
        s->flags = was.flags;
        s->correlation = was.correlation;
        s->seq = was.seq;
    }
    return 0;
}

/* Continue the first k carried entries, in order. */
static int
continue_carry(Agg *a, size_t k, int64_t ts)
{
    for (size_t i = 0; i < k; i++)
        if (continue_entry(a, &a->carry.v[i], ts) < 0)
            return -1;
    if (k < a->carry.n) /* (carry.v may still be NULL when nothing was ever carried) */
        memmove(a->carry.v, &a->carry.v[k], (a->carry.n - k) * sizeof(Entry));
    a->carry.n -= k;
    return 0;
}

int
gp_replay_flush_carry(Agg *a, int64_t ts)
{
    return continue_carry(a, a->carry.n, ts);
}

static int
step_end(Agg *a, uint32_t step, int64_t ts)
{
    int follows = a->step_follows;
    a->step_follows = 0;
    int64_t i = find_top(a, E_STEP, 0, 1, step);
    if (i < 0)
        return 0;
    if (cut_to_carry(a, (size_t)i + 1, ts) < 0)
        return -1;
    remove_entry(a, (size_t)i, ts);
    /* The next step's begin places what was cut above itself; else it goes
     * on here. */
    return follows ? 0 : gp_replay_flush_carry(a, ts);
}

/* The stack position of a step begun with `popped` Python frames below it
 * returning during the step (payload - 1), over the stack and the carried
 * entries above it: right above the last Python frame that stays open. */
static size_t
step_position(const Agg *a, uint32_t payload)
{
    size_t n = a->stack.n, all = n + a->carry.n, py = 0;
    if (payload == 0)
        return all;
    for (size_t i = 0; i < all; i++)
        py += (i < n ? &a->stack.v[i] : &a->carry.v[i - n])->kind == E_PY;
    uint32_t popped = payload - 1;
    if (popped >= py)
        return 0;
    size_t keep = py - popped, seen = 0;
    for (size_t i = 0; i < all; i++)
        if ((i < n ? &a->stack.v[i] : &a->carry.v[i - n])->kind == E_PY && ++seen == keep)
            return i + 1;
    return all;
}

static int
step_begin(Agg *a, uint32_t step, uint32_t payload, int64_t ts)
{
    if ((int64_t)step + 1 == a->in->unclosed_step)
        return gp_replay_flush_carry(a, ts); /* its end is stop()'s: no step */
    size_t n = a->stack.n, at = step_position(a, payload);
    if (at <= n) {
        if (cut_to_carry(a, at, ts) < 0)
            return -1;
    } else if (continue_carry(a, at - n, ts) < 0) {
        return -1;
    }
    StepMark *m = VEC_PUSH(a->stepmarks);
    if (m == NULL)
        return -1;
    m->step = step;
    m->start_ns = ts;
    m->end_ns = -1;
    m->thread = a->thread;
    if (push_entry(a, ts, E_STEP, GP_OP_STEP, GP_OPID_STEP, 0, 1, 0) < 0)
        return -1;
    a->stack.v[a->stack.n - 1].op = step;
    return gp_replay_flush_carry(a, ts);
}

/* GP_EV_NVTX_TORCH: what PyTorch's message said about the range just pushed
 * (the entry on top; a merged node range gives it to the wrapper below). */
static int
nvtx_torch(Agg *a, const GpEvent *ev)
{
    size_t n = a->stack.n;
    if (n == 0 || (a->stack.v[n - 1].kind != E_NVTX && a->stack.v[n - 1].kind != E_NVTX_SE))
        return 0; /* its push was not recorded */
    Entry *e = &a->stack.v[n - 1];
    /* (engine is set only on NVTX entries: replay_thread.c's fast path leaves
     * it unset on the calls it pushes) */
    if (e->hidden && n >= 2 && a->stack.v[n - 2].kind == e->kind && a->stack.v[n - 2].engine)
        e = &a->stack.v[n - 2];
    uint32_t flags = GP_EV_PAYLOAD(ev->kind);
    if (flags & GP_NVTXT_ENGINE)
        e->engine = 1;
    if (e->hidden)
        return 0;
    if (flags & GP_NVTXT_AUTOGRAD)
        a->t->ops.v[e->row].flags |= GP_OPF_AUTOGRAD;
    if ((flags & GP_NVTXT_SEQ) && e->span >= 0)
        a->t->spans.v[e->span].seq = (int32_t)(ev->arg & 0x7fffffffu);
    return 0;
}

/* ---- autograd nodes ---------------------------------------------------------
 * autograd's engine runs a node's function inside the node's range, then,
 * still for that node and outside the range: validate_outputs (sum_to a
 * broadcast input's shape, casts to its dtype), the node's post hooks (DDP's
 * reducer) and the accumulation of its outputs into the next nodes' input
 * buffers. The launches of that tail belong to the node; with emit_nvtx() the
 * engine's evaluate_function wrapper covers them, without it nothing does. So
 * a node range that pops at the bottom of its thread's stack stays open
 * while only CUDA API calls follow on that thread, and closes at the end of
 * the last of them, before any other event (the next node's range, a
 * Python frame, the thread's end). The time after that end, charged to it
 * meanwhile as self time, is taken back. */

void
gp_replay_close_linger(Agg *a, int64_t now)
{
    a->lingering = 0;
    if (a->stack.n != 1) { /* a launch still open (not seen): the node ends now */
        if (a->stack.n > 1)
            remove_entry(a, 0, now);
        return;
    }
    int64_t end = a->linger_end < now ? a->linger_end : now;
    a->stack.v[0].self -= now - end; /* the idle time since, charged to it meanwhile */
    a->busy -= now - end;
    remove_entry(a, 0, end);
}

/* The pop of the range at stack index i: lingers (above), or closes now. */
static void
nvtx_pop(Agg *a, int64_t i, int64_t ts)
{
    const Entry *e = &a->stack.v[i];
    if (i == 0 && a->stack.n == 1 && e->kind == E_NVTX && !e->hidden &&
        (a->t->ops.v[e->row].flags & GP_OPF_AUTOGRAD)) {
        a->lingering = 1;
        a->linger_end = ts;
        return;
    }
    remove_entry(a, (size_t)i, ts);
}

/* GP_EV_SEQ: the nodes [arg - payload, arg) were made in the innermost open
 * call (hook.c, "autograd sequence numbers"), the frame that ran the C code
 * that made them; ranges, steps and gpuprof's own frames are looked through. */
static int
seq_moved(Agg *a, const GpEvent *ev, int64_t ts)
{
    uint32_t moved = GP_EV_PAYLOAD(ev->kind);
    if (moved == 0)
        return 0; /* the window's first reading on this thread */
    int32_t node = -1, span = -1;
    for (size_t i = a->stack.n; i-- > 0;) {
        const Entry *e = &a->stack.v[i];
        if ((e->kind == E_PY || e->kind == E_C) && !e->hidden) {
            node = e->node;
            span = e->span;
            break;
        }
    }
    GpSeqRow *r = VEC_PUSH(a->t->seqs);
    if (r == NULL)
        return -1;
    int64_t hi = (int64_t)ev->arg, lo = hi - (int64_t)moved;
    r->ts = ts;
    r->lo = (int32_t)(lo < 0 ? 0 : lo); /* (a counter past 2^31 wraps: its first nodes are lost) */
    r->hi = (int32_t)hi;
    r->node = node;
    r->span = span;
    r->thread = a->thread;
    return 0;
}

static int
replay_other(Agg *a, const GpEvent *ev, int64_t ts)
{
    uint32_t kind = GP_EV_KIND(ev->kind);
    switch (kind) {
    case GP_EV_RANGE_PUSH:
        return push_entry(a, ts, E_RANGE, GP_OP_USER, ev->arg, 0, 1, 0);
    case GP_EV_RANGE_POP: {
        int64_t i = find_top(a, E_RANGE, 0, 1, ev->arg);
        if (i >= 0)
            remove_entry(a, (size_t)i, ts);
        return 0;
    }
    case GP_EV_STEP_BEGIN:
        return step_begin(a, ev->arg, GP_EV_PAYLOAD(ev->kind), ts);
    case GP_EV_STEP_END:
        return step_end(a, ev->arg, ts);
    case GP_EV_API_ENTER:
        return on_api_enter(a, ts, ev->arg, GP_EV_PAYLOAD(ev->kind));
    case GP_EV_API_EXIT: {
        int64_t i = find_top(a, E_API, 0, 0, 0);
        if (i >= 0)
            remove_entry(a, (size_t)i, ts);
        if (a->lingering)
            a->linger_end = ts;
        return 0;
    }
    case GP_EV_NVTX_PUSH:
    case GP_EV_NVTX_START: {
        uint8_t ek = kind == GP_EV_NVTX_PUSH ? E_NVTX : E_NVTX_SE;
        uint32_t key = GP_EV_PAYLOAD(ev->kind);
        /* A node's own range right inside the engine's wrapper of the same
         * node (emit_nvtx): one call of the node, so the inner range is hidden
         * and its time and launches are the wrapper's. */
        const Entry *top = a->stack.n ? &a->stack.v[a->stack.n - 1] : NULL;
        int merged =
            top && top->engine && top->kind == ek && top->op == ev->arg && top->nvtx == key;
        if (push_entry(a, ts, ek, GP_OP_NVTX, ev->arg, merged, 1, 0) < 0)
            return -1;
        a->stack.v[a->stack.n - 1].nvtx = key;
        return 0;
    }
    case GP_EV_NVTX_TORCH:
        return nvtx_torch(a, ev);
    case GP_EV_SEQ:
        return seq_moved(a, ev, ts);
    case GP_EV_MODULE: {
        /* the Module.__call__ frame just pushed (hook.c, "module instances") */
        size_t n = a->stack.n;
        if (n > 0 && a->stack.v[n - 1].kind == E_PY && a->stack.v[n - 1].span >= 0)
            a->t->spans.v[a->stack.v[n - 1].span].module = ev->arg + 1;
        return 0;
    }
    case GP_EV_NVTX_POP:
    case GP_EV_NVTX_END: {
        /* An end recorded on another thread closes the range on the thread
         * that started it (merged into that thread's replay). */
        if (kind == GP_EV_NVTX_END && ev->arg != a->buf_index)
            return 0;
        int64_t i =
            find_nvtx(a, kind == GP_EV_NVTX_POP ? E_NVTX : E_NVTX_SE, GP_EV_PAYLOAD(ev->kind));
        if (i >= 0)
            nvtx_pop(a, i, ts);
        return 0;
    }
    default:
        return 0;
    }
}

/* Replay one event at time ts (ns, clamped): every kind, in general (the
 * thread's stack in `a`). Out of line: replay_run handles the common
 * events itself and calls this for the rest. */
__attribute__((noinline)) int
gp_replay_event(Agg *a, const GpEvent *ev, int64_t ts)
{
    uint32_t kind = GP_EV_KIND(ev->kind);
    if (GP_UNLIKELY(a->lingering) && kind != GP_EV_API_ENTER && kind != GP_EV_API_EXIT)
        gp_replay_close_linger(a, ts);
    switch (kind) {
    case GP_EV_FRAME:
    case GP_EV_CALL:
    case GP_EV_RESUME:
    case GP_EV_CCALL: {
        uint32_t op = ev->arg;
        int known = op < a->in->n_ops;
        int hidden = known && (a->in->op_flags[op] & GP_OPF_HIDDEN);
        /* C calls made by gpuprof's own Python code are part of its cost,
         * not the user's: hide them too. */
        if (kind == GP_EV_CCALL && caller_is_hidden(a))
            hidden = 1;
        uint8_t ek = kind == GP_EV_CCALL ? E_C : E_PY;
        uint8_t ok = known ? a->in->op_kinds[op] : GP_OP_NONE;
        if (push_entry(a, ts, ek, ok, op, hidden, kind == GP_EV_CALL || kind == GP_EV_CCALL,
                       kind == GP_EV_FRAME) < 0)
            return -1;
        if (a->want_spans && GP_EV_PAYLOAD(ev->kind) != 0) {
            /* the call site in the caller (hook.c): every C call, and a Python
             * frame that the user's code entered in a library */
            int32_t span = a->stack.v[a->stack.n - 1].span;
            if (span >= 0)
                a->t->spans.v[span].site = GP_EV_PAYLOAD(ev->kind);
        }
        return 0;
    }
    case GP_EV_RETURN: {
        int64_t i = find_top(a, E_PY, 0, 0, 0);
        if (i < 0)
            return 0; /* returns from frames entered before the window */
        /* C calls above it lost their return (cannot happen in CPython, but
         * a truncated stream must not corrupt the stack); ranges, steps
         * and API calls stay open and move down. */
        for (int64_t k = (int64_t)a->stack.n - 1; k > i; k--)
            if (a->stack.v[k].kind == E_C)
                remove_entry(a, (size_t)k, ts);
        if ((size_t)i + 2 == a->stack.n && reparent_nvtx(a, (size_t)i) < 0)
            return -1;
        remove_entry(a, (size_t)i, ts);
        return 0;
    }
    case GP_EV_CRETURN: {
        int64_t i = find_top(a, E_C, E_PY, 0, 0);
        if (i >= 0) {
            if ((size_t)i + 2 == a->stack.n && reparent_nvtx(a, (size_t)i) < 0)
                return -1;
            remove_entry(a, (size_t)i, ts);
        }
        return 0;
    }
    default:
        return replay_other(a, ev, ts);
    }
}

void
gp_replay_remove_entry(Agg *a, size_t i, int64_t ts)
{
    remove_entry(a, i, ts);
}
