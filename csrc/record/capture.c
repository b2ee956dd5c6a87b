/* Capture ranges (profile(capture=...)): the cudaProfilerStart/Stop or NVTX
 * range that opens and closes windows instead of the schedule, and
 * ProfilerStep#N ranges out to an attached NVTX tool (profiler_internal.h). */
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

/* ---- capture ranges and NVTX out ---------------------------------------------- */

/* Gate state requested by a capture notice (any thread, maybe without the
 * GIL), applied with the GIL by a pending call or the next step(). */
static atomic_int capture_want;
static atomic_int capture_queued;

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
int
gp_capture_apply(GpProfilerObject *self, int which)
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
        rc = gp_transition_run(self, GP_ACT_NONE, GP_ACT_RECORD);
        if (rc == 0) {
            self->action = GP_ACT_RECORD;
            capture_open_markers(self);
        } else {
            gp_transition_discard(self);
        }
    } else {
        self->action = GP_ACT_NONE;
        rc = gp_transition_run(self, GP_ACT_RECORD_AND_SAVE, GP_ACT_NONE);
    }
    self->in_transition = 0;
    return rc;
}

static int
capture_pending_call(void *arg)
{
    (void)arg;
    atomic_store(&capture_queued, 0);
    if (gp_profiler_active == NULL)
        return 0;
    return gp_capture_apply((GpProfilerObject *)gp_profiler_active, CAP_OPEN | CAP_CLOSE);
}

/* Arm the capture source for a starting session. 0, or -1 with an exception. */
int
gp_capture_arm(GpProfilerObject *self)
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
            PyErr_SetString(
                PyExc_ValueError,
                "profile(capture='nvtx:NAME'): NAME and domain must be under 256 bytes");
            return -1;
        }
    }
    if (self->capture != GP_CAPTURE_NONE)
        gp_nvtx_capture_handler(capture_request);
    return 0;
}

void
gp_capture_disarm(GpProfilerObject *self)
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
void
gp_capture_step_begin(int64_t step)
{
    if (!gp_nvtx_emit_ready())
        return;
    char buf[48];
    snprintf(buf, sizeof buf, "ProfilerStep#%lld", (long long)step);
    gp_nvtx_emit_push(buf);
}

void
gp_capture_step_end(void)
{
    if (gp_nvtx_emit_ready())
        gp_nvtx_emit_pop();
}

int
gp_capture_action_for(GpProfilerObject *self, int64_t step, GpAction *out)
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
