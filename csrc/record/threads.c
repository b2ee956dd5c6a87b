/* Thread names kept past a thread's end (python/gpuprof/_threads.py).
 *
 * A thread's name is readable only while it runs, and the threads of a
 * `with ThreadPoolExecutor()` block have ended before a trace is written. Every
 * thread threading starts runs Thread._delete last (the finally of
 * Thread._bootstrap_inner, 3.10 to 3.13); while a profile runs, _delete is an
 * instance of this type, which keeps the name and calls the original.
 *
 * It is C, and not a builtin function, so that no profile hook sees a call of it:
 * sys.setprofile reports C calls of builtin functions and method descriptors
 * only, and gpuprof's sys.monitoring CALL handler records C functions only. A
 * Python wrapper would be a frame of gpuprof's own, hidden, whose time would
 * belong to no op when it is the outermost frame a thread records (a thread
 * started inside the window enters _bootstrap_inner before the hook is on). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "threads.h"

#include <stddef.h>

#if PY_VERSION_HEX < 0x030C0000 /* 3.10, 3.11: the member flags' older names */
#include <structmember.h>
#define Py_T_PYSSIZET T_PYSSIZET
#define Py_READONLY READONLY
#endif

typedef struct {
    PyObject_HEAD
    PyObject *original;    /* threading.Thread._delete before ours; GIL */
    PyObject *names;       /* the session's dict: OS thread id -> name; GIL */
    PyObject *attr_tid;    /* "_native_id", "_name": interned once, not per thread end */
    PyObject *attr_name;
    vectorcallfunc vectorcall; /* thread_end_vectorcall: no argument tuple per call */
} GpThreadEndObject;

static PyObject *thread_end_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf,
                                       PyObject *kwnames);

static PyObject *
thread_end_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *original, *names;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError, "_ThreadEnd() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO!:_ThreadEnd", &original, &PyDict_Type, &names))
        return NULL;
    if (!PyCallable_Check(original)) {
        PyErr_Format(PyExc_TypeError, "_ThreadEnd(): original must be callable, got %R", original);
        return NULL;
    }
    GpThreadEndObject *self = (GpThreadEndObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->original = Py_NewRef(original);
    self->names = Py_NewRef(names);
    self->attr_tid = PyUnicode_InternFromString("_native_id");
    self->attr_name = PyUnicode_InternFromString("_name");
    self->vectorcall = thread_end_vectorcall;
    if (self->attr_tid == NULL || self->attr_name == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* Store thread._name under thread._native_id, the OS thread id that the trace's
 * rows carry: threading's idents (pthread_self()) are given to the next thread as
 * soon as one ends, so threads started one after the other share one. Plain
 * instance attributes: reading them runs no Python code, so nothing here is
 * recorded. A thread without them (a subclass that skipped Thread.__init__, a
 * platform without native ids) keeps no name; any error is dropped, since the
 * thread must end as it would have. */
static void
keep_name(GpThreadEndObject *self, PyObject *thread)
{
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    PyObject *tid = PyObject_GetAttr(thread, self->attr_tid); /* new reference */
    PyObject *name = tid != NULL ? PyObject_GetAttr(thread, self->attr_name) : NULL;
    if (name != NULL && PyLong_Check(tid) && PyUnicode_Check(name))
        (void)PyDict_SetItem(self->names, tid, name);
    Py_XDECREF(name);
    Py_XDECREF(tid);
    PyErr_Clear();
    PyErr_Restore(exc_type, exc_value, exc_tb);
}

static PyObject *
thread_end_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    GpThreadEndObject *self = (GpThreadEndObject *)op;
    if (PyVectorcall_NARGS(nargsf) >= 1)
        keep_name(self, args[0]); /* borrowed from the caller */
    return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
}

/* Looked up on a thread, bind to it as a method does (thread._delete()). */
static PyObject *
thread_end_get(PyObject *op, PyObject *obj, PyObject *type)
{
    (void)type;
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(op);
    return PyMethod_New(op, obj);
}

static int
thread_end_traverse(PyObject *op, visitproc visit, void *arg)
{
    GpThreadEndObject *self = (GpThreadEndObject *)op;
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(self->original);
    Py_VISIT(self->names);
    return 0;
}

static int
thread_end_clear(PyObject *op)
{
    GpThreadEndObject *self = (GpThreadEndObject *)op;
    Py_CLEAR(self->original);
    Py_CLEAR(self->names);
    Py_CLEAR(self->attr_tid);
    Py_CLEAR(self->attr_name);
    return 0;
}

static void
thread_end_dealloc(PyObject *op)
{
    PyTypeObject *tp = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    (void)thread_end_clear(op);
    tp->tp_free(op);
    Py_DECREF(tp);
}

static PyMemberDef thread_end_members[] = {
    {"__vectorcalloffset__", Py_T_PYSSIZET, offsetof(GpThreadEndObject, vectorcall), Py_READONLY,
     NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot thread_end_slots[] = {
    {Py_tp_doc, "_ThreadEnd(original, names): threading.Thread._delete while profiling; "
                "keeps the ending thread's name in names, then calls original."},
    {Py_tp_new, thread_end_new},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_members, thread_end_members},
    {Py_tp_descr_get, thread_end_get},
    {Py_tp_traverse, thread_end_traverse},
    {Py_tp_clear, thread_end_clear},
    {Py_tp_dealloc, thread_end_dealloc},
    {0, NULL},
};

PyType_Spec gp_threads_end_spec = {
    .name = "gpuprof._gpuprof._ThreadEnd",
    .basicsize = sizeof(GpThreadEndObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = thread_end_slots,
};
