/* The trace's GPU events: kernels, copies, memsets and syncs on their device
 * and stream lanes, the flows from their launches, counters, and the GPU
 * projections of user annotations (trace_internal.h). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "trace_internal.h"

#include "opkinds.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- GPU events ------------------------------------------------------------ */

/* Correlation id -> API span, sorted by correlation. */
typedef struct Corr {
    uint32_t corr;
    uint32_t span;
} Corr;

static int
cmp_corr(const void *x, const void *y)
{
    const Corr *a = x, *b = y;
    if (a->corr != b->corr)
        return a->corr < b->corr ? -1 : 1;
    return (a->span > b->span) - (a->span < b->span);
}

/* Find the devices and their stream-0 substitutes. */
int
gp_trace_gpu_devices(const Ctx *c, Devices *d)
{
    uint64_t *pairs = malloc((c->n_gpu + 1) * sizeof(uint64_t));
    d->v = calloc(c->n_gpu + 1, sizeof(DevLane));
    d->n = 0;
    if (pairs == NULL || d->v == NULL) {
        free(pairs);
        return -1;
    }
    size_t np = 0;
    for (size_t i = 0; i < c->n_gpu; i++) {
        const GpGpuEventRow *g = &c->gpu[i];
        int32_t dev = dev_pid(g->device);
        if (dev_find(d, dev) == NULL) {
            d->v[d->n].device = dev;
            d->v[d->n].zero_sub = 1;
            d->n++;
        }
        if (is_slice_kind(g->kind))
            pairs[np++] = (uint64_t)(uint32_t)dev << 32 | g->stream;
    }
    if (np > 1)
        qsort(pairs, np, sizeof(uint64_t), cmp_u64);
    /* Streams ascend within a device: the first gap from 1 up is unused. */
    for (size_t i = 0; i < np; i++) {
        DevLane *dl = dev_find(d, (int32_t)(uint32_t)(pairs[i] >> 32));
        uint32_t s = (uint32_t)pairs[i];
        if (dl != NULL && s == dl->zero_sub && s != UINT32_MAX)
            dl->zero_sub = s + 1;
    }
    free(pairs);
    return 0;
}

static void
put_xyz(Out *o, const uint32_t v[3])
{
    PUT(o, "[");
    put_i64(o, v[0]);
    PUT(o, ",");
    put_i64(o, v[1]);
    PUT(o, ",");
    put_i64(o, v[2]);
    PUT(o, "]");
}

static const Str gpu_activity_name = {"<gpu activity>", 14};

/* One end of a flow of family `fam` ("ac2g", "blocked_call", "fwdbwd"). */
static void
put_flow_of(Out *o, const char *fam, char ph, uint32_t id, int64_t pid, int64_t tid, int64_t ts)
{
    begin_event(o);
    if (ph == 's')
        PUT(o, "{\"ph\":\"s\",\"id\":");
    else
        PUT(o, "{\"ph\":\"f\",\"id\":");
    put_i64(o, id);
    put_lane_ts(o, pid, tid, ts);
    PUT(o, ",\"cat\":\"");
    out_bytes(o, fam, strlen(fam));
    PUT(o, "\",\"name\":\"");
    out_bytes(o, fam, strlen(fam));
    if (ph == 's')
        PUT(o, "\"}");
    else
        PUT(o, "\",\"bp\":\"e\"}");
}

void
gp_trace_fwdbwd_write(const Ctx *c, Out *o)
{
    for (size_t i = 0; i < c->n_fwdbwd; i++) {
        const int64_t *f = &c->fwdbwd[4 * i];
        if (f[0] < 0 || f[2] < 0 || (size_t)f[0] >= c->n_threads || (size_t)f[2] >= c->n_threads)
            continue;
        uint32_t id = (uint32_t)i + 1;
        put_flow_of(o, "fwdbwd", 's', id, c->pid, thread_tid(c, (uint32_t)f[0]), rel(c, f[1]));
        put_flow_of(o, "fwdbwd", 'f', id, c->pid, thread_tid(c, (uint32_t)f[2]), rel(c, f[3]));
    }
}

