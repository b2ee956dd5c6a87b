/* The trace writer's output: a block buffer flushed to a file or a Python
 * write(), number formatting without printf, and JSON string escaping
 * (trace_out.c). Internal to csrc/trace/trace_*.c. */
#ifndef GPUPROF_CSRC_TRACE_OUT_H
#define GPUPROF_CSRC_TRACE_OUT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "common.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define OUT_BLOCK ((size_t)1 << 20)

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

/* An escaped JSON string body (no quotes), malloc'ed. */
typedef struct Str {
    char *p;
    size_t n;
} Str;

/* Write the block out (to the file, or through write()); sets o->failed on
 * failure, after which nothing more is written. */
void gp_trace_out_flush(Out *o);

/* out_bytes when the block is full: flush and continue. */
void gp_trace_out_bytes_slow(Out *o, const char *s, size_t len);

/* A finite non-negative number with two decimals (NaN, negative or absurd: 0.00). */
void gp_trace_out_fixed2(Out *o, double x);

/* obj (str, or bytes holding UTF-8) escaped into out (malloc'ed). 0, or -1 with
 * an exception set (what names the argument). GIL held. */
int gp_trace_out_escape_obj(PyObject *obj, Str *out, const char *what);

/* Every item of list escaped (gp_trace_out_escape_obj) into a malloc'ed array
 * of *n strings. 0, or -1 with an exception set. GIL held. */
int gp_trace_out_escape_list(PyObject *list, Str **out, size_t *n, const char *what);

/* Free n escaped strings and the array v. */
void gp_trace_out_free_strs(Str *v, size_t n);

static inline void
out_bytes(Out *o, const char *s, size_t len)
{
    if (GP_LIKELY(o->n + len <= OUT_BLOCK)) {
        memcpy(o->buf + o->n, s, len);
        o->n += len;
        return;
    }
    gp_trace_out_bytes_slow(o, s, len);
}

#define PUT(o, lit) out_bytes((o), (lit), sizeof(lit) - 1)

/* Room for one number. */
static inline char *
out_room(Out *o, size_t k)
{
    if (o->n + k > OUT_BLOCK)
        gp_trace_out_flush(o);
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

static inline void
put_str(Out *o, const Str *s)
{
    PUT(o, "\"");
    out_bytes(o, s->p, s->n);
    PUT(o, "\"");
}

#endif /* GPUPROF_CSRC_TRACE_OUT_H */
