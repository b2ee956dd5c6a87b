/* Input shapes recorded on some steps, given to the steps that ran the same.
 *
 * PyTorch writes an op's input sizes into its NVTX message as text, at about
 * 1.75 us an op on the H100 (docs/benchmarks.md): most of what
 * record_shapes costs. With reuse (the profile's reuse_shapes, the default)
 * the sizes are asked for on the first recorded step of each window only
 * (python/gpuprof/record/_autograd.py); the other steps' ranges carry the
 * op's name alone. Here, before the replay, each later step is compared
 * with the steps that carried sizes, thread by thread:
 *
 *   - the sequence of its NVTX range opens and closes, by name without
 *     sizes (gp_nvtx_base_key), and
 *   - each CUDA API call in order, with what the GPU ran for it (kernel name,
 *     grid, block, shared memory; copy and set sizes), joined through the
 *     correlation id.
 *
 * A step that matches a sized step on every one of those gets the sized
 * step's range names: its push events' name ids are rewritten in place to
 * the sized ones, so every table and trace shows the shapes as if they had
 * been recorded. A step that matches none keeps its unsized names and is
 * counted (GpTables.shapes_unmatched_steps; docs/aten.md says what to do).
 * Shapes that change between steps change the launches, so they are never
 * given to a step that did not run them; an op whose shapes change without
 * any launch changing (a view of another size feeding the same kernel) is
 * the case this cannot see.
 *
 * A step is [its GP_EV_STEP_BEGIN on the step thread, the next one), on the
 * raw clock of the events, which every thread shares. Rewriting is
 * idempotent: a second aggregation of the same events (kept spans,
 * csrc/results/window.c) finds the rewritten steps sized and leaves them.
 */
#include "aggregate_internal.h"

/* One thread's part of one step. */
typedef struct StepSig {
    uint64_t hash;     /* of the sequence of items (below) */
    uint32_t items;    /* NVTX opens and closes and CUDA API calls */
    uint32_t opens;    /* NVTX range opens */
    uint32_t sized;    /* of those, names with input sizes */
    GpChunk *chunk;    /* its first event (NULL: none) */
    uint32_t at;
} StepSig;

/* An NVTX name id's name without its sizes (gp_nvtx_base_key), cached. */
typedef struct BaseName {
    uint64_t key;
    uint8_t sized; /* the name carried input sizes */
} BaseName;

typedef struct Shapes {
    const GpAggInput *in;
    const uint64_t *bounds; /* step begins, raw clock, ascending */
    size_t n_steps;
    GpU64Map gpu_of_corr;   /* correlation -> index into gpu_hash */
    uint64_t *gpu_hash;
    GpU64Map base_of_id;    /* NVTX name id -> index into bases */
    GP_VEC(BaseName) bases;
    uint32_t *sample_args;  /* a sized step's open name ids, in order */
    size_t n_sample, cap_sample;
} Shapes;

static inline uint64_t
chain(uint64_t h, uint64_t item)
{
    return mix64(h ^ (item + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)));
}

/* The base key of NVTX name id `id` and whether it carried sizes; -1 when
 * out of memory. Unknown ids are their own key, unsized. */
static int
base_of(Shapes *s, uint32_t id, uint64_t *key, int *sized)
{
    uint32_t i = gp_u64map_get(&s->base_of_id, id);
    if (i == UINT32_MAX) {
        BaseName *b = VEC_PUSH(s->bases);
        if (b == NULL)
            return -1;
        int rc = s->in->nvtx_base(id, &b->key);
        if (rc < 0)
            b->key = mix64((uint64_t)id | 1ull << 40);
        b->sized = rc == 1;
        i = (uint32_t)(s->bases.n - 1);
        if (gp_u64map_put(&s->base_of_id, id, i) < 0)
            return -1;
    }
    *key = s->bases.v[i].key;
    *sized = s->bases.v[i].sized;
    return 0;
}

/* What the GPU ran for each correlation id: a hash of its kernels' names and
 * launch shapes and its copies' and sets' sizes, in any order. */
