/* The profile callback and per-thread hook installation.
 *
 * The callback does, per event: one relaxed load of the phase, one TLS read,
 * at most one intern lookup, one clock read and one 16-byte store, and for a
 * Python frame one byte of the thread's shadow stack. It never calls Python
 * code, never leaves an exception set and always returns 0; it creates Python
 * objects only on an op's first sight (intern.c) and where the user's code
 * calls into a library (user_call_site).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "hook.h"

#include "buffer.h"
#include "clock.h"
#include "compat.h"
#include "frames.h"
#include "intern.h"
#include "u64map.h"

#include <stdlib.h>
#include <string.h>

static uint64_t intern_failures = 0; /* GIL */

/* ---- the user's call sites -------------------------------------------------
 * Findings name the user's line: the innermost line of the user's code on the
 * path that did the work (docs/diagnosis.md). A C call records its call site
 * always (the caller's instruction offset, cheap to read). A Python call
 * records it where the user's code calls library code directly: the hook
 * keeps, per thread, whether each open frame is the user's and whether it has
 * a C call open (GpThreadBuf.py_frames), so the caller's frame is read
 * at those few boundaries and not at every call. (Library code that a C call
 * of the user's runs, as ndarray.sum runs numpy's _sum, needs no site: the C
 * call's own is the user's line.) */

enum { SHADOW_USER = 1, SHADOW_IN_C = 2 }; /* GpThreadBuf.py_frames */

GP_INLINE int
shadow_caller_is_user(const GpThreadBuf *tb)
{
    uint32_t d = tb->py_depth;
    if (d == 0 || d > GP_SHADOW_DEPTH)
        return 0; /* unknown: no site */
    return tb->py_frames[d - 1] == SHADOW_USER;
}

GP_INLINE void
shadow_push(GpThreadBuf *tb, uint8_t op_flags)
{
    uint32_t d = tb->py_depth++;
    if (d < GP_SHADOW_DEPTH)
        tb->py_frames[d] = (op_flags & GP_OPF_LIBRARY) ? 0 : SHADOW_USER;
}

GP_INLINE void
shadow_pop(GpThreadBuf *tb)
{
    if (tb->py_depth > 0) {
        tb->py_depth--;
        if (GP_UNLIKELY(tb->py_depth < tb->step_min))
            tb->step_min = tb->py_depth; /* a frame below the open step's begin returned */
    }
}

/* A C call opened (in_c 1) or closed (0) by the innermost Python frame. */
GP_INLINE void
shadow_c_call(GpThreadBuf *tb, int in_c)
{
    uint32_t d = tb->py_depth;
    if (d == 0 || d > GP_SHADOW_DEPTH)
        return;
    if (in_c)
        tb->py_frames[d - 1] |= SHADOW_IN_C;
    else
        tb->py_frames[d - 1] &= (uint8_t)~SHADOW_IN_C;
}

/* An instruction offset (bytes) as an event's site payload: offset + 1, 0 =
 * unknown (negative, or too large for the payload's 24 bits). */
GP_INLINE uint32_t
site_payload(long offset)
{
    return offset >= 0 && offset < 0xfffffe ? (uint32_t)offset + 1 : 0;
}

/* A frame's current instruction as a site payload. */
GP_INLINE uint32_t
frame_site(PyFrameObject *frame)
{
    return site_payload(PyFrame_GetLasti(frame));
}

/* The site in the caller of `frame` (its outer frame), or 0. */
static uint32_t
back_site(PyFrameObject *frame)
{
    PyFrameObject *back = PyFrame_GetBack(frame); /* new reference or NULL */
    if (back == NULL)
        return 0;
    uint32_t site = frame_site(back);
    Py_DECREF(back);
    return site;
}

/* Whether a frame of op `op_flags` entered now has its call site recorded:
 * library code called directly by the user's code. */
GP_INLINE int
wants_site(const GpThreadBuf *tb, uint8_t op_flags)
{
    return (op_flags & GP_OPF_LIBRARY) && shadow_caller_is_user(tb);
}

/* The call site of the frame entered now (wants_site), or 0. `frame` is the
 * entered frame, or NULL for the thread's current one (a sys.monitoring
 * callback: the started frame, or its caller where the started one is not yet
 * complete). Keeps a pending exception (a generator resumed by throw()) as it
 * is. */
