/* NumPy structured arrays from plain row structs (docs/development.md,
 * "NumPy arrays from C"). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "arrays.h"

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <stdlib.h>
#include <string.h>

#include "aggregate.h"

typedef struct Field {
    const char *name;
    const char *format; /* NumPy format string */
    size_t offset;
} Field;

#define F(type, field, fmt) {#field, fmt, offsetof(type, field)}

/* One field a line, in the row struct's order. */
/* clang-format off */
static const Field op_fields[] = {
    F(GpOpRow, op, "u4"),
    F(GpOpRow, kind, "u1"),
    F(GpOpRow, flags, "u1"),
    F(GpOpRow, calls, "i8"),
    F(GpOpRow, cpu_total_ns, "i8"),
    F(GpOpRow, cpu_self_ns, "i8"),
    F(GpOpRow, cpu_min_ns, "i8"),
    F(GpOpRow, cpu_max_ns, "i8"),
    F(GpOpRow, cuda_total_ns, "i8"),
    F(GpOpRow, cuda_self_ns, "i8"),
    F(GpOpRow, kernels, "i8"),
    F(GpOpRow, cuda_mem_self_bytes, "i8"),
    F(GpOpRow, cuda_mem_total_bytes, "i8"),
    F(GpOpRow, cpu_mem_self_bytes, "i8"),
    {NULL, NULL, 0},
};

static const Field node_fields[] = {
    F(GpNodeRow, id, "i4"),
    F(GpNodeRow, parent, "i4"),
    F(GpNodeRow, op_row, "u4"),
    F(GpNodeRow, thread, "u4"),
    F(GpNodeRow, calls, "i8"),
    F(GpNodeRow, total_ns, "i8"),
    F(GpNodeRow, self_ns, "i8"),
    F(GpNodeRow, cuda_total_ns, "i8"),
    F(GpNodeRow, cuda_self_ns, "i8"),
    F(GpNodeRow, cuda_mem_self_bytes, "i8"),
    F(GpNodeRow, cuda_mem_total_bytes, "i8"),
    {NULL, NULL, 0},
};

static const Field kernel_fields[] = {
    F(GpKernelRow, name, "u4"),
    F(GpKernelRow, device, "i4"),
    F(GpKernelRow, calls, "i8"),
    F(GpKernelRow, total_ns, "i8"),
    F(GpKernelRow, min_ns, "i8"),
    F(GpKernelRow, max_ns, "i8"),
    F(GpKernelRow, bytes, "i8"),
    F(GpKernelRow, grid, "(3,)u4"),
    F(GpKernelRow, block, "(3,)u4"),
    F(GpKernelRow, registers, "u4"),
    F(GpKernelRow, shared_mem, "u4"),
    F(GpKernelRow, category, "u1"),
    {NULL, NULL, 0},
};

static const Field gpu_fields[] = {
    F(GpGpuEventRow, start_ns, "i8"),
    F(GpGpuEventRow, end_ns, "i8"),
    F(GpGpuEventRow, bytes, "i8"),
    F(GpGpuEventRow, address, "i8"),
    F(GpGpuEventRow, correlation, "u4"),
    F(GpGpuEventRow, kernel_row, "u4"),
    F(GpGpuEventRow, op_row, "i4"),
    F(GpGpuEventRow, node, "i4"),
    F(GpGpuEventRow, thread, "i4"),
    F(GpGpuEventRow, stream, "u4"),
    F(GpGpuEventRow, device, "i4"),
    F(GpGpuEventRow, graph_id, "u4"),
    F(GpGpuEventRow, grid, "(3,)u4"),
    F(GpGpuEventRow, block, "(3,)u4"),
    F(GpGpuEventRow, registers, "u4"),
    F(GpGpuEventRow, shared_mem, "u4"),
    F(GpGpuEventRow, wait_stream, "u4"),
    F(GpGpuEventRow, kind, "u1"),
    F(GpGpuEventRow, subkind, "u1"),
    F(GpGpuEventRow, src_mem, "u1"),
    F(GpGpuEventRow, dst_mem, "u1"),
    F(GpGpuEventRow, flags, "u1"),
    {NULL, NULL, 0},
};

