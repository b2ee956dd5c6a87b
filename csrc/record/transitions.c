/* Schedule transitions: what opening, closing, discarding and handing over a
 * recorded window does to the hook, the buffers and GPU capture
 * (profiler_internal.h). */
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

/* ---- window operations ----------------------------------------------------- */

void
gp_transition_set_phase(int phase)
{
    atomic_store(&gp_buffer_phase, phase);
}

/* Stop writers and drop what the buffers hold. */
static void
quiet_and_reset(void)
{
    gp_transition_set_phase(GP_PHASE_WAIT);
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
void
gp_transition_cuda_off(GpProfilerObject *self)
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
window_prepare(GpProfilerObject *self)
{
    quiet_and_reset();
    cuda_window_on(self);
    gp_transition_set_phase(GP_PHASE_WARMUP);
    return gp_hook_monitoring_restart();
}

static int
window_start(GpProfilerObject *self)
{
    quiet_and_reset();
    if (self->cuda_on)
        cuda_discard(); /* warm-up records delivered so far */
    GpClockAnchor start = gp_buffer_anchor();
    self->window_start = start.ns;
    if (gp_hook_snapshot(start.raw) < 0)
        return -1;
    cuda_window_on(self);
    gp_transition_set_phase(GP_PHASE_ACTIVE);
    return gp_hook_monitoring_restart();
}

void
gp_transition_discard(GpProfilerObject *self)
{
    quiet_and_reset();
    gp_transition_cuda_off(self);
    if (self->cuda_on)
        cuda_discard();
}

/* Close the recorded window, aggregate it, replace self->result. */
static int
window_stop(GpProfilerObject *self)
{
    if (self->result == NULL) {
        /* tp_clear already ran: the GC is breaking the cycle with the
         * gpuprof.profile wrapper (at interpreter exit, or once the last
         * reference to a running profile went away) and dealloc is stopping
         * us. Nobody can read a result now, and storing one into the
         * cleared field crashed: drop the window instead. */
        gp_transition_discard(self);
        return 0;
    }
    gp_transition_set_phase(GP_PHASE_WAIT);
    uint64_t window_end = gp_buffer_anchor().ns;
    gp_buffer_quiesce();
    gp_transition_cuda_off(self);
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
        .nvtx_base = gp_nvtx_shaped_names() > 0 ? gp_nvtx_base_key : NULL,
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
        /* The spans come later, from the events (csrc/results/window.h). */
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
window_ready(GpProfilerObject *self)
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

int
gp_transition_run(GpProfilerObject *self, GpAction prev, GpAction cur)
{
    unsigned ops = gp_schedule_transition(prev, cur);
    int rc = 0;
    if (ops & GP_TR_STOP)
        rc = window_stop(self);
    if (ops & GP_TR_DISCARD)
        gp_transition_discard(self);
    /* on_trace_ready runs even if a later op fails, and its error wins. The next
     * window still opens when on_trace_ready fails: a user who catches its error
     * around prof.step() keeps profiling, so its exception waits aside meanwhile. */
    PyObject *ready_type = NULL, *ready_value = NULL, *ready_tb = NULL;
    if (rc == 0 && (ops & GP_TR_READY) && window_ready(self) < 0)
        PyErr_Fetch(&ready_type, &ready_value, &ready_tb);
    if (rc == 0 && (ops & GP_TR_PREPARE))
        rc = window_prepare(self);
    if (rc == 0 && (ops & GP_TR_START))
        rc = window_start(self);
    if (ready_type != NULL) {
        if (rc < 0)
            PyErr_Clear();
        PyErr_Restore(ready_type, ready_value, ready_tb);
        rc = -1;
    }
    if (rc == 0 && (ops & GP_TR_WARN) && prev != GP_ACT_EXIT) {
        rc = PyErr_WarnEx(PyExc_UserWarning,
                          "gpuprof: the schedule went from recording or warm-up straight to "
                          "waiting; each cycle should end with RECORD_AND_SAVE",
                          1);
    }
    if (self->started && !self->monitoring && cur != GP_ACT_EXIT)
        gp_hook_follow_phase((PyObject *)self);
    return rc;
}
