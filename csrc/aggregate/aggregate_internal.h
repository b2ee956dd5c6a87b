/* What the files of the aggregation share (aggregate.c: the run and its
 * tables; replay.c: the replay state and one event; replay_thread.c: one
 * thread's events in order, with the fast path for calls and returns;
 * gpu_join.c: GPU records joined to their launches, and the step rows).
 * Internal to those files. */
#ifndef GPUPROF_CSRC_AGGREGATE_INTERNAL_H
#define GPUPROF_CSRC_AGGREGATE_INTERNAL_H

#include "aggregate.h"
#include "opkinds.h"
#include "u64map.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- small growable arrays ---------------------------------------------- */

static inline void *
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

/* Append a zeroed item; evaluates to a pointer to it or NULL. */
#define VEC_PUSH(vec)                                                                              \
    (vec_grow((void **)&(vec).v, &(vec).cap, (vec).n + 1, sizeof(*(vec).v)) == NULL                \
         ? NULL                                                                                    \
         : memset(&(vec).v[(vec).n++], 0, sizeof(*(vec).v)))

/* ---- replay state -------------------------------------------------------- */

enum { E_PY = 1, E_C, E_RANGE, E_STEP, E_API, E_NVTX, E_NVTX_SE };

typedef struct Entry {
    int64_t start;  /* this piece's start (a call cut at a step boundary goes on) */
    int64_t origin; /* the call's start: its duration for min and max */
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
    uint8_t engine; /* E_NVTX, E_NVTX_SE: autograd's evaluate_function wrapper
                       (GP_NVTXT_ENGINE); unset for other kinds */
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

/* Map value of a node taken back (reparent_nvtx): node_for makes a new one. */
#define NODE_GONE (UINT32_MAX - 1)

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
    GpU64Map nvtx_rows;        /* NVTX name id -> op row */
    GpEvent *foreign_ends;/* NVTX ends recorded on another thread than the start, by ts (ns) */
    size_t n_foreign_ends;
    NodeMap nodes;        /* (parent node, row) -> node */
    GP_VEC(Entry) stack;
    GP_VEC(Launch) launches;
    GP_VEC(StepMark) stepmarks;
    GpU64Map corr;             /* correlation -> launch index */
    uint8_t *api_used;    /* per GPU record: an API record merged into a thread's events */
    uint32_t thread;      /* index of the thread being replayed */
    uint32_t buf_index;   /* its GpThreadBuf.index (NVTX range ends name it) */
    uint32_t pushes;      /* non-hidden entries pushed so far */
    /* Steps as siblings (replay.c, "step boundaries") */
    GP_VEC(Entry) carry;  /* entries cut at a step end, to go on above the next step */
    int step_follows;     /* this step end's next event is the next step's begin */
    int64_t busy;         /* this thread's time with a non-empty stack */
    int64_t self_sum;
    /* An autograd node's range that popped at the bottom of its thread's stack
     * stays open while only launches follow (replay.c, "autograd nodes"). */
    int lingering;
    int64_t linger_end;   /* its pop, or the exit of the last launch since */
} Agg;

static inline int
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
    s->seq = -1;
    return 0;
}

/* The statistics of one piece of visible stack entry e, ending at `end`: its
 * op row's and call-tree node's self and total time, its row's count of open
 * entries and its span's end; its self time is added to *self_sum. A call cut
 * at a step boundary (replay.c) ends a piece without ending the call. */
static inline void
close_piece_stats(GpOpRow *ops, GpNodeRow *nodes, int32_t *active, GpSpanRow *spans, const Entry *e,
                  int64_t end, int64_t *self_sum)
{
    int64_t dur = end - e->start;
    GpOpRow *r = &ops[e->row];
    GpNodeRow *n = &nodes[e->node];
    r->cpu_self_ns += e->self;
    n->self_ns += e->self;
    n->total_ns += dur;
    *self_sum += e->self;
    active[e->row]--;
    if (e->outermost)
        r->cpu_total_ns += dur;
    if (e->span >= 0)
        spans[e->span].end_ns = end;
}

/* The end of visible stack entry e at `end`: its last piece, and the call's
 * duration (over all its pieces) into its op row's min and max. Both replay
 * paths (replay.c, replay_thread.c) end entries with it. */
static inline void
close_entry_stats(GpOpRow *ops, GpNodeRow *nodes, int32_t *active, GpSpanRow *spans, const Entry *e,
                  int64_t end, int64_t *self_sum)
{
    close_piece_stats(ops, nodes, active, spans, e, end, self_sum);
    GpOpRow *r = &ops[e->row];
    int64_t call = end - e->origin;
    if (call < r->cpu_min_ns)
        r->cpu_min_ns = call;
    if (call > r->cpu_max_ns)
        r->cpu_max_ns = call;
}

/* ---- replay.c ------------------------------------------------------------ */

/* The call-tree node table with room for about cap nodes. 0, or -1 when out of memory. */
int gp_replay_nodemap_init(NodeMap *m, size_t cap);

/* Replay one event of the current thread at ts (any kind: the general path).
 * 0, or -1 when out of memory. */
int gp_replay_event(Agg *a, const GpEvent *ev, int64_t ts);

/* End the stack entry i at ts and take it off the stack (from the middle too). */
void gp_replay_remove_entry(Agg *a, size_t i, int64_t ts);

/* Entries cut at a step end and not yet continued go on at ts (a step end
 * with no begin after it). 0, or -1 when out of memory. */
int gp_replay_flush_carry(Agg *a, int64_t ts);
/* Close the lingering autograd node range (replay.c) at what `now` leaves of it. */
void gp_replay_close_linger(Agg *a, int64_t now);

/* ---- replay_thread.c ------------------------------------------------------ */

/* The NVTX range ends recorded on another thread than their start, by time.
 * 0, or -1 when out of memory. */
int gp_replay_thread_foreign_ends(Agg *a, const GpClockMap *clock);

/* Replay every event of one thread into the tables; fills tr. 0, or -1 when
 * out of memory. */
int gp_replay_thread_run(Agg *a, const GpWindowThread *tb, GpThreadRow *tr,
                         const GpClockMap *clock);

/* ---- gpu_join.c ----------------------------------------------------------- */

/* Join the GPU records to their launches: kernel and GPU event rows, GPU time
 * charged along the call tree. 0, or -1 when out of memory. */
int gp_gpu_join_build(Agg *a, size_t *span_lo, size_t *span_hi, uint32_t step_thread);

/* The step rows' GPU busy, idle, communication, copy and sync-wait times.
 * 0, or -1 when out of memory. */
int gp_gpu_join_steps(Agg *a);

/* ---- shapes.c ------------------------------------------------------------ */

/* Give the input sizes of the steps that recorded them to the later steps of
 * the window that ran the same ops and launches (shapes.c), counting them in
 * out->shapes_*; before the replay. 0, or -1 when out of memory. */
int gp_shapes_reuse(const GpAggInput *in, GpTables *out);

#endif /* GPUPROF_CSRC_AGGREGATE_INTERNAL_H */
