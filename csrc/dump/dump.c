/* The dump server of an armed process (dump.h).
 *
 * Why a native thread: a dump is asked for when a program hangs, and a thread
 * that holds the GIL forever (a C loop, a call that blocks without releasing
 * it) stops every Python-level handler, gpuprof's on-demand thread included. So
 * arming starts this thread too. It never takes the GIL and calls no Python API:
 * it sleeps in poll() on a Unix socket in the runtime folder (mode 0700, and the
 * peer's uid is checked), and for each connection
 *
 *   1. reads one request line, "dump WAIT_MS";
 *   2. walks every thread state (dump_walk.c) and sends that JSON line at once;
 *   3. sends the thread names the on-demand thread last handed over (a JSON line
 *      of Python's, cached: threads seldom change names);
 *   4. wakes the on-demand thread (one byte into its wake pipe) and waits up to
 *      WAIT_MS for its answer (thread names now, torch.distributed's in-flight
 *      collectives: what only Python can read), which it forwards; if none
 *      comes, a line saying so. Then it closes the connection.
 *
 * The program's threads are never stopped or signalled; the on-demand thread,
 * when it gets the GIL late, finds the request gone (_dump_pending() == 0) and
 * does nothing. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dump.h"

#include "clock.h"
#include "common.h"
#include "compat.h"
#include "dump_call.h"
#include "dump_out.h"
#include "dump_walk.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define REQUEST_MAX 256
#define WAIT_MAX_MS 10000
#define LINE_MAX_BYTES ((Py_ssize_t)8 << 20)

/* The server's state. `mu` protects every field below it; `tables` is written
 * only while no server runs (and before one starts), then read by it. */
static GpDumpTables tables;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t answered; /* CLOCK_MONOTONIC; made once, in cond_init */
static int cond_ready;
static int running;         /* a server thread exists (until _dump_stop joins it) */
static int stopping;        /* _dump_stop has begun */
static pthread_t thread;
static int listen_fd = -1;  /* the server thread's, while running */
static int stop_pipe[2] = {-1, -1};
static int wake_fd = -1;    /* our dup of the on-demand thread's wake pipe */
static char sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
static uint64_t seq;        /* requests served so far */
static uint64_t pending;    /* the request waiting for Python's answer, or 0 */
static char *answer;        /* that answer (malloc'ed line), once given */
static size_t answer_len;
static char *names;         /* the cached thread names line (malloc'ed), or NULL */
static size_t names_len;
static long server_tid;     /* the server thread's OS id (left out of the native list) */

static void
cond_init(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&answered, &a);
    pthread_condattr_destroy(&a);
    cond_ready = 1;
}

static void
close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* A forked child has no server thread: forget the parent's (its socket file
 * stays: it is the parent's). The fds are the parent's copies; close ours. */
static void
after_fork_child(void)
{
    pthread_mutex_init(&mu, NULL);
    if (cond_ready)
        cond_init();
    running = stopping = 0;
    close_fd(&listen_fd);
    close_fd(&stop_pipe[0]);
    close_fd(&stop_pipe[1]);
    close_fd(&wake_fd);
    sock_path[0] = '\0';
    pending = 0;
    free(answer);
    answer = NULL;
    free(names);
    names = NULL;
}

static int
send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1; /* the requester went away, or stopped reading for SO_SNDTIMEO */
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int
send_line(int fd, const char *p, size_t n)
{
    if (send_all(fd, p, n) != 0)
        return -1;
    return send_all(fd, "\n", 1);
}

