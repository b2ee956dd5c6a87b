/* What the Profiler type's files share: the object (profiler.c), window
 * transitions (transitions.c), capture ranges and NVTX step ranges
 * (capture.c), record_function ranges and fork handling (ranges.c). Internal
 * to those files. */
#ifndef GPUPROF_CSRC_PROFILER_INTERNAL_H
#define GPUPROF_CSRC_PROFILER_INTERNAL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "profiler.h"
#include "schedule.h"

#include <stdint.h>

/* At most one profiler records at a time (CUPTI and the hook are per
 * process). GIL. */
extern PyObject *gp_profiler_active; /* borrowed; cleared at stop */

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

/* ---- transitions.c: what a schedule transition does to the window ---------- */

/* The buffers' phase flag (GP_PHASE_*), read by the hook. */
void gp_transition_set_phase(int phase);

/* Disable GPU capture for the window (blocking: GIL released). */
void gp_transition_cuda_off(GpProfilerObject *self);

/* Drop the open window: stop writers, discard events and GPU records. */
void gp_transition_discard(GpProfilerObject *self);

/* Carry out the transition prev -> cur (gp_schedule_transition's bits: close
 * and aggregate the window, call on_trace_ready, discard, prepare, start).
 * GIL. 0, or -1 with an exception. */
int gp_transition_run(GpProfilerObject *self, GpAction prev, GpAction cur);

/* ---- capture.c: capture ranges and NVTX out -------------------------------- */

/* Gates a capture notice requests (the `which` of gp_capture_apply). */
enum { CAP_OPEN = 1, CAP_CLOSE = 2 };

/* Open or close the window to match the requested gate (`which`: CAP_*).
 * GIL. 0, or -1 with an exception. */
int gp_capture_apply(GpProfilerObject *self, int which);

/* Arm the capture source for a starting session. 0, or -1 with an exception. */
int gp_capture_arm(GpProfilerObject *self);

/* Disarm it at stop. */
void gp_capture_disarm(GpProfilerObject *self);

/* ProfilerStep#N out to an attached NVTX tool (Nsight Systems); nothing
 * when none is. */
void gp_capture_step_begin(int64_t step);
void gp_capture_step_end(void);

/* The schedule action for `step`: the schedule's, or with a capture range the
 * range's. GIL. 0, or -1 with an exception. */
int gp_capture_action_for(GpProfilerObject *self, int64_t step, GpAction *out);

#endif /* GPUPROF_CSRC_PROFILER_INTERNAL_H */