static int
hash_gpu_work(Shapes *s)
{
    const GpAggInput *in = s->in;
    s->gpu_hash = calloc(in->n_gpu + 1, sizeof(uint64_t));
    if (s->gpu_hash == NULL || gp_u64map_init(&s->gpu_of_corr, in->n_gpu + 16) < 0)
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < in->n_gpu; i++) {
        const GpGpuRecord *g = &in->gpu[i];
        if (g->correlation == 0 ||
            (g->kind != GP_GPU_KERNEL && g->kind != GP_GPU_MEMCPY && g->kind != GP_GPU_MEMSET))
            continue;
        uint64_t h = chain(g->kind, g->kind == GP_GPU_KERNEL ? g->name_id : g->bytes);
        for (int d = 0; d < 3; d++)
            h = chain(h, (uint64_t)g->grid[d] << 32 | g->block[d]);
        h = chain(h, (uint64_t)g->static_smem << 32 | g->dynamic_smem);
        uint32_t k = gp_u64map_get(&s->gpu_of_corr, g->correlation);
        if (k == UINT32_MAX) {
            k = (uint32_t)n++;
            if (gp_u64map_put(&s->gpu_of_corr, g->correlation, k) < 0)
                return -1;
        }
        s->gpu_hash[k] += h; /* commutative: records of one launch in any order */
    }
    return 0;
}

/* The index of the step that raw time `ts` falls in, from *step up (events
 * of a thread come in time order); SIZE_MAX before the first step. */
static inline size_t
step_of(const Shapes *s, uint64_t ts, size_t *step)
{
    if (ts < s->bounds[0])
        return SIZE_MAX;
    while (*step + 1 < s->n_steps && ts >= s->bounds[*step + 1])
        (*step)++;
    return *step;
}

/* Fill sig[0..n_steps) for one thread's events. */
static int
sign_thread(Shapes *s, const GpWindowThread *tb, StepSig *sig)
{
    size_t step = 0;
    for (GpChunk *c = tb->head; c; c = c->next) {
        for (uint32_t i = 0; i < c->n; i++) {
            const GpEvent *ev = &c->ev[i];
            uint32_t kind = GP_EV_KIND(ev->kind);
            int open = kind == GP_EV_NVTX_PUSH || kind == GP_EV_NVTX_START;
            if (!open && kind != GP_EV_NVTX_POP && kind != GP_EV_NVTX_END &&
                kind != GP_EV_API_ENTER)
                continue;
            size_t j = step_of(s, ev->ts, &step);
            if (j == SIZE_MAX)
                continue;
            StepSig *g = &sig[j];
            uint64_t item = kind;
            if (open) {
                uint64_t key;
                int sized;
                if (base_of(s, ev->arg, &key, &sized) < 0)
                    return -1;
                /* a push's domain, not a start's range tag (new each time) */
                item = chain(key, kind == GP_EV_NVTX_PUSH ? ev->kind : kind);
                g->opens++;
                g->sized += (uint32_t)sized;
            } else if (kind == GP_EV_API_ENTER) {
                uint32_t k = gp_u64map_get(&s->gpu_of_corr, ev->arg);
                item = chain(ev->kind, k == UINT32_MAX ? 0 : s->gpu_hash[k]);
            }
            if (g->chunk == NULL) {
                g->chunk = c;
                g->at = i;
            }
            g->hash = chain(g->hash, item);
            g->items++;
        }
    }
    return 0;
}

/* Calls fn(s, event, k) for the k-th NVTX open of step j of a thread, from the
 * step's first signed event to the next step's begin, and sets *visited to how
 * many it visited; stops early when fn returns nonzero, and returns that. */
typedef int (*OpenFn)(Shapes *s, GpEvent *ev, size_t k);

static int
each_open(Shapes *s, const StepSig *g, size_t j, OpenFn fn, size_t *visited)
{
    uint64_t end = j + 1 < s->n_steps ? s->bounds[j + 1] : UINT64_MAX;
    size_t k = 0;
    int rc = 0;
    uint32_t i = g->at;
    for (GpChunk *c = g->chunk; c && rc == 0; c = c->next, i = 0) {
        for (; i < c->n && rc == 0; i++) {
            GpEvent *ev = &c->ev[i];
            if (ev->ts >= end)
                break;
            uint32_t kind = GP_EV_KIND(ev->kind);
            if (kind == GP_EV_NVTX_PUSH || kind == GP_EV_NVTX_START)
                rc = fn(s, ev, k++);
        }
        if (i < c->n && rc == 0) /* stopped at the next step's begin */
            break;
    }
    *visited = k;
    return rc;
}

/* The sized step's k-th open name id; 1 (stop) past as many as were signed. */
static int
take_sample(Shapes *s, GpEvent *ev, size_t k)
{
    if (k >= s->n_sample)
        return 1;
    s->sample_args[k] = ev->arg;
    return 0;
}

/* 0 where the candidate's k-th open has the sample's k-th open's base name
 * (a check of the hash's verdict), 1 where not, -1 out of memory. */
static int
check_open(Shapes *s, GpEvent *ev, size_t k)
{
    uint64_t a, b;
    int sa, sb;
    if (k >= s->n_sample)
        return 1;
    if (base_of(s, ev->arg, &a, &sa) < 0 || base_of(s, s->sample_args[k], &b, &sb) < 0)
        return -1;
    return a == b ? 0 : 1;
}

