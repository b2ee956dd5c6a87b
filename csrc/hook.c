/* The profile callback and per-thread hook installation.
 *
 * The callback does, per event: one relaxed load of the phase, one TLS read,
 * at most one intern lookup, one clock read and one 16-byte store. It never
 * creates Python objects (except on an op's first sight, in intern.c), never
 * calls Python code, never sets an exception and always returns 0.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "hook.h"

#include "buffer.h"
#include "clock.h"
#include "compat.h"
#include "intern.h"

#include <stdlib.h>
#include <string.h>

static uint64_t intern_failures = 0; /* GIL */

/* Whether `self` is the private record a binding library hands its free
 * functions as their `self` (pybind11: a capsule, or since 3.0 a
 * pybind11_builtins.pybind11_detail_function_record_* object). Such a
 * function belongs to its __module__, not to the record's type. */
static int
is_binding_record(PyObject *self)
{
    return Py_IS_TYPE(self, &PyCapsule_Type) ||
           strncmp(Py_TYPE(self)->tp_name, "pybind11_builtins.", 18) == 0;
}

/* Key of a C function call: its PyMethodDef and its owner (the module for
 * module functions, the class itself for class and static methods, the type
 * of self for methods, the __module__ string for a binding library's free
 * functions). `self_arg` is the first argument of a call through a method
 * descriptor (sys.monitoring's CALL passes it; NULL otherwise): a method is
 * keyed by the type of the object it runs on, as a bound method of that
 * object is (the profile hook and 3.12's legacy profiler see those), so
 * both backends name `x.relu()` alike. 0 when `callable` is not a C
 * function we name (then neither its call nor its return is recorded). */
GP_INLINE int
cfunc_key(PyObject *callable, PyObject *self_arg, const PyMethodDef **ml, PyObject **owner)
{
    if (PyCFunction_Check(callable)) {
        PyCFunctionObject *fn = (PyCFunctionObject *)callable;
        PyObject *self = fn->m_self;
        *ml = fn->m_ml;
        if (self == NULL || PyModule_Check(self))
            *owner = self;
        else if (fn->m_module != NULL && PyUnicode_Check(fn->m_module) && is_binding_record(self))
            *owner = fn->m_module;
        else if (PyType_Check(self)) /* class and static methods: the class, not its type */
            *owner = self;
        else
            *owner = (PyObject *)Py_TYPE(self);
        return 1;
    }
    if (Py_IS_TYPE(callable, &PyMethodDescr_Type)) {
        PyMethodDescrObject *d = (PyMethodDescrObject *)callable;
        *ml = d->d_method;
        *owner = self_arg != NULL && PyObject_TypeCheck(self_arg, PyDescr_TYPE(d))
                     ? (PyObject *)Py_TYPE(self_arg)
                     : (PyObject *)PyDescr_TYPE(d);
        return 1;
    }
    return 0;
}

