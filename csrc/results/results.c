/* One recorded window's tables as the dict Profiler.result returns
 * (gp_profiler_result_dict, profiler.h). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "profiler.h"

#include "gp_cuda.h"
#include "arrays.h"
#include "buffer.h"
#include "clock.h"
#include "hook.h"
#include "intern.h"
#include "nvtx.h"
#include "schedule.h"
#include "window.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- results -------------------------------------------------------------- */

static int
dict_steal(PyObject *d, const char *key, PyObject *value)
{
    if (value == NULL)
        return -1;
    int rc = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return rc;
}

/* op_shapes[i] = the input sizes of op row i (its NVTX name after
 * GP_NVTX_SHAPES_SEP); the list, of "" for the other rows, is made at the
 * first. 0, or -1 with an exception. */
static int
shapes_at(PyObject **shapes, size_t n, size_t i, const char *text)
{
    if (*shapes == NULL) {
        PyObject *empty = PyUnicode_FromString("");
        *shapes = empty ? PyList_New((Py_ssize_t)n) : NULL;
        if (*shapes == NULL) {
            Py_XDECREF(empty);
            return -1;
        }
        for (size_t j = 0; j < n; j++) {
            Py_INCREF(empty);
            PyList_SET_ITEM(*shapes, (Py_ssize_t)j, empty); /* steals */
        }
        Py_DECREF(empty);
    }
    PyObject *s = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
    if (s == NULL)
        return -1;
    return PyList_SetItem(*shapes, (Py_ssize_t)i, s); /* steals */
}

