/* The dump server of an armed process (dump.c): a native thread, started at
 * arming, that answers `gpuprof dump PID` on a Unix socket with every thread's
 * stack, read without the GIL (dump_walk.h). */
#ifndef GPUPROF_CSRC_DUMP_H
#define GPUPROF_CSRC_DUMP_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* _dump_tables, _dump_start, _dump_stop, _dump_pending, _dump_answer,
 * _dump_names, _dump_walk (python/gpuprof/_ondemand/_dump.py uses them); added to
 * the module by module_exec. */
extern PyMethodDef gp_dump_methods[];

#endif /* GPUPROF_CSRC_DUMP_H */
