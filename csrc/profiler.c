/* The Profiler type: session lifecycle, schedule transitions, window
 * aggregation, and the only place where GpStatus becomes an exception. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "profiler.h"

#include "../cuda/gp_cuda.h"
#include "arrays.h"
#include "buffer.h"
#include "clock.h"
#include "hook.h"
#include "intern.h"
#include "schedule.h"
#include "window.h"

#include <pthread.h>
#include <stdlib.h>

/* At most one profiler records at a time (CUPTI and the hook are per
 * process). GIL. */
static PyObject *active_profiler = NULL; /* borrowed; cleared at stop */

typedef struct GpProfilerObject {
    PyObject_HEAD
    /* All fields: GIL. */
    uint64_t max_events;
    int want_cuda;          /* capture GPU activity this session */
    int cuda_on;            /* session_begin succeeded */
    int cuda_window;        /* callbacks/activities enabled */
    int memory;             /* device memory records */
    int cuda_sync_records;  /* CUPTI's sync and event records (GP_CUDA_SYNC_RECORDS) */
    int has_schedule;       /* use `sched` (else schedule_fn, else always record) */
    GpSchedule sched;
    PyObject *schedule_fn;  /* callable(step) -> int action, or NULL */
    PyObject *owner;        /* passed to on_trace_ready, or NULL */
    PyObject *on_trace_ready;
    PyObject *result;       /* dict of the last completed window, or None */
    PyObject *cuda_error;   /* str: why GPU capture is off this session, or None */
    int started;
    int64_t step_num;
    GpAction action;
    uint64_t window_start;
    uint64_t step_thread;   /* pthread_self() of the thread that started */
    int64_t windows;        /* completed windows */
    int in_transition;      /* guards re-entry from on_trace_ready */
    int stopping;           /* stop() is closing the window: its open step is no step */
    int forked_off;         /* this is a forked child's copy of a running profiler */
    int monitoring;         /* events come from sys.monitoring (installed in Python),
                               not from the per-thread profile function */
    int capture;            /* GP_CAPTURE_*: a capture range, not the schedule, decides */
    char *capture_name;     /* GP_CAPTURE_NVTX: range name and domain ("" default); malloc'ed */
    char *capture_domain;
} GpProfilerObject;

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

/* ---- results -------------------------------------------------------------- */

static int
dict_steal(PyObject *d, const char *key, PyObject *value)
{
    if (value == NULL)
        return -1;
    int rc = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return rc;
}