/* One request: "dump WAIT_MS\n". WAIT_MS, or -1 for anything else. */
static int
read_request(int fd)
{
    char buf[REQUEST_MAX];
    size_t n = 0;
    while (n + 1 < sizeof buf) {
        ssize_t k = recv(fd, buf + n, sizeof buf - 1 - n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        n += (size_t)k;
        if (memchr(buf, '\n', n) != NULL)
            break;
    }
    buf[n] = '\0';
    if (strncmp(buf, "dump ", 5) != 0)
        return -1;
    char *end;
    long ms = strtol(buf + 5, &end, 10);
    if (end == buf + 5 || ms < 0)
        return -1;
    return ms > WAIT_MAX_MS ? WAIT_MAX_MS : (int)ms;
}

static void
serve_one(int fd)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    /* the folder is private already; a connection of another user is refused anyway */
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        (cred.uid != geteuid() && cred.uid != 0))
        return;
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    tv.tv_sec = 5;
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int wait_ms = read_request(fd);
    if (wait_ms < 0) {
        const char *bad = "{\"kind\":\"error\",\"message\":\"expected \\\"dump WAIT_MS\\\"\"}";
        send_line(fd, bad, strlen(bad));
        return;
    }

    GpDumpOut out = {NULL, 0, 0, 0};
    gp_dump_walk_threads(&tables, server_tid, &out);
    if (out.full) {
        gp_dump_out_free(&out);
        const char *oom =
            "{\"kind\":\"walk\",\"problems\":[\"out of memory while writing the dump\"]}";
        gp_dump_out_str(&out, oom);
    }
    int ok = out.p != NULL && send_line(fd, out.p, out.n) == 0;
    gp_dump_out_free(&out);
    if (!ok)
        return;

    pthread_mutex_lock(&mu);
    char *cached = names_len ? malloc(names_len) : NULL;
    size_t cached_len = cached ? names_len : 0;
    if (cached)
        memcpy(cached, names, names_len);
    uint64_t me = ++seq;
    int ask = wait_ms > 0 && wake_fd >= 0 && !stopping;
    if (ask) {
        pending = me;
        free(answer);
        answer = NULL;
        answer_len = 0;
    }
    int wfd = wake_fd;
    pthread_mutex_unlock(&mu);
    if (cached) {
        ok = send_line(fd, cached, cached_len) == 0;
        free(cached);
        if (!ok)
            ask = 0;
    }
    if (!ask) {
        pthread_mutex_lock(&mu);
        if (pending == me)
            pending = 0;
        pthread_mutex_unlock(&mu);
        return;
    }

    /* Wake the on-demand thread: a full pipe already wakes it. */
    ssize_t wrote;
    do {
        wrote = write(wfd, "d", 1);
    } while (wrote < 0 && errno == EINTR);
    uint64_t t0 = gp_clock_now();
    struct timespec deadline;
    gp_clock_deadline_ms(CLOCK_MONOTONIC, wait_ms, &deadline);
    pthread_mutex_lock(&mu);
    while (answer == NULL && !stopping) {
        int rc = pthread_cond_timedwait(&answered, &mu, &deadline);
        if (rc == ETIMEDOUT)
            break;
    }
    char *got = answer;
    size_t got_len = answer_len;
    answer = NULL;
    answer_len = 0;
    pending = 0;
    pthread_mutex_unlock(&mu);
    if (got != NULL) {
        send_line(fd, got, got_len);
        free(got);
        return;
    }
    char line[160];
    long waited = (long)((gp_clock_now() - t0) / 1000000u);
    snprintf(line, sizeof line, "{\"kind\":\"python\",\"missing\":true,\"waited_ms\":%ld}", waited);
    send_line(fd, line, strlen(line));
}

static void *
serve(void *arg)
{
    (void)arg;
    prctl(PR_SET_NAME, "gpuprof-dump", 0, 0, 0);
    server_tid = (long)syscall(SYS_gettid);
    for (;;) {
        struct pollfd p[2] = {{listen_fd, POLLIN, 0}, {stop_pipe[0], POLLIN, 0}};
        int r = poll(p, 2, -1);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents)
            break;
        if (p[0].revents & (POLLERR | POLLNVAL))
            break;
        if (p[0].revents & POLLIN) {
            int c = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
            if (c >= 0) {
                serve_one(c);
                close(c);
            }
        }
    }
    return NULL;
}

/* -- Python entry points (GIL held) -------------------------------------------------------- */

/* _dump_tables(deopt: bytes[256], caches: bytes[256], ops: dict[str, int]) -> None.
 * The bytecode tables of this interpreter (python/gpuprof/_ondemand/_dump.py
 * builds them from the opcode module). RuntimeError while a server runs. */
static PyObject *
dump_tables(PyObject *module, PyObject *args)
{
    (void)module;
    Py_buffer deopt = {0}, caches = {0};
    PyObject *ops, *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*O!:_dump_tables", &deopt, &caches, &PyDict_Type, &ops))
        return NULL;
    GpDumpTables t;
    memset(&t, 0, sizeof t);
    if (deopt.len != 256 || caches.len != 256) {
        PyErr_Format(PyExc_ValueError,
                     "_dump_tables: deopt and caches must be 256 bytes each, got %zd and %zd",
                     deopt.len, caches.len);
        goto done;
    }
    memcpy(t.deopt, deopt.buf, 256);
    memcpy(t.caches, caches.buf, 256);
    for (int i = 0; i < GP_DUMP_OP_COUNT; i++) {
        PyObject *v = NULL, *key = PyUnicode_FromString(gp_dump_call_op_names[i]);
        if (key == NULL)
            goto done;
        int found = PyDict_GetItemRef(ops, key, &v);
        Py_DECREF(key);
        if (found < 0)
            goto done;
        long n = found ? PyLong_AsLong(v) : -1;
        Py_XDECREF(v);
        if (n == -1 && PyErr_Occurred())
            goto done;
        if (n < -1 || n > 255) {
            PyErr_Format(PyExc_ValueError,
                         "_dump_tables: opcode %s must be in 0..255 or -1, got %ld",
                         gp_dump_call_op_names[i], n);
            goto done;
        }
        t.op[i] = (int16_t)n;
    }
    t.ready = 1;
    pthread_mutex_lock(&mu);
    int busy = running;
    if (!busy)
        tables = t;
    pthread_mutex_unlock(&mu);
    if (busy) {
        PyErr_SetString(PyExc_RuntimeError, "_dump_tables: the dump server is running");
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&deopt);
    PyBuffer_Release(&caches);
    return result;
}