static int
rewrite_open(Shapes *s, GpEvent *ev, size_t k)
{
    ev->arg = s->sample_args[k];
    return 0;
}

/* Step j of a thread (sig) from the sized step it matches (sample); 1 when
 * given its sizes, 0 when the names did not check out, -1 out of memory. */
static int
give_sizes(Shapes *s, const StepSig *sig, size_t sample, size_t j)
{
    const StepSig *from = &sig[sample], *to = &sig[j];
    if (!vec_grow((void **)&s->sample_args, &s->cap_sample, from->opens, sizeof *s->sample_args))
        return -1;
    size_t n;
    s->n_sample = from->opens; /* room for as many as were signed */
    if (each_open(s, from, sample, take_sample, &n) != 0)
        return 0; /* more opens than signed: the events are not in time order */
    s->n_sample = n;
    int rc = each_open(s, to, j, check_open, &n);
    if (rc != 0 || n != s->n_sample)
        return rc < 0 ? -1 : 0;
    each_open(s, to, j, rewrite_open, &n);
    return 1;
}

enum { STEP_SIZED = 1, STEP_REUSED = 2, STEP_UNMATCHED = 4 };

static int
reuse_thread(Shapes *s, const GpWindowThread *tb, StepSig *sig, uint8_t *verdict)
{
    memset(sig, 0, s->n_steps * sizeof *sig);
    if (sign_thread(s, tb, sig) < 0)
        return -1;
    for (size_t j = 0; j < s->n_steps; j++) {
        const StepSig *g = &sig[j];
        if (g->sized > 0) {
            verdict[j] |= STEP_SIZED;
            continue;
        }
        if (g->opens == 0)
            continue;
        int given = 0;
        for (size_t k = 0; k < s->n_steps && !given; k++) {
            const StepSig *f = &sig[k];
            if (f->sized == 0 || f->hash != g->hash || f->items != g->items || f->opens != g->opens)
                continue;
            given = give_sizes(s, sig, k, j);
            if (given < 0)
                return -1;
        }
        verdict[j] |= given ? STEP_REUSED : STEP_UNMATCHED;
    }
    return 0;
}

int
gp_shapes_reuse(const GpAggInput *in, GpTables *out)
{
    if (in->nvtx_base == NULL)
        return 0;
    const GpWindowThread *steps = NULL;
    for (uint32_t k = 0; k < in->n_threads; k++)
        if (!in->threads[k].ignored && in->threads[k].ident == in->step_thread_ident)
            steps = &in->threads[k];
    if (steps == NULL)
        return 0;
    Shapes s;
    memset(&s, 0, sizeof s);
    s.in = in;
    GP_VEC(uint64_t) bounds = {0};
    StepSig *sig = NULL;
    uint8_t *verdict = NULL;
    int rc = -1;
    for (const GpChunk *c = steps->head; c; c = c->next)
        for (uint32_t i = 0; i < c->n; i++)
            if (GP_EV_KIND(c->ev[i].kind) == GP_EV_STEP_BEGIN) {
                uint64_t *b = VEC_PUSH(bounds);
                if (b == NULL)
                    goto done;
                *b = c->ev[i].ts;
            }
    rc = 0;
    if (bounds.n < 2) /* one step at most: nothing to give sizes to */
        goto done;
    rc = -1;
    s.bounds = bounds.v;
    s.n_steps = bounds.n;
    sig = malloc(s.n_steps * sizeof *sig);
    verdict = calloc(s.n_steps, 1);
    if (sig == NULL || verdict == NULL || gp_u64map_init(&s.base_of_id, 256) < 0 ||
        hash_gpu_work(&s) < 0)
        goto done;
    for (uint32_t k = 0; k < in->n_threads; k++)
        if (!in->threads[k].ignored && reuse_thread(&s, &in->threads[k], sig, verdict) < 0)
            goto done;
    for (size_t j = 0; j < s.n_steps; j++) {
        if (verdict[j] & STEP_UNMATCHED)
            out->shapes_unmatched_steps++;
        else if (verdict[j] & STEP_REUSED)
            out->shapes_reused_steps++;
        if (verdict[j] & STEP_SIZED)
            out->shapes_sampled_steps++;
    }
    rc = 0;
done:
    free(bounds.v);
    free(sig);
    free(verdict);
    free(s.gpu_hash);
    free(s.bases.v);
    free(s.sample_args);
    gp_u64map_free(&s.gpu_of_corr);
    gp_u64map_free(&s.base_of_id);
    return rc;
}