static void
put_flow(Out *o, char ph, uint32_t id, int64_t pid, int64_t tid, int64_t ts)
{
    put_flow_of(o, "ac2g", ph, id, pid, tid, ts);
}

/* ---- GPU projections of user annotations (trace-format 6.7) ----------------- */

/* One annotation's slice on one GPU lane. */
typedef struct AnnSlice {
    int64_t start; /* first op's start; after pad_slices, the written start */
    int64_t end;   /* last op's end; after pad_slices, the written end */
    uint32_t ann;  /* annotation number */
    uint32_t pad;
} AnnSlice;

/* A slice open during pad_slices. */
typedef struct Open {
    int64_t start; /* written start */
    int64_t end;   /* op's end, or the annotation's last op's end */
    int64_t cap;   /* an op's end, or the cap of an annotation's parent (INT64_MAX none) */
    uint32_t item; /* index in Proj.items, or NO_ITEM for an op */
    uint32_t pad;
} Open;

#define NO_ITEM UINT32_MAX

/* Scratch for the projections, owned by gp_trace_gpu_write; the per-annotation arrays
 * hold n_anns + 1 entries. */
typedef struct Proj {
    uint32_t *stamp; /* per annotation: the last lane number that has a slice of it */
    uint32_t *slot;  /* per annotation: its index in items, valid while stamped */
    AnnSlice *items; /* the slices of the current lane */
    size_t n;
    Open *open;     /* pad_slices' stack: as many entries as a lane has slices */
    uint32_t lane_no;
} Proj;

static int
cmp_slice_ann(const void *x, const void *y)
{
    const AnnSlice *a = x, *b = y;
    return (a->ann > b->ann) - (a->ann < b->ann);
}

/* Lane order: start ascending, longest first, an outer range before an inner
 * one with the same bounds. */
static int
cmp_slice(const void *x, const void *y)
{
    const AnnSlice *a = x, *b = y;
    if (a->start != b->start)
        return a->start < b->start ? -1 : 1;
    if (a->end != b->end)
        return a->end > b->end ? -1 : 1;
    return (a->ann > b->ann) - (a->ann < b->ann);
}

/* Whether the annotation slice goes before the op in lane order; with the
 * same bounds it is the op's parent. */
static inline int
slice_first(const AnnSlice *a, const Key *k)
{
    return a->start < k->start || (a->start == k->start && a->end >= k->end);
}

/* Add 1 ns on each side of every annotation slice of the lane, less where
 * that would overlap a neighbour, so that the lane nests without moving an
 * op. On one stream the ops of a range run in launch order, so the unpadded
 * slices of one thread's ranges nest or are disjoint; ranges of threads that
 * share a stream can cross, and then the later one is cut at the end of the
 * one it starts in. A slice starts no earlier than anything before it ended
 * (a zero-length op 1 ns earlier included) or than its parent, and ends no
 * later than the next slice starts or than an op around it. */