PyObject *
gp_profiler_result_dict(GpTables *t)
{
    PyObject *d = PyDict_New();
    PyObject *names = NULL, *files = NULL, *lines = NULL, *knames = NULL;
    if (d == NULL)
        return NULL;
    size_t n = t->ops.n;
    names = PyList_New((Py_ssize_t)n);
    files = PyList_New((Py_ssize_t)n);
    lines = PyList_New((Py_ssize_t)n);
    if (!names || !files || !lines)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        const GpOpRow *r = &t->ops.v[i];
        PyObject *name, *file;
        int line = 0;
        if (r->kind == GP_OP_CUDA_API) {
            name = PyUnicode_FromString(gp_cuda_api_name(r->op));
            file = PyUnicode_FromString("");
            if (!name || !file) {
                Py_XDECREF(name);
                Py_XDECREF(file);
                goto fail;
            }
        } else if (r->kind == GP_OP_USER && (r->flags & GP_OPF_NVTX)) {
            /* NVTX range: its message, and "nvtx[:domain][/category]" as file. */
            char text[1024], where[600];
            if (gp_nvtx_describe(r->op, text, sizeof text, where, sizeof where) < 0) {
                snprintf(text, sizeof text, "<nvtx %u>", r->op);
                snprintf(where, sizeof where, "nvtx");
            }
            name = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
            file = PyUnicode_DecodeUTF8(where, (Py_ssize_t)strlen(where), "replace");
            if (!name || !file) {
                Py_XDECREF(name);
                Py_XDECREF(file);
                goto fail;
            }
        } else if (gp_intern_describe(r->op, &name, &file, &line) < 0) {
            goto fail;
        }
        PyObject *ln = PyLong_FromLong(line);
        if (ln == NULL) {
            Py_DECREF(name);
            Py_DECREF(file);
            goto fail;
        }
        PyList_SET_ITEM(names, (Py_ssize_t)i, name); /* steals */
        PyList_SET_ITEM(files, (Py_ssize_t)i, file); /* steals */
        PyList_SET_ITEM(lines, (Py_ssize_t)i, ln);   /* steals */
    }
    knames = PyList_New((Py_ssize_t)t->strings.n);
    if (knames == NULL)
        goto fail;
    for (size_t i = 0; i < t->strings.n; i++) {
        PyObject *s = PyUnicode_DecodeUTF8(t->strings.v[i], (Py_ssize_t)strlen(t->strings.v[i]),
                                           "replace");
        if (s == NULL)
            goto fail;
        PyList_SET_ITEM(knames, (Py_ssize_t)i, s); /* steals */
    }
    if (dict_steal(d, "op_names", names) < 0)
        goto fail_after_names;
    names = NULL;
    if (dict_steal(d, "op_files", files) < 0)
        goto fail_after_names;
    files = NULL;
    if (dict_steal(d, "op_lines", lines) < 0)
        goto fail_after_names;
    lines = NULL;
    if (dict_steal(d, "kernel_names", knames) < 0)
        goto fail_after_names;
    knames = NULL;
    if (dict_steal(d, "ops", gp_arrays_build(GP_ROWS_OPS, t->ops.v, t->ops.n)) < 0 ||
        dict_steal(d, "nodes", gp_arrays_build(GP_ROWS_NODES, t->nodes.v, t->nodes.n)) < 0 ||
        dict_steal(d, "kernels", gp_arrays_build(GP_ROWS_KERNELS, t->kernels.v, t->kernels.n)) < 0 ||
        dict_steal(d, "gpu", gp_arrays_build(GP_ROWS_GPU, t->gpu.v, t->gpu.n)) < 0 ||
        dict_steal(d, "steps", gp_arrays_build(GP_ROWS_STEPS, t->steps.v, t->steps.n)) < 0 ||
        dict_steal(d, "threads", gp_arrays_build(GP_ROWS_THREADS, t->threads.v, t->threads.n)) < 0 ||
        dict_steal(d, "window_start_ns", PyLong_FromLongLong(t->window_start_ns)) < 0 ||
        dict_steal(d, "window_end_ns", PyLong_FromLongLong(t->window_end_ns)) < 0 ||
        dict_steal(d, "dropped_events", PyLong_FromLongLong(t->dropped_events)) < 0 ||
        dict_steal(d, "dropped_gpu", PyLong_FromLongLong(t->dropped_gpu)) < 0 ||
        dict_steal(d, "attributed_gpu_ns", PyLong_FromLongLong(t->attributed_gpu_ns)) < 0 ||
        dict_steal(d, "unattributed_gpu_ns", PyLong_FromLongLong(t->unattributed_gpu_ns)) < 0 ||
        dict_steal(d, "epoch_offset_ns", PyLong_FromLongLong(gp_clock_epoch_offset())) < 0)
        goto fail_after_names;
    if (t->has_spans &&
        dict_steal(d, "spans",
                   gp_window_spans_array(t, (PyObject *const *)gp_intern.refs, gp_intern.kinds,
                                         gp_intern.n_ops)) < 0)
        goto fail_after_names;
    return d;
fail:
fail_after_names:
    Py_XDECREF(names);
    Py_XDECREF(files);
    Py_XDECREF(lines);
    Py_XDECREF(knames);
    Py_DECREF(d);
    return NULL;
}

/* ---- window operations ----------------------------------------------------- */

static void
set_phase(int phase)
{
    atomic_store(&gp_buffer_phase, phase);
}

/* Stop writers and drop what the buffers hold. */
static void
quiet_and_reset(void)
{
    set_phase(GP_PHASE_WAIT);
    gp_buffer_quiesce();
    gp_buffer_reset();
}

