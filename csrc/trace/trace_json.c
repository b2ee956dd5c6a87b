/* Streaming Chrome-trace writer (see trace_json.h and docs/traces.md).
 *
 * Layout of one call: (1) with the GIL, take buffer views of the arrays and
 * escape every name once; (2) without Python objects (and, when writing to
 * a path, with the GIL released), order the events per lane, nest them,
 * and format them into a 1 MiB block that is flushed to the file or to a
 * Python write(); (3) with the GIL, rename or raise.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "trace_json.h"

#include "aggregate.h"
#include "opkinds.h"
#include "trace_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* meta.part: a whole file, or one window's events inside a file written by
 * several calls on the same writer (other processes' lanes): "open" writes the
 * header and the events, "append" the events, "close" the events, the window
 * markers and the end. */
enum { PART_WHOLE = 0, PART_OPEN, PART_APPEND, PART_CLOSE };

/* ---- inputs ------------------------------------------------------------- */

/* Rows of one structured array, read through the buffer protocol. */
typedef struct Rows {
    Py_buffer view;
    int have_view;
    void *copy; /* aligned copy when the buffer was not 8-byte aligned */
    const void *v;
    size_t n;
} Rows;

static int
get_rows(PyObject *window, const char *key, size_t itemsize, Rows *r)
{
    memset(r, 0, sizeof(*r));
    PyObject *arr = PyDict_GetItemString(window, key); /* borrowed */
    if (arr == NULL) {
        PyErr_Format(PyExc_KeyError, "_write_trace: the window has no '%s' array", key);
        return -1;
    }
    if (PyObject_GetBuffer(arr, &r->view, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    r->have_view = 1;
    if (r->view.ndim != 1 || (size_t)r->view.itemsize != itemsize) {
        PyErr_Format(PyExc_ValueError,
                     "_write_trace: window['%s'] must be a 1-D array of %zu-byte rows "
                     "(got %d-D, itemsize %zd)",
                     key, itemsize, r->view.ndim, r->view.itemsize);
        return -1;
    }
    r->n = (size_t)r->view.len / itemsize;
    r->v = r->view.buf;
    if (r->n && ((uintptr_t)r->view.buf % 8) != 0) {
        r->copy = malloc((size_t)r->view.len);
        if (r->copy == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(r->copy, r->view.buf, (size_t)r->view.len);
        r->v = r->copy;
    }
    return 0;
}

static void
release_rows(Rows *r)
{
    if (r->have_view)
        PyBuffer_Release(&r->view);
    free(r->copy);
    memset(r, 0, sizeof(*r));
}

/* A field that is there and not None. */
static int
present(PyObject *d, const char *key)
{
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    return v != NULL && v != Py_None;
}

static int
get_i64(PyObject *d, const char *key, int64_t *out, const char *where)
{
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "_write_trace: %s has no '%s'", where, key);
        return -1;
    }
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)x;
    return 0;
}

/* Optional int: *out is left as it is when the key is absent or None. */
static int
get_opt_i64(PyObject *d, const char *key, int64_t *out)
{
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    if (v == NULL || v == Py_None)
        return 0;
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "_write_trace: meta.%s must be an int, not %.100s", key,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)x;
    return 0;
}

