/* The Profiler type: arguments, start/stop/step, and the only place where
 * GpStatus becomes an exception. Window transitions are in transitions.c,
 * capture ranges in capture.c, the result dict in results.c, record_function
 * ranges and fork handling in ranges.c. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "profiler_internal.h"

#include "gp_cuda.h"
#include "arrays.h"
#include "buffer.h"
#include "clock.h"
#include "hook.h"
#include "intern.h"
#include "schedule.h"
#include "window.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

PyObject *gp_profiler_active = NULL;

/* ---- status -> exception ------------------------------------------------- */

PyObject *
gp_status_raise(GpStatus status, const char *context)
{
    switch (status) {
    case GP_OK:
        PyErr_Format(PyExc_SystemError, "%s: reported success as an error", context);
        break;
    case GP_ERR_NOMEM:
        PyErr_Format(PyExc_MemoryError, "%s: out of memory", context);
        break;
    case GP_ERR_STATE:
        PyErr_Format(PyExc_RuntimeError, "%s: not valid in the profiler's current state", context);
        break;
    case GP_ERR_VALUE:
        PyErr_Format(PyExc_ValueError, "%s: invalid argument", context);
        break;
    case GP_ERR_CUDA_UNAVAIL:
    case GP_ERR_CUPTI:
        PyErr_Format(PyExc_RuntimeError, "%s: %s", context, gp_cuda_reason());
        break;
    case GP_ERR_IO:
        PyErr_SetFromErrno(PyExc_OSError);
        break;
    case GP_ERR_OVERFLOW:
        PyErr_Format(PyExc_OverflowError, "%s: table full", context);
        break;
    }
    return NULL;
}

/* ---- the type ---------------------------------------------------------------- */

static int
Profiler_init(GpProfilerObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"max_events",
                             "cuda",
                             "memory",
                             "schedule",
                             "schedule_fn",
                             "on_trace_ready",
                             "owner",
                             "capture",
                             "capture_name",
                             "capture_domain",
                             "monitoring",
                             "cuda_sync_records",
                             NULL};
    unsigned long long max_events = 8000000;
    int cuda = 0, memory = 0, capture = GP_CAPTURE_NONE, monitoring = 0, sync_records = 0;
    const char *capture_name = NULL, *capture_domain = NULL;
    PyObject *sched = Py_None, *schedule_fn = Py_None, *on_ready = Py_None, *owner = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|KppOOOOizzpp:Profiler", kwlist, &max_events,
                                     &cuda, &memory, &sched, &schedule_fn, &on_ready, &owner,
                                     &capture, &capture_name, &capture_domain, &monitoring,
                                     &sync_records))
        return -1;
#if PY_VERSION_HEX < 0x030C0000
    if (monitoring) {
        PyErr_SetString(PyExc_ValueError,
                        "Profiler(monitoring=True) needs Python 3.12+ (sys.monitoring)");
        return -1;
    }