static int
profile_callback(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg)
{
    (void)obj;
    if (atomic_load_explicit(&gp_buffer_phase, memory_order_relaxed) < GP_PHASE_WARMUP)
        return 0;
    GpThreadBuf *tb = gp_buffer_thread();
    if (GP_UNLIKELY(tb == NULL))
        return 0;
    uint64_t ts = gp_clock_raw();
    switch (what) {
    case PyTrace_CALL: {
#if PY_VERSION_HEX < 0x030B0000
        PyCodeObject *code = frame->f_code; /* borrowed: the frame struct is public before 3.11 */
        uint32_t op = gp_intern_code(code);
#else
        PyCodeObject *code = PyFrame_GetCode(frame);
        uint32_t op = gp_intern_code(code);
        Py_DECREF(code);
#endif
        if (GP_UNLIKELY(op == 0)) {
            intern_failures++;
            return 0;
        }
        uint32_t kind = GP_EV_CALL;
        if (GP_UNLIKELY(gp_intern.flags[op] & GP_OPF_GENERATOR)) {
            /* A generator frame's first entry is at or before its prologue's
             * RESUME (intern.c computes that offset per code object); later
             * entries resume after a yield or await, at higher offsets. */
            if (PyFrame_GetLasti(frame) > gp_intern.gen_lasti[op])
                kind = GP_EV_RESUME;
        }
        gp_buffer_push(tb, ts, op, kind);
        break;
    }
    case PyTrace_RETURN:
        gp_buffer_push(tb, ts, 0, GP_EV_RETURN);
        break;
    case PyTrace_C_CALL: {
        const PyMethodDef *ml;
        PyObject *owner;
        if (!cfunc_key(arg, NULL, &ml, &owner))
            return 0;
        uint32_t op = gp_intern_cfunc(ml, owner);
        if (GP_UNLIKELY(op == 0)) {
            intern_failures++;
            return 0;
        }
        /* The call site: the caller's instruction offset, resolved to a line
         * only when results are built (sync points and launches are C calls,
         * and users want the line that made them). 0 = unknown. */
        int lasti = PyFrame_GetLasti(frame);
        uint32_t site = lasti >= 0 && lasti < 0xfffffe ? (uint32_t)lasti + 1 : 0;
        gp_buffer_push(tb, ts, op, GP_EV_MAKE(GP_EV_CCALL, site));
        break;
    }
    case PyTrace_C_RETURN:
    case PyTrace_C_EXCEPTION:
        /* Profile functions see C calls of builtin functions and method
         * descriptors only (3.12+'s legacy shim binds the latter first),
         * which cfunc_key always names; a return whose call went unrecorded
         * (out of memory) closes nothing: the aggregation never looks past
         * the calling Python frame for it. */
        gp_buffer_push(tb, ts, 0, GP_EV_CRETURN);
        break;
    default:
        break;
    }
    return 0;
}

/* Whether `obj` is gpuprof._gpuprof._thread_bootstrap, the sys.setprofile
 * function a thread started during a session runs once to install the hook. */
static int
is_thread_bootstrap(PyObject *obj)
{
    if (obj == NULL || !PyCFunction_Check(obj))
        return 0;
    PyCFunctionObject *fn = (PyCFunctionObject *)obj;
    if (fn->m_self == NULL || !PyModule_Check(fn->m_self) ||
        strcmp(fn->m_ml->ml_name, "_thread_bootstrap") != 0)
        return 0;
    const char *mod = PyModule_GetName(fn->m_self);
    if (mod == NULL) {
        PyErr_Clear();
        return 0;
    }
    return strcmp(mod, "gpuprof._gpuprof") == 0;
}

/* Installing the hook replaces every thread's profile function, so refuse
 * when some thread runs another profiler (profiler.py checks the calling
 * thread first, with its own message; this covers the others, which were
 * silently replaced, and then cleared at stop). */
static int
check_no_other_profiler(PyInterpreterState *interp)
{
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts;
         ts = PyThreadState_Next(ts)) {
        if (ts->c_profilefunc == NULL || ts->c_profilefunc == profile_callback ||
            is_thread_bootstrap(ts->c_profileobj))
            continue;
        PyErr_Format(PyExc_RuntimeError,
                     "gpuprof.profile.start(): another profiler is active in thread %lu "
                     "(sys.setprofile is set to %R there); stop it first, gpuprof will not "
                     "silently replace it",
                     ts->thread_id, ts->c_profileobj ? ts->c_profileobj : Py_None);
        return -1;
    }
    return 0;
}