static void
cuda_discard(void)
{
    size_t n = 0;
    free(gp_cuda_take_records(&n));
}

/* Disable GPU capture for the window (blocking: GIL released). */
static void
cuda_window_off(GpProfilerObject *self)
{
    if (!self->cuda_window)
        return;
    GpStatus st;
    Py_BEGIN_ALLOW_THREADS
    st = gp_cuda_window_end();
    Py_END_ALLOW_THREADS
    self->cuda_window = 0;
    if (st != GP_OK && self->cuda_error == Py_None) {
        PyObject *msg = PyUnicode_FromString(gp_cuda_reason());
        if (msg)
            Py_SETREF(self->cuda_error, msg);
        else
            PyErr_Clear();
    }
}

static void
cuda_window_on(GpProfilerObject *self)
{
    if (!self->cuda_on || self->cuda_window)
        return;
    if (gp_cuda_window_begin(self->memory) == GP_OK)
        self->cuda_window = 1;
}

static int
op_prepare(GpProfilerObject *self)
{
    quiet_and_reset();
    cuda_window_on(self);
    set_phase(GP_PHASE_WARMUP);
    return gp_hook_monitoring_restart();
}

static int
op_start(GpProfilerObject *self)
{
    quiet_and_reset();
    if (self->cuda_on)
        cuda_discard(); /* warm-up records delivered so far */
    GpClockAnchor start = gp_buffer_anchor();
    self->window_start = start.ns;
    if (gp_hook_snapshot(start.raw) < 0)
        return -1;
    cuda_window_on(self);
    set_phase(GP_PHASE_ACTIVE);
    return gp_hook_monitoring_restart();
}

static void
op_discard(GpProfilerObject *self)
{
    quiet_and_reset();
    cuda_window_off(self);
    if (self->cuda_on)
        cuda_discard();
}

/* Close the recorded window, aggregate it, replace self->result. */
static int
op_stop(GpProfilerObject *self)
{
    if (self->result == NULL) {
        /* tp_clear already ran: the GC is breaking the cycle with the
         * gpuprof.profile wrapper (at interpreter exit, or once the last
         * reference to a running profile went away) and dealloc is stopping
         * us. Nobody can read a result now, and storing one into the
         * cleared field crashed: drop the window instead. */
        op_discard(self);
        return 0;
    }
    set_phase(GP_PHASE_WAIT);
    uint64_t window_end = gp_buffer_anchor().ns;
    gp_buffer_quiesce();
    cuda_window_off(self);
    size_t n_gpu = 0;
    GpGpuRecord *gpu = self->cuda_on ? gp_cuda_take_records(&n_gpu) : NULL;
    GpWindowEvents ev;
    GpStatus st = gp_buffer_take_window(&ev);
    if (st != GP_OK) {
        free(gpu);
        gp_status_raise(st, "gpuprof: closing the recorded window");
        return -1;
    }
    GpAggInput in = {
        .threads = ev.threads,
        .n_threads = ev.n_threads,
        .anchors = ev.anchors,
        .n_anchors = ev.n_anchors,
        .op_kinds = gp_intern.kinds,
        .op_flags = gp_intern.flags,
        .n_ops = gp_intern.n_ops,
        .gpu = gpu,
        .n_gpu = n_gpu,
        .window_start_ns = self->window_start,
        .window_end_ns = window_end,
        .step_thread_ident = self->step_thread,
        .unclosed_step = self->stopping ? self->step_num + 1 : 0,
        .kernel_name = gp_cuda_string,
        .want_spans = 0,
        .nvtx_cross_thread_ends = gp_nvtx_cross_thread_ends() > 0,
    };
    GpTables t;
    st = gp_aggregate_run(&in, &t);
    free(gpu);
    if (st != GP_OK) {
        gp_buffer_release_window(&ev);
        gp_status_raise(st, "gpuprof: aggregating the recorded window");
        return -1;
    }
    t.dropped_gpu = self->cuda_on ? (int64_t)gp_cuda_dropped() : 0;
    PyObject *result = gp_profiler_result_dict(&t);
    int spans_built = t.has_spans;
    gp_aggregate_free(&t);
    if (result != NULL && !spans_built) {
        /* The spans come later, from the events (csrc/window.h). */
        PyObject *kept = gp_window_keep(&ev, &in);
        if (kept == NULL || PyDict_SetItemString(result, "_events", kept) < 0)
            Py_CLEAR(result);
        Py_XDECREF(kept);
    }
    gp_buffer_release_window(&ev); /* no-op when kept */
    if (result == NULL)
        return -1;
    Py_SETREF(self->result, result);
    self->windows++;
    return 0;
}

