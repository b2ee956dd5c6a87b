/* The trace writer's output block, numbers and strings (trace_out.h). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "trace_out.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- output ------------------------------------------------------------- */

void
gp_trace_out_flush(Out *o)
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

void
gp_trace_out_bytes_slow(Out *o, const char *s, size_t len)
{
    while (len > 0) {
        if (o->n == OUT_BLOCK)
            gp_trace_out_flush(o);
        size_t k = OUT_BLOCK - o->n;
        if (k > len)
            k = len;
        memcpy(o->buf + o->n, s, k);
        o->n += k;
        s += k;
        len -= k;
    }
}

/* A finite non-negative number with two decimals, without printf (a
 * process locale with a decimal comma must not reach the JSON). */
void
gp_trace_out_fixed2(Out *o, double x)
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
int
gp_trace_out_escape_obj(PyObject *obj, Str *out, const char *what)
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

void
gp_trace_out_free_strs(Str *v, size_t n)
{
    if (v == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        free(v[i].p);
    free(v);
}

/* Escape every item of a list into a new array (*out, *n). 0 / -1. */
int
gp_trace_out_escape_list(PyObject *list, Str **out, size_t *n, const char *what)
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
        if (gp_trace_out_escape_obj(PyList_GET_ITEM(list, (Py_ssize_t)i), &v[i], what) <
            0) { /* borrowed */
            gp_trace_out_free_strs(v, len);
            return -1;
        }
    }
    *out = v;
    *n = len;
    return 0;
}