#endif
    self->monitoring = monitoring;
    if (capture < GP_CAPTURE_NONE || capture > GP_CAPTURE_NVTX ||
        (capture == GP_CAPTURE_NVTX && capture_name == NULL)) {
        PyErr_SetString(PyExc_ValueError, "capture must be 0 (none), 1 (cudaProfilerApi) or 2 "
                                          "(NVTX, with capture_name)");
        return -1;
    }
    if (self->started) {
        PyErr_SetString(PyExc_RuntimeError, "Profiler.__init__: profiler is running");
        return -1;
    }
    if (max_events < 1) {
        PyErr_SetString(PyExc_ValueError, "max_events must be >= 1");
        return -1;
    }
    self->has_schedule = 0;
    if (sched != Py_None) {
        GpSchedule s;
        if (!PyArg_ParseTuple(sched,
                              "LLLLLL;schedule must be a tuple (wait, warmup, active, "
                              "repeat, skip_first, skip_first_wait)",
                              &s.wait, &s.warmup, &s.active, &s.repeat, &s.skip_first,
                              &s.skip_first_wait))
            return -1;
        if (gp_schedule_check(&s) != GP_OK) {
            PyErr_SetString(PyExc_ValueError,
                            "schedule: wait, warmup, repeat, skip_first and skip_first_wait must "
                            "be >= 0 and active >= 1");
            return -1;
        }
        self->sched = s;
        self->has_schedule = 1;
    }
    if (schedule_fn != Py_None && !PyCallable_Check(schedule_fn)) {
        PyErr_SetString(PyExc_TypeError, "schedule_fn must be callable or None");
        return -1;
    }
    if (on_ready != Py_None && !PyCallable_Check(on_ready)) {
        PyErr_SetString(PyExc_TypeError, "on_trace_ready must be callable or None");
        return -1;
    }
    if (capture != GP_CAPTURE_NONE && (sched != Py_None || schedule_fn != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "capture and schedule cannot be combined: the capture "
                                          "range decides when to record");
        return -1;
    }
    char *cname = capture_name ? strdup(capture_name) : NULL;
    char *cdomain = strdup(capture_domain ? capture_domain : "");
    if ((capture_name && cname == NULL) || cdomain == NULL) {
        free(cname);
        free(cdomain);
        PyErr_NoMemory();
        return -1;
    }
    free(self->capture_name);
    free(self->capture_domain);
    self->capture_name = cname;
    self->capture_domain = cdomain;
    self->capture = capture;
    self->max_events = max_events;
    self->want_cuda = cuda;
    self->memory = memory;
    self->cuda_sync_records = sync_records;
    Py_XSETREF(self->schedule_fn, schedule_fn == Py_None ? NULL : Py_NewRef(schedule_fn));
    Py_XSETREF(self->on_trace_ready, on_ready == Py_None ? NULL : Py_NewRef(on_ready));
    /* The wrapper holds us and we hold it: a cycle the GC sees (traverse). */
    Py_XSETREF(self->owner, owner == Py_None ? NULL : Py_NewRef(owner));
    if (self->result == NULL)
        self->result = Py_NewRef(Py_None);
    if (self->cuda_error == NULL)
        self->cuda_error = Py_NewRef(Py_None);
    return 0;
}

static PyObject *
Profiler_start(GpProfilerObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->started) {
        PyErr_SetString(PyExc_RuntimeError, "Profiler.start(): this profiler is already running");
        return NULL;
    }
    if (gp_profiler_active != NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Profiler.start(): another gpuprof profiler is already running in this "
                        "process; stop it first (profiling is per process)");
        return NULL;
    }
    GpStatus st = gp_buffer_session_begin(self->max_events);
    if (st != GP_OK)
        return gp_status_raise(st, "Profiler.start()");
    if (gp_intern_init() < 0) {
        gp_buffer_session_end();
        return NULL;
    }
    self->cuda_on = 0;
    self->cuda_window = 0;
    Py_SETREF(self->cuda_error, Py_NewRef(Py_None));
    if (self->want_cuda) {
        st = gp_cuda_session_begin(self->cuda_sync_records ? GP_CUDA_SYNC_RECORDS : 0);
        if (st == GP_OK) {
            self->cuda_on = 1;
        } else {
            PyObject *msg = PyUnicode_FromString(gp_cuda_reason());
            if (msg == NULL)
                goto fail;
            Py_SETREF(self->cuda_error, msg);
        }
    }
    gp_transition_set_phase(GP_PHASE_WAIT);
    if (gp_capture_arm(self) < 0)
        goto fail;
    if (!self->monitoring && gp_hook_install((PyObject *)self) < 0)
        goto fail;
    self->started = 1;
    gp_profiler_active = (PyObject *)self;
    self->step_num = 0;
    self->step_thread = (uint64_t)pthread_self();
    self->action = GP_ACT_NONE;
    GpAction first;
    if (gp_capture_action_for(self, 0, &first) < 0)
        goto fail_started;
    self->action = GP_ACT_NONE;
    if (gp_transition_run(self, GP_ACT_NONE, first) < 0)
        goto fail_started;
    self->action = first;
    gp_hook_marker(GP_EV_STEP_BEGIN, 0);
    gp_capture_step_begin(0);
    Py_RETURN_NONE;
fail_started:
    self->started = 0;
    gp_profiler_active = NULL;
