/* The Python-visible Profiler type and the status -> exception table. */
#ifndef GPUPROF_CSRC_PROFILER_H
#define GPUPROF_CSRC_PROFILER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "aggregate.h"
#include "common.h"

/* Capture ranges (profile(capture=...)); exported as module constants CAPTURE_*. */
enum { GP_CAPTURE_NONE = 0, GP_CAPTURE_PROFILER_API = 1, GP_CAPTURE_NVTX = 2 };

/* The type spec, instantiated by module exec. */
extern PyType_Spec gp_profiler_spec;

/* Raise the exception that `status` maps to, with `context` naming the call
 * that failed. Always returns NULL (for `return gp_status_raise(...)`). */
PyObject *gp_status_raise(GpStatus status, const char *context);

/* A dict of NumPy arrays, name lists and scalars describing one window's
 * tables (the layout documented in python/gpuprof/_results.py); "spans"
 * only when they were built (t->has_spans; they move into the dict).
 * Op names and C-call sites (span `line`) are resolved through the intern
 * table, which must be alive.
 * New reference, or NULL with an exception. */
PyObject *gp_profiler_result_dict(GpTables *t);

/* In a child process right after fork(): the running profiler (if any)
 * belongs to the parent; stop recording in the child without touching CUDA.
 * Its step()/stop() become no-ops there. GIL held. */
void gp_profiler_after_fork_child(void);

/* Module-level functions for ranges and steps (module.c's method table). */
PyObject *gp_profiler_range_push(PyObject *module, PyObject *label);
PyObject *gp_profiler_range_pop(PyObject *module, PyObject *op_id);

#endif /* GPUPROF_CSRC_PROFILER_H */