int
gp_hook_install(PyObject *owner)
{
    if (check_no_other_profiler(PyThreadState_GetInterpreter(PyThreadState_Get())) < 0)
        return -1;
#if PY_VERSION_HEX >= 0x030C0000
    PyEval_SetProfileAllThreads(profile_callback, owner);
    if (PyErr_Occurred())
        return -1;
#else
    PyThreadState *self = PyThreadState_Get();
    PyInterpreterState *interp = PyThreadState_GetInterpreter(self);
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts;
         ts = PyThreadState_Next(ts)) {
        /* _PyEval_SetProfile is the 3.10/3.11 way to set another thread's
         * profiler (public PyEval_SetProfile only sets the caller's). */
        if (_PyEval_SetProfile(ts, profile_callback, owner) < 0)
            return -1;
    }
#endif
    return 0;
}

void
gp_hook_install_current(void)
{
    PyThreadState *ts = PyThreadState_Get();
    if (atomic_load_explicit(&gp_buffer_phase, memory_order_relaxed) >= GP_PHASE_WARMUP)
        PyEval_SetProfile(profile_callback, ts->c_profileobj);
    else /* waiting: the next window installs it (gp_hook_follow_phase) */
        PyEval_SetProfile(NULL, NULL);
}

/* While the schedule waits the hook would return at once on every call, but
 * CPython's call path with any profile function set is slow in itself (on
 * 3.11, a loop of empty Python calls ran 4.5x slower): so it is installed
 * only while a window records or warms up. Threads whose profile function is
 * someone else's are left alone; the window's stack snapshot supplies the
 * calls in progress when it opens. */
void
gp_hook_follow_phase(PyObject *owner)
{
    int recording = atomic_load(&gp_buffer_phase) >= GP_PHASE_WARMUP;
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    PyInterpreterState *interp = PyThreadState_GetInterpreter(PyThreadState_Get());
#if PY_VERSION_HEX >= 0x030C0000
    /* No per-thread setter here: with another profiler on some thread,
     * every thread is left as it is. */
    int foreign = 0;
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts; ts = PyThreadState_Next(ts))
        foreign |= ts->c_profilefunc != NULL && ts->c_profilefunc != profile_callback &&
                   !is_thread_bootstrap(ts->c_profileobj);
    if (!foreign)
        PyEval_SetProfileAllThreads(recording ? profile_callback : NULL, recording ? owner : NULL);
#else
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts;
         ts = PyThreadState_Next(ts)) {
        if (recording && ts->c_profilefunc == NULL)
            _PyEval_SetProfile(ts, profile_callback, owner);
        else if (!recording && ts->c_profilefunc == profile_callback)
            _PyEval_SetProfile(ts, NULL, NULL);
    }
#endif
    PyErr_Clear(); /* an audit hook's refusal leaves that thread as it was */
    PyErr_Restore(exc_type, exc_value, exc_tb);
}

void
gp_hook_uninstall(void)
{
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    PyThreadState *self = PyThreadState_Get();
    PyInterpreterState *interp = PyThreadState_GetInterpreter(self);
    int foreign = 0; /* a thread whose profile function is someone else's */
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts;
         ts = PyThreadState_Next(ts)) {
        if (ts->c_profilefunc != profile_callback) {
            foreign |= ts->c_profilefunc != NULL;
            continue;
        }
#if PY_VERSION_HEX < 0x030C0000
        if (_PyEval_SetProfile(ts, NULL, NULL) < 0)
            PyErr_Clear();
#endif
    }
#if PY_VERSION_HEX >= 0x030C0000
    /* 3.12+ has no public setter for another thread: clear all threads at
     * once, unless user code installed its own profiler meanwhile; then
     * clear only this thread's (ours elsewhere stay, idle: the phase is off). */
    if (!foreign)
        PyEval_SetProfileAllThreads(NULL, NULL);
    else if (self->c_profilefunc == profile_callback)
        PyEval_SetProfile(NULL, NULL);
    PyErr_Clear();
#else
    (void)foreign;
#endif
    PyErr_Restore(exc_type, exc_value, exc_tb);
}