/* _dump_start(path: str, wake_fd: int) -> None. Listen on a Unix socket at path
 * (mode 0600; an old file there is replaced) and start the server thread;
 * wake_fd is the on-demand thread's wake pipe (written, never read; dup'ed).
 * RuntimeError: already running, or not supported on this Python. OSError:
 * the socket (its errno, naming the path). */
static PyObject *
dump_start(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *path_obj = NULL;
    int wake = -1;
    if (!PyArg_ParseTuple(args, "O&i:_dump_start", PyUnicode_FSConverter, &path_obj, &wake))
        return NULL;
    const char *path = PyBytes_AS_STRING(path_obj);
    const char *why = gp_dump_walk_unsupported();
    struct sockaddr_un addr;
    int fd = -1, sp[2] = {-1, -1}, wfd = -1, err = 0;
    if (why != NULL) {
        PyErr_SetString(PyExc_RuntimeError, why);
        goto fail;
    }
    if (strlen(path) >= sizeof addr.sun_path) {
        PyErr_Format(PyExc_ValueError,
                     "_dump_start: the socket path %R is longer than %zu bytes; set "
                     "GPUPROF_RUNTIME_DIR to a shorter folder",
                     path_obj, sizeof addr.sun_path - 1);
        goto fail;
    }
    pthread_mutex_lock(&mu);
    int busy = running;
    pthread_mutex_unlock(&mu);
    if (busy) {
        PyErr_SetString(PyExc_RuntimeError, "_dump_start: the dump server is already running");
        goto fail;
    }
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, path, strlen(path) + 1);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        goto os_error;
    unlink(path); /* one left by an earlier process of this pid */
    mode_t old = umask(0177);
    int rc = bind(fd, (struct sockaddr *)&addr, sizeof addr);
    umask(old);
    if (rc != 0 || listen(fd, 8) != 0 || pipe2(sp, O_CLOEXEC) != 0)
        goto os_error;
    if (wake >= 0 && (wfd = fcntl(wake, F_DUPFD_CLOEXEC, 0)) < 0)
        goto os_error;

    static int atfork_done = 0;
    pthread_mutex_lock(&mu);
    if (!cond_ready)
        cond_init();
    if (!atfork_done && pthread_atfork(NULL, NULL, after_fork_child) == 0)
        atfork_done = 1;
    listen_fd = fd;
    stop_pipe[0] = sp[0];
    stop_pipe[1] = sp[1];
    wake_fd = wfd;
    stopping = 0;
    snprintf(sock_path, sizeof sock_path, "%s", path);
    /* Every signal blocked in the new thread (it inherits this mask): the
     * program's handlers must run on its own threads, not on this one. */
    sigset_t all, saved;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &saved);
    err = pthread_create(&thread, NULL, serve, NULL);
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
    running = err == 0;
    if (!running) {
        listen_fd = stop_pipe[0] = stop_pipe[1] = wake_fd = -1;
        sock_path[0] = '\0';
    }
    pthread_mutex_unlock(&mu);
    if (err != 0) {
        errno = err;
        goto os_error;
    }
    Py_DECREF(path_obj);
    Py_RETURN_NONE;

os_error:
    PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path_obj);
    if (fd >= 0)
        unlink(path);
fail:
    close_fd(&fd);
    close_fd(&sp[0]);
    close_fd(&sp[1]);
    close_fd(&wfd);
    Py_XDECREF(path_obj);
    return NULL;
}

/* _dump_stop() -> None: end the server thread (a dump in progress is finished
 * first, within its socket timeouts), close its socket and remove the file.
 * Does nothing when none runs. */
static PyObject *
dump_stop(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    pthread_mutex_lock(&mu);
    if (!running) {
        pthread_mutex_unlock(&mu);
        Py_RETURN_NONE;
    }
    stopping = 1;
    pthread_cond_broadcast(&answered);
    ssize_t w;
    do {
        w = write(stop_pipe[1], "x", 1);
    } while (w < 0 && errno == EINTR);
    pthread_t t = thread;
    pthread_mutex_unlock(&mu);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(t, NULL);
    Py_END_ALLOW_THREADS
    pthread_mutex_lock(&mu);
    running = 0;
    close_fd(&listen_fd);
    close_fd(&stop_pipe[0]);
    close_fd(&stop_pipe[1]);
    close_fd(&wake_fd);
    if (sock_path[0])
        unlink(sock_path);
    sock_path[0] = '\0';
    free(answer);
    answer = NULL;
    answer_len = 0;
    pending = 0;
    pthread_mutex_unlock(&mu);
    Py_RETURN_NONE;
}

