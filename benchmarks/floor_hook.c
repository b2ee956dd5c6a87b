/* The "floor" profile hook for benchmarks/bench_python_hook.py.
 *
 * The cheapest hook that still records something: per event, one
 * clock_gettime(CLOCK_MONOTONIC) and one 16-byte store into a preallocated
 * array. Installed with PyEval_SetProfile on the calling thread only. The
 * array is a power-of-two ring that is written through once at install (so
 * the timed run takes no page faults), and the index wraps, so the hook never
 * allocates, never branches on a full buffer and never calls Python.
 *
 * Built at benchmark time into a temporary directory; it is not part of the
 * gpuprof package.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    uint64_t ts;
    uint32_t what;
    uint32_t pad;
} FloorEvent; /* 16 bytes, like a gpuprof event */

static FloorEvent *events = NULL;
static uint64_t mask = 0;
static uint64_t count = 0;

static int
floor_callback(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg)
{
    (void)obj;
    (void)frame;
    (void)arg;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    FloorEvent *e = &events[count & mask];
    e->ts = (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
    e->what = (uint32_t)what;
    count++;
    return 0;
}

static PyObject *
floor_install(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t capacity = 1 << 20;
    if (!PyArg_ParseTuple(args, "|n", &capacity))
        return NULL;
    if (capacity < 1 || (capacity & (capacity - 1)) != 0) {
        PyErr_SetString(PyExc_ValueError, "install(): capacity must be a power of two");
        return NULL;
    }
    if (events == NULL || (uint64_t)capacity != mask + 1) {
        free(events);
        events = malloc((size_t)capacity * sizeof(FloorEvent));
        if (events == NULL)
            return PyErr_NoMemory();
        memset(events, 0, (size_t)capacity * sizeof(FloorEvent));
        mask = (uint64_t)capacity - 1;
    }
    count = 0;
    PyEval_SetProfile(floor_callback, NULL);
    Py_RETURN_NONE;
}

static PyObject *
floor_uninstall(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    PyEval_SetProfile(NULL, NULL);
    return PyLong_FromUnsignedLongLong(count);
}

static PyObject *
floor_count(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromUnsignedLongLong(count);
}

static PyMethodDef floor_methods[] = {
    {"install", floor_install, METH_VARARGS,
     "install(capacity=2**20): set the floor hook on this thread."},
    {"uninstall", floor_uninstall, METH_NOARGS, "Remove the hook; return the events seen."},
    {"count", floor_count, METH_NOARGS, "Events seen since install."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef floor_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "floor_hook",
    .m_doc = "A minimal profile hook: one clock read, one store.",
    .m_size = -1,
    .m_methods = floor_methods,
};

PyMODINIT_FUNC
PyInit_floor_hook(void)
{
    return PyModule_Create(&floor_module);
}
