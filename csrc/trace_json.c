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

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OUT_BLOCK ((size_t)1 << 20)
#define SYNC_LANE_OFFSET 1000000    /* trace-format 5: Stream Sync rows */
#define DEVICE_SORT_OFFSET 5000000  /* trace-format 5: device process_sort_index */

/* ---- output ------------------------------------------------------------- */

/* Output block. Path mode (fp) runs without the GIL; writer mode (write)
 * holds it throughout. Owned by one call of gp_trace_json_write. */
typedef struct Out {
    char *buf;        /* OUT_BLOCK bytes */
    size_t n;
    FILE *fp;         /* path mode */
    PyObject *write;  /* writer mode: bound write method (strong) */
    int failed;       /* 0 ok, 1 I/O error (err), 2 Python exception set */
    int err;          /* errno of the failed file operation */
    int first;        /* no event written yet */
    int64_t events;
} Out;

static void
out_flush(Out *o)
{
    if (o->n == 0 || o->failed) {
        o->n = 0;
        return;
    }
    if (o->fp != NULL) {
        errno = 0;
        if (fwrite(o->buf, 1, o->n, o->fp) != o->n) {
            o->failed = 1;
            o->err = errno ? errno : EIO;
        }
    } else {
        PyObject *b = PyBytes_FromStringAndSize(o->buf, (Py_ssize_t)o->n);
        PyObject *r = b ? PyObject_CallOneArg(o->write, b) : NULL;
        Py_XDECREF(b);
        if (r == NULL)
            o->failed = 2;
        Py_XDECREF(r);
    }
    o->n = 0;
}

static void
out_bytes_slow(Out *o, const char *s, size_t len)
{
    while (len > 0) {
        if (o->n == OUT_BLOCK)
            out_flush(o);
        size_t k = OUT_BLOCK - o->n;
        if (k > len)
            k = len;
        memcpy(o->buf + o->n, s, k);
        o->n += k;
        s += k;
        len -= k;
    }
}

static inline void
out_bytes(Out *o, const char *s, size_t len)
{
    if (GP_LIKELY(o->n + len <= OUT_BLOCK)) {
        memcpy(o->buf + o->n, s, len);
        o->n += len;
        return;
    }
    out_bytes_slow(o, s, len);
}

#define PUT(o, lit) out_bytes((o), (lit), sizeof(lit) - 1)

/* Room for one number. */
static inline char *
out_room(Out *o, size_t k)
{
    if (o->n + k > OUT_BLOCK)
        out_flush(o);
    return o->buf + o->n;
}