/* _dump_pending() -> int: the request waiting for the on-demand thread's answer,
 * or 0. */
static PyObject *
dump_pending(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    pthread_mutex_lock(&mu);
    uint64_t p = pending;
    pthread_mutex_unlock(&mu);
    return PyLong_FromUnsignedLongLong(p);
}

static int
copy_line(PyObject *obj, const char *what, char **out, size_t *out_len)
{
    char *p;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(obj, &p, &n) < 0)
        return -1;
    if (n > LINE_MAX_BYTES || memchr(p, '\n', (size_t)n) != NULL) {
        PyErr_Format(PyExc_ValueError, "%s: one line of at most %zd bytes is needed", what,
                     LINE_MAX_BYTES);
        return -1;
    }
    *out = malloc((size_t)n ? (size_t)n : 1);
    if (*out == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(*out, p, (size_t)n);
    *out_len = (size_t)n;
    return 0;
}

/* _dump_answer(request: int, line: bytes) -> bool: hand the server the answer to
 * that request (one JSON line); False when it is no longer waiting for it. */
static PyObject *
dump_answer(PyObject *module, PyObject *args)
{
    (void)module;
    unsigned long long req;
    PyObject *line;
    if (!PyArg_ParseTuple(args, "KO!:_dump_answer", &req, &PyBytes_Type, &line))
        return NULL;
    char *copy;
    size_t n;
    if (copy_line(line, "_dump_answer", &copy, &n) < 0)
        return NULL;
    pthread_mutex_lock(&mu);
    int taken = req != 0 && pending == req && answer == NULL;
    if (taken) {
        answer = copy;
        answer_len = n;
        pthread_cond_broadcast(&answered);
    }
    pthread_mutex_unlock(&mu);
    if (!taken)
        free(copy);
    return PyBool_FromLong(taken);
}

/* _dump_names(line: bytes) -> None: the thread-names line the server sends
 * before it asks the on-demand thread (kept until replaced). */
static PyObject *
dump_names(PyObject *module, PyObject *line)
{
    (void)module;
    if (!PyBytes_Check(line)) {
        PyErr_Format(PyExc_TypeError, "_dump_names: bytes needed, not %.100s",
                     Py_TYPE(line)->tp_name);
        return NULL;
    }
    char *copy;
    size_t n;
    if (copy_line(line, "_dump_names", &copy, &n) < 0)
        return NULL;
    pthread_mutex_lock(&mu);
    free(names);
    names = copy;
    names_len = n;
    pthread_mutex_unlock(&mu);
    Py_RETURN_NONE;
}

/* _dump_walk() -> bytes: the walk's JSON line, made on the calling thread with
 * the GIL released (as the server makes it), with the tables of _dump_tables. */
static PyObject *
dump_walk(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    GpDumpOut out = {NULL, 0, 0, 0};
    GpDumpTables t;
    pthread_mutex_lock(&mu);
    t = tables;
    pthread_mutex_unlock(&mu);
    GpStatus st;
    Py_BEGIN_ALLOW_THREADS
    st = gp_dump_walk_threads(&t, 0, &out);
    Py_END_ALLOW_THREADS
    if (st != GP_OK) {
        gp_dump_out_free(&out);
        return PyErr_NoMemory();
    }
    PyObject *r = PyBytes_FromStringAndSize(out.p, (Py_ssize_t)out.n);
    gp_dump_out_free(&out);
    return r;
}

PyMethodDef gp_dump_methods[] = {
    {"_dump_tables", dump_tables, METH_VARARGS,
     "_dump_tables(deopt, caches, ops): this interpreter's bytecode tables for the dump."},
    {"_dump_start", dump_start, METH_VARARGS,
     "_dump_start(path, wake_fd): start the dump server on a Unix socket at path."},
    {"_dump_stop", dump_stop, METH_NOARGS, "Stop the dump server and remove its socket."},
    {"_dump_pending", dump_pending, METH_NOARGS,
     "The dump request waiting for the on-demand thread's answer, or 0."},
    {"_dump_answer", dump_answer, METH_VARARGS,
     "_dump_answer(request, line) -> bool: answer a pending dump request."},
    {"_dump_names", dump_names, METH_O, "_dump_names(line): the cached thread-names line."},
    {"_dump_walk", dump_walk, METH_NOARGS,
     "The walk of every thread's stack as one JSON line (bytes), made here."},
    {NULL, NULL, 0, NULL},
};