/* meta.part (optional, default "whole") -> PART_*. */
static int
meta_part(PyObject *meta, int *part)
{
    static const char *const names[] = {"whole", "open", "append", "close"};
    *part = PART_WHOLE;
    PyObject *v = PyDict_GetItemString(meta, "part"); /* borrowed */
    if (v == NULL || v == Py_None)
        return 0;
    const char *s = PyUnicode_Check(v) ? PyUnicode_AsUTF8(v) : NULL;
    if (s == NULL && PyErr_Occurred())
        return -1;
    for (int i = 0; s != NULL && i < 4; i++) {
        if (strcmp(s, names[i]) == 0) {
            *part = i;
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError,
                 "_write_trace: meta.part must be 'whole', 'open', 'append' or 'close', "
                 "got %R",
                 v);
    return -1;
}

/* Optional list of ints -> malloc'ed array (NULL, 0 when absent). */
static int
get_int_list(PyObject *d, const char *key, int64_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    if (v == NULL || v == Py_None)
        return 0;
    if (!PyList_Check(v)) {
        PyErr_Format(PyExc_TypeError, "_write_trace: meta.%s must be a list of int", key);
        return -1;
    }
    size_t len = (size_t)PyList_GET_SIZE(v);
    int64_t *a = calloc(len + 1, sizeof(int64_t));
    if (a == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < len; i++) {
        long long x = PyLong_AsLongLong(PyList_GET_ITEM(v, (Py_ssize_t)i)); /* borrowed */
        if (x == -1 && PyErr_Occurred()) {
            free(a);
            return -1;
        }
        a[i] = (int64_t)x;
    }
    *out = a;
    *n = len;
    return 0;
}

/* ---- metadata events ------------------------------------------------------- */

static void
put_meta_head(Out *o, const char *what, size_t len, int64_t pid, int64_t tid)
{
    begin_event(o);
    PUT(o, "{\"ph\": \"M\", \"name\": \"");
    out_bytes(o, what, len);
    PUT(o, "\", \"ts\": 0.000, \"pid\": ");
    put_i64(o, pid);
    PUT(o, ", \"tid\": ");
    put_i64(o, tid);
    PUT(o, ", \"args\": {");
}

static void
write_process_meta(const Ctx *c, Out *o, int64_t pid, int64_t device)
{
    put_meta_head(o, CAT("process_name"), pid, 0);
    PUT(o, "\"name\": ");
    put_str(o, &c->process_name);
    PUT(o, "}}");
    put_meta_head(o, CAT("process_labels"), pid, 0);
    if (device < 0) {
        PUT(o, "\"labels\": \"CPU\"}}");
    } else {
        PUT(o, "\"labels\": \"GPU ");
        put_i64(o, device);
        PUT(o, "\"}}");
    }
    put_meta_head(o, CAT("process_sort_index"), pid, 0);
    PUT(o, "\"sort_index\": ");
    put_i64(o, device < 0 ? c->sort_index : device + DEVICE_SORT_OFFSET);
    PUT(o, "}}");
}

static void
write_thread_sort(Out *o, int64_t pid, int64_t tid)
{
    put_meta_head(o, CAT("thread_sort_index"), pid, tid);
    PUT(o, "\"sort_index\": ");
    put_i64(o, tid);
    PUT(o, "}}");
}

static void
write_host_meta(const Ctx *c, Out *o)
{
    write_process_meta(c, o, c->pid, -1);
    for (size_t i = 0; i < c->n_threads; i++) {
        int64_t tid = thread_tid(c, (uint32_t)i);
        put_meta_head(o, CAT("thread_name"), c->pid, tid);
        PUT(o, "\"name\": \"thread ");
        put_i64(o, tid);
        if (i < c->n_thread_names) {
            PUT(o, " (");
            out_bytes(o, c->thread_names[i].p, c->thread_names[i].n);
            PUT(o, ")");
        }
        PUT(o, "\"}}");
        write_thread_sort(o, c->pid, tid);
    }
}

/* Lane metadata for each (device, tid) that has slices. */
static int
write_device_meta(const Ctx *c, Out *o, const Devices *devs)
{
    for (size_t i = 0; i < devs->n; i++)
        write_process_meta(c, o, devs->v[i].device, devs->v[i].device);
    uint64_t *lanes = malloc((c->n_gpu + 1) * sizeof(uint64_t));
    if (lanes == NULL)
        return -1;
    size_t nl = 0;
    for (size_t i = 0; i < c->n_gpu; i++) {
        const GpGpuEventRow *g = &c->gpu[i];
        if (!is_slice_kind(g->kind))
            continue;
        const DevLane *dl = dev_find(devs, dev_pid(g->device));
        lanes[nl++] = (uint64_t)(uint32_t)dl->device << 40 | (uint64_t)gpu_tid(g, dl);
    }
    if (nl > 1)
        qsort(lanes, nl, sizeof(uint64_t), cmp_u64);
    for (size_t i = 0; i < nl; i++) {
        if (i > 0 && lanes[i] == lanes[i - 1])
            continue;
        int64_t pid = (int64_t)(lanes[i] >> 40);
        int64_t tid = (int64_t)(lanes[i] & (((uint64_t)1 << 40) - 1));
        put_meta_head(o, CAT("thread_name"), pid, tid);
        PUT(o, "\"name\": \"stream ");
        if (tid >= SYNC_LANE_OFFSET) {
            put_i64(o, tid - SYNC_LANE_OFFSET);
            PUT(o, " sync\"}}");
        } else {
            put_i64(o, tid);
            PUT(o, "\"}}");
        }
        write_thread_sort(o, pid, tid);
    }
    free(lanes);
    return 0;
}

/* ---- the whole file --------------------------------------------------------- */

/* The file's start: '{', the header keys and the opening of traceEvents. */
static void
write_open(const Ctx *c, Out *o)
{
    PUT(o, "{\n  ");
    if (c->header.n) {
        out_bytes(o, c->header.p, c->header.n);
        PUT(o, ",\n  ");
    }
    PUT(o, "\"traceEvents\": [");
}

/* The window's span and iteration markers (trace-format 6.10). */
static void
write_markers(const Ctx *c, Out *o, int64_t end)
{
    begin_event(o);
    PUT(o, "{\"ph\": \"X\", \"cat\": \"Trace\", \"name\": \"gpuprof (0)\", \"pid\": \"Spans\", "
           "\"tid\": \"gpuprof\", \"ts\": 0.000, \"dur\": ");
    put_us(o, end);
    PUT(o, ", \"args\": {\"Op count\": ");
    put_i64(o, (int64_t)c->n_spans);
    PUT(o, "}}");
    begin_event(o);
    PUT(o, "{\"ph\": \"i\", \"s\": \"g\", \"name\": \"Iteration Start: gpuprof\", "
           "\"pid\": \"Traces\", \"tid\": \"Trace gpuprof\", \"ts\": 0.000}");
}

/* The file's end: the window end marker (the last event), traceName, '}'. */
static void
write_close(const Ctx *c, Out *o, int64_t end)
{
    begin_event(o);
    PUT(o, "{\"ph\": \"i\", \"s\": \"g\", \"name\": \"Record Window End\", \"pid\": \"\", "
           "\"tid\": \"\", \"ts\": ");
    put_us(o, end);
    PUT(o, "}\n  ],\n  \"traceName\": ");
    put_str(o, &c->trace_name);
    PUT(o, "\n}\n");
}

/* 0, or -1 when out of memory (o->failed reports I/O errors). */
static int
write_all(const Ctx *c, Out *o)
{
    Devices devs = {NULL, 0};
    ApiUp *api_up = calloc(c->n_spans + 1, sizeof(ApiUp));
    Anns anns = {malloc((c->n_spans + 1) * sizeof(Ann)), 0};
    int rc = -1;
    int opens = c->part == PART_WHOLE || c->part == PART_OPEN;
    int closes = c->part == PART_WHOLE || c->part == PART_CLOSE;
    if (api_up == NULL || anns.v == NULL || gp_trace_gpu_devices(c, &devs) < 0)
        goto done;
    if (opens)
        write_open(c, o);
    /* Appended events follow those of an earlier call: each needs a comma. */
    o->first = opens;

    write_host_meta(c, o);
    if (write_device_meta(c, o, &devs) < 0)
        goto done;

    int64_t end = c->window_end - c->base;
    if (end < 0)
        end = 0;
    if (closes)
        write_markers(c, o, end);
    if (gp_trace_host_write(c, o, api_up, &anns) < 0)
        goto done;
    if (gp_trace_gpu_write(c, o, &devs, api_up, &anns, &end) < 0)
        goto done;
    gp_trace_fwdbwd_write(c, o);
    if (closes)
        write_close(c, o, end);
    gp_trace_out_flush(o);
    rc = 0;
done:
    free(api_up);
    free(anns.v);
    free(devs.v);
    return rc;
}

static void
free_ctx(Ctx *c)
{
    free(c->header.p);
    free(c->trace_name.p);
    free(c->process_name.p);
    gp_trace_out_free_strs(c->names, c->n_names);
    gp_trace_out_free_strs(c->files, c->n_files);
    gp_trace_out_free_strs(c->kernel_names, c->n_kernel_names);
    gp_trace_out_free_strs(c->thread_names, c->n_thread_names);
    gp_trace_out_free_strs(c->module_names, c->n_module_names);
    free(c->sm_counts);
    free(c->warp_sizes);
}

static int
meta_str(PyObject *meta, const char *key, Str *out)
{
    PyObject *v = PyDict_GetItemString(meta, key); /* borrowed */
    if (v == NULL) {
        PyErr_Format(PyExc_TypeError, "_write_trace: meta.%s is missing", key);
        return -1;
    }
    return gp_trace_out_escape_obj(v, out, key);
}

static int
meta_list(PyObject *d, const char *key, Str **out, size_t *n, const char *where)
{
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "_write_trace: %s has no '%s'", where, key);
        return -1;
    }
    return gp_trace_out_escape_list(v, out, n, key);
}