static inline char *
fmt_u64(char *p, uint64_t v)
{
    char tmp[20];
    int i = 0;
    do {
        tmp[i++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (i)
        *p++ = tmp[--i];
    return p;
}

static inline void
put_i64(Out *o, int64_t v)
{
    char *p = out_room(o, 24);
    if (v < 0) {
        *p++ = '-';
        p = fmt_u64(p, (uint64_t)0 - (uint64_t)v);
    } else {
        p = fmt_u64(p, (uint64_t)v);
    }
    o->n = (size_t)(p - o->buf);
}

/* Nanoseconds as microseconds with exactly three decimals; negative -> 0. */
static inline void
put_us(Out *o, int64_t ns)
{
    if (ns < 0)
        ns = 0;
    char *p = out_room(o, 28);
    p = fmt_u64(p, (uint64_t)ns / 1000);
    unsigned f = (unsigned)((uint64_t)ns % 1000);
    *p++ = '.';
    *p++ = (char)('0' + f / 100);
    *p++ = (char)('0' + f / 10 % 10);
    *p++ = (char)('0' + f % 10);
    o->n = (size_t)(p - o->buf);
}

/* A finite non-negative number with two decimals, without printf (a
 * process locale with a decimal comma must not reach the JSON). */
static void
put_fixed2(Out *o, double x)
{
    if (!(x >= 0.0) || x > 1e15) /* NaN, negative or absurd */
        x = 0.0;
    uint64_t c = (uint64_t)(x * 100.0 + 0.5);
    char *p = out_room(o, 28);
    p = fmt_u64(p, c / 100);
    *p++ = '.';
    *p++ = (char)('0' + c / 10 % 10);
    *p++ = (char)('0' + c % 10);
    o->n = (size_t)(p - o->buf);
}

/* ---- strings -------------------------------------------------------------- */

/* An escaped JSON string body (no quotes), malloc'ed. */
typedef struct Str {
    char *p;
    size_t n;
} Str;

static inline void
put_str(Out *o, const Str *s)
{
    PUT(o, "\"");
    out_bytes(o, s->p, s->n);
    PUT(o, "\"");
}

/* Length of the well-formed UTF-8 sequence at s (RFC 3629: no overlongs,
 * no surrogates, at most U+10FFFF), or 0. */
static size_t
utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F; /* UTF-16 surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return len;
}

/* Escape n bytes of (possibly invalid) UTF-8: '"' and '\\' escaped, every
 * control character below U+0020 as \u00XX, invalid bytes as \ufffd.
 * 0, or -1 when out of memory. */
static int
escape_utf8(const char *src, size_t n, Str *out)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)src;
    char *p = malloc(6 * n + 1);
    out->p = p;
    out->n = 0;
    if (p == NULL)
        return -1;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c == '"' || c == '\\') {
            *p++ = '\\';
            *p++ = (char)c;
            i++;
        } else if (c < 0x20) {
            memcpy(p, "\\u00", 4);
            p[4] = hex[c >> 4];
            p[5] = hex[c & 15];
            p += 6;
            i++;
        } else if (c < 0x80) {
            *p++ = (char)c;
            i++;
        } else {
            size_t k = utf8_seq(s + i, n - i);
            if (k == 0) {
                memcpy(p, "\\ufffd", 6);
                p += 6;
                i++;
            } else {
                memcpy(p, s + i, k);
                p += k;
                i += k;
            }
        }
    }
    out->n = (size_t)(p - out->p);
    return 0;
}

/* Escape a str (lone surrogates allowed) or bytes object. 0 / -1 with an
 * exception. `what` names the argument in a TypeError. */