PyObject *
gp_profiler_result_dict(GpTables *t)
{
    PyObject *d = PyDict_New();
    PyObject *names = NULL, *files = NULL, *lines = NULL, *knames = NULL, *shapes = NULL;
    if (d == NULL)
        return NULL;
    size_t n = t->ops.n;
    names = PyList_New((Py_ssize_t)n);
    files = PyList_New((Py_ssize_t)n);
    lines = PyList_New((Py_ssize_t)n);
    if (!names || !files || !lines)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        const GpOpRow *r = &t->ops.v[i];
        PyObject *name, *file;
        int line = 0;
        if (r->kind == GP_OP_CUDA_API) {
            name = PyUnicode_FromString(gp_cuda_api_name(r->op));
            file = PyUnicode_FromString("");
            if (!name || !file) {
                Py_XDECREF(name);
                Py_XDECREF(file);
                goto fail;
            }
        } else if (r->kind == GP_OP_USER && (r->flags & GP_OPF_NVTX)) {
            /* NVTX range: its message, and "nvtx[:domain][/category]" as file;
             * an autograd node's range (AddmmBackward0) is from "autograd". */
            char text[1024], where[600];
            if (gp_nvtx_describe(r->op, text, sizeof text, where, sizeof where) < 0) {
                snprintf(text, sizeof text, "<nvtx %u>", r->op);
                snprintf(where, sizeof where, "nvtx");
            }
            if (r->flags & GP_OPF_AUTOGRAD)
                snprintf(where, sizeof where, "autograd");
            char *sep = strchr(text, GP_NVTX_SHAPES_SEP); /* an ATen op's input sizes */
            if (sep != NULL) {
                *sep = '\0';
                if (shapes_at(&shapes, n, i, sep + 1) < 0)
                    goto fail;
            }
            name = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
            file = PyUnicode_DecodeUTF8(where, (Py_ssize_t)strlen(where), "replace");
            if (!name || !file) {
                Py_XDECREF(name);
                Py_XDECREF(file);
                goto fail;
            }
        } else if (gp_intern_describe(r->op, &name, &file, &line) < 0) {
            goto fail;
        }
        PyObject *ln = PyLong_FromLong(line);
        if (ln == NULL) {
            Py_DECREF(name);
            Py_DECREF(file);
            goto fail;
        }
        PyList_SET_ITEM(names, (Py_ssize_t)i, name); /* steals */
        PyList_SET_ITEM(files, (Py_ssize_t)i, file); /* steals */
        PyList_SET_ITEM(lines, (Py_ssize_t)i, ln);   /* steals */
    }
    knames = PyList_New((Py_ssize_t)t->strings.n);
    if (knames == NULL)
        goto fail;
    for (size_t i = 0; i < t->strings.n; i++) {
        PyObject *s =
            PyUnicode_DecodeUTF8(t->strings.v[i], (Py_ssize_t)strlen(t->strings.v[i]), "replace");
        if (s == NULL)
            goto fail;
        PyList_SET_ITEM(knames, (Py_ssize_t)i, s); /* steals */
    }
    if (dict_steal(d, "op_names", names) < 0)
        goto fail_after_names;
    names = NULL;
    if (dict_steal(d, "op_files", files) < 0)
        goto fail_after_names;
    files = NULL;
    if (dict_steal(d, "op_lines", lines) < 0)
        goto fail_after_names;
    lines = NULL;
    if (dict_steal(d, "kernel_names", knames) < 0)
        goto fail_after_names;
    knames = NULL;
    if (shapes != NULL) { /* only where an op carried its input sizes */
        if (dict_steal(d, "op_shapes", shapes) < 0)
            goto fail_after_names;
        shapes = NULL;
    }
    if (dict_steal(d, "ops", gp_arrays_build(GP_ROWS_OPS, t->ops.v, t->ops.n)) < 0 ||
        dict_steal(d, "nodes", gp_arrays_build(GP_ROWS_NODES, t->nodes.v, t->nodes.n)) < 0 ||
        dict_steal(d, "kernels", gp_arrays_build(GP_ROWS_KERNELS, t->kernels.v, t->kernels.n)) <
            0 ||
        dict_steal(d, "gpu", gp_arrays_build(GP_ROWS_GPU, t->gpu.v, t->gpu.n)) < 0 ||
        dict_steal(d, "steps", gp_arrays_build(GP_ROWS_STEPS, t->steps.v, t->steps.n)) < 0 ||
        dict_steal(d, "threads", gp_arrays_build(GP_ROWS_THREADS, t->threads.v, t->threads.n)) <
            0 ||
        dict_steal(d, "seqs", gp_arrays_build(GP_ROWS_SEQS, t->seqs.v, t->seqs.n)) < 0 ||
        dict_steal(d, "window_start_ns", PyLong_FromLongLong(t->window_start_ns)) < 0 ||
        dict_steal(d, "window_end_ns", PyLong_FromLongLong(t->window_end_ns)) < 0 ||
        dict_steal(d, "dropped_events", PyLong_FromLongLong(t->dropped_events)) < 0 ||
        dict_steal(d, "dropped_gpu", PyLong_FromLongLong(t->dropped_gpu)) < 0 ||
        dict_steal(d, "attributed_gpu_ns", PyLong_FromLongLong(t->attributed_gpu_ns)) < 0 ||
        dict_steal(d, "unattributed_gpu_ns", PyLong_FromLongLong(t->unattributed_gpu_ns)) < 0 ||
        dict_steal(d, "epoch_offset_ns", PyLong_FromLongLong(gp_clock_epoch_offset())) < 0)
        goto fail_after_names;
    if ((t->shapes_sampled_steps || t->shapes_reused_steps || t->shapes_unmatched_steps) &&
        dict_steal(d, "shapes_steps",
                   Py_BuildValue("{sLsLsL}", "sampled", (long long)t->shapes_sampled_steps,
                                 "reused", (long long)t->shapes_reused_steps, "unmatched",
                                 (long long)t->shapes_unmatched_steps)) < 0)
        goto fail_after_names;
    if (t->has_spans && dict_steal(d, "spans",
                                   gp_window_spans_array(t, (PyObject *const *)gp_intern.refs,
                                                         gp_intern.kinds, gp_intern.n_ops)) < 0)
        goto fail_after_names;
    return d;
fail:
fail_after_names:
    Py_XDECREF(names);
    Py_XDECREF(files);
    Py_XDECREF(lines);
    Py_XDECREF(knames);
    Py_XDECREF(shapes);
    Py_DECREF(d);
    return NULL;
}
