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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "demangle.h"
#include "opkinds.h"

/* ---- small growable arrays ---------------------------------------------- */

static void *
vec_grow(void **v, size_t *cap, size_t need, size_t item)
{
    if (need <= *cap)
        return *v;
    size_t cap2 = *cap ? *cap : 64;
    while (cap2 < need)
        cap2 *= 2;
    void *p = realloc(*v, cap2 * item);
    if (p == NULL)
        return NULL;
    *v = p;
    *cap = cap2;
    return p;
}

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

/* Append a zeroed item; evaluates to a pointer to it or NULL. */
#define VEC_PUSH(vec)                                                                              \
    (vec_grow((void **)&(vec).v, &(vec).cap, (vec).n + 1, sizeof(*(vec).v)) == NULL                \
         ? NULL                                                                                    \
         : memset(&(vec).v[(vec).n++], 0, sizeof(*(vec).v)))

/* ---- open-addressing map: uint64 key -> uint32 value ------------------- */

typedef struct Map {
    uint64_t *keys;
    uint32_t *vals; /* UINT32_MAX = empty */
    size_t mask;
    size_t used;
} Map;

static uint64_t
mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static int
map_init(Map *m, size_t cap)
{
    size_t c = 64;
    while (c < cap * 2)
        c *= 2;
    m->keys = malloc(c * sizeof(uint64_t));
    m->vals = malloc(c * sizeof(uint32_t));
    if (!m->keys || !m->vals)
        return -1;
    memset(m->vals, 0xff, c * sizeof(uint32_t));
    m->mask = c - 1;
    m->used = 0;
    return 0;
}

static void
map_free(Map *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof(*m));
}

static uint32_t
map_get(const Map *m, uint64_t key)
{
    size_t i = mix64(key) & m->mask;
    while (m->vals[i] != UINT32_MAX) {
        if (m->keys[i] == key)
            return m->vals[i];
        i = (i + 1) & m->mask;
    }
    return UINT32_MAX;
}

static int
map_put(Map *m, uint64_t key, uint32_t val)
{
    if ((m->used + 1) * 2 > m->mask + 1) {
        Map bigger;
        if (map_init(&bigger, (m->mask + 1)) < 0) {
            map_free(&bigger);
            return -1;
        }
        for (size_t i = 0; i <= m->mask; i++)
            if (m->vals[i] != UINT32_MAX)
                map_put(&bigger, m->keys[i], m->vals[i]);
        map_free(m);
        *m = bigger;
    }
    size_t i = mix64(key) & m->mask;
    while (m->vals[i] != UINT32_MAX) {
        if (m->keys[i] == key) {
            m->vals[i] = val;
            return 0;
        }
        i = (i + 1) & m->mask;
    }
    m->keys[i] = key;
    m->vals[i] = val;
    m->used++;
    return 0;
}

/* ---- replay state -------------------------------------------------------- */

enum { E_PY = 1, E_C, E_RANGE, E_STEP, E_API, E_NVTX, E_NVTX_SE };

typedef struct Entry {
    int64_t start;
    int64_t self;
    uint32_t row;   /* op row, UINT32_MAX when hidden */
    int32_t node;
    int32_t span;   /* span index, -1 when hidden or spans are not built */
    uint32_t seq;   /* Agg.pushes when it was pushed (reparent_nvtx) */
    uint32_t op;    /* intern op id, step number, or api key */
    uint32_t launch;/* E_API: index into launches (unset for other kinds) */
    uint32_t nvtx;  /* E_NVTX: domain index; E_NVTX_SE: range tag (unset for other kinds) */
    uint8_t kind;   /* E_* */
    uint8_t hidden;
    uint8_t outermost;
} Entry;

typedef struct Launch {
    int64_t enter_ns;
    int64_t exit_ns;
    uint32_t correlation;
    uint32_t api_key;
    uint32_t owner_row; /* UINT32_MAX: orphan (no Python op on its thread) */
    int32_t owner_node;
    uint32_t thread;
} Launch;

typedef struct StepMark {
    int64_t step;
    int64_t start_ns;
    int64_t end_ns;
    uint32_t thread;
} StepMark;

/* (parent node, op row) -> call-tree node: one lookup per call, so a flat
 * table of 16-byte slots, Fibonacci-hashed, kept at most half full. */
typedef struct NodeSlot {
    uint64_t key;
    uint32_t val; /* UINT32_MAX: empty */
    uint32_t pad;
} NodeSlot;