fail:
    gp_capture_disarm(self);
    gp_transition_set_phase(GP_PHASE_OFF);
    gp_hook_uninstall();
    if (self->cuda_on) {
        Py_BEGIN_ALLOW_THREADS
        gp_cuda_session_end();
        Py_END_ALLOW_THREADS
        self->cuda_on = 0;
    }
    gp_buffer_quiesce();
    gp_buffer_session_end();
    gp_hook_set_module_code(NULL);
    gp_intern_clear();
    return NULL;
}

static PyObject *
Profiler_step(GpProfilerObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->forked_off)
        Py_RETURN_NONE; /* a forked child: the parent owns the session */
    if (!self->started) {
        PyErr_SetString(PyExc_RuntimeError,
                        "prof.step() called on a profiler that is not running; call it inside "
                        "`with gpuprof.profile(...) as prof:` or after prof.start()");
        return NULL;
    }
    if (self->in_transition) {
        PyErr_SetString(PyExc_RuntimeError, "prof.step() called from on_trace_ready");
        return NULL;
    }
    /* A capture close that is still queued takes effect before the step
     * ends, an open after the next one begins: no sliver of a step. */
    if (gp_capture_apply(self, CAP_CLOSE) < 0)
        return NULL;
    gp_hook_marker(GP_EV_STEP_END, (uint32_t)self->step_num);
    gp_capture_step_end();
    if (atomic_load(&gp_buffer_phase) >= GP_PHASE_WARMUP)
        gp_buffer_anchor(); /* keeps the raw -> ns map exact over long windows */
    int64_t next = self->step_num + 1;
    GpAction cur;
    if (gp_capture_action_for(self, next, &cur) < 0)
        return NULL;
    GpAction prev = self->action;
    self->step_num = next;
    self->in_transition = 1;
    int rc = gp_transition_run(self, prev, cur);
    self->in_transition = 0;
    self->action = cur;
    gp_hook_marker(GP_EV_STEP_BEGIN, (uint32_t)self->step_num);
    gp_capture_step_begin(self->step_num);
    if (rc < 0)
        return NULL;
    if (gp_capture_apply(self, CAP_OPEN) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
Profiler_stop(GpProfilerObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->forked_off)
        Py_RETURN_NONE;
    if (!self->started) {
        PyErr_SetString(PyExc_RuntimeError, "Profiler.stop(): the profiler is not running");
        return NULL;
    }
    gp_hook_marker(GP_EV_STEP_END, (uint32_t)self->step_num);
    gp_capture_step_end();
    gp_capture_disarm(self);
    /* Keep any exception the caller is propagating (the with block's). */
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    self->in_transition = 1;
    self->stopping = 1;
    int rc = gp_transition_run(self, self->action, GP_ACT_EXIT);
    self->stopping = 0;
    self->in_transition = 0;
    self->action = GP_ACT_NONE;
    gp_transition_set_phase(GP_PHASE_OFF);
    if (!self->monitoring)
        gp_hook_uninstall();
    gp_buffer_quiesce();
    if (self->cuda_on) {
        gp_transition_cuda_off(self);
        Py_BEGIN_ALLOW_THREADS
        gp_cuda_session_end();
        Py_END_ALLOW_THREADS
        gp_cuda_clear_strings();
        self->cuda_on = 0;
    }
    gp_buffer_session_end();
    gp_hook_set_module_code(NULL); /* its op id dies with the intern table */
    gp_intern_clear();
    gp_nvtx_clear();
    self->started = 0;
    gp_profiler_active = NULL;
    if (exc_type != NULL) {
        if (rc < 0) /* the user's exception wins; ours becomes its context */
            PyErr_Clear();
        PyErr_Restore(exc_type, exc_value, exc_tb);
        return NULL;
    }
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
Profiler_get_result(GpProfilerObject *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->result ? self->result : Py_None);
}

static PyObject *
Profiler_get_step_num(GpProfilerObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->step_num);
}

static PyObject *
Profiler_get_action(GpProfilerObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(self->started ? (long)self->action : -1);
}

static PyObject *
Profiler_get_running(GpProfilerObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->started);
}