static void
pad_slices(Proj *p, const Key *keys, size_t kb, size_t ke)
{
    size_t i = 0, k = kb, depth = 0;
    int64_t floor = 0;
    while (i < p->n || k < ke) {
        int is_ann = k == ke || (i < p->n && slice_first(&p->items[i], &keys[k]));
        int64_t s = is_ann ? p->items[i].start : keys[k].start;
        int64_t e = is_ann ? p->items[i].end : keys[k].end;
        /* Close what ends at or before s; a zero-length slice at the end of
         * a range (its last op, say) stays inside it. */
        while (depth > 0 && p->open[depth - 1].end <= s &&
               (e > p->open[depth - 1].end || p->open[depth - 1].item == NO_ITEM)) {
            Open *t = &p->open[--depth];
            int64_t end = t->end;
            if (t->item != NO_ITEM) {
                int64_t padded = end + 1 < s ? end + 1 : s;
                end = p->items[t->item].end = padded < t->cap ? padded : t->cap;
            }
            int64_t after = t->start == end ? end + 1 : end;
            if (after > floor)
                floor = after;
        }
        Open *up = depth > 0 ? &p->open[depth - 1] : NULL;
        if (up != NULL && e > up->end)
            e = up->end; /* crosses the open slice: cut */
        Open *t = &p->open[depth++];
        t->end = e;
        if (is_ann) {
            AnnSlice *a = &p->items[i];
            int64_t st = s - 1 > floor ? s - 1 : floor;
            if (st > s)
                st = s;
            if (up != NULL && st < up->start)
                st = up->start;
            a->start = t->start = st;
            a->end = e;
            t->cap = up == NULL ? INT64_MAX : up->cap;
            t->item = (uint32_t)i++;
        } else {
            t->start = s;
            t->cap = e;
            t->item = NO_ITEM;
            k++;
        }
    }
    while (depth > 0) {
        Open *t = &p->open[--depth];
        if (t->item != NO_ITEM)
            p->items[t->item].end = t->end < t->cap ? t->end + 1 : t->cap;
    }
}

/* Sort the lane's slices by cmp (unless they are in order already) and
 * index them by annotation. */
static void
sort_slices(Proj *p, int (*cmp)(const void *, const void *))
{
    for (size_t i = 1; i < p->n; i++) {
        if (cmp(&p->items[i - 1], &p->items[i]) > 0) {
            qsort(p->items, p->n, sizeof(AnnSlice), cmp);
            break;
        }
    }
    for (size_t i = 0; i < p->n; i++)
        p->slot[p->items[i].ann] = (uint32_t)i;
}

/* The annotation slices of the lane keys[kb..ke) into p->items, in lane
 * order with their written bounds: for each annotation with an op of the lane
 * launched inside it (or inside a range within it), from 1 ns before the
 * first such op to 1 ns after the last. Output-sensitive: one pass over the
 * lane's ops, plus O(k log k) for its k slices. The sorts are only checks when
 * one thread launched the lane's ops: its ranges are found in the order of
 * their first op, outer ones first, which is both their numbering and the lane
 * order. */
static void
project_lane(Proj *p, const Anns *anns, const ApiUp *api_up, const GpGpuEventRow *gpu,
             const Key *keys, size_t kb, size_t ke)
{
    uint32_t lane = ++p->lane_no;
    p->n = 0;
    for (size_t k = kb; k < ke; k++) {
        if (keys[k].api == 0 || gpu[keys[k].idx].kind == GP_GPU_SYNC)
            continue;
        uint32_t a = api_up[keys[k].api - 1].ann;
        if (a == 0)
            continue;
        if (p->stamp[a] == lane) {
            AnnSlice *s = &p->items[p->slot[a]];
            if (keys[k].start < s->start)
                s->start = keys[k].start;
            if (keys[k].end > s->end)
                s->end = keys[k].end;
            continue;
        }
        /* A new range, and the ranges around it that the lane does not have
         * yet, outermost first. */
        size_t first = p->n;
        for (uint32_t up = a; up != 0 && p->stamp[up] != lane; up = anns->v[up - 1].parent) {
            p->stamp[up] = lane;
            p->items[p->n++] = (AnnSlice){INT64_MAX, INT64_MIN, up, 0};
        }
        for (size_t i = first, j = p->n - 1; i < j; i++, j--) {
            AnnSlice tmp = p->items[i];
            p->items[i] = p->items[j];
            p->items[j] = tmp;
        }
        for (size_t i = first; i < p->n; i++)
            p->slot[p->items[i].ann] = (uint32_t)i;
        p->items[p->n - 1].start = keys[k].start;
        p->items[p->n - 1].end = keys[k].end;
    }
    if (p->n == 0)
        return;
    /* Inner ranges have higher numbers: widen the outer ones bottom up. */
    sort_slices(p, cmp_slice_ann);
    for (size_t i = p->n; i-- > 0;) {
        uint32_t up = anns->v[p->items[i].ann - 1].parent;
        if (up == 0)
            continue;
        AnnSlice *s = &p->items[p->slot[up]];
        if (p->items[i].start < s->start)
            s->start = p->items[i].start;
        if (p->items[i].end > s->end)
            s->end = p->items[i].end;
    }
    sort_slices(p, cmp_slice);
    pad_slices(p, keys, kb, ke);
    sort_slices(p, cmp_slice); /* padding keeps the order but for rare ties */
}

