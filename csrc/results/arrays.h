/* Table rows -> NumPy structured arrays. The only file with NumPy headers. */
#ifndef GPUPROF_CSRC_ARRAYS_H
#define GPUPROF_CSRC_ARRAYS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

/* The row types that have a dtype. */
typedef enum GpRowType {
    GP_ROWS_OPS = 0,
    GP_ROWS_NODES,
    GP_ROWS_KERNELS,
    GP_ROWS_GPU,
    GP_ROWS_STEPS,
    GP_ROWS_SPANS,
    GP_ROWS_THREADS,
    GP_ROWS_SEQS,
    GP_ROWS_COUNT
} GpRowType;

/* Import NumPy's C API and build the dtypes once. 0, or -1 with an
 * exception (also when a dtype's itemsize disagrees with its struct). */
int gp_arrays_init(void);

/* Release the cached dtypes. */
void gp_arrays_clear(void);

/* A new 1-D structured array holding a copy of n rows of type `type`.
 * New reference, or NULL with an exception. */
PyObject *gp_arrays_build(GpRowType type, const void *rows, size_t n);

/* A new 1-D structured array over n rows of type `type` at `rows`, without
 * a copy: it takes over `rows` (malloc'ed), which a capsule, the array's
 * base, frees with the array. `rows` is freed on failure too.
 * New reference, or NULL with an exception. */
PyObject *gp_arrays_adopt(GpRowType type, void *rows, size_t n);

/* _gpuprof._row_dtypes() -> {window key: dtype}: the dtype of each array of a
 * window dict ("ops", "nodes", ...). New reference, or NULL with an exception. */
PyObject *gp_arrays_dtypes(PyObject *module, PyObject *unused);

/* The cached dtype of `type`: new reference. */
PyObject *gp_arrays_dtype(GpRowType type);

#endif /* GPUPROF_CSRC_ARRAYS_H */