__attribute__((noinline)) static uint32_t
user_call_site(PyFrameObject *frame, PyCodeObject *code)
{
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    uint32_t site = 0;
    if (frame != NULL) {
        site = back_site(frame);
    } else if ((frame = PyEval_GetFrame()) != NULL) { /* borrowed */
        PyCodeObject *running = PyFrame_GetCode(frame);
        site = running == code ? back_site(frame) : frame_site(frame);
        Py_DECREF(running);
    }
    PyErr_Clear(); /* a frame object that could not be made: no site */
    PyErr_Restore(exc_type, exc_value, exc_tb);
    return site;
}

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

/* ---- autograd sequence numbers ---------------------------------------------
 * PyTorch numbers each autograd node it makes from a per-thread counter
 * (at::sequence_number), and its NVTX range for the node carries that number
 * when the node runs in the backward pass (csrc/record/nvtx.c). The nodes a forward
 * call made are those numbered between the counter's values at its entry and
 * at its exit: so, where the profile asks for it (python/gpuprof/_autograd.py
 * passes at::sequence_number::peek), the hook reads the counter at each event
 * and, when it moved since the thread's last event, writes a GP_EV_SEQ before
 * that event. Nodes are made only in C code, which ran in the innermost frame
 * open between the two events; the replay charges them to it. One indirect
 * call and one compare per event; the event itself only where the forward
 * made nodes. */

typedef uint64_t (*GpSeqPeek)(void);
static GpSeqPeek seq_peek = NULL; /* GIL */

void
gp_hook_set_seq_peek(void *fn)
{
    seq_peek = (GpSeqPeek)fn;
}

GP_INLINE void
seq_check(GpThreadBuf *tb, uint64_t ts)
{
    GpSeqPeek peek = seq_peek;
    if (peek == NULL)
        return;
    uint64_t v = peek();
    if (GP_LIKELY(v == tb->seq_last))
        return;
    uint64_t moved = tb->seq_last == GP_SEQ_UNSET || v < tb->seq_last ? 0 : v - tb->seq_last;
    tb->seq_last = v;
    gp_buffer_push(tb, ts, (uint32_t)(v & 0x7fffffffu),
                   GP_EV_MAKE(GP_EV_SEQ, moved > 0xffffffu ? 0xffffffu : (uint32_t)moved));
}

/* ---- C calls in flight at a window's start ----------------------------------
 * The start snapshot (gp_hook_snapshot) sees another thread's Python frames, not
 * the C call its innermost frame may be in: a feeder thread waiting in
 * lock.acquire, a worker in time.sleep. If that thread's first event is a C
 * return, the call was in flight all along: it is opened at the snapshot's time
 * so that its wait is the call's (an idle wait) and not the frame's own time. */

GP_INLINE void
snapshot_c_call(GpThreadBuf *tb, PyObject *callable, PyObject *self_arg, uint32_t site)
{
    int first = tb->snap_cur == tb->cur; /* nothing written since the snapshot */
    tb->snap_cur = NULL;
    uint32_t d = tb->py_depth;
    if (!first || d == 0 || d > GP_SHADOW_DEPTH || (tb->py_frames[d - 1] & SHADOW_IN_C))
        return;
    const PyMethodDef *ml;
    PyObject *owner;
    if (!cfunc_key(callable, self_arg, &ml, &owner))
        return;
    uint32_t op = gp_intern_cfunc(ml, owner);
    if (GP_UNLIKELY(op == 0)) {
        intern_failures++;
        return;
    }
    gp_buffer_push(tb, tb->snap_ts, op, GP_EV_MAKE(GP_EV_CCALL, site));
}

/* ---- module instances ----------------------------------------------------
 * Which torch.nn.Module instance each call of Module.__call__ ran on, so that
 * the twelve blocks of a model are twelve rows (python/gpuprof/_modules.py
 * names them). Where the profile asks for it, the hook compares each Python
 * call's op with __call__'s; for those calls it reads `self` from the frame
 * (frames.c), gives the instance a small number on first sight and writes a
 * GP_EV_MODULE after the call. The instances are held (strong references)
 * until gp_hook_set_module_code(NULL), so that a number never names two. */

static uint32_t module_op = 0;       /* op id of Module.__call__'s code; 0: off. GIL */
static PyObject *module_code = NULL; /* that code object */
static PyObject *instances = NULL;   /* list: number -> instance */
static GpU64Map instance_ids;        /* address -> number */