/* One gpu_user_annotation slice (no stream arg: HTA takes any event with one
 * for a GPU op). */
static void
write_ann_slice(const Ctx *c, Out *o, const Anns *anns, const AnnSlice *a, uint64_t lane)
{
    const Ann *ann = &anns->v[a->ann - 1];
    int64_t pid = (int64_t)(lane >> 40);
    int64_t tid = (int64_t)(lane & (((uint64_t)1 << 40) - 1));
    put_slice_head(o, CAT("gpu_user_annotation"), name_of(c, c->spans[ann->span].op_row), pid, tid,
                   a->start, a->end - a->start);
    PUT(o, ",\"args\":{\"External id\":");
    put_i64(o, (int64_t)c->id_base + ann->span + 1);
    PUT(o, "}}");
}

/* One kernel, copy, set or sync, with its ac2g flow. */
static void
write_gpu_op(const Ctx *c, Out *o, const Devices *devs, const Key *key, const ApiUp *api_up,
             uint8_t *flowed)
{
    const GpGpuEventRow *g = &c->gpu[key->idx];
    DevLane *dl = dev_find(devs, dev_pid(g->device));
    int64_t pid = dl->device, tid = gpu_tid(g, dl);
    int64_t stream = g->stream ? (int64_t)g->stream : (int64_t)dl->zero_sub;
    int64_t dur = key->end - key->start;
    const Str *name =
        g->kernel_row < c->n_kernel_names ? &c->kernel_names[g->kernel_row] : &gpu_activity_name;
    uint32_t ext = key->api ? api_up[key->api - 1].ext : 0;
    switch (g->kind) {
    case GP_GPU_KERNEL:
        put_slice_head(o, CAT("kernel"), name, pid, tid, key->start, dur);
        break;
    case GP_GPU_MEMCPY:
        put_slice_head(o, CAT("gpu_memcpy"), name, pid, tid, key->start, dur);
        break;
    case GP_GPU_MEMSET:
        put_slice_head(o, CAT("gpu_memset"), name, pid, tid, key->start, dur);
        break;
    default:
        put_slice_head(o, CAT("cuda_sync"), name, pid, tid, key->start, dur);
        break;
    }
    PUT(o, ",\"args\":{");
    if (ext) {
        PUT(o, "\"External id\":");
        put_i64(o, ext);
        PUT(o, ",");
    }
    if (g->kind == GP_GPU_SYNC) {
        PUT(o, "\"cuda_sync_kind\":");
        put_str(o, name);
        PUT(o, ",");
        if (g->wait_stream) {
            PUT(o, "\"wait_on_stream\":");
            put_i64(o, g->wait_stream);
            PUT(o, ",");
        }
        stream = g->stream ? (int64_t)g->stream : -1;
    }
    PUT(o, "\"device\":");
    put_i64(o, pid);
    PUT(o, ",\"stream\":");
    put_i64(o, stream);
    PUT(o, ",\"correlation\":");
    put_i64(o, g->correlation);
    if (g->kind == GP_GPU_KERNEL) {
        PUT(o, ",\"registers per thread\":");
        put_i64(o, g->registers);
        PUT(o, ",\"shared memory\":");
        put_i64(o, g->shared_mem);
        int64_t sms = (size_t)pid < c->n_sm_counts ? c->sm_counts[pid] : 0;
        if (sms > 0) {
            double blocks = 1.0, threads = 1.0;
            for (int d = 0; d < 3; d++) {
                blocks *= g->grid[d] ? g->grid[d] : 1;
                threads *= g->block[d] ? g->block[d] : 1;
            }
            int64_t warp =
                (size_t)pid < c->n_warp_sizes && c->warp_sizes[pid] > 0 ? c->warp_sizes[pid] : 32;
            double warps = (double)(((int64_t)threads + warp - 1) / warp);
            PUT(o, ",\"blocks per SM\":");
            gp_trace_out_fixed2(o, blocks / (double)sms);
            PUT(o, ",\"warps per SM\":");
            gp_trace_out_fixed2(o, blocks * warps / (double)sms);
        }
        PUT(o, ",\"grid\":");
        put_xyz(o, g->grid);
        PUT(o, ",\"block\":");
        put_xyz(o, g->block);
        if (g->graph_id) {
            PUT(o, ",\"graph id\":");
            put_i64(o, g->graph_id);
        }
    } else if (g->kind == GP_GPU_MEMCPY || g->kind == GP_GPU_MEMSET) {
        int64_t raw_dur = g->end_ns - g->start_ns;
        PUT(o, ",\"bytes\":");
        put_i64(o, g->bytes);
        PUT(o, ",\"memory bandwidth (GB/s)\":");
        gp_trace_out_fixed2(o, raw_dur > 0 ? (double)g->bytes / (double)raw_dur : 0.0);
    }
    PUT(o, "}}");

    /* ac2g: only when both slices exist; once per correlation. */
    if (key->api != 0 && g->kind != GP_GPU_SYNC && !flowed[key->api - 1]) {
        const GpSpanRow *s = &c->spans[key->api - 1];
        flowed[key->api - 1] = 1;
        put_flow(o, 's', g->correlation, c->pid, thread_tid(c, s->thread), rel(c, s->start_ns));
        put_flow(o, 'f', g->correlation, pid, tid, key->start);
    }
}