PyObject *
gp_trace_json_write(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *dest, *window, *typed;
    if (!PyArg_ParseTuple(args, "OO!O:_write_trace", &dest, &PyDict_Type, &window, &typed))
        return NULL;
    /* meta is a gpuprof.exporters.chrome.TraceMeta (a dataclass): its fields are its
     * instance dict, which every reader below takes, None standing for a field left
     * out. */
    PyObject *meta = PyDict_Check(typed) ? NULL : PyObject_GetAttrString(typed, "__dict__");
    if (meta == NULL || !PyDict_Check(meta)) {
        Py_XDECREF(meta);
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "_write_trace: meta must be a gpuprof.exporters.chrome.TraceMeta, not %.100s",
                     Py_TYPE(typed)->tp_name);
        return NULL;
    }
    Ctx c;
    Out o;
    Rows spans, gpu, ops, steps, threads, fwdbwd;
    memset(&c, 0, sizeof(c));
    memset(&fwdbwd, 0, sizeof(fwdbwd));
    memset(&o, 0, sizeof(o));
    memset(&spans, 0, sizeof(spans));
    memset(&gpu, 0, sizeof(gpu));
    memset(&ops, 0, sizeof(ops));
    memset(&steps, 0, sizeof(steps));
    memset(&threads, 0, sizeof(threads));
    PyObject *path = NULL, *result = NULL;
    char *tmp = NULL;

    if (get_rows(window, "spans", sizeof(GpSpanRow), &spans) < 0 ||
        get_rows(window, "gpu", sizeof(GpGpuEventRow), &gpu) < 0 ||
        get_rows(window, "ops", sizeof(GpOpRow), &ops) < 0 ||
        get_rows(window, "steps", sizeof(GpStepRow), &steps) < 0 ||
        get_rows(window, "threads", sizeof(GpThreadRow), &threads) < 0)
        goto done;
    c.spans = spans.v;
    c.n_spans = spans.n;
    c.gpu = gpu.v;
    c.n_gpu = gpu.n;
    c.ops = ops.v;
    c.n_ops = ops.n;
    c.steps = steps.v;
    c.n_steps = steps.n;
    c.threads = threads.v;
    c.n_threads = threads.n;
    if (present(meta, "module_names") &&
        meta_list(meta, "module_names", &c.module_names, &c.n_module_names, "meta") < 0)
        goto done;
    if (present(meta, "fwdbwd")) { /* optional: docs/backward.md */
        if (get_rows(meta, "fwdbwd", 4 * sizeof(int64_t), &fwdbwd) < 0)
            goto done;
        c.fwdbwd = fwdbwd.v;
        c.n_fwdbwd = fwdbwd.n;
    }
    if (c.n_spans >= UINT32_MAX || c.n_gpu >= UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "_write_trace: too many events for one trace");
        goto done;
    }
    /* CallFrom's files: as displayed (meta.files), else as recorded */
    int files_in_meta = present(meta, "files");
    if (get_i64(window, "window_start_ns", &c.base, "the window") < 0 ||
        get_i64(window, "window_end_ns", &c.window_end, "the window") < 0 ||
        get_i64(meta, "pid", &c.pid, "meta") < 0 ||
        (files_in_meta ? meta_list(meta, "files", &c.files, &c.n_files, "meta")
                       : meta_list(window, "op_files", &c.files, &c.n_files, "the window")) < 0 ||
        meta_list(meta, "names", &c.names, &c.n_names, "meta") < 0 ||
        meta_list(meta, "kernel_names", &c.kernel_names, &c.n_kernel_names, "meta") < 0 ||
        meta_list(meta, "thread_names", &c.thread_names, &c.n_thread_names, "meta") < 0 ||
        get_int_list(meta, "sm_counts", &c.sm_counts, &c.n_sm_counts) < 0 ||
        get_int_list(meta, "warp_sizes", &c.warp_sizes, &c.n_warp_sizes) < 0 ||
        meta_str(meta, "trace_name", &c.trace_name) < 0 ||
        meta_str(meta, "process_name", &c.process_name) < 0)
        goto done;
    c.sort_index = c.pid;
    if (get_opt_i64(meta, "base_ns", &c.base) < 0 ||
        get_opt_i64(meta, "sort_index", &c.sort_index) < 0 || meta_part(meta, &c.part) < 0)
        goto done;
    {
        int64_t id_base = 0;
        if (get_opt_i64(meta, "id_base", &id_base) < 0)
            goto done;
        if (id_base < 0 || (uint64_t)id_base + c.n_spans >= UINT32_MAX) {
            PyErr_Format(PyExc_ValueError,
                         "_write_trace: meta.id_base must be >= 0 and leave room for the "
                         "window's %zu spans below 2**32 - 1, got %lld",
                         c.n_spans, (long long)id_base);
            goto done;
        }
        c.id_base = (uint32_t)id_base;
    }
    {
        /* The header is JSON already: copied verbatim, not escaped. */
        PyObject *h = PyDict_GetItemString(meta, "header"); /* borrowed */
        Py_ssize_t hn;
        const char *hs = h && PyUnicode_Check(h) ? PyUnicode_AsUTF8AndSize(h, &hn) : NULL;
        if (hs == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "_write_trace: meta.header must be a str");
            goto done;
        }
        c.header.p = malloc((size_t)hn + 1);
        if (c.header.p == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        memcpy(c.header.p, hs, (size_t)hn);
        c.header.n = (size_t)hn;
    }
    o.buf = malloc(OUT_BLOCK);
    if (o.buf == NULL) {
        PyErr_NoMemory();
        goto done;
    }

    int nomem;
    if (PyObject_HasAttrString(dest, "write") && !PyUnicode_Check(dest) && !PyBytes_Check(dest)) {
        o.write = PyObject_GetAttrString(dest, "write");
        if (o.write == NULL)
            goto done;
        nomem = write_all(&c, &o) < 0;
        if (o.failed == 2)
            goto done;
        if (nomem) {
            PyErr_NoMemory();
            goto done;
        }
    } else {
        if (!PyUnicode_FSConverter(dest, &path))
            goto done;
        const char *p = PyBytes_AS_STRING(path);
        size_t plen = (size_t)PyBytes_GET_SIZE(path);
        tmp = malloc(plen + 5);
        if (tmp == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        memcpy(tmp, p, plen);
        memcpy(tmp + plen, ".tmp", 5);
        const char *failed_name = tmp;
        Py_BEGIN_ALLOW_THREADS
        o.fp = fopen(tmp, "wb");
        if (o.fp == NULL) {
            o.failed = 1;
            o.err = errno;
            nomem = 0;
        } else {
            nomem = write_all(&c, &o) < 0;
            errno = 0;
            if (fclose(o.fp) != 0 && !o.failed) {
                o.failed = 1;
                o.err = errno ? errno : EIO;
            }
            o.fp = NULL;
            if (!o.failed && !nomem) {
                if (rename(tmp, p) != 0) {
                    o.failed = 1;
                    o.err = errno;
                    failed_name = p;
                }
            }
            if (o.failed || nomem)
                remove(tmp);
        }
        Py_END_ALLOW_THREADS
        if (nomem) {
            PyErr_NoMemory();
            goto done;
        }
        if (o.failed) {
            errno = o.err;
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, failed_name);
            goto done;
        }
    }
    result = PyLong_FromLongLong(o.events);