static const Field step_fields[] = {
    F(GpStepRow, step, "i8"),
    F(GpStepRow, start_ns, "i8"),
    F(GpStepRow, end_ns, "i8"),
    F(GpStepRow, cpu_ns, "i8"),
    F(GpStepRow, gpu_busy_ns, "i8"),
    F(GpStepRow, gpu_idle_ns, "i8"),
    F(GpStepRow, comm_ns, "i8"),
    F(GpStepRow, memcpy_ns, "i8"),
    F(GpStepRow, sync_wait_ns, "i8"),
    F(GpStepRow, kernels, "i8"),
    F(GpStepRow, thread, "u4"),
    {NULL, NULL, 0},
};

static const Field span_fields[] = {
    F(GpSpanRow, start_ns, "i8"),
    F(GpSpanRow, end_ns, "i8"),
    F(GpSpanRow, op_row, "u4"),
    F(GpSpanRow, parent, "i4"),
    F(GpSpanRow, thread, "u4"),
    F(GpSpanRow, correlation, "u4"),
    F(GpSpanRow, node, "i4"),
    F(GpSpanRow, site, "u4"),
    F(GpSpanRow, line, "i4"),
    F(GpSpanRow, depth, "u2"),
    F(GpSpanRow, kind, "u1"),
    F(GpSpanRow, flags, "u1"),
    F(GpSpanRow, seq, "i4"),
    F(GpSpanRow, module, "u4"),
    {NULL, NULL, 0},
};

static const Field thread_fields[] = {
    F(GpThreadRow, ident, "u8"),
    F(GpThreadRow, os_tid, "u8"),
    F(GpThreadRow, events, "i8"),
    F(GpThreadRow, dropped, "i8"),
    F(GpThreadRow, first_ns, "i8"),
    F(GpThreadRow, last_ns, "i8"),
    F(GpThreadRow, self_sum_ns, "i8"),
    F(GpThreadRow, busy_ns, "i8"),
    {NULL, NULL, 0},
};

static const Field seq_fields[] = {
    F(GpSeqRow, ts, "i8"),
    F(GpSeqRow, lo, "i4"),
    F(GpSeqRow, hi, "i4"),
    F(GpSeqRow, node, "i4"),
    F(GpSeqRow, span, "i4"),
    F(GpSeqRow, thread, "u4"),
    {NULL, NULL, 0},
};
/* clang-format on */

/* Each row type's fields, size and key in the window dict (results.c). */
static const struct {
    const Field *fields;
    size_t itemsize;
    const char *key;
} row_types[GP_ROWS_COUNT] = {
    [GP_ROWS_OPS] = {op_fields, sizeof(GpOpRow), "ops"},
    [GP_ROWS_NODES] = {node_fields, sizeof(GpNodeRow), "nodes"},
    [GP_ROWS_KERNELS] = {kernel_fields, sizeof(GpKernelRow), "kernels"},
    [GP_ROWS_GPU] = {gpu_fields, sizeof(GpGpuEventRow), "gpu"},
    [GP_ROWS_STEPS] = {step_fields, sizeof(GpStepRow), "steps"},
    [GP_ROWS_SPANS] = {span_fields, sizeof(GpSpanRow), "spans"},
    [GP_ROWS_THREADS] = {thread_fields, sizeof(GpThreadRow), "threads"},
    [GP_ROWS_SEQS] = {seq_fields, sizeof(GpSeqRow), "seqs"},
};

/* Cached descriptors: written at module exec, read with the GIL. */
static PyArray_Descr *descrs[GP_ROWS_COUNT];

