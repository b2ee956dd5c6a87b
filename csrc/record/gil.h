/* Taking the GIL back from a busy main thread (gil.c): for gpuprof's own Python
 * threads, which wait in native code and must get back to Python soon even
 * while the program's main thread runs flat out. */
#ifndef GPUPROF_CSRC_GIL_H
#define GPUPROF_CSRC_GIL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* PyEval_RestoreThread(ts), with the main thread asked to stand aside until
 * this thread holds the GIL. Called without the GIL, returns with it. */
void gp_gil_take_back(PyThreadState *ts);

/* A forked child: the parent's waiters are gone. */
void gp_gil_after_fork_child(void);

/* _wait_readable; added to the module by module_exec. */
extern PyMethodDef gp_gil_methods[];

#endif /* GPUPROF_CSRC_GIL_H */