static PyObject *
Profiler_get_cuda(GpProfilerObject *self, void *Py_UNUSED(closure))
{
    return Py_BuildValue("{sOsOssss}", "active", self->cuda_on ? Py_True : Py_False, "error",
                         self->cuda_error ? self->cuda_error : Py_None, "mode",
                         self->cuda_on ? gp_cuda_mode() : "off", "parts",
                         self->cuda_on ? gp_cuda_parts() : "");
}

static PyObject *
Profiler_get_windows(GpProfilerObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->windows);
}

static PyObject *
Profiler_buffer_stats(GpProfilerObject *self, PyObject *Py_UNUSED(ignored))
{
    (void)self;
    return Py_BuildValue("{sKsKsKsKsI}", "bytes_held", (unsigned long long)gp_buffer_bytes_held(),
                         "events", (unsigned long long)gp_buffer_events(), "dropped",
                         (unsigned long long)gp_buffer_dropped(), "capacity_events",
                         (unsigned long long)gp_buffer_capacity_events(), "threads",
                         gp_buffer_thread_count());
}

static int
Profiler_traverse(GpProfilerObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->schedule_fn);
    Py_VISIT(self->owner);
    Py_VISIT(self->on_trace_ready);
    Py_VISIT(self->result);
    return 0;
}

static int
Profiler_clear(GpProfilerObject *self)
{
    Py_CLEAR(self->schedule_fn);
    Py_CLEAR(self->owner);
    Py_CLEAR(self->on_trace_ready);
    Py_CLEAR(self->result);
    Py_CLEAR(self->cuda_error);
    return 0;
}

static void
Profiler_dealloc(GpProfilerObject *self)
{
    PyObject_GC_UnTrack(self);
    if (self->started) {
        /* Deallocation stops a running profiler; failures are unraisable.
         * No Python code may run here with `self` (on_trace_ready would get
         * it as its argument and free it a second time), nor with a wrapper
         * that the GC is tearing down: drop the callbacks first. */
        Py_CLEAR(self->on_trace_ready);
        Py_CLEAR(self->schedule_fn);
        Py_CLEAR(self->owner);
        PyObject *r = Profiler_stop(self, NULL);
        if (r == NULL)
            PyErr_WriteUnraisable((PyObject *)self);
        Py_XDECREF(r);
    }
    PyTypeObject *tp = Py_TYPE(self);
    free(self->capture_name);
    free(self->capture_domain);
    Profiler_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyMethodDef Profiler_methods[] = {
    {"start", (PyCFunction)Profiler_start, METH_NOARGS, "Start the session (installs the hook)."},
    {"step", (PyCFunction)Profiler_step, METH_NOARGS, "Mark the end of a step."},
    {"stop", (PyCFunction)Profiler_stop, METH_NOARGS, "Stop the session."},
    {"buffer_stats", (PyCFunction)Profiler_buffer_stats, METH_NOARGS,
     "Bytes held, events, drops and capacity of the event buffers."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Profiler_getset[] = {
    {"result", (getter)Profiler_get_result, NULL, "Tables of the last completed window.", NULL},
    {"step_num", (getter)Profiler_get_step_num, NULL, "Current step number.", NULL},
    {"action", (getter)Profiler_get_action, NULL, "Current schedule action, -1 when stopped.",
     NULL},
    {"running", (getter)Profiler_get_running, NULL, "True between start() and stop().", NULL},
    {"cuda", (getter)Profiler_get_cuda, NULL, "GPU capture state of this session.", NULL},
    {"windows", (getter)Profiler_get_windows, NULL, "Completed windows.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Profiler_slots[] = {
    {Py_tp_doc, "Low-level profiler session (use gpuprof.profile)."},
    {Py_tp_init, Profiler_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, Profiler_dealloc},
    {Py_tp_traverse, Profiler_traverse},
    {Py_tp_clear, Profiler_clear},
    {Py_tp_methods, Profiler_methods},
    {Py_tp_getset, Profiler_getset},
    {0, NULL},
};

PyType_Spec gp_profiler_spec = {
    .name = "gpuprof._gpuprof.Profiler",
    .basicsize = sizeof(GpProfilerObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = Profiler_slots,
};