static int
escape_obj(PyObject *obj, Str *out, const char *what)
{
    const char *s = NULL;
    Py_ssize_t n = 0;
    PyObject *tmp = NULL;
    out->p = NULL;
    out->n = 0;
    if (PyBytes_Check(obj)) {
        s = PyBytes_AS_STRING(obj);
        n = PyBytes_GET_SIZE(obj);
    } else if (PyUnicode_Check(obj)) {
        s = PyUnicode_AsUTF8AndSize(obj, &n);
        if (s == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
                return -1;
            /* Lone surrogates: encode them as they are, the escaper
             * replaces the (invalid) bytes. */
            PyErr_Clear();
            tmp = PyUnicode_AsEncodedString(obj, "utf-8", "surrogatepass");
            if (tmp == NULL)
                return -1;
            s = PyBytes_AS_STRING(tmp);
            n = PyBytes_GET_SIZE(tmp);
        }
    } else {
        PyErr_Format(PyExc_TypeError, "_write_trace: %s must be str or bytes, not %.100s", what,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    int rc = escape_utf8(s, (size_t)n, out);
    Py_XDECREF(tmp);
    if (rc < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void
free_strs(Str *v, size_t n)
{
    if (v == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        free(v[i].p);
    free(v);
}

/* Escape every item of a list into a new array (*out, *n). 0 / -1. */
static int
escape_list(PyObject *list, Str **out, size_t *n, const char *what)
{
    *out = NULL;
    *n = 0;
    if (!PyList_Check(list)) {
        PyErr_Format(PyExc_TypeError, "_write_trace: %s must be a list", what);
        return -1;
    }
    size_t len = (size_t)PyList_GET_SIZE(list);
    Str *v = calloc(len + 1, sizeof(Str));
    if (v == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < len; i++) {
        if (escape_obj(PyList_GET_ITEM(list, (Py_ssize_t)i), &v[i], what) < 0) { /* borrowed */
            free_strs(v, len);
            return -1;
        }
    }
    *out = v;
    *n = len;
    return 0;
}

/* meta['part']: a whole file, or one window's events inside a file written by
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
        PyErr_Format(PyExc_TypeError, "_write_trace: meta['%s'] must be an int, not %.100s", key,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)x;
    return 0;
}

/* meta['part'] (optional, default "whole") -> PART_*. */
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
                 "_write_trace: meta['part'] must be 'whole', 'open', 'append' or 'close', "
                 "got %R", v);
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
        PyErr_Format(PyExc_TypeError, "_write_trace: meta['%s'] must be a list of int", key);
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

/* Everything the pure-C part needs. */
typedef struct Ctx {
    const GpSpanRow *spans;
    size_t n_spans;
    const GpGpuEventRow *gpu;
    size_t n_gpu;
    const GpOpRow *ops;
    size_t n_ops;
    const GpStepRow *steps;
    size_t n_steps;
    const GpThreadRow *threads;
    size_t n_threads;
    int64_t base;       /* profiler-clock ns of ts == 0 (window start, or meta base_ns) */
    int64_t window_end;
    int64_t pid;
    int64_t sort_index; /* process_sort_index of the host lane (meta, default pid) */
    uint32_t id_base;   /* added to Python ids, External ids and Ev Idx (meta id_base) */
    int part;           /* PART_*: which pieces of the file this call writes */
    Str header, trace_name, process_name;
    Str *names;         /* per op row */
    size_t n_names;
    Str *files;         /* per op row */
    size_t n_files;
    Str *kernel_names;  /* per kernels row */
    size_t n_kernel_names;
    Str *thread_names;  /* per threads row */
    size_t n_thread_names;
    int64_t *sm_counts, *warp_sizes;
    size_t n_sm_counts, n_warp_sizes;
} Ctx;

/* ---- ordering and nesting -------------------------------------------------- */

/* One slice in lane order: lane, start ascending, then longest first. */
typedef struct Key {
    int64_t start; /* relative ns, >= 0 */
    int64_t end;   /* relative ns, >= start; clamped into the enclosing slice */
    uint64_t lane;
    uint32_t idx;
    uint32_t api;  /* GPU slice: 1 + the API span that launched it, 0 none */
} Key;

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

static void
sort_keys(Key *k, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        if (cmp_key(&k[i - 1], &k[i]) > 0) {
            qsort(k, n, sizeof(Key), cmp_key);
            return;
        }
    }
}

static inline int64_t
rel(const Ctx *c, int64_t t)
{
    int64_t r = t - c->base;
    return r < 0 ? 0 : r;
}

/* ---- host events ---------------------------------------------------------- */

/* An open slice during the host sweep. */
typedef struct Frame {
    int64_t end;
    uint32_t span;   /* its span row */
    uint32_t py_id;  /* Python id of the innermost python_function at or above, 0 none */
    int32_t py_span; /* innermost Python-function span (CallFrom), -1 none */
    uint32_t ext;    /* External id of the innermost user_annotation, 0 none */
    uint32_t ann;    /* its number in the Anns list, 0 none */
} Frame;

/* One step of a host sweep (keys in lane order, depth reset to 0 at each new
 * lane): closes the open slices that end at or before key starts, clamps key
 * into the slice still open (snapshot frames and ranges left open by a
 * returning function can otherwise overlap) and makes room on the stack for
 * key. Returns the depth under key, or -1 when the stack cannot grow. */
static ptrdiff_t
open_slice(Frame **stack, size_t *cap, size_t depth, Key *key)
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

/* The record_function ranges in host sweep order, so that a range comes
 * after the range enclosing it: the GPU side projects each one, with the
 * ranges around it, onto the streams its launches ran on (trace-format 6.7).
 * ProfilerStep#N is not projected: torch.profiler draws steps on the host
 * only, and readers that take every ProfilerStep#N slice for a step (the
 * TensorBoard plugin) would count each step once per stream. Owned by
 * write_all. */
typedef struct Ann {
    uint32_t span;   /* span row */
    uint32_t parent; /* number (index + 1) of the enclosing range, 0 none */
} Ann;

typedef struct Anns {
    Ann *v; /* capacity n_spans */
    uint32_t n;
} Anns;

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

static int64_t
thread_tid(const Ctx *c, uint32_t thread)
{
    if (thread >= c->n_threads)
        return 0;
    const GpThreadRow *t = &c->threads[thread];
    if (t->os_tid != 0 && t->os_tid <= (uint64_t)INT64_MAX)
        return (int64_t)t->os_tid;
    return (int64_t)(t->ident & 0x7fffffffu);
}

static const Str unknown_name = {"<unknown>", 9};

static const Str *
name_of(const Ctx *c, uint32_t op_row)
{
    return op_row < c->n_names ? &c->names[op_row] : &unknown_name;
}

static void
begin_event(Out *o)
{
    if (o->first) {
        PUT(o, "\n");
        o->first = 0;
    } else {
        PUT(o, ",\n");
    }
    o->events++;
}

/* "pid": P, "tid": T, "ts": S */
static void
put_lane_ts(Out *o, int64_t pid, int64_t tid, int64_t ts)
{
    PUT(o, ",\"pid\":");
    put_i64(o, pid);
    PUT(o, ",\"tid\":");
    put_i64(o, tid);
    PUT(o, ",\"ts\":");
    put_us(o, ts);
}

static void
put_slice_head(Out *o, const char *cat, size_t cat_len, const Str *name, int64_t pid,
               int64_t tid, int64_t ts, int64_t dur)
{
    begin_event(o);
    PUT(o, "{\"ph\":\"X\",\"cat\":\"");
    out_bytes(o, cat, cat_len);
    PUT(o, "\",\"name\":");
    put_str(o, name);
    put_lane_ts(o, pid, tid, ts);
    PUT(o, ",\"dur\":");
    put_us(o, dur);
}

#define CAT(s) (s), sizeof(s) - 1

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
static Key *
span_keys(const Ctx *c)
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
    sort_keys(keys, n);
    return keys;
}

/* What the GPU side needs of each CUDA API span: the innermost projected
 * range around it, and the External id it carries (its innermost
 * user_annotation, steps included), which its GPU work carries too. */
typedef struct ApiUp {
    uint32_t ann; /* number of the range in Anns, 0 none */
    uint32_t ext; /* External id, 0 none */
} ApiUp;

/* Write every span. Fills anns, and api_up for each API span. */
static int
write_host(const Ctx *c, Out *o, ApiUp *api_up, Anns *anns)
{
    size_t n = c->n_spans;
    Key *keys = span_keys(c);
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
        ptrdiff_t under = open_slice(&stack, &cap, depth, key);
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

static int
cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a > b) - (a < b);
}

/* Per device: the id that stands in for stream 0 (an unused positive id). */
typedef struct DevLane {
    int32_t device;
    uint32_t zero_sub;
    int64_t allocated; /* running device-memory total */
} DevLane;

typedef struct Devices {
    DevLane *v;
    size_t n;
} Devices;

static DevLane *
dev_find(const Devices *d, int32_t device)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->v[i].device == device)
            return &d->v[i];
    return NULL;
}