int
gp_hook_snapshot(uint64_t ts)
{
    PyThreadState *self = PyThreadState_Get();
    PyInterpreterState *interp = PyThreadState_GetInterpreter(self);
    size_t cap = 64;
    uint32_t *ops = malloc(cap * sizeof(uint32_t));
    if (ops == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (PyThreadState *t = PyInterpreterState_ThreadHead(interp); t; t = PyThreadState_Next(t)) {
        size_t n = 0;
        PyFrameObject *frame = PyThreadState_GetFrame(t); /* new reference or NULL */
        while (frame != NULL) {
            if (n == cap) {
                uint32_t *grown = realloc(ops, cap * 2 * sizeof(uint32_t));
                if (grown == NULL) {
                    Py_DECREF(frame);
                    free(ops);
                    PyErr_NoMemory();
                    return -1;
                }
                ops = grown;
                cap *= 2;
            }
            PyCodeObject *code = PyFrame_GetCode(frame);
            uint32_t op = gp_intern_code(code);
            Py_DECREF(code);
            if (op)
                ops[n++] = op;
            PyFrameObject *back = PyFrame_GetBack(frame); /* new reference or NULL */
            Py_DECREF(frame);
            frame = back;
        }
        if (n == 0)
            continue;
        GpThreadBuf *tb = gp_buffer_thread_for((uint64_t)t->thread_id);
        if (tb == NULL)
            continue; /* a helper thread of ours (or out of memory: that thread goes unseen) */
        tb->has_python = 1;
        while (n > 0)
            gp_buffer_push(tb, ts, ops[--n], GP_EV_FRAME);
    }
    free(ops);
    return 0;
}

void
gp_hook_marker(uint32_t kind, uint32_t arg)
{
    if (atomic_load_explicit(&gp_buffer_phase, memory_order_relaxed) < GP_PHASE_WARMUP)
        return;
    GpThreadBuf *tb = gp_buffer_thread();
    if (tb == NULL)
        return;
    gp_buffer_push(tb, gp_clock_raw(), arg, kind);
}

uint64_t
gp_hook_intern_failures(void)
{
    return intern_failures;
}

/* ---- sys.monitoring (PEP 669) backend, CPython 3.12+ -------------------------
 *
 * The same records as the profile callback, from sys.monitoring callbacks
 * registered in Python (python/gpuprof/_monitoring.py). Three differences:
 * PY_START and PY_RESUME tell a fresh call from a resume directly; events
 * are interpreter-wide, so threads need no per-thread installation; and a
 * callback can return sys.monitoring.DISABLE to switch an event off at one
 * code location, which we do for every location while not recording and
 * for calls of anything but C functions, so that waiting costs next to
 * nothing. gp_hook_monitoring_restart re-arms them when recording starts.
 */
#if PY_VERSION_HEX >= 0x030C0000

static PyObject *mon_disable = NULL; /* sys.monitoring.DISABLE; GIL */
static PyObject *mon_restart = NULL; /* sys.monitoring.restart_events; GIL */

GP_INLINE int
recording(void)
{
    return atomic_load_explicit(&gp_buffer_phase, memory_order_relaxed) >= GP_PHASE_WARMUP;
}

GP_INLINE PyObject *
disable_or_none(void)
{
    return Py_NewRef(mon_disable ? mon_disable : Py_None);
}

static PyObject *
mon_push_code(PyObject *const *args, Py_ssize_t nargs, uint32_t kind)
{
    if (!recording())
        return disable_or_none();
    if (nargs < 1 || !PyCode_Check(args[0]))
        Py_RETURN_NONE;
    GpThreadBuf *tb = gp_buffer_thread();
    if (GP_UNLIKELY(tb == NULL))
        Py_RETURN_NONE;
    uint64_t ts = gp_clock_raw();
    uint32_t op = gp_intern_code((PyCodeObject *)args[0]);
    if (GP_UNLIKELY(op == 0)) {
        intern_failures++;
        Py_RETURN_NONE;
    }
    gp_buffer_push(tb, ts, op, kind);
    Py_RETURN_NONE;
}

PyObject *
gp_hook_mon_start(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return mon_push_code(args, nargs, GP_EV_CALL);
}

PyObject *
gp_hook_mon_resume(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return mon_push_code(args, nargs, GP_EV_RESUME);
}

/* PY_THROW cannot be disabled: never return DISABLE for it. */
PyObject *
gp_hook_mon_throw(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (!recording())
        Py_RETURN_NONE;
    PyObject *r = mon_push_code(args, nargs, GP_EV_RESUME);
    Py_XDECREF(r);
    Py_RETURN_NONE;
}

static void
push_return(void)
{
    GpThreadBuf *tb = gp_buffer_thread();
    if (GP_LIKELY(tb != NULL))
        gp_buffer_push(tb, gp_clock_raw(), 0, GP_EV_RETURN);
}

/* PY_RETURN and PY_YIELD (local events: DISABLE allowed). */
PyObject *
gp_hook_mon_return(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    (void)args;
    (void)nargs;
    if (!recording())
        return disable_or_none();
    push_return();
    Py_RETURN_NONE;
}

/* PY_UNWIND: a frame left by an exception (cannot be disabled). */
PyObject *
gp_hook_mon_unwind(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    (void)args;
    (void)nargs;
    if (recording())
        push_return();
    Py_RETURN_NONE;
}

/* CALL(code, offset, callable, arg0): only C functions are recorded; any
 * other callable switches CALL (and with it C_RETURN/C_RAISE) off at that
 * location. */
PyObject *
gp_hook_mon_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    const PyMethodDef *ml;
    PyObject *owner;
    PyObject *self_arg = nargs > 3 ? args[3] : NULL;
    if (!recording() || nargs < 3 || !cfunc_key(args[2], self_arg, &ml, &owner))
        return disable_or_none();
    GpThreadBuf *tb = gp_buffer_thread();
    if (GP_UNLIKELY(tb == NULL))
        Py_RETURN_NONE;
    uint64_t ts = gp_clock_raw();
    uint32_t op = gp_intern_cfunc(ml, owner);
    if (GP_UNLIKELY(op == 0)) {
        intern_failures++;
        Py_RETURN_NONE;
    }
    long offset = PyLong_AsLong(args[1]);
    if (offset == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        offset = -1;
    }
    uint32_t site = offset >= 0 && offset < 0xfffffe ? (uint32_t)offset + 1 : 0;
    gp_buffer_push(tb, ts, op, GP_EV_MAKE(GP_EV_CCALL, site));
    Py_RETURN_NONE;
}

