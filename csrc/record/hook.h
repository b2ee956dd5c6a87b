/* The PyEval_SetProfile callback (the hot path) and its installation. */
#ifndef GPUPROF_CSRC_HOOK_H
#define GPUPROF_CSRC_HOOK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

/* Install the callback on every thread of this interpreter, with `owner`
 * (borrowed; the interpreter keeps its own reference) as the profile object
 * that sys.getprofile() returns. Threads started later install it through
 * gp_hook_bootstrap_thread (threading.setprofile, done in Python).
 * 0 on success, -1 with an exception: RuntimeError, installing nothing, when
 * a thread runs another profile function (gpuprof never replaces one). */
int gp_hook_install(PyObject *owner);

/* Remove the callback from every thread where it is ours. Never fails. */
void gp_hook_uninstall(void);

/* Install the callback on the calling thread only (used by the bootstrap). */
void gp_hook_install_current(void);

/* Profile-function backend: install the hook on every thread that has no
 * profile function while recording (warm-up included), remove ours while
 * waiting. GIL; never fails (an exception in flight is kept). */
void gp_hook_follow_phase(PyObject *owner);

/* Write one GP_EV_FRAME event per Python frame of every thread, outermost
 * first, stamped `ts` (raw clock), so that the window starts with the real
 * stacks.
 * Recording must be off and writers quiesced. 0 / -1 with MemoryError. */
int gp_hook_snapshot(uint64_t ts);

/* Write a marker (step, range) into the calling thread's buffer at the
 * current time, if recording. GIL held. */
void gp_hook_marker(uint32_t kind, uint32_t arg);

/* Events lost because an op could not be interned (out of memory). */
uint64_t gp_hook_intern_failures(void);

/* The function that reads PyTorch's autograd sequence counter of the calling
 * thread (at::sequence_number::peek), or NULL to read none (hook.c). GIL. */
void gp_hook_set_seq_peek(void *fn);

/* Record which torch.nn.Module instance each call of `code` (Module.__call__'s
 * code object) runs on, or nothing with NULL, which also lets the instances
 * go. Needs a recording session (the op is interned). 0, or -1 with an
 * exception. GIL. */
int gp_hook_set_module_code(PyObject *code);

/* The instances numbered so far, by number (a new list). */
PyObject *gp_hook_module_instances(void);

/* sys.monitoring backend (3.12+): callbacks registered from Python by
 * python/gpuprof/_monitoring.py; each returns a new reference to None or to
 * sys.monitoring.DISABLE, and never raises. */
#if PY_VERSION_HEX >= 0x030C0000
PyObject *gp_hook_mon_start(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *gp_hook_mon_resume(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *gp_hook_mon_throw(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *gp_hook_mon_return(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *gp_hook_mon_unwind(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *gp_hook_mon_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *gp_hook_mon_c_return(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
#endif

/* Keep sys.monitoring.DISABLE and restart_events (borrowed; None clears).
 * Always 0. */
int gp_hook_monitoring_configure(PyObject *disable, PyObject *restart);

/* Re-arm the locations that callbacks disabled while not recording: called
 * when a warm-up or a recorded window begins. 0, or -1 with an exception. */
int gp_hook_monitoring_restart(void);

#endif /* GPUPROF_CSRC_HOOK_H */
