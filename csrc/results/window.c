/* A window's spans: from its kept events when first asked for, and the
 * call-site lines of C calls. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "window.h"

#include "arrays.h"
#include "compat.h"
#include "intern.h"
#include "opkinds.h"
#include "profiler.h"

#include <stdlib.h>
#include <string.h>

#define CAPSULE_NAME "gpuprof._window_events"

/* All fields: GIL (the capsule is only touched from Python). */
typedef struct Kept {
    GpWindowEvents ev;   /* empty once the spans are built */
    uint8_t *kinds;      /* per op id (copies) */
    uint8_t *flags;
    PyObject **refs;     /* per op id: strong references (code, owner, label) or NULL */
    uint32_t n_ops;
    uint64_t window_start_ns;
    uint64_t window_end_ns;
    uint64_t step_thread_ident;
    int64_t unclosed_step; /* as in GpAggInput: the same op rows on the second run */
    int nvtx_cross_thread_ends;
    PyObject *spans;     /* the built array, or NULL */
} Kept;

static void
kept_free(Kept *k)
{
    gp_buffer_release_window(&k->ev);
    if (k->refs) {
        for (uint32_t i = 0; i < k->n_ops; i++)
            Py_XDECREF(k->refs[i]);
    }
    free(k->refs);
    free(k->kinds);
    free(k->flags);
    Py_XDECREF(k->spans);
    free(k);
}

static void
kept_destructor(PyObject *capsule)
{
    Kept *k = PyCapsule_GetPointer(capsule, CAPSULE_NAME);
    if (k == NULL) {
        PyErr_Clear(); /* cannot happen: only we make these capsules */
        return;
    }
    kept_free(k);
}

PyObject *
gp_window_keep(GpWindowEvents *ev, const GpAggInput *in)
{
    Kept *k = calloc(1, sizeof(Kept));
    uint32_t n = in->n_ops;
    if (k != NULL) {
        k->ev = *ev;
        memset(ev, 0, sizeof(*ev));
        k->kinds = malloc(n + 1);
        k->flags = malloc(n + 1);
        k->refs = calloc(n + 1, sizeof(PyObject *));
    }
    if (k == NULL || k->kinds == NULL || k->flags == NULL || k->refs == NULL) {
        if (k)
            kept_free(k);
        else
            gp_buffer_release_window(ev);
        return PyErr_NoMemory();
    }
    memcpy(k->kinds, in->op_kinds, n);
    memcpy(k->flags, in->op_flags, n);
    k->n_ops = n;
    for (uint32_t i = 0; i < n && i < gp_intern.n_ops; i++)
        k->refs[i] = Py_XNewRef(gp_intern.refs[i]);
    k->window_start_ns = in->window_start_ns;
    k->window_end_ns = in->window_end_ns;
    k->step_thread_ident = in->step_thread_ident;
    k->unclosed_step = in->unclosed_step;
    k->nvtx_cross_thread_ends = in->nvtx_cross_thread_ends;
    PyObject *capsule = PyCapsule_New(k, CAPSULE_NAME, kept_destructor);
    if (capsule == NULL)
        kept_free(k);
    return capsule;
}

static PyObject *
kept_spans(PyObject *capsule)
{
    Kept *k = PyCapsule_GetPointer(capsule, CAPSULE_NAME);
    if (k == NULL)
        return NULL; /* ValueError: not one of ours */
    if (k->spans != NULL)
        return Py_NewRef(k->spans);
    GpAggInput in = {
        .threads = k->ev.threads,
        .n_threads = k->ev.n_threads,
        .anchors = k->ev.anchors,
        .n_anchors = k->ev.n_anchors,
        .op_kinds = k->kinds,
        .op_flags = k->flags,
        .n_ops = k->n_ops,
        .window_start_ns = k->window_start_ns,
        .window_end_ns = k->window_end_ns,
        .step_thread_ident = k->step_thread_ident,
        .unclosed_step = k->unclosed_step,
        .want_spans = 1,
        .nvtx_cross_thread_ends = k->nvtx_cross_thread_ends,
    };
    GpTables t;
    GpStatus st = gp_aggregate_run(&in, &t);
    if (st != GP_OK)
        return gp_status_raise(st, "gpuprof: building the spans of a recorded window");
    PyObject *spans = gp_window_spans_array(&t, k->refs, k->kinds, k->n_ops);
    gp_aggregate_free(&t);
    if (spans == NULL)
        return NULL;
    k->spans = Py_NewRef(spans);
    gp_buffer_release_window(&k->ev); /* the chunks go back for reuse */
    return spans;
}

