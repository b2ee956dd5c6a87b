/* record_function ranges (range_push/range_pop) and a forked child's copy of
 * the running profiler (profiler.h). */
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
    if (gp_profiler_active == NULL || atomic_load(&gp_buffer_phase) < GP_PHASE_WARMUP)
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
    if (token != 0 && gp_profiler_active != NULL && token >> 32 == range_session())
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
    if (gp_profiler_active != NULL) {
        GpProfilerObject *p = (GpProfilerObject *)gp_profiler_active;
        p->started = 0;
        p->cuda_on = 0;
        p->cuda_window = 0;
        p->forked_off = 1;
        gp_profiler_active = NULL;
        gp_intern_clear();
    }
}