/* C_RETURN and C_RAISE (cannot be disabled; seen only where CALL is on). */
PyObject *
gp_hook_mon_c_return(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    const PyMethodDef *ml;
    PyObject *owner;
    if (!recording() || nargs < 3 || !cfunc_key(args[2], NULL, &ml, &owner))
        Py_RETURN_NONE;
    GpThreadBuf *tb = gp_buffer_thread();
    if (GP_LIKELY(tb != NULL))
        gp_buffer_push(tb, gp_clock_raw(), 0, GP_EV_CRETURN);
    Py_RETURN_NONE;
}

int
gp_hook_monitoring_configure(PyObject *disable, PyObject *restart)
{
    Py_XSETREF(mon_disable, Py_XNewRef(disable == Py_None ? NULL : disable));
    Py_XSETREF(mon_restart, Py_XNewRef(restart == Py_None ? NULL : restart));
    return 0;
}

int
gp_hook_monitoring_restart(void)
{
    if (mon_restart == NULL)
        return 0;
    PyObject *r = PyObject_CallNoArgs(mon_restart);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

#else /* before 3.12: no sys.monitoring */

int
gp_hook_monitoring_configure(PyObject *disable, PyObject *restart)
{
    (void)disable;
    (void)restart;
    return 0;
}

int
gp_hook_monitoring_restart(void)
{
    return 0;
}

#endif
