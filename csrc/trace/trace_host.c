/* The trace's host events: the spans of every thread in lane order, nested,
 * with their Python ids, External ids and the ranges the GPU side projects
 * (trace_internal.h). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "trace_internal.h"

#include "opkinds.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- ordering and nesting -------------------------------------------------- */

static int
cmp_key(const void *x, const void *y)
{
    const Key *a = x, *b = y;
    if (a->lane != b->lane)
        return a->lane < b->lane ? -1 : 1;
    if (a->start != b->start)
        return a->start < b->start ? -1 : 1;
    if (a->end != b->end)
        return a->end > b->end ? -1 : 1;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

void
gp_trace_sort_keys(Key *k, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        if (cmp_key(&k[i - 1], &k[i]) > 0) {
            qsort(k, n, sizeof(Key), cmp_key);
            return;
        }
    }
}

/* ---- host events ---------------------------------------------------------- */

/* One step of a host sweep (keys in lane order, depth reset to 0 at each new
 * lane): closes the open slices that end at or before key starts, clamps key
 * into the slice still open (snapshot frames and ranges left open by a
 * returning function can otherwise overlap) and makes room on the stack for
 * key. Returns the depth under key, or -1 when the stack cannot grow. */
ptrdiff_t
gp_trace_open_slice(Frame **stack, size_t *cap, size_t depth, Key *key)
{
    while (depth > 0 && (*stack)[depth - 1].end <= key->start)
        depth--;
    if (depth > 0 && key->end > (*stack)[depth - 1].end)
        key->end = (*stack)[depth - 1].end;
    if (depth == *cap) {
        Frame *grown = realloc(*stack, 2 * *cap * sizeof(Frame));
        if (grown == NULL)
            return -1;
        *stack = grown;
        *cap *= 2;
    }
    return (ptrdiff_t)depth;
}

typedef struct StepKey {
    uint32_t thread;
    int64_t start;
    int64_t step;
} StepKey;

static int
cmp_step(const void *x, const void *y)
{
    const StepKey *a = x, *b = y;
    if (a->thread != b->thread)
        return a->thread < b->thread ? -1 : 1;
    return (a->start > b->start) - (a->start < b->start);
}

/* "ProfilerStep#<step>" in buf (48 bytes). */
static Str
step_name(char *buf, int64_t step)
{
    static const char prefix[] = "ProfilerStep#";
    char *p = buf + sizeof(prefix) - 1;
    memcpy(buf, prefix, sizeof(prefix) - 1);
    if (step < 0) {
        *p++ = '-';
        p = fmt_u64(p, (uint64_t)0 - (uint64_t)step);
    } else {
        p = fmt_u64(p, (uint64_t)step);
    }
    return (Str){buf, (size_t)(p - buf)};
}

/* The spans as keys in lane order (malloc'ed; NULL when out of memory). */
Key *
gp_trace_span_keys(const Ctx *c)
{
    size_t n = c->n_spans;
    Key *keys = malloc((n + 1) * sizeof(Key));
    if (keys == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        const GpSpanRow *s = &c->spans[i];
        keys[i].start = rel(c, s->start_ns);
        keys[i].end = rel(c, s->end_ns);
        if (keys[i].end < keys[i].start)
            keys[i].end = keys[i].start;
        keys[i].lane = s->thread;
        keys[i].idx = (uint32_t)i;
        keys[i].api = 0;
    }
    gp_trace_sort_keys(keys, n);
    return keys;
}