int
gp_hook_set_module_code(PyObject *code)
{
    module_op = 0;
    Py_CLEAR(module_code);
    Py_CLEAR(instances);
    gp_u64map_free(&instance_ids);
    if (code == NULL)
        return 0;
    if (!PyCode_Check(code)) {
        PyErr_SetString(PyExc_TypeError, "_set_module_code: a code object or None is needed");
        return -1;
    }
    instances = PyList_New(0);
    if (instances == NULL || gp_u64map_init(&instance_ids, 256) < 0) {
        Py_CLEAR(instances);
        gp_u64map_free(&instance_ids);
        PyErr_NoMemory();
        return -1;
    }
    uint32_t op = gp_intern_code((PyCodeObject *)code);
    if (op == 0) {
        Py_CLEAR(instances);
        gp_u64map_free(&instance_ids);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "_set_module_code: no recording session");
        return -1;
    }
    module_code = Py_NewRef(code);
    module_op = op;
    return 0;
}

PyObject *
gp_hook_module_instances(void)
{
    return instances ? PyList_GetSlice(instances, 0, PyList_GET_SIZE(instances)) : PyList_New(0);
}

/* A call of Module.__call__ on `self` (borrowed; NULL: unknown) was just pushed. */
__attribute__((noinline)) static void
module_call(GpThreadBuf *tb, uint64_t ts, PyObject *self)
{
    if (self == NULL || instances == NULL)
        return;
    uint32_t id = gp_u64map_get(&instance_ids, (uint64_t)(uintptr_t)self);
    if (id == UINT32_MAX) {
        id = (uint32_t)PyList_GET_SIZE(instances);
        if (PyList_Append(instances, self) < 0) {
            PyErr_Clear();
            return;
        }
        if (gp_u64map_put(&instance_ids, (uint64_t)(uintptr_t)self, id) < 0)
            return; /* (the next call of it appends it again) */
    }
    gp_buffer_push(tb, ts, id, GP_EV_MODULE);
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
    if (GP_UNLIKELY(tb->snap_cur != NULL) &&
        (what == PyTrace_C_RETURN || what == PyTrace_C_EXCEPTION))
        snapshot_c_call(tb, arg, NULL, frame_site(frame));
    seq_check(tb, ts);
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
        uint8_t flags = gp_intern.flags[op];
        uint32_t kind = GP_EV_CALL;
        if (GP_UNLIKELY(flags & GP_OPF_GENERATOR)) {
            /* A generator frame's first entry is at or before its prologue's
             * RESUME (intern.c computes that offset per code object); later
             * entries resume after a yield or await, at higher offsets. */
            if (PyFrame_GetLasti(frame) > gp_intern.gen_lasti[op])
                kind = GP_EV_RESUME;
        }
        uint32_t site = wants_site(tb, flags) ? user_call_site(frame, NULL) : 0;
        shadow_push(tb, flags);
        gp_buffer_push(tb, ts, op, GP_EV_MAKE(kind, site));
        if (GP_UNLIKELY(op == module_op) && kind == GP_EV_CALL)
            module_call(tb, ts, gp_frames_self(frame));
        break;
    }
    case PyTrace_RETURN:
        shadow_pop(tb);
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
        shadow_c_call(tb, 1);
        gp_buffer_push(tb, ts, op, GP_EV_MAKE(GP_EV_CCALL, frame_site(frame)));
        break;
    }
    case PyTrace_C_RETURN:
    case PyTrace_C_EXCEPTION:
        /* Profile functions see C calls of builtin functions and method
         * descriptors only (3.12+'s legacy shim binds the latter first),
         * which cfunc_key always names; a return whose call went unrecorded
         * (out of memory) closes nothing: the aggregation never looks past
         * the calling Python frame for it. */
        shadow_c_call(tb, 0);
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
    /* per running frame, innermost first: its op and its call site in its caller */
    struct {
        uint32_t op, site;
    } *frames = malloc(cap * sizeof(*frames));
    if (frames == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (PyThreadState *t = PyInterpreterState_ThreadHead(interp); t; t = PyThreadState_Next(t)) {
        size_t n = 0;
        PyFrameObject *frame = PyThreadState_GetFrame(t); /* new reference or NULL */
        while (frame != NULL) {
            if (n == cap) {
                void *grown = realloc(frames, cap * 2 * sizeof(*frames));
                if (grown == NULL) {
                    Py_DECREF(frame);
                    free(frames);
                    PyErr_NoMemory();
                    return -1;
                }
                frames = grown;
                cap *= 2;
            }
            PyCodeObject *code = PyFrame_GetCode(frame);
            uint32_t op = gp_intern_code(code);
            Py_DECREF(code);
            PyFrameObject *back = PyFrame_GetBack(frame); /* new reference or NULL */
            if (op) {
                frames[n].op = op;
                frames[n++].site = back != NULL ? frame_site(back) : 0;
            }
            Py_DECREF(frame);
            frame = back;
        }
        if (n == 0)
            continue;
        GpThreadBuf *tb = gp_buffer_thread_for((uint64_t)t->thread_id);
        if (tb == NULL)
            continue; /* a helper thread of ours (or out of memory: that thread goes unseen) */
        tb->has_python = 1;
        tb->py_depth = 0;
        while (n > 0) {
            n--;
            shadow_push(tb, gp_intern.flags[frames[n].op]);
            gp_buffer_push(tb, ts, frames[n].op, GP_EV_MAKE(GP_EV_FRAME, frames[n].site));
        }
        /* another thread may be inside a C call (snapshot_c_call); this one is in
         * the call that took the snapshot */
        tb->snap_cur = t != self ? tb->cur : NULL;
        tb->snap_ts = ts;
    }
    free(frames);
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
    if (GP_EV_KIND(kind) == GP_EV_STEP_END && tb->step_begin != NULL) {
        /* How many frames below the step's begin returned during the step (+1;
         * 0 means unknown): the replay puts the step under the rest (replay.c,
         * "step boundaries"). The begin event is this thread's and still in
         * this window's chunks (clear_thread_locked forgets it with them). */
        uint32_t popped = tb->step_depth - tb->step_min;
        if (popped < (1u << 23))
            tb->step_begin->kind = GP_EV_MAKE(GP_EV_STEP_BEGIN, popped + 1);
    }
    if (GP_EV_KIND(kind) == GP_EV_STEP_END) {
        tb->step_begin = NULL;
        tb->step_min = 0;
    }
    GpEvent *slot = tb->cur;
    gp_buffer_push(tb, gp_clock_raw(), arg, kind);
    if (GP_EV_KIND(kind) == GP_EV_STEP_BEGIN) {
        /* NULL when the event was dropped; a fresh chunk's first slot otherwise */
        tb->step_begin = tb->cur != slot ? tb->cur - 1 : NULL;
        tb->step_depth = tb->step_min = tb->py_depth;
    }
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
mon_push_code(PyObject *const *args, Py_ssize_t nargs, uint32_t kind, int want_site)
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
    uint8_t flags = gp_intern.flags[op];
    uint32_t site =
        want_site && wants_site(tb, flags) ? user_call_site(NULL, (PyCodeObject *)args[0]) : 0;
    seq_check(tb, ts);
    shadow_push(tb, flags);
    gp_buffer_push(tb, ts, op, GP_EV_MAKE(kind, site));
    if (GP_UNLIKELY(op == module_op) && kind == GP_EV_CALL)
        module_call(tb, ts, gp_frames_current_self());
    Py_RETURN_NONE;
}