static int
op_ready(GpProfilerObject *self)
{
    if (self->on_trace_ready == NULL || self->on_trace_ready == Py_None)
        return 0;
    PyObject *arg = self->owner ? self->owner : (PyObject *)self;
    PyObject *r = PyObject_CallOneArg(self->on_trace_ready, arg);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static int
transit(GpProfilerObject *self, GpAction prev, GpAction cur)
{
    unsigned ops = gp_schedule_transition(prev, cur);
    int rc = 0;
    if (ops & GP_TR_STOP)
        rc = op_stop(self);
    if (ops & GP_TR_DISCARD)
        op_discard(self);
    /* on_trace_ready runs even if a later op fails, and its error wins. */
    if (rc == 0 && (ops & GP_TR_READY))
        rc = op_ready(self);
    if (rc == 0 && (ops & GP_TR_PREPARE))
        rc = op_prepare(self);
    if (rc == 0 && (ops & GP_TR_START))
        rc = op_start(self);
    if (rc == 0 && (ops & GP_TR_WARN) && prev != GP_ACT_EXIT) {
        rc = PyErr_WarnEx(PyExc_UserWarning,
                          "gpuprof: the schedule went from recording or warm-up straight to "
                          "waiting; each cycle should end with RECORD_AND_SAVE",
                          1);
    }
    return rc;
}

/* ---- capture ranges and NVTX out ---------------------------------------------- */

/* Gate state requested by a capture notice (any thread, maybe without the
 * GIL), applied with the GIL by a pending call or the next step(). */
static atomic_int capture_want;
static atomic_int capture_queued;

enum { CAP_OPEN = 1, CAP_CLOSE = 2 };

static int capture_pending_call(void *arg);

/* GpNvtxCaptureFn: only atomics and Py_AddPendingCall, which needs neither
 * the GIL nor a thread state. The pending call runs on the main thread at
 * its next bytecode boundary. */
static void
capture_request(int open)
{
    atomic_store(&capture_want, open);
    if (atomic_exchange(&capture_queued, 1) == 0 &&
        Py_AddPendingCall(capture_pending_call, NULL) < 0)
        atomic_store(&capture_queued, 0); /* queue full: the next step() applies it */
}

/* Markers at a capture window's start: the step in progress (so steps()
 * shows it, from here), and the NVTX range that opened the window, when it
 * was pushed on this thread (its push came before recording began). */
static void
capture_open_markers(GpProfilerObject *self)
{
    gp_hook_marker(GP_EV_STEP_BEGIN, (uint32_t)self->step_num);
    uint64_t thread;
    uint32_t name, domain;
    if (self->capture == GP_CAPTURE_NVTX && gp_nvtx_capture_label(&thread, &name, &domain) &&
        thread == (uint64_t)pthread_self())
        gp_hook_marker(GP_EV_MAKE(GP_EV_NVTX_PUSH, domain), name);
}

/* Open or close the window to match the requested gate (`which`: CAP_*).
 * GIL. 0, or -1 with an exception. */
static int
capture_apply(GpProfilerObject *self, int which)
{
    if (self->capture == GP_CAPTURE_NONE || !self->started || self->in_transition)
        return 0;
    int want = atomic_load(&capture_want);
    int on = self->action == GP_ACT_RECORD;
    if (want == on || (want && !(which & CAP_OPEN)) || (!want && !(which & CAP_CLOSE)))
        return 0;
    int rc;
    self->in_transition = 1;
    if (want) {
        rc = transit(self, GP_ACT_NONE, GP_ACT_RECORD);
        if (rc == 0) {
            self->action = GP_ACT_RECORD;
            capture_open_markers(self);
        } else {
            op_discard(self);
        }
    } else {
        self->action = GP_ACT_NONE;
        rc = transit(self, GP_ACT_RECORD_AND_SAVE, GP_ACT_NONE);
    }
    self->in_transition = 0;
    return rc;
}

static int
capture_pending_call(void *arg)
{
    (void)arg;
    atomic_store(&capture_queued, 0);
    if (active_profiler == NULL)
        return 0;
    return capture_apply((GpProfilerObject *)active_profiler, CAP_OPEN | CAP_CLOSE);
}

/* Arm the capture source for a starting session. 0, or -1 with an exception. */
static int
capture_arm(GpProfilerObject *self)
{
    atomic_store(&capture_want, 0);
    if (self->capture == GP_CAPTURE_PROFILER_API) {
        if (!self->cuda_on) {
            PyErr_Format(PyExc_RuntimeError,
                         "profile(capture='cudaProfilerApi') needs CUDA capture, which is off: %S",
                         self->cuda_error);
            return -1;
        }
        if (gp_cuda_capture_profiler_api(1) != GP_OK) {
            PyErr_Format(PyExc_RuntimeError, "profile(capture='cudaProfilerApi'): %s",
                         gp_cuda_reason());
            return -1;
        }
    } else if (self->capture == GP_CAPTURE_NVTX) {
        if (gp_nvtx_capture_set(self->capture_name, self->capture_domain) != GP_OK) {
            PyErr_SetString(PyExc_ValueError,
                            "profile(capture='nvtx:NAME'): NAME and domain must be under 256 bytes");
            return -1;
        }
    }
    if (self->capture != GP_CAPTURE_NONE)
        gp_nvtx_capture_handler(capture_request);
    return 0;
}

static void
capture_disarm(GpProfilerObject *self)
{
    if (self->capture == GP_CAPTURE_NONE)
        return;
    gp_nvtx_capture_handler(NULL);
    gp_nvtx_capture_set(NULL, NULL);
    if (self->capture == GP_CAPTURE_PROFILER_API && self->cuda_on)
        gp_cuda_capture_profiler_api(0);
}

/* ProfilerStep#N out to an attached NVTX tool (Nsight Systems); nothing
 * when none is. */
static void
emit_step_begin(int64_t step)
{
    if (!gp_nvtx_emit_ready())
        return;
    char buf[48];
    snprintf(buf, sizeof buf, "ProfilerStep#%lld", (long long)step);
    gp_nvtx_emit_push(buf);
}

static void
emit_step_end(void)
{
    if (gp_nvtx_emit_ready())
        gp_nvtx_emit_pop();
}

static int
action_for(GpProfilerObject *self, int64_t step, GpAction *out)
{
    if (self->capture != GP_CAPTURE_NONE) {
        /* The capture range, not the step count, opens and closes windows. */
        *out = self->action == GP_ACT_RECORD ? GP_ACT_RECORD : GP_ACT_NONE;
        return 0;
    }
    if (self->has_schedule) {
        *out = gp_schedule_action(&self->sched, step);
        return 0;
    }
    if (self->schedule_fn == NULL || self->schedule_fn == Py_None) {
        *out = GP_ACT_RECORD;
        return 0;
    }
    PyObject *r = PyObject_CallFunction(self->schedule_fn, "L", (long long)step);
    if (r == NULL)
        return -1;
    /* Accept ints and enum members (anything with __index__ or .value). */
    PyObject *v = r;
    if (!PyLong_Check(r) && PyObject_HasAttrString(r, "value")) {
        v = PyObject_GetAttrString(r, "value");
        Py_DECREF(r);
        if (v == NULL)
            return -1;
    }
    long a = PyLong_AsLong(v);
    Py_DECREF(v);
    if (a == -1 && PyErr_Occurred())
        return -1;
    if (a < GP_ACT_NONE || a > GP_ACT_RECORD_AND_SAVE) {
        PyErr_Format(PyExc_ValueError,
                     "schedule(%lld) returned %ld; expected a ProfilerAction (0 NONE, 1 WARMUP, "
                     "2 RECORD, 3 RECORD_AND_SAVE)",
                     (long long)step, a);
        return -1;
    }
    *out = (GpAction)a;
    return 0;
}

/* ---- the type ---------------------------------------------------------------- */

static int
Profiler_init(GpProfilerObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"max_events", "cuda", "memory", "schedule", "schedule_fn",
                             "on_trace_ready", "owner", "capture", "capture_name",
                             "capture_domain", "monitoring", "cuda_sync_records", NULL};
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
        if (!PyArg_ParseTuple(sched, "LLLLLL;schedule must be a tuple (wait, warmup, active, "
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
    if (active_profiler != NULL) {
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
    set_phase(GP_PHASE_WAIT);
    if (capture_arm(self) < 0)
        goto fail;
    if (!self->monitoring && gp_hook_install((PyObject *)self) < 0)
        goto fail;
    self->started = 1;
    active_profiler = (PyObject *)self;
    self->step_num = 0;
    self->step_thread = (uint64_t)pthread_self();
    self->action = GP_ACT_NONE;
    GpAction first;
    if (action_for(self, 0, &first) < 0)
        goto fail_started;
    self->action = GP_ACT_NONE;
    if (transit(self, GP_ACT_NONE, first) < 0)
        goto fail_started;
    self->action = first;
    gp_hook_marker(GP_EV_STEP_BEGIN, 0);
    emit_step_begin(0);
    Py_RETURN_NONE;
fail_started:
    self->started = 0;
    active_profiler = NULL;
fail:
    capture_disarm(self);
    set_phase(GP_PHASE_OFF);
    gp_hook_uninstall();
    if (self->cuda_on) {
        Py_BEGIN_ALLOW_THREADS
        gp_cuda_session_end();
        Py_END_ALLOW_THREADS
        self->cuda_on = 0;
    }
    gp_buffer_quiesce();
    gp_buffer_session_end();
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
    if (capture_apply(self, CAP_CLOSE) < 0)
        return NULL;
    gp_hook_marker(GP_EV_STEP_END, (uint32_t)self->step_num);
    emit_step_end();
    if (atomic_load(&gp_buffer_phase) >= GP_PHASE_WARMUP)
        gp_buffer_anchor(); /* keeps the raw -> ns map exact over long windows */
    int64_t next = self->step_num + 1;
    GpAction cur;
    if (action_for(self, next, &cur) < 0)
        return NULL;
    GpAction prev = self->action;
    self->step_num = next;
    self->in_transition = 1;
    int rc = transit(self, prev, cur);
    self->in_transition = 0;
    self->action = cur;
    gp_hook_marker(GP_EV_STEP_BEGIN, (uint32_t)self->step_num);
    emit_step_begin(self->step_num);
    if (rc < 0)
        return NULL;
    if (capture_apply(self, CAP_OPEN) < 0)
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
    emit_step_end();
    capture_disarm(self);
    /* Keep any exception the caller is propagating (the with block's). */
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    self->in_transition = 1;
    self->stopping = 1;
    int rc = transit(self, self->action, GP_ACT_EXIT);
    self->stopping = 0;
    self->in_transition = 0;
    self->action = GP_ACT_NONE;
    set_phase(GP_PHASE_OFF);
    if (!self->monitoring)
        gp_hook_uninstall();
    gp_buffer_quiesce();
    if (self->cuda_on) {
        cuda_window_off(self);
        Py_BEGIN_ALLOW_THREADS
        gp_cuda_session_end();
        Py_END_ALLOW_THREADS
        gp_cuda_clear_strings();
        self->cuda_on = 0;
    }
    gp_buffer_session_end();
    gp_intern_clear();
    gp_nvtx_clear();
    self->started = 0;
    active_profiler = NULL;
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

static PyObject *
Profiler_nvtx_info(PyObject *Py_UNUSED(cls), PyObject *Py_UNUSED(ignored))
{
    GpNvtxInfo info;
    gp_nvtx_info(&info);
    return Py_BuildValue("{sisOsssIsIsKsI}", "clients", info.clients, "emit",
                         info.emit ? Py_True : Py_False, "emit_reason", info.emit_reason, "names",
                         info.names, "domains", info.domains, "names_dropped",
                         (unsigned long long)info.names_dropped, "probe_hits", info.probe_hits);
}

static PyMethodDef Profiler_methods[] = {
    {"nvtx_info", (PyCFunction)Profiler_nvtx_info, METH_NOARGS | METH_STATIC,
     "NVTX state: clients attached to gpuprof's injection, whether gpuprof's ranges go out "
     "to another NVTX tool (and why not), names interned this session."},
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
    {"action", (getter)Profiler_get_action, NULL, "Current schedule action, -1 when stopped.", NULL},
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

/* ---- ranges ------------------------------------------------------------------ */

/* Token bit of range_push: the label also went out as an NVTX range (op ids
 * stay far below it). */
#define GP_RANGE_EMITTED 0x80000000ull

/* A range token is the session it was opened in (high 32 bits) and the
 * label's op id (low 32 bits); 0 means "not recorded". Op ids restart with
 * every session, so a bare id from a range left open when one session
 * stopped closed whichever range of the next session had the same id. */
static uint64_t
range_session(void)
{
    return (uint64_t)atomic_load(&gp_buffer_session) & 0xffffffffu;
}

PyObject *
gp_profiler_range_push(PyObject *module, PyObject *label)
{
    (void)module;
    if (!PyUnicode_Check(label)) {
        PyErr_Format(PyExc_TypeError, "record_function name must be a str, not %.100s",
                     Py_TYPE(label)->tp_name);
        return NULL;
    }
    /* Out to Nsight Systems (or any NVTX tool) when one is attached;
     * GP_RANGE_EMITTED in the token tells range_pop. */
    uint64_t emitted = 0;
    if (gp_nvtx_emit_ready()) {
        const char *utf8 = PyUnicode_AsUTF8(label);
        if (utf8 == NULL)
            return NULL;
        gp_nvtx_emit_push(utf8);
        emitted = GP_RANGE_EMITTED;
    }
    if (active_profiler == NULL || atomic_load(&gp_buffer_phase) < GP_PHASE_WARMUP)
        return PyLong_FromUnsignedLongLong(emitted);
    uint32_t op = gp_intern_label(label);
    if (op == 0) {
        if (emitted)
            gp_nvtx_emit_pop();
        return NULL;
    }
    gp_hook_marker(GP_EV_RANGE_PUSH, op);
    return PyLong_FromUnsignedLongLong(range_session() << 32 | op | emitted);
}

PyObject *
gp_profiler_range_pop(PyObject *module, PyObject *op_id)
{
    (void)module;
    unsigned long long token = PyLong_AsUnsignedLongLong(op_id);
    if (token == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (token & GP_RANGE_EMITTED) {
        gp_nvtx_emit_pop();
        token &= ~(unsigned long long)GP_RANGE_EMITTED;
        if (token >> 32 == 0)
            Py_RETURN_NONE; /* emitted only: not recorded */
    }
    /* Tokens of another session (or forged ones) close nothing. */
    if (token != 0 && active_profiler != NULL && token >> 32 == range_session())
        gp_hook_marker(GP_EV_RANGE_POP, (uint32_t)token);
    Py_RETURN_NONE;
}

void
gp_profiler_after_fork_child(void)
{
    gp_hook_uninstall();
    gp_cuda_after_fork_child();
    gp_nvtx_after_fork_child();
    gp_buffer_after_fork_child();
    if (active_profiler != NULL) {
        GpProfilerObject *p = (GpProfilerObject *)active_profiler;
        p->started = 0;
        p->cuda_on = 0;
        p->cuda_window = 0;
        p->forked_off = 1;
        active_profiler = NULL;
        gp_intern_clear();
    }
}