/* ---- blocked-call flows ---------------------------------------------------- */

/* The outermost span of span a's thread that is open at ts: spans of a thread
 * are contiguous and sorted by start, and a thread's top-level spans do not
 * overlap, so the search stops at the first one before a. */
static size_t
outermost_at(const Ctx *c, size_t a, int64_t ts)
{
    size_t root = a;
    for (size_t j = a; j-- > 0;) {
        const GpSpanRow *s = &c->spans[j];
        if (s->thread != c->spans[a].thread)
            break;
        if (s->start_ns <= ts && s->end_ns >= ts)
            root = j;
        if (s->depth == 0)
            break;
    }
    return root;
}

/* The innermost span of `thread` open at ts (the latest-started one that
 * contains it), or SIZE_MAX. [lo, hi) are the thread's spans. */
static size_t
innermost_at(const Ctx *c, size_t lo, size_t hi, int64_t ts)
{
    size_t l = lo, h = hi;
    while (l < h) { /* first span starting after ts */
        size_t m = l + (h - l) / 2;
        if (c->spans[m].start_ns <= ts)
            l = m + 1;
        else
            h = m;
    }
    for (size_t j = l; j-- > lo;) {
        const GpSpanRow *s = &c->spans[j];
        if (s->end_ns >= ts)
            return j;
        if (s->depth == 0)
            break;
    }
    return SIZE_MAX;
}

/* One flow from the call that the stepping thread was blocked in to the
 * outermost call of another thread that launched work for it (the kernels
 * marked GP_GF_ROLLED_UP), once per such call. Both ends bind to slices the
 * host part writes (every span of c->spans is one). */