static inline int32_t
dev_pid(int32_t device)
{
    return device < 0 ? 0 : device;
}

static inline int
is_slice_kind(uint8_t kind)
{
    return kind >= GP_GPU_KERNEL && kind <= GP_GPU_SYNC;
}

/* Lane id (tid) of a GPU slice. */
static int64_t
gpu_tid(const GpGpuEventRow *g, const DevLane *d)
{
    int64_t stream = g->stream ? (int64_t)g->stream : (int64_t)d->zero_sub;
    return g->kind == GP_GPU_SYNC ? stream + SYNC_LANE_OFFSET : stream;
}

/* Find the devices and their stream-0 substitutes. */
static int
build_devices(const Ctx *c, Devices *d)
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

static void
put_flow(Out *o, char ph, uint32_t id, int64_t pid, int64_t tid, int64_t ts)
{
    begin_event(o);
    if (ph == 's')
        PUT(o, "{\"ph\":\"s\",\"id\":");
    else
        PUT(o, "{\"ph\":\"f\",\"id\":");
    put_i64(o, id);
    put_lane_ts(o, pid, tid, ts);
    if (ph == 's')
        PUT(o, ",\"cat\":\"ac2g\",\"name\":\"ac2g\"}");
    else
        PUT(o, ",\"cat\":\"ac2g\",\"name\":\"ac2g\",\"bp\":\"e\"}");
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

/* Scratch for the projections, owned by write_gpu; the per-annotation arrays
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
    const Str *name = g->kernel_row < c->n_kernel_names ? &c->kernel_names[g->kernel_row]
                                                        : &gpu_activity_name;
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
            int64_t warp = (size_t)pid < c->n_warp_sizes && c->warp_sizes[pid] > 0
                               ? c->warp_sizes[pid]
                               : 32;
            double warps = (double)(((int64_t)threads + warp - 1) / warp);
            PUT(o, ",\"blocks per SM\":");
            put_fixed2(o, blocks / (double)sms);
            PUT(o, ",\"warps per SM\":");
            put_fixed2(o, blocks * warps / (double)sms);
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
        put_fixed2(o, raw_dur > 0 ? (double)g->bytes / (double)raw_dur : 0.0);
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

static int
write_gpu(const Ctx *c, Out *o, Devices *devs, const ApiUp *api_up, const Anns *anns,
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
    sort_keys(keys, nk);

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
    rc = 0;
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
    if (api_up == NULL || anns.v == NULL || build_devices(c, &devs) < 0)
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
    if (write_host(c, o, api_up, &anns) < 0)
        goto done;
    if (write_gpu(c, o, &devs, api_up, &anns, &end) < 0)
        goto done;
    if (closes)
        write_close(c, o, end);
    out_flush(o);
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
    free_strs(c->names, c->n_names);
    free_strs(c->files, c->n_files);
    free_strs(c->kernel_names, c->n_kernel_names);
    free_strs(c->thread_names, c->n_thread_names);
    free(c->sm_counts);
    free(c->warp_sizes);
}

static int
meta_str(PyObject *meta, const char *key, Str *out)
{
    PyObject *v = PyDict_GetItemString(meta, key); /* borrowed */
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "_write_trace: meta has no '%s'", key);
        return -1;
    }
    return escape_obj(v, out, key);
}