typedef struct NodeMap {
    NodeSlot *s;
    size_t mask, used;
    unsigned shift; /* 64 - log2(capacity) */
} NodeMap;

GP_INLINE uint64_t
node_key(int32_t parent, uint32_t row, uint32_t thread)
{
    /* Roots are keyed per thread so that each thread has its own tree. */
    uint64_t pkey = parent >= 0 ? (uint64_t)parent : (0x80000000ull | thread);
    return (pkey << 32) | row;
}

static int
nodemap_init(NodeMap *m, size_t cap)
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

GP_INLINE uint32_t
nodemap_get(const NodeMap *m, uint64_t key)
{
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> m->shift);
    for (;;) {
        const NodeSlot *s = &m->s[i];
        if (s->key == key)
            return s->val;
        if (s->val == UINT32_MAX)
            return UINT32_MAX;
        i = (i + 1) & m->mask;
    }
}

static int
nodemap_put(NodeMap *m, uint64_t key, uint32_t val)
{
    if ((m->used + 1) * 2 > m->mask + 1) {
        NodeMap bigger;
        if (nodemap_init(&bigger, m->mask + 1) < 0)
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

typedef struct Agg {
    const GpAggInput *in;
    GpTables *t;
    int want_spans;       /* build the span table (else only the tables) */
    int32_t *row_of_op;   /* op id -> op row, -1 */
    int32_t *fast_row;    /* op id -> op row where a call needs no checks (known, not
                             hidden), else -1: replay_run's one test per call */
    uint32_t n_fast;      /* entries of fast_row (the op ids) */
    GP_VEC(int32_t) active;      /* per op row: open non-hidden entries */
    GP_VEC(uint32_t) api_rows;   /* (api key, row) pairs, flattened */
    Map nvtx_rows;        /* NVTX name id -> op row */
    GpEvent *foreign_ends;/* NVTX ends recorded on another thread than the start, by ts (ns) */
    size_t n_foreign_ends;
    NodeMap nodes;        /* (parent node, row) -> node */
    GP_VEC(Entry) stack;
    GP_VEC(Launch) launches;
    GP_VEC(StepMark) stepmarks;
    Map corr;             /* correlation -> launch index */
    uint8_t *api_used;    /* per GPU record: an API record merged into a thread's events */
    uint32_t thread;      /* index of the thread being replayed */
    uint32_t buf_index;   /* its GpThreadBuf.index (NVTX range ends name it) */
    uint32_t pushes;      /* non-hidden entries pushed so far */
    int64_t busy;         /* this thread's time with a non-empty stack */
    int64_t self_sum;
} Agg;

static int64_t
op_row_slow(Agg *a, uint32_t op, uint8_t kind)
{
    if (kind == GP_OP_CUDA_API) {
        for (size_t i = 0; i + 1 < a->api_rows.n; i += 2)
            if (a->api_rows.v[i] == op)
                return a->api_rows.v[i + 1];
    } else if (kind == GP_OP_NVTX) {
        uint32_t hit = map_get(&a->nvtx_rows, op);
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
        if (map_put(&a->nvtx_rows, op, row) < 0)
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

/* Map value of a node taken back (reparent_nvtx): node_for makes a new one. */
#define NODE_GONE (UINT32_MAX - 1)

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

static int
push_span(Agg *a, Entry *e, int64_t ts, uint8_t opkind, int32_t parent_span, int snapshot)
{
    GpSpanRow *s = VEC_PUSH(a->t->spans);
    if (s == NULL)
        return -1;
    e->span = (int32_t)(a->t->spans.n - 1);
    s->start_ns = ts;
    s->end_ns = ts;
    s->op_row = e->row;
    s->parent = parent_span;
    s->thread = a->thread;
    s->node = e->node;
    s->kind = opkind == GP_OP_NVTX ? GP_OP_USER : opkind;
    s->flags = snapshot ? GP_SF_ENTERED : 0;
    s->depth = (uint16_t)(parent_span >= 0 ? a->t->spans.v[parent_span].depth + 1 : 0);
    return 0;
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
        int64_t dur = ts - e->start;
        GpOpRow *r = &a->t->ops.v[e->row];
        GpNodeRow *n = &a->t->nodes.v[e->node];
        r->cpu_self_ns += e->self;
        n->self_ns += e->self;
        n->total_ns += dur;
        a->self_sum += e->self;
        a->active.v[e->row]--;
        if (e->outermost)
            r->cpu_total_ns += dur;
        if (dur < r->cpu_min_ns)
            r->cpu_min_ns = dur;
        if (dur > r->cpu_max_ns)
            r->cpu_max_ns = dur;
        if (e->span >= 0)
            a->t->spans.v[e->span].end_ns = ts;
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
    if (corr != 0 && map_put(&a->corr, corr, li) < 0)
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
    case GP_EV_STEP_BEGIN: {
        if ((int64_t)ev->arg + 1 == a->in->unclosed_step)
            return 0; /* its end is stop()'s, which finds no entry to close */
        StepMark *m = VEC_PUSH(a->stepmarks);
        if (m == NULL)
            return -1;
        m->step = ev->arg;
        m->start_ns = ts;
        m->end_ns = -1;
        m->thread = a->thread;
        if (push_entry(a, ts, E_STEP, GP_OP_STEP, GP_OPID_STEP, 0, 1, 0) < 0)
            return -1;
        a->stack.v[a->stack.n - 1].op = ev->arg;
        return 0;
    }
    case GP_EV_STEP_END: {
        int64_t i = find_top(a, E_STEP, 0, 1, ev->arg);
        if (i >= 0)
            remove_entry(a, (size_t)i, ts);
        return 0;
    }
    case GP_EV_API_ENTER:
        return on_api_enter(a, ts, ev->arg, GP_EV_PAYLOAD(ev->kind));
    case GP_EV_API_EXIT: {
        int64_t i = find_top(a, E_API, 0, 0, 0);
        if (i >= 0)
            remove_entry(a, (size_t)i, ts);
        return 0;
    }
    case GP_EV_NVTX_PUSH:
    case GP_EV_NVTX_START: {
        uint8_t ek = kind == GP_EV_NVTX_PUSH ? E_NVTX : E_NVTX_SE;
        if (push_entry(a, ts, ek, GP_OP_NVTX, ev->arg, 0, 1, 0) < 0)
            return -1;
        a->stack.v[a->stack.n - 1].nvtx = GP_EV_PAYLOAD(ev->kind);
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
            remove_entry(a, (size_t)i, ts);
        return 0;
    }
    default:
        return 0;
    }
}

/* Replay one event at time ts (ns, clamped): every kind, in general (the
 * thread's stack in `a`). Out of line: replay_run handles the common
 * events itself and calls this for the rest. */
static __attribute__((noinline)) int
replay_event(Agg *a, const GpEvent *ev, int64_t ts)
{
    uint32_t kind = GP_EV_KIND(ev->kind);
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
        if (kind == GP_EV_CCALL && a->want_spans) {
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
static int
collect_foreign_ends(Agg *a, const GpClockMap *clock)
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
 * node exists. They do exactly what replay_event would do (which handles
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
                    int64_t dur = last - e->start;
                    GpOpRow *r = &ops[e->row];
                    GpNodeRow *n = &nodes[e->node];
                    r->cpu_self_ns += e->self;
                    n->self_ns += e->self;
                    n->total_ns += dur;
                    self_sum += e->self;
                    active[e->row]--;
                    if (e->outermost)
                        r->cpu_total_ns += dur;
                    if (dur < r->cpu_min_ns)
                        r->cpu_min_ns = dur;
                    if (dur > r->cpu_max_ns)
                        r->cpu_max_ns = dur;
                    if (e->span >= 0)
                        a->t->spans.v[e->span].end_ns = last;
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
                        if (kind == GP_EV_CCALL)
                            a->t->spans.v[e->span].site = GP_EV_PAYLOAD(ev->kind);
                    }
                    continue;
                }
            }
        }
        /* Anything else: the general path, on the state written back. */
        a->stack.n = (size_t)(p - sv);
        a->busy = busy;
        a->self_sum = self_sum;
        a->pushes = pushes;
        if (replay_event(a, ev, last) < 0)
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

static int
replay_thread(Agg *a, const GpWindowThread *tb, GpThreadRow *tr, const GpClockMap *clock)
{
    size_t n_api = 0;
    GpEvent *api = api_events_for_thread(a->in, tb, a->api_used, &n_api);
    if (a->n_foreign_ends > 0 && merge_foreign_ends(a, tb, &api, &n_api) < 0) {
        free(api);
        return -1;
    }
    a->buf_index = tb->index;
    a->stack.n = 0;
    a->busy = 0;
    a->self_sum = 0;
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
                if (replay_event(a, &api[ai++], last) < 0) {
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
            if (replay_event(a, ev, last) < 0) {
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
        if (replay_event(a, &api[ai], last) < 0)
            rc = -1;
    }
    free(api);
    if (rc < 0)
        return -1;
    if (last >= 0 && end > last && a->stack.n > 0) {
        a->stack.v[a->stack.n - 1].self += end - last;
        a->busy += end - last;
    }
    while (a->stack.n > 0)
        remove_entry(a, a->stack.n - 1, end);
    tr->last_ns = last >= 0 ? end : 0;
    tr->busy_ns = a->busy;
    tr->self_sum_ns = a->self_sum;
    return 0;
}

/* ---- GPU side ------------------------------------------------------------ */

static int
cmp_gpu_start(const void *x, const void *y)
{
    const GpGpuRecord *a = x, *b = y;
    return (a->start_ns > b->start_ns) - (a->start_ns < b->start_ns);
}

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

/* Add GPU time `dur` to node and all its ancestors, and to each distinct op
 * row on that path (stamp prevents double counting under recursion). */
static void
charge_gpu(GpTables *t, int32_t node, int64_t dur, uint32_t *stamp, uint32_t mark)
{
    for (int32_t n = node; n >= 0; n = t->nodes.v[n].parent) {
        GpNodeRow *nr = &t->nodes.v[n];
        nr->cuda_total_ns += dur;
        if (stamp[nr->op_row] != mark) {
            stamp[nr->op_row] = mark;
            t->ops.v[nr->op_row].cuda_total_ns += dur;
        }
    }
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

static int
build_gpu(Agg *a, size_t *span_lo, size_t *span_hi, uint32_t step_thread)
{
    const GpAggInput *in = a->in;
    GpTables *t = a->t;
    Map kmap;
    if (map_init(&kmap, 256) < 0)
        return -1;
    uint32_t *stamp = calloc(t->ops.n + 1, sizeof(uint32_t));
    if (stamp == NULL) {
        map_free(&kmap);
        return -1;
    }
    int rc = -1;
    for (size_t i = 0; i < in->n_gpu; i++) {
        const GpGpuRecord *g = &in->gpu[i];
        if (g->kind == GP_GPU_API)
            continue;
        uint32_t li = g->correlation ? map_get(&a->corr, g->correlation) : UINT32_MAX;
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
        int32_t node = -1;
        if (li != UINT32_MAX) {
            const Launch *l = &a->launches.v[li];
            r->thread = (int32_t)l->thread;
            if (l->owner_row != UINT32_MAX) {
                row = l->owner_row;
                node = l->owner_node;
                r->flags |= GP_GF_ATTRIBUTED;
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
            if (row != UINT32_MAX)
                t->ops.v[row].cuda_mem_self_bytes +=
                    g->kind == GP_GPU_MALLOC ? (int64_t)g->bytes : -(int64_t)g->bytes;
            continue;
        }

        /* Kernel table row. */
        uint64_t key = activity_key(g);
        uint32_t kr = map_get(&kmap, key);
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
            if (map_put(&kmap, key, kr) < 0)
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
            charge_gpu(t, node, dur, stamp, (uint32_t)(i + 1));
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
    map_free(&kmap);
    return rc;
}

static int
build_steps(Agg *a)
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
    if (!span_lo || !span_hi || !a.row_of_op || !a.fast_row || nodemap_init(&a.nodes, 1024) < 0 ||
        map_init(&a.corr, 1024) < 0 || map_init(&a.nvtx_rows, 64) < 0)
        goto done;
    if (in->nvtx_cross_thread_ends && collect_foreign_ends(&a, &clock) < 0)
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
        if (replay_thread(&a, tb, tr, &clock) < 0)
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
        if (map_put(&a.corr, g->correlation, (uint32_t)(a.launches.n - 1)) < 0)
            goto done;
    }
    if (build_gpu(&a, span_lo, span_hi, step_thread) < 0)
        goto done;
    if (out->gpu.n > 1)
        qsort(out->gpu.v, out->gpu.n, sizeof(GpGpuEventRow), cmp_gpu_row_start);
    if (build_steps(&a) < 0)
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
    free(a.nodes.s);
    map_free(&a.corr);
    map_free(&a.nvtx_rows);
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
    memset(t, 0, sizeof(*t));
}