static int
write_blocked_flows(const Ctx *c, Out *o, const Key *keys, size_t nk)
{
    if (c->n_steps == 0 || c->n_spans == 0)
        return 0;
    uint32_t step_thread = c->steps[0].thread;
    size_t lo = SIZE_MAX, hi = 0;
    uint8_t *done = NULL;
    uint32_t id = 0;
    for (size_t k = 0; k < nk; k++) {
        const GpGpuEventRow *g = &c->gpu[keys[k].idx];
        if (!(g->flags & GP_GF_ROLLED_UP) || keys[k].api == 0)
            continue;
        if (done == NULL) { /* the first one: the stepping thread's spans */
            done = calloc(c->n_spans, 1);
            if (done == NULL)
                return -1;
            for (size_t i = 0; i < c->n_spans; i++) {
                if (c->spans[i].thread != step_thread)
                    continue;
                if (lo == SIZE_MAX)
                    lo = i;
                hi = i + 1;
            }
        }
        size_t a = keys[k].api - 1;
        int64_t ts = c->spans[a].start_ns;
        size_t root = outermost_at(c, a, ts);
        if (done[root] || lo == SIZE_MAX)
            continue;
        done[root] = 1;
        size_t b = innermost_at(c, lo, hi, ts);
        if (b == SIZE_MAX)
            continue;
        id++;
        put_flow_of(o, "blocked_call", 's', id, c->pid, thread_tid(c, step_thread),
                    rel(c, c->spans[b].start_ns));
        put_flow_of(o, "blocked_call", 'f', id, c->pid, thread_tid(c, c->spans[root].thread),
                    rel(c, c->spans[root].start_ns));
    }
    free(done);
    return 0;
}