static PyArray_Descr *
make_descr(const Field *fields, size_t itemsize)
{
    PyObject *names = PyList_New(0), *formats = PyList_New(0), *offsets = PyList_New(0);
    PyObject *spec = NULL, *item = NULL;
    PyArray_Descr *descr = NULL;
    if (!names || !formats || !offsets)
        goto done;
    for (const Field *f = fields; f->name; f++) {
        if ((item = PyUnicode_FromString(f->name)) == NULL || PyList_Append(names, item) < 0)
            goto done;
        Py_CLEAR(item);
        if ((item = PyUnicode_FromString(f->format)) == NULL || PyList_Append(formats, item) < 0)
            goto done;
        Py_CLEAR(item);
        if ((item = PyLong_FromSize_t(f->offset)) == NULL || PyList_Append(offsets, item) < 0)
            goto done;
        Py_CLEAR(item);
    }
    spec = Py_BuildValue("{sOsOsOsn}", "names", names, "formats", formats, "offsets", offsets,
                         "itemsize", (Py_ssize_t)itemsize);
    if (spec == NULL)
        goto done;
    if (!PyArray_DescrConverter(spec, &descr)) {
        descr = NULL;
        goto done;
    }
    if ((size_t)PyDataType_ELSIZE(descr) != itemsize) {
        PyErr_Format(PyExc_ImportError, "gpuprof: dtype size %zd != row size %zu",
                     (Py_ssize_t)PyDataType_ELSIZE(descr), itemsize);
        Py_CLEAR(descr);
    }
done:
    Py_XDECREF(item);
    Py_XDECREF(names);
    Py_XDECREF(formats);
    Py_XDECREF(offsets);
    Py_XDECREF(spec);
    return descr;
}

int
gp_arrays_init(void)
{
    if (PyArray_ImportNumPyAPI() < 0)
        return -1;
    for (int i = 0; i < GP_ROWS_COUNT; i++) {
        if (descrs[i] != NULL)
            continue;
        descrs[i] = make_descr(row_types[i].fields, row_types[i].itemsize);
        if (descrs[i] == NULL)
            return -1;
    }
    return 0;
}

void
gp_arrays_clear(void)
{
    for (int i = 0; i < GP_ROWS_COUNT; i++)
        Py_CLEAR(descrs[i]);
}

PyObject *
gp_arrays_dtype(GpRowType type)
{
    return Py_NewRef((PyObject *)descrs[type]);
}

PyObject *
gp_arrays_dtypes(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    PyObject *d = PyDict_New();
    for (int i = 0; d != NULL && i < GP_ROWS_COUNT; i++) {
        if (PyDict_SetItemString(d, row_types[i].key, (PyObject *)descrs[i]) < 0)
            Py_CLEAR(d);
    }
    return d;
}

PyObject *
gp_arrays_build(GpRowType type, const void *rows, size_t n)
{
    npy_intp dims[1] = {(npy_intp)n};
    Py_INCREF(descrs[type]); /* PyArray_NewFromDescr steals it */
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, descrs[type], 1, dims, NULL, NULL, 0, NULL);
    if (arr == NULL)
        return NULL;
    if (n)
        memcpy(PyArray_DATA((PyArrayObject *)arr), rows, n * row_types[type].itemsize);
    return arr;
}

static void
free_rows(PyObject *capsule)
{
    free(PyCapsule_GetPointer(capsule, "gpuprof._rows"));
}

PyObject *
gp_arrays_adopt(GpRowType type, void *rows, size_t n)
{
    if (rows == NULL || n == 0) {
        free(rows);
        return gp_arrays_build(type, NULL, 0);
    }
    PyObject *base = PyCapsule_New(rows, "gpuprof._rows", free_rows);
    if (base == NULL) {
        free(rows);
        return NULL;
    }
    npy_intp dims[1] = {(npy_intp)n};
    Py_INCREF(descrs[type]); /* PyArray_NewFromDescr steals it */
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, descrs[type], 1, dims, NULL, rows,
                                         NPY_ARRAY_CARRAY, NULL);
    if (arr == NULL) {
        Py_DECREF(base);
        return NULL;
    }
    /* Steals `base`, also when it fails (then the array frees it). */
    if (PyArray_SetBaseObject((PyArrayObject *)arr, base) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}
