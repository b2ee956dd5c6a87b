/* Taking the GIL back from a busy main thread (gil.h).
 *
 * CPython starves a thread that waits for the GIL while the holder lets it go
 * and takes it back often. The waiter asks the holder to drop the GIL only when
 * a whole switch interval (5 ms) passes with no switch, and each short release
 * by the holder (a stat(), a lock, a CUDA launch) counts as a switch: the waiter,
 * woken too late to take the GIL, starts its interval again, and the holder
 * takes the GIL back first. A loop that calls os.path.exists() once in each 2 ms
 * step kept gpuprof's on-demand thread off the GIL for seconds at a time, so
 * `gpuprof capture` and `gpuprof top` got no answer.
 *
 * gp_gil_take_back() asks the main thread to stand aside, with
 * Py_AddPendingCall (which any thread may call without the GIL): at its next
 * bytecode boundary the main thread releases the GIL and waits until the asking
 * thread holds it, at most HANDOFF_MAX_MS, then goes on (and asks itself again if
 * the waiter still does not hold it). The program pays one
 * handoff (tens of microseconds) each time gpuprof's thread wakes: once a second
 * when it polls, once per request. Where the GIL is free the waiter takes it at
 * once and the main thread, when it runs the call, finds nobody waiting. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "gil.h"

#include "clock.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#define HANDOFF_MAX_MS 50

/* `mu` protects the three counters. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t taken = PTHREAD_COND_INITIALIZER;
static unsigned waiting;      /* threads in gp_gil_take_back, not yet holding the GIL */
static unsigned long handoffs; /* times a waiter got the GIL: a main thread standing
                                  aside waits for this to move */
static int queued;            /* a stand_aside call is pending */

/* The pending call: on the main thread, holding the GIL. */
static int
stand_aside(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    queued = 0;
    unsigned long seen = handoffs;
    int wanted = waiting > 0;
    pthread_mutex_unlock(&mu);
    if (!wanted)
        return 0;
    int again = 0;
    Py_BEGIN_ALLOW_THREADS
    struct timespec until; /* `taken` waits on the default clock, CLOCK_REALTIME */
    gp_clock_deadline_ms(CLOCK_REALTIME, HANDOFF_MAX_MS, &until);
    pthread_mutex_lock(&mu);
    while (handoffs == seen && waiting > 0)
        if (pthread_cond_timedwait(&taken, &mu, &until) == ETIMEDOUT)
            break;
    /* Not taken in time (the waiter was not scheduled: a loaded machine): ask again
     * at the next bytecode boundary rather than leave it to CPython's starvation. */
    again = handoffs == seen && waiting > 0 && !queued;
    if (again)
        queued = 1;
    pthread_mutex_unlock(&mu);
    Py_END_ALLOW_THREADS
    if (again && Py_AddPendingCall(stand_aside, NULL) != 0) {
        pthread_mutex_lock(&mu);
        queued = 0;
        pthread_mutex_unlock(&mu);
    }
    return 0;
}

void
gp_gil_take_back(PyThreadState *ts)
{
    pthread_mutex_lock(&mu);
    waiting++;
    int ask = !queued;
    queued = 1;
    pthread_mutex_unlock(&mu);
    if (ask && Py_AddPendingCall(stand_aside, NULL) != 0) { /* the queue is full */
        pthread_mutex_lock(&mu);
        queued = 0;
        pthread_mutex_unlock(&mu);
    }
    PyEval_RestoreThread(ts);
    pthread_mutex_lock(&mu);
    waiting--;
    handoffs++;
    pthread_cond_broadcast(&taken);
    pthread_mutex_unlock(&mu);
}

void
gp_gil_after_fork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    pthread_cond_init(&taken, NULL);
    waiting = 0;
    queued = 0; /* a call queued in the parent runs in the child too: it finds none waiting */
}

/* Read what fd holds, without blocking (it was readable), and drop it. */
static void
drain_fd(int fd)
{
    char buf[4096];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < (ssize_t)sizeof buf)
            return;
        struct pollfd more = {.fd = fd, .events = POLLIN};
        if (poll(&more, 1, 0) <= 0 || !(more.revents & POLLIN))
            return;
    }
}

/* _wait_readable(fd, timeout_s, drain=False) -> bool: wait without the GIL until
 * fd is readable or timeout_s seconds pass, then take the GIL back (above). True
 * if fd is readable (or has hung up). drain=True reads what fd holds before the
 * GIL is taken back: a wake-up pipe's bytes, which an os.read() afterwards would
 * read with one more release of the GIL, and one more wait to get it back. */
static PyObject *
wait_readable(PyObject *module, PyObject *args)
{
    (void)module;
    int fd, drain = 0;
    double timeout_s;
    if (!PyArg_ParseTuple(args, "id|p:_wait_readable", &fd, &timeout_s, &drain))
        return NULL;
    if (fd < 0) {
        PyErr_Format(PyExc_ValueError, "_wait_readable: fd must be >= 0, got %d", fd);
        return NULL;
    }
    if (!(timeout_s >= 0.0) || isinf(timeout_s)) {
        PyErr_Format(PyExc_ValueError,
                     "_wait_readable: timeout_s must be a finite number of seconds >= 0");
        return NULL;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int rc, err = 0;
    PyThreadState *ts = PyEval_SaveThread();
    uint64_t until_ns = gp_clock_now() + (uint64_t)(timeout_s * 1e9);
    double left_ms = timeout_s * 1e3;
    for (;;) {
        rc = poll(&p, 1, left_ms > (double)INT_MAX ? INT_MAX : (int)ceil(left_ms));
        if (rc >= 0 || errno != EINTR) {
            err = rc < 0 ? errno : 0;
            break;
        }
        uint64_t now = gp_clock_now();
        if (now >= until_ns) {
            rc = 0;
            break;
        }
        left_ms = (double)(until_ns - now) / 1e6;
    }
    if (drain && rc > 0 && (p.revents & POLLIN))
        drain_fd(fd);
    gp_gil_take_back(ts);
    if (rc < 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyBool_FromLong(rc > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)));
}

PyMethodDef gp_gil_methods[] = {
    {"_wait_readable", wait_readable, METH_VARARGS,
     "_wait_readable(fd, timeout_s, drain=False) -> bool: wait without the GIL for fd to be "
     "readable (drain: and read what it holds), then take the GIL back even from a main "
     "thread that keeps retaking it."},
    {NULL, NULL, 0, NULL},
};
