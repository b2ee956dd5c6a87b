/* _test_* entry points: drive the C pieces from Python tests (no GPU). */
#ifndef GPUPROF_CSRC_TESTING_H
#define GPUPROF_CSRC_TESTING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Method table entries, terminated by the caller's sentinel. */
extern PyMethodDef gp_testing_methods[];

#endif /* GPUPROF_CSRC_TESTING_H */