done:
    Py_DECREF(meta);
    Py_XDECREF(o.write);
    Py_XDECREF(path);
    free(o.buf);
    free(tmp);
    free_ctx(&c);
    release_rows(&spans);
    release_rows(&gpu);
    release_rows(&ops);
    release_rows(&steps);
    release_rows(&threads);
    release_rows(&fwdbwd);
    return result;
}

/* ---- a trace without the shortest calls ----------------------------------- */

enum { KEEP = 1, LAUNCHES = 2 };

/* Marks in keep[] the spans a trace with a minimum duration writes: every span
 * that is not a Python or C call (annotations, steps, CUDA API calls); every
 * call lasting min_ns or more; and every call around a CUDA API call on its
 * thread, so that each kernel still links to the Python calls that launched
 * it. Nesting, and the clamp into the enclosing slice, are gp_trace_host_write's.
 * Returns the number of spans left out, or -1 when out of memory. */
static int64_t
keep_spans(const Ctx *c, int64_t min_ns, unsigned char *keep)
{
    size_t n = c->n_spans, cap = 64, depth = 0;
    Key *keys = gp_trace_span_keys(c);
    Frame *stack = malloc(cap * sizeof(Frame));
    int64_t omitted = -1;
    if (keys == NULL || stack == NULL)
        goto done;
    memset(keep, 0, n);
    uint64_t lane = UINT64_MAX;
    for (size_t k = 0; k < n; k++) {
        Key *key = &keys[k];
        const GpSpanRow *s = &c->spans[key->idx];
        if (key->lane != lane) {
            lane = key->lane;
            depth = 0;
        }
        ptrdiff_t under = gp_trace_open_slice(&stack, &cap, depth, key);
        if (under < 0)
            goto done;
        depth = (size_t)under;
        if (s->kind == GP_OP_CUDA_API) {
            /* the frames above an already marked one are marked too */
            for (size_t j = depth; j-- > 0 && !(keep[stack[j].span] & LAUNCHES);)
                keep[stack[j].span] |= KEEP | LAUNCHES;
        }
        if ((s->kind != GP_OP_PYTHON && s->kind != GP_OP_CFUNC) || key->end - key->start >= min_ns)
            keep[key->idx] |= KEEP;
        stack[depth++] = (Frame){.end = key->end, .span = key->idx};
    }
    omitted = 0;
    for (size_t i = 0; i < n; i++) {
        keep[i] &= KEEP;
        omitted += !keep[i];
    }
done:
    free(keys);
    free(stack);
    return omitted;
}