/* Write every span. Fills anns, and api_up for each API span. */
int
gp_trace_host_write(const Ctx *c, Out *o, ApiUp *api_up, Anns *anns)
{
    size_t n = c->n_spans;
    Key *keys = gp_trace_span_keys(c);
    StepKey *steps = malloc((c->n_steps + 1) * sizeof(StepKey));
    size_t cap = 64, depth = 0;
    Frame *stack = malloc(cap * sizeof(Frame));
    int rc = -1;
    if (keys == NULL || steps == NULL || stack == NULL)
        goto done;
    for (size_t i = 0; i < c->n_steps; i++) {
        steps[i].thread = c->steps[i].thread;
        steps[i].start = c->steps[i].start_ns;
        steps[i].step = c->steps[i].step;
    }
    if (c->n_steps > 1)
        qsort(steps, c->n_steps, sizeof(StepKey), cmp_step);

    uint64_t lane = UINT64_MAX;
    int64_t tid = 0, next_step = 0;
    for (size_t k = 0; k < n; k++) {
        Key *key = &keys[k];
        const GpSpanRow *s = &c->spans[key->idx];
        if (key->lane != lane) {
            lane = key->lane;
            tid = thread_tid(c, s->thread);
            depth = 0;
            next_step = 0;
        }
        ptrdiff_t under = gp_trace_open_slice(&stack, &cap, depth, key);
        if (under < 0)
            goto done;
        depth = (size_t)under;
        Frame up = depth > 0 ? stack[depth - 1] : (Frame){.py_span = -1};
        Frame *f = &stack[depth++];
        *f = up;
        f->end = key->end;
        f->span = key->idx;
        uint32_t id = c->id_base + key->idx + 1;
        const Str *name = name_of(c, s->op_row);
        if (s->module > 0 && s->module - 1 < c->n_module_names) /* Module.__call__ on one */
            name = &c->module_names[s->module - 1];
        int64_t dur = key->end - key->start;
        switch (s->kind) {
        case GP_OP_USER:
        case GP_OP_STEP: {
            f->ext = id;
            if (s->kind == GP_OP_USER) {
                anns->v[anns->n++] = (Ann){key->idx, up.ann};
                f->ann = anns->n;
            }
            if (s->kind == GP_OP_STEP) {
                StepKey want = {s->thread, s->start_ns, 0};
                StepKey *hit = c->n_steps
                                   ? bsearch(&want, steps, c->n_steps, sizeof(StepKey), cmp_step)
                                   : NULL;
                int64_t step = hit ? hit->step : next_step;
                next_step = step + 1;
                char buf[48];
                Str sn = step_name(buf, step);
                put_slice_head(o, CAT("user_annotation"), &sn, c->pid, tid, key->start, dur);
            } else {
                put_slice_head(o, CAT("user_annotation"), name, c->pid, tid, key->start, dur);
            }
            PUT(o, ",\"args\":{\"External id\":");
            put_i64(o, id);
            PUT(o, ",\"Ev Idx\":");
            put_i64(o, (int64_t)c->id_base + key->idx);
            if (s->seq >= 0) { /* PyTorch's range: an autograd node's sequence number */
                PUT(o, ",\"Sequence number\":");
                put_i64(o, s->seq);
            }
            PUT(o, "}}");
            break;
        }
        case GP_OP_CUDA_API: {
            uint32_t api = s->op_row < c->n_ops ? c->ops[s->op_row].op : 0;
            if (GP_API_DOMAIN(api) == GP_API_DRIVER)
                put_slice_head(o, CAT("cuda_driver"), name, c->pid, tid, key->start, dur);
            else
                put_slice_head(o, CAT("cuda_runtime"), name, c->pid, tid, key->start, dur);
            PUT(o, ",\"args\":{");
            if (up.ext) {
                PUT(o, "\"External id\":");
                put_i64(o, up.ext);
                PUT(o, ",");
            }
            PUT(o, "\"cbid\":");
            put_i64(o, GP_API_CBID(api));
            PUT(o, ",\"correlation\":");
            put_i64(o, s->correlation);
            PUT(o, "}}");
            api_up[key->idx] = (ApiUp){up.ann, up.ext};
            break;
        }
        default: { /* Python and C calls */
            f->py_id = id;
            if (s->kind == GP_OP_PYTHON)
                f->py_span = (int32_t)key->idx;
            put_slice_head(o, CAT("python_function"), name, c->pid, tid, key->start, dur);
            PUT(o, ",\"args\":{\"Python id\":");
            put_i64(o, id);
            PUT(o, ",\"Python parent id\":");
            if (up.py_id)
                put_i64(o, up.py_id);
            else
                PUT(o, "null");
            if (s->kind == GP_OP_CFUNC && s->line > 0 && up.py_span >= 0) {
                uint32_t row = c->spans[up.py_span].op_row;
                if (row < c->n_files) {
                    PUT(o, ",\"CallFrom\":\"");
                    out_bytes(o, c->files[row].p, c->files[row].n);
                    PUT(o, ":");
                    put_i64(o, s->line);
                    PUT(o, "\"");
                }
            }
            PUT(o, "}}");
            break;
        }
        }
    }
    rc = 0;
done:
    free(keys);
    free(steps);
    free(stack);
    return rc;
}