PyObject *
gp_window_complete(PyObject *module, PyObject *raw)
{
    (void)module;
    if (!PyDict_Check(raw)) {
        PyErr_Format(PyExc_TypeError, "_complete_window: a window dict is needed, not %.100s",
                     Py_TYPE(raw)->tp_name);
        return NULL;
    }
    PyObject *spans_key = PyUnicode_InternFromString("spans");
    PyObject *events_key = PyUnicode_InternFromString("_events");
    PyObject *spans = NULL, *kept = NULL, *result = NULL;
    if (spans_key == NULL || events_key == NULL)
        goto done;
    int has = PyDict_Contains(raw, spans_key);
    if (has < 0 || (has == 0 && PyDict_GetItemRef(raw, events_key, &kept) < 0))
        goto done;
    if (kept != NULL) {
        spans = kept_spans(kept);
        if (spans == NULL || PyDict_SetItem(raw, spans_key, spans) < 0 ||
            PyDict_DelItem(raw, events_key) < 0)
            goto done;
    }
    result = Py_NewRef(raw);
done:
    Py_XDECREF(spans);
    Py_XDECREF(kept);
    Py_XDECREF(spans_key);
    Py_XDECREF(events_key);
    return result;
}

/* Line of each call site (C calls, and Python frames entered from the user's
 * code): the caller is the innermost Python span above the span that was still
 * running when it started. (A range can outlive the frame that opened it, as the
 * step range that an optimizer-step hook opens: the spans under it have that
 * frame as an ancestor after it returned.) */
static void
resolve_call_sites(GpTables *t, PyObject *const *refs, const uint8_t *kinds, uint32_t n_ops)
{
    for (size_t i = 0; i < t->spans.n; i++) {
        GpSpanRow *s = &t->spans.v[i];
        if (s->site == 0)
            continue;
        int32_t p = s->parent;
        while (p >= 0 && (t->spans.v[p].kind != GP_OP_PYTHON || t->spans.v[p].end_ns < s->start_ns))
            p = t->spans.v[p].parent;
        if (p < 0)
            continue;
        uint32_t op = t->ops.v[t->spans.v[p].op_row].op;
        if (op >= n_ops || kinds[op] != GP_OP_PYTHON || refs[op] == NULL || !PyCode_Check(refs[op]))
            continue;
        s->line = PyCode_Addr2Line((PyCodeObject *)refs[op], (int)(s->site - 1));
    }
}

PyObject *
gp_window_spans_array(GpTables *t, PyObject *const *refs, const uint8_t *kinds, uint32_t n_ops)
{
    resolve_call_sites(t, refs, kinds, n_ops);
    GpSpanRow *rows = t->spans.v;
    size_t n = t->spans.n;
    /* The table was reserved for one span per event; give back the rest
     * (never touched, so it cost address space only). */
    if (n > 0 && n < t->spans.cap) {
        GpSpanRow *shrunk = realloc(rows, n * sizeof(GpSpanRow));
        if (shrunk != NULL)
            rows = shrunk;
    }
    memset(&t->spans, 0, sizeof(t->spans));
    return gp_arrays_adopt(GP_ROWS_SPANS, rows, n);
}