int
gp_trace_gpu_write(const Ctx *c, Out *o, Devices *devs, const ApiUp *api_up, const Anns *anns,
                   int64_t *max_end)
{
    size_t n = c->n_gpu;
    Key *keys = malloc((n + 1) * sizeof(Key));
    Corr *corr = malloc((c->n_spans + 1) * sizeof(Corr));
    uint8_t *flowed = calloc(c->n_spans + 1, 1);
    /* The lane stack holds ops and annotation slices. */
    int64_t *ends = malloc((n + anns->n + 1) * sizeof(int64_t));
    Proj proj = {NULL, NULL, NULL, 0, NULL, 0};
    int rc = -1;
    if (keys == NULL || corr == NULL || flowed == NULL || ends == NULL)
        goto done;
    if (anns->n > 0 && n > 0) {
        proj.stamp = calloc(anns->n + 1, sizeof(uint32_t));
        proj.slot = malloc((anns->n + 1) * sizeof(uint32_t));
        proj.items = malloc((anns->n + 1) * sizeof(AnnSlice));
        proj.open = malloc((n + anns->n + 1) * sizeof(Open));
        if (proj.stamp == NULL || proj.slot == NULL || proj.items == NULL || proj.open == NULL)
            goto done;
    }

    size_t nc = 0;
    for (size_t i = 0; i < c->n_spans; i++) {
        if (c->spans[i].kind == GP_OP_CUDA_API && c->spans[i].correlation != 0) {
            corr[nc].corr = c->spans[i].correlation;
            corr[nc].span = (uint32_t)i;
            nc++;
        }
    }
    if (nc > 1)
        qsort(corr, nc, sizeof(Corr), cmp_corr);

    /* Device memory: counters on the device, [memory] instants on the
     * launching thread (trace-format 6.9, 6.10). Rows are sorted by start. */
    for (size_t i = 0; i < n; i++) {
        const GpGpuEventRow *g = &c->gpu[i];
        if (g->kind != GP_GPU_MALLOC && g->kind != GP_GPU_FREE)
            continue;
        DevLane *dl = dev_find(devs, dev_pid(g->device));
        int64_t delta = g->kind == GP_GPU_MALLOC ? g->bytes : -g->bytes;
        dl->allocated += delta;
        int64_t ts = rel(c, g->start_ns);
        begin_event(o);
        PUT(o, "{\"ph\":\"C\",\"cat\":\"gpu_memory\",\"name\":\"GPU ");
        put_i64(o, dl->device);
        PUT(o, " memory\"");
        put_lane_ts(o, dl->device, 0, ts);
        PUT(o, ",\"args\":{\"allocated\":");
        put_i64(o, dl->allocated);
        PUT(o, "}}");
        if (g->thread >= 0 && (size_t)g->thread < c->n_threads) {
            begin_event(o);
            PUT(o, "{\"ph\":\"i\",\"s\":\"t\",\"cat\":\"cpu_instant_event\", "
                   "\"name\":\"[memory]\"");
            put_lane_ts(o, c->pid, thread_tid(c, (uint32_t)g->thread), ts);
            PUT(o, ",\"args\":{\"Device Type\":1,\"Device Id\":");
            put_i64(o, dl->device);
            PUT(o, ",\"Addr\":");
            put_i64(o, g->address);
            PUT(o, ",\"Bytes\":");
            put_i64(o, delta);
            /* CUPTI sees driver allocations: what is allocated is also what
             * is reserved from the device. */
            PUT(o, ",\"Total Allocated\":");
            put_i64(o, dl->allocated);
            PUT(o, ",\"Total Reserved\":");
            put_i64(o, dl->allocated);
            PUT(o, "}}");
        }
    }

    size_t nk = 0;
    for (size_t i = 0; i < n; i++) {
        const GpGpuEventRow *g = &c->gpu[i];
        if (!is_slice_kind(g->kind))
            continue;
        DevLane *dl = dev_find(devs, dev_pid(g->device));
        keys[nk].start = rel(c, g->start_ns);
        keys[nk].end = rel(c, g->end_ns);
        if (keys[nk].end < keys[nk].start)
            keys[nk].end = keys[nk].start;
        keys[nk].lane = (uint64_t)(uint32_t)dl->device << 40 | (uint64_t)gpu_tid(g, dl);
        keys[nk].idx = (uint32_t)i;
        keys[nk].api = 0;
        if (g->correlation != 0 && nc > 0) {
            /* the first API span with this correlation */
            Corr want = {g->correlation, 0};
            size_t lo = 0, hi = nc;
            while (lo < hi) {
                size_t m = lo + (hi - lo) / 2;
                if (cmp_corr(&corr[m], &want) < 0)
                    lo = m + 1;
                else
                    hi = m;
            }
            if (lo < nc && corr[lo].corr == g->correlation)
                keys[nk].api = corr[lo].span + 1;
        }
        nk++;
    }
    gp_trace_sort_keys(keys, nk);

    for (size_t kb = 0, ke; kb < nk; kb = ke) {
        uint64_t lane = keys[kb].lane;
        for (ke = kb + 1; ke < nk && keys[ke].lane == lane; ke++)
            ;
        proj.n = 0;
        if (proj.stamp != NULL)
            project_lane(&proj, anns, api_up, c->gpu, keys, kb, ke);
        /* Ops and annotation slices, merged in lane order, nested. */
        size_t depth = 0, i = 0, k = kb;
        while (k < ke || i < proj.n) {
            int is_ann = k == ke || (i < proj.n && slice_first(&proj.items[i], &keys[k]));
            int64_t *start = is_ann ? &proj.items[i].start : &keys[k].start;
            int64_t *end = is_ann ? &proj.items[i].end : &keys[k].end;
            while (depth > 0 && ends[depth - 1] <= *start)
                depth--;
            if (depth > 0 && *end > ends[depth - 1])
                *end = ends[depth - 1];
            ends[depth++] = *end;
            if (*end > *max_end)
                *max_end = *end;
            if (is_ann)
                write_ann_slice(c, o, anns, &proj.items[i++], lane);
            else
                write_gpu_op(c, o, devs, &keys[k++], api_up, flowed);
        }
    }
    rc = write_blocked_flows(c, o, keys, nk);
done:
    free(keys);
    free(corr);
    free(flowed);
    free(ends);
    free(proj.stamp);
    free(proj.slot);
    free(proj.items);
    free(proj.open);
    return rc;
}