PyObject *
gp_hook_mon_start(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return mon_push_code(args, nargs, GP_EV_CALL, 1);
}

PyObject *
gp_hook_mon_resume(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return mon_push_code(args, nargs, GP_EV_RESUME, 1);
}

/* PY_THROW cannot be disabled: never return DISABLE for it. */
PyObject *
gp_hook_mon_throw(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (!recording())
        Py_RETURN_NONE;
    PyObject *r = mon_push_code(args, nargs, GP_EV_RESUME, 0);
    Py_XDECREF(r);
    Py_RETURN_NONE;
}

static void
push_return(void)
{
    GpThreadBuf *tb = gp_buffer_thread();
    if (GP_LIKELY(tb != NULL)) {
        uint64_t ts = gp_clock_raw();
        seq_check(tb, ts);
        shadow_pop(tb);
        gp_buffer_push(tb, ts, 0, GP_EV_RETURN);
    }
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
    seq_check(tb, ts);
    shadow_c_call(tb, 1);
    gp_buffer_push(tb, ts, op, GP_EV_MAKE(GP_EV_CCALL, site_payload(offset)));
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
    if (GP_LIKELY(tb != NULL)) {
        uint64_t ts = gp_clock_raw();
        if (GP_UNLIKELY(tb->snap_cur != NULL)) {
            long offset = PyLong_AsLong(args[1]);
            if (offset == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                offset = -1;
            }
            snapshot_c_call(tb, args[2], nargs > 3 ? args[3] : NULL, site_payload(offset));
        }
        seq_check(tb, ts);
        shadow_c_call(tb, 0);
        gp_buffer_push(tb, ts, 0, GP_EV_CRETURN);
    }
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