static int
meta_list(PyObject *d, const char *key, Str **out, size_t *n, const char *where)
{
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "_write_trace: %s has no '%s'", where, key);
        return -1;
    }
    return escape_list(v, out, n, key);
}

PyObject *
gp_trace_json_write(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *dest, *window, *meta;
    if (!PyArg_ParseTuple(args, "OO!O!:_write_trace", &dest, &PyDict_Type, &window, &PyDict_Type,
                          &meta))
        return NULL;
    Ctx c;
    Out o;
    Rows spans, gpu, ops, steps, threads;
    memset(&c, 0, sizeof(c));
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
    if (c.n_spans >= UINT32_MAX || c.n_gpu >= UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "_write_trace: too many events for one trace");
        goto done;
    }
    /* CallFrom's files: as displayed (meta['files']), else as recorded */
    int files_in_meta = PyDict_GetItemString(meta, "files") != NULL;
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
                         "_write_trace: meta['id_base'] must be >= 0 and leave room for the "
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
                PyErr_SetString(PyExc_TypeError, "_write_trace: meta['header'] must be a str");
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
    return result;
}

/* ---- a trace without the shortest calls ----------------------------------- */

enum { KEEP = 1, LAUNCHES = 2 };

/* Marks in keep[] the spans a trace with a minimum duration writes: every span
 * that is not a Python or C call (annotations, steps, CUDA API calls); every
 * call lasting min_ns or more; and every call around a CUDA API call on its
 * thread, so that each kernel still links to the Python calls that launched
 * it. Nesting, and the clamp into the enclosing slice, are write_host's.
 * Returns the number of spans left out, or -1 when out of memory. */
static int64_t
keep_spans(const Ctx *c, int64_t min_ns, unsigned char *keep)
{
    size_t n = c->n_spans, cap = 64, depth = 0;
    Key *keys = span_keys(c);
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
        ptrdiff_t under = open_slice(&stack, &cap, depth, key);
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