PyObject *
gp_trace_json_keep(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *window;
    long long min_ns;
    if (!PyArg_ParseTuple(args, "O!L:_trace_keep", &PyDict_Type, &window, &min_ns))
        return NULL;
    if (min_ns < 0) {
        PyErr_SetString(PyExc_ValueError, "_trace_keep: min_ns must be >= 0");
        return NULL;
    }
    Ctx c;
    Rows spans;
    memset(&c, 0, sizeof(c));
    if (get_rows(window, "spans", sizeof(GpSpanRow), &spans) < 0) {
        release_rows(&spans);
        return NULL;
    }
    PyObject *result = NULL;
    c.spans = spans.v;
    c.n_spans = spans.n;
    if (get_i64(window, "window_start_ns", &c.base, "the window") == 0) {
        PyObject *mask = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)spans.n);
        int64_t omitted = -1;
        if (mask != NULL) {
            Py_BEGIN_ALLOW_THREADS
            omitted = keep_spans(&c, min_ns, (unsigned char *)PyBytes_AS_STRING(mask));
            Py_END_ALLOW_THREADS
            if (omitted < 0) {
                Py_DECREF(mask);
                PyErr_NoMemory();
            } else {
                result = Py_BuildValue("(NL)", mask, (long long)omitted); /* steals mask */
            }
        }
    }
    release_rows(&spans);
    return result;
}
