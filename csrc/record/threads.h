/* Thread names kept past a thread's end: the stand-in for threading.Thread._delete
 * that a profile installs while it runs (python/gpuprof/_threads.py). */
#ifndef GPUPROF_CSRC_THREADS_H
#define GPUPROF_CSRC_THREADS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The _gpuprof._ThreadEnd type: ``_ThreadEnd(original, names)`` makes a callable
 * that, bound to a thread as its ``_delete`` method, stores the thread's ``_name``
 * under its ``_native_id`` (the OS thread id) in ``names`` (a dict) and then calls
 * ``original(thread)``, returning its result. Added to the module by module_exec. */
extern PyType_Spec gp_threads_end_spec;

#endif
