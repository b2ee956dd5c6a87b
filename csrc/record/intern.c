/* Op interning: the table, its miss paths and op descriptions. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "intern.h"

#include "compat.h"

#if PY_VERSION_HEX >= 0x030B0000
#include <opcode.h> /* RESUME, for first_entry_lasti */
#endif
#include <stdlib.h>
#include <string.h>

GpIntern gp_intern;

#define INITIAL_SLOTS 4096u
#define INITIAL_OPS 1024u

int
gp_intern_init(void)
{
    /* Set once at import; they survive sessions. */
    PyObject *prefix = gp_intern.hidden_prefix, *shown = gp_intern.shown_prefix;
    PyObject *roots = gp_intern.library_roots;
    gp_intern_clear();
    memset(&gp_intern, 0, sizeof(gp_intern));
    gp_intern.hidden_prefix = prefix;
    gp_intern.shown_prefix = shown;
    gp_intern.library_roots = roots;
    gp_intern.slots = calloc(INITIAL_SLOTS, sizeof(GpInternSlot));
    gp_intern.mask = INITIAL_SLOTS - 1;
    gp_intern.cap_ops = INITIAL_OPS;
    gp_intern.kinds = calloc(INITIAL_OPS, 1);
    gp_intern.flags = calloc(INITIAL_OPS, 1);
    gp_intern.gen_lasti = calloc(INITIAL_OPS, sizeof(int32_t));
    gp_intern.refs = calloc(INITIAL_OPS, sizeof(PyObject *));
    gp_intern.methods = calloc(INITIAL_OPS, sizeof(PyMethodDef *));
    gp_intern.names = calloc(INITIAL_OPS, sizeof(PyObject *));
    gp_intern.labels = PyDict_New();
    if (!gp_intern.slots || !gp_intern.kinds || !gp_intern.flags || !gp_intern.gen_lasti ||
        !gp_intern.refs || !gp_intern.methods || !gp_intern.names || !gp_intern.labels) {
        gp_intern_clear();
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    gp_intern.n_ops = GP_OPID_FIRST;
    gp_intern.kinds[GP_OPID_STEP] = GP_OP_STEP;
    return 0;
}

void
gp_intern_clear(void)
{
    if (gp_intern.refs) {
        for (uint32_t i = 0; i < gp_intern.n_ops; i++)
            Py_XDECREF(gp_intern.refs[i]);
    }
    if (gp_intern.names) {
        for (uint32_t i = 0; i < gp_intern.n_ops; i++)
            Py_XDECREF(gp_intern.names[i]);
    }
    free(gp_intern.names);
    Py_XDECREF(gp_intern.binding_index);
    free(gp_intern.slots);
    free(gp_intern.kinds);
    free(gp_intern.flags);
    free(gp_intern.gen_lasti);
    free(gp_intern.refs);
    free((void *)gp_intern.methods);
    Py_XDECREF(gp_intern.labels);
    PyObject *prefix = gp_intern.hidden_prefix, *shown = gp_intern.shown_prefix;
    PyObject *roots = gp_intern.library_roots;
    memset(&gp_intern, 0, sizeof(gp_intern));
    /* The prefixes and roots outlive sessions: they are set once at import. */
    gp_intern.hidden_prefix = prefix;
    gp_intern.shown_prefix = shown;
    gp_intern.library_roots = roots;
}

static int
grow_slots(void)
{
    uint32_t cap = (gp_intern.mask + 1) * 2;
    GpInternSlot *slots = calloc(cap, sizeof(GpInternSlot));
    if (slots == NULL)
        return -1;
    for (uint32_t i = 0; i <= gp_intern.mask; i++) {
        GpInternSlot *s = &gp_intern.slots[i];
        if (s->op == 0)
            continue;
        uint32_t j = intern_hash(s->a, s->b) & (cap - 1);
        while (slots[j].op)
            j = (j + 1) & (cap - 1);
        slots[j] = *s;
    }
    free(gp_intern.slots);
    gp_intern.slots = slots;
    gp_intern.mask = cap - 1;
    return 0;
}

#define GROW(field, type)                                                                          \
    do {                                                                                           \
        type *p = realloc((void *)gp_intern.field, (size_t)cap * sizeof(type));                    \
        if (p == NULL)                                                                             \
            return -1;                                                                             \
        memset((void *)(p + gp_intern.cap_ops), 0,                                                 \
               (size_t)(cap - gp_intern.cap_ops) * sizeof(type));                                  \
        gp_intern.field = p;                                                                       \
    } while (0)

static int
grow_ops(void)
{
    uint32_t cap = gp_intern.cap_ops * 2;
    GROW(kinds, uint8_t);
    GROW(flags, uint8_t);
    GROW(gen_lasti, int32_t);
    GROW(refs, PyObject *);
    GROW(methods, const PyMethodDef *);
    GROW(names, PyObject *);
    gp_intern.cap_ops = cap;
    return 0;
}

/* Add an op; `ref` is stolen. Returns the id or 0 when out of memory (ref released). */
static uint32_t
add_op(const void *a, const void *b, uint8_t kind, uint8_t flags, PyObject *ref,
       const PyMethodDef *ml)
{
    if (gp_intern.slots == NULL)
        goto fail;
    /* Growth runs once per doubling of distinct ops: first sight only. */
    if ((gp_intern.used + 1) * 2 > gp_intern.mask + 1 && grow_slots() < 0)
        goto fail;
    if (gp_intern.n_ops == gp_intern.cap_ops && grow_ops() < 0)
        goto fail;
    uint32_t op = gp_intern.n_ops++;
    gp_intern.kinds[op] = kind;
    gp_intern.flags[op] = flags;
    gp_intern.gen_lasti[op] = INT32_MAX;
    gp_intern.refs[op] = ref;
    gp_intern.methods[op] = ml;
    if (a != NULL) {
        uint32_t i = intern_hash(a, b) & gp_intern.mask;
        while (gp_intern.slots[i].op)
            i = (i + 1) & gp_intern.mask;
        gp_intern.slots[i].a = a;
        gp_intern.slots[i].b = b;
        gp_intern.slots[i].op = op;
        gp_intern.used++;
    }
    return op;
fail:
    Py_XDECREF(ref);
    return 0;
}

/* Whether str `s` starts with `prefix`, a str or a tuple of str (any of them). */
static int
starts_with(PyObject *s, PyObject *prefix)
{
    if (prefix == NULL || !PyUnicode_Check(s))
        return 0;
    if (PyTuple_Check(prefix)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prefix); i++)
            if (starts_with(s, PyTuple_GET_ITEM(prefix, i))) /* borrowed from the tuple */
                return 1;
        return 0;
    }
    Py_ssize_t r = PyUnicode_Tailmatch(s, prefix, 0, PyUnicode_GetLength(prefix), -1);
    if (r < 0) {
        PyErr_Clear();
        return 0;
    }
    return (int)r;
}

int
gp_intern_is_library(PyObject *filename)
{
    const char *f = PyUnicode_Check(filename) ? PyUnicode_AsUTF8(filename) : NULL;
    if (f == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (strncmp(f, "<frozen", 7) == 0)
        return 1;
    if (f[0] != '/')
        return 0; /* "<string>", "<ipython-input-...>", a relative path: the user's */
    if (strstr(f, "/site-packages/") != NULL || strstr(f, "/dist-packages/") != NULL)
        return 1;
    return starts_with(filename, gp_intern.library_roots);
}

int
gp_intern_set_library_roots(PyObject *roots)
{
    int ok = PyTuple_Check(roots);
    for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(roots); i++)
        ok = PyUnicode_Check(PyTuple_GET_ITEM(roots, i)); /* borrowed from the tuple */
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, "the library roots must be a tuple of str");
        return -1;
    }
    Py_XSETREF(gp_intern.library_roots, Py_NewRef(roots));
    return 0;
}

static int
is_hidden_code(PyCodeObject *code)
{
    PyObject *filename = code->co_filename; /* borrowed from the code object */
    return starts_with(filename, gp_intern.hidden_prefix) &&
           !starts_with(filename, gp_intern.shown_prefix);
}

/* Largest f_lasti at which a frame of generator code `code` is entered for
 * the first time. Up to 3.10 a fresh frame has f_lasti -1. From 3.11 the
 * prologue (MAKE_CELL/COPY_FREE_VARS, RETURN_GENERATOR, POP_TOP) ends in a
 * RESUME: a normal start enters at that RESUME, a close() or throw() before
 * the start at offset 0 (3.11), and each resume after a yield or await at a
 * later RESUME. (Learning the offset from the entries seen failed both ways:
 * closing an unstarted generator made every later start look like a resume,
 * and a generator started before the window made its resumes look like
 * calls.) First sight of a code object only. */
static int32_t
first_entry_lasti(PyCodeObject *code)
{
#if PY_VERSION_HEX >= 0x030B0000
    PyObject *bytecode = PyCode_GetCode(code); /* new reference */
    if (bytecode == NULL) {
        PyErr_Clear();
        return INT32_MAX; /* unknown: every entry counts as a call, as in cProfile */
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(bytecode);
    Py_ssize_t n = PyBytes_GET_SIZE(bytecode);
    int32_t at = INT32_MAX;
    for (Py_ssize_t i = 0; i + 1 < n; i += 2) { /* 2-byte code units: opcode, arg */
        if (b[i] == RESUME) {
            at = (int32_t)i;
            break;
        }
    }
    Py_DECREF(bytecode);
    return at;
#else
    (void)code;
    return -1;
#endif
}

uint32_t
gp_intern_code_slow(PyCodeObject *code)
{
    /* A generator resumed by throw() enters the hook with an exception set:
     * keep it untouched around the Python calls below. */
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    uint8_t flags = 0;
    if (code->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR))
        flags |= GP_OPF_GENERATOR;
    if (is_hidden_code(code))
        flags |= GP_OPF_HIDDEN | GP_OPF_LIBRARY;
    else if (gp_intern_is_library(code->co_filename))
        flags |= GP_OPF_LIBRARY;
    uint32_t op = add_op(code, NULL, GP_OP_PYTHON, flags, Py_NewRef((PyObject *)code), NULL);
    if (op != 0 && (flags & GP_OPF_GENERATOR))
        gp_intern.gen_lasti[op] = first_entry_lasti(code);
    PyErr_Restore(exc_type, exc_value, exc_tb);
    return op;
}

static int
is_hidden_owner(PyObject *owner)
{
    const char *name = NULL;
    if (PyModule_Check(owner)) {
        name = PyModule_GetName(owner);
        if (name == NULL) {
            PyErr_Clear();
            return 0;
        }
    } else if (PyType_Check(owner)) {
        name = ((PyTypeObject *)owner)->tp_name;
    } else if (PyUnicode_Check(owner)) {
        name = PyUnicode_AsUTF8(owner);
        if (name == NULL)
            PyErr_Clear();
    }
    return name != NULL && strncmp(name, "gpuprof.", 8) == 0;
}

/* C functions that block their thread until something else happens: time spent in
 * them is waiting, not computing (GP_OPF_WAIT; the tables leave it out unless asked,
 * as py-spy does without --idle). Each is named by the module or the type that
 * defines it, as CPython spells it, and its method name. Python functions that wait
 * (Condition.wait, Event.wait, Thread.join, queue.Queue.get) do it in one of these. */
static const struct {
    const char *owner;
    const char *name;
} wait_calls[] = {
    {"time", "sleep"},
    {"_thread.lock", "acquire"},
    {"_thread.lock", "acquire_lock"},
    {"_thread.lock", "__enter__"},
    {"_thread.RLock", "acquire"},
    {"_thread.RLock", "__enter__"},
    {"_thread._ThreadHandle", "join"}, /* Thread.join on 3.13+ */
    {"_queue.SimpleQueue", "get"},
    {"_multiprocessing.SemLock", "acquire"},
    {"_multiprocessing.SemLock", "__enter__"},
    {"select", "select"},
    {"select.poll", "poll"},
    {"select.epoll", "poll"},
    {"select.devpoll", "poll"},
    {"select.kqueue", "control"},
    {"_socket.socket", "recv"},
    {"_socket.socket", "recv_into"},
    {"_socket.socket", "recvfrom"},
    {"_socket.socket", "recvfrom_into"},
    {"_socket.socket", "recvmsg"},
    {"_socket.socket", "recvmsg_into"},
    {"_socket.socket", "_accept"},
    {"posix", "read"}, /* os.read: the pipes of multiprocessing and subprocess */
    {"posix", "waitpid"},
    {"posix", "wait"},
    {"posix", "wait3"},
    {"posix", "wait4"},
    {"posix", "waitid"},
    {"signal", "pause"},
    {"signal", "sigwait"},
    {"signal", "sigwaitinfo"},
    {"signal", "sigtimedwait"},
};

static int
has_method(const PyTypeObject *t, const PyMethodDef *ml)
{
    for (const PyMethodDef *m = t->tp_methods; m != NULL && m->ml_name != NULL; m++) {
        if (m == ml)
            return 1;
    }
    return 0;
}

/* The type on `owner`'s MRO whose method table holds `ml` (a method called on an
 * instance of a subclass, such as socket.socket's recv), or NULL. Reads the types'
 * static fields only: no Python code runs. */
static const PyTypeObject *
defining_type(const PyTypeObject *owner, const PyMethodDef *ml)
{
    if (has_method(owner, ml))
        return owner;
    PyObject *mro = owner->tp_mro; /* borrowed; NULL before PyType_Ready */
    if (mro == NULL || !PyTuple_Check(mro))
        return NULL;
    for (Py_ssize_t i = 1; i < PyTuple_GET_SIZE(mro); i++) {
        const PyTypeObject *t = (const PyTypeObject *)PyTuple_GET_ITEM(mro, i); /* borrowed */
        if (has_method(t, ml))
            return t;
    }
    return NULL;
}

/* Whether C function `ml` of `owner` (see cfunc_key in hook.c) is one of wait_calls.
 * Runs once per distinct C function, when it is first interned. */
static int
is_wait_call(const PyMethodDef *ml, PyObject *owner)
{
    const char *owner_name = NULL;
    int candidate = 0;
    for (size_t i = 0; i < sizeof(wait_calls) / sizeof(wait_calls[0]) && !candidate; i++)
        candidate = strcmp(ml->ml_name, wait_calls[i].name) == 0;
    if (!candidate || owner == NULL)
        return 0;
    if (PyModule_Check(owner)) {
        owner_name = PyModule_GetName(owner);
        if (owner_name == NULL)
            PyErr_Clear();
    } else if (PyType_Check(owner)) {
        const PyTypeObject *t = defining_type((const PyTypeObject *)owner, ml);
        owner_name = t != NULL ? t->tp_name : NULL;
    }
    if (owner_name == NULL)
        return 0;
    for (size_t i = 0; i < sizeof(wait_calls) / sizeof(wait_calls[0]); i++) {
        if (strcmp(ml->ml_name, wait_calls[i].name) == 0 &&
            strcmp(owner_name, wait_calls[i].owner) == 0)
            return 1;
    }
    return 0;
}

uint32_t
gp_intern_cfunc_slow(const PyMethodDef *ml, PyObject *owner)
{
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    uint8_t flags = owner != NULL && is_hidden_owner(owner) ? GP_OPF_HIDDEN : 0;
    if (is_wait_call(ml, owner))
        flags |= GP_OPF_WAIT;
    uint32_t op = add_op(ml, owner, GP_OP_CFUNC, flags, Py_XNewRef(owner), ml);
    PyErr_Restore(exc_type, exc_value, exc_tb);
    return op;
}

uint32_t
gp_intern_label(PyObject *label)
{
    PyObject *found = NULL;
    if (PyDict_GetItemRef(gp_intern.labels, label, &found) < 0)
        return 0;
    if (found) {
        uint32_t op = (uint32_t)PyLong_AsUnsignedLong(found);
        Py_DECREF(found);
        return op;
    }
    uint32_t op = add_op(NULL, NULL, GP_OP_USER, 0, Py_NewRef(label), NULL);
    if (op == 0) {
        PyErr_NoMemory();
        return 0;
    }
    PyObject *id = PyLong_FromUnsignedLong(op);
    if (id == NULL || PyDict_SetItem(gp_intern.labels, label, id) < 0) {
        Py_XDECREF(id);
        return 0;
    }
    Py_DECREF(id);
    return op;
}

int
gp_intern_set_hidden_prefix(PyObject *prefix, PyObject *shown)
{
    int ok = PyUnicode_Check(prefix) || PyTuple_Check(prefix);
    for (Py_ssize_t i = 0; ok && PyTuple_Check(prefix) && i < PyTuple_GET_SIZE(prefix); i++)
        ok = PyUnicode_Check(PyTuple_GET_ITEM(prefix, i)); /* borrowed from the tuple */
    if (!ok || (shown != NULL && !PyUnicode_Check(shown))) {
        PyErr_SetString(PyExc_TypeError,
                        "the hidden prefix must be a str or a tuple of str, the shown one a str");
        return -1;
    }
    Py_XSETREF(gp_intern.hidden_prefix, Py_NewRef(prefix));
    Py_XSETREF(gp_intern.shown_prefix, Py_XNewRef(shown));
    return 0;
}

/* ---- names of C functions ------------------------------------------------------
 *
 * A C function is named as its user writes it: `torch.relu` rather than the
 * class torch binds it to, `numpy.array` rather than the extension module that
 * defines it, `torch.Tensor.add_`, `dict.fromkeys`, `len`. The rules:
 * a function whose __module__ names a loaded module that exports it under its
 * own name is "module.name" (torch sets __module__ = "torch" on its
 * _VariableFunctions static methods, NumPy sets "numpy" on its C functions);
 * any other module function is "defining_module.name"; a method (of an
 * instance, a class or static method, a method descriptor) is "Type.name",
 * with Type spelled from the shortest package that exports the class
 * (torch.Tensor, torch.nn.Parameter, numpy.ndarray; bare for builtins); a
 * binding library's function (pybind11) is found in its __module__: a free
 * function there, or a method of a class there.
 *
 * Names are made once per op, when results are first built (gp_intern_describe,
 * never on the hot path), from the objects the intern table holds. Only
 * dictionaries are read to find functions (no getattr on modules, which could
 * run a module __getattr__ that imports), and only modules already imported
 * are consulted. The profiler is not recording then (the phase is WAIT). */

/* New reference to dict[key] (key a C string), or NULL; never an exception. */
static PyObject *
dict_item(PyObject *dict, const char *key)
{
    if (dict == NULL || !PyDict_Check(dict))
        return NULL;
    PyObject *k = PyUnicode_FromString(key);
    PyObject *v = NULL;
    if (k == NULL || PyDict_GetItemRef(dict, k, &v) < 0) {
        PyErr_Clear();
        v = NULL;
    }
    Py_XDECREF(k);
    return v;
}

/* New reference to the already imported module `name` (str), or NULL. */
static PyObject *
loaded_module(PyObject *name)
{
    if (name == NULL || !PyUnicode_Check(name))
        return NULL;
    PyObject *m = PyImport_GetModule(name);
    if (m == NULL)
        PyErr_Clear();
    return m;
}

/* New reference to attribute `key` of loaded module `modname`, read from the
 * module's dict, or NULL. */
static PyObject *
module_item(PyObject *modname, const char *key)
{
    PyObject *m = loaded_module(modname);
    if (m == NULL)
        return NULL;
    PyObject *v = PyModule_Check(m) ? dict_item(PyModule_GetDict(m) /* borrowed */, key) : NULL;
    Py_DECREF(m);
    return v;
}

/* The C function inside a class-dict entry: itself, or what a staticmethod,
 * an instancemethod (pybind11 methods) or a method/classmethod descriptor
 * wraps. Returns the PyMethodDef, or NULL when `v` wraps no C function.
 * When `fn` is given it receives a new reference to the PyCFunction object,
 * or NULL (descriptors have none). */
static const PyMethodDef *
entry_method(PyObject *v, PyObject **fn)
{
    PyObject *f = NULL;
    const PyMethodDef *ml = NULL;
    if (fn)
        *fn = NULL;
    if (v == NULL)
        return NULL;
    if (Py_IS_TYPE(v, &PyMethodDescr_Type) || Py_IS_TYPE(v, &PyClassMethodDescr_Type))
        return ((PyMethodDescrObject *)v)->d_method;
    if (PyInstanceMethod_Check(v)) {
        f = Py_NewRef(PyInstanceMethod_GET_FUNCTION(v)); /* borrowed from v */
    } else if (Py_IS_TYPE(v, &PyStaticMethod_Type)) {
        f = PyObject_GetAttrString(v, "__func__"); /* a member of staticmethod: no user code */
        if (f == NULL)
            PyErr_Clear();
    } else if (PyCFunction_Check(v)) {
        f = Py_NewRef(v);
    }
    if (f != NULL && PyCFunction_Check(f))
        ml = ((PyCFunctionObject *)f)->m_ml;
    if (ml != NULL && fn != NULL)
        *fn = f;
    else
        Py_XDECREF(f);
    return ml;
}

/* "module.name" when C function `fn` says (by its __module__) it belongs to a
 * loaded module that holds it under its own name; bare "name" for builtins.
 * New reference, or NULL (no exception) when it does not. */
static PyObject *
exported_name(PyObject *fn, const PyMethodDef *ml)
{
    if (fn == NULL || !PyCFunction_Check(fn))
        return NULL;
    PyObject *mod = ((PyCFunctionObject *)fn)->m_module; /* borrowed from fn */
    if (mod == NULL || !PyUnicode_Check(mod))
        return NULL;
    PyObject *there = module_item(mod, ml->ml_name);
    const PyMethodDef *found = entry_method(there, NULL);
    Py_XDECREF(there);
    if (found != ml)
        return NULL;
    if (PyUnicode_CompareWithASCIIString(mod, "builtins") == 0)
        return PyUnicode_FromString(ml->ml_name);
    return PyUnicode_FromFormat("%U.%s", mod, ml->ml_name);
}

/* The class as its user spells it: "list" for builtins, else the shortest
 * package prefix of its __module__ that exports it under its __qualname__
 * ("torch.Tensor", "torch.nn.Parameter", "numpy.ndarray"), else
 * "__module__.__qualname__". New reference, or NULL with an exception. */
static PyObject *
type_display(PyTypeObject *tp)
{
    PyObject *qual = PyObject_GetAttrString((PyObject *)tp, "__qualname__");
    PyObject *mod = NULL, *out = NULL;
    if (qual == NULL || !PyUnicode_Check(qual)) {
        PyErr_Clear();
        Py_XDECREF(qual);
        qual = PyUnicode_FromString(tp->tp_name);
        if (qual == NULL)
            return NULL;
    }
    mod = PyObject_GetAttrString((PyObject *)tp, "__module__");
    if (mod == NULL)
        PyErr_Clear();
    if (mod == NULL || !PyUnicode_Check(mod) ||
        PyUnicode_CompareWithASCIIString(mod, "builtins") == 0) {
        out = Py_NewRef(qual);
        goto done;
    }
    const char *q = PyUnicode_AsUTF8(qual);
    const char *m = PyUnicode_AsUTF8(mod);
    if (q == NULL || m == NULL) {
        PyErr_Clear();
    } else if (strchr(q, '.') == NULL) {
        /* Each prefix "a", "a.b", ... of the module, shortest first. */
        size_t len = strlen(m);
        for (size_t end = 1; end <= len && out == NULL; end++) {
            if (end < len && m[end] != '.')
                continue;
            PyObject *prefix = PyUnicode_FromStringAndSize(m, (Py_ssize_t)end);
            if (prefix == NULL)
                goto done;
            PyObject *there = module_item(prefix, q);
            if (there == (PyObject *)tp)
                out = PyUnicode_FromFormat("%U.%U", prefix, qual);
            Py_XDECREF(there);
            Py_DECREF(prefix);
        }
        if (out != NULL || PyErr_Occurred())
            goto done;
    }
    out = PyUnicode_FromFormat("%U.%U", mod, qual);
done:
    Py_XDECREF(qual);
    Py_XDECREF(mod);
    return out;
}

/* Index of binding module `modname`: {PyMethodDef address: name} for its free
 * functions and the methods of its classes. Built once per module and
 * session; borrowed reference (held by gp_intern.binding_index), or NULL
 * with an exception. */
static PyObject *
binding_index(PyObject *modname)
{
    if (gp_intern.binding_index == NULL && (gp_intern.binding_index = PyDict_New()) == NULL)
        return NULL;
    PyObject *index = NULL;
    if (PyDict_GetItemRef(gp_intern.binding_index, modname, &index) < 0)
        return NULL;
    if (index != NULL) {
        Py_DECREF(index); /* the cache holds it */
        return index;
    }
    if ((index = PyDict_New()) == NULL)
        return NULL;
    PyObject *m = loaded_module(modname);
    PyObject *mdict = m != NULL && PyModule_Check(m) ? PyModule_GetDict(m) : NULL; /* borrowed */
    Py_ssize_t pos = 0;
    PyObject *key, *value; /* borrowed from mdict */
    while (mdict != NULL && PyDict_Next(mdict, &pos, &key, &value)) {
        PyObject *name = NULL, *addr = NULL;
        const PyMethodDef *ml = entry_method(value, NULL);
        if (ml != NULL && PyUnicode_Check(key)) {
            name = PyUnicode_FromFormat("%U.%U", modname, key);
            addr = PyLong_FromVoidPtr((void *)ml);
            if (name == NULL || addr == NULL || PyDict_SetItem(index, addr, name) < 0)
                goto fail_entry;
        } else if (PyType_Check(value)) {
            PyObject *tdict = ((PyTypeObject *)value)->tp_dict; /* borrowed; heap types own one */
            Py_ssize_t tpos = 0;
            PyObject *tkey, *tvalue; /* borrowed from tdict */
            while (tdict != NULL && PyDict_Next(tdict, &tpos, &tkey, &tvalue)) {
                const PyMethodDef *tml = entry_method(tvalue, NULL);
                if (tml == NULL || !PyUnicode_Check(tkey))
                    continue;
                addr = PyLong_FromVoidPtr((void *)tml);
                if (addr == NULL)
                    goto fail_entry;
                int has = PyDict_Contains(index, addr);
                if (has == 0) { /* the first class holding it: the defining one, usually */
                    if (name == NULL && (name = type_display((PyTypeObject *)value)) == NULL)
                        goto fail_entry;
                    PyObject *full = PyUnicode_FromFormat("%U.%U", name, tkey);
                    has = full == NULL ? -1 : PyDict_SetItem(index, addr, full);
                    Py_XDECREF(full);
                }
                Py_CLEAR(addr);
                if (has < 0)
                    goto fail_entry;
            }
        }
        Py_XDECREF(name);
        Py_XDECREF(addr);
        continue;
    fail_entry:
        Py_XDECREF(name);
        Py_XDECREF(addr);
        Py_XDECREF(m);
        Py_DECREF(index);
        return NULL;
    }
    Py_XDECREF(m);
    int rc = PyDict_SetItem(gp_intern.binding_index, modname, index);
    Py_DECREF(index); /* the cache holds it, or the set failed */
    return rc < 0 ? NULL : index;
}

/* The name of C function `ml` owned by `owner` (see cfunc_key in hook.c: a
 * module, a class for class and static methods, the type of self for
 * methods, or the __module__ string of a binding library's function).
 * New reference, or NULL with an exception. */
static PyObject *
cfunc_name(const PyMethodDef *ml, PyObject *owner)
{
    if (owner == NULL)
        return PyUnicode_FromString(ml->ml_name);
    if (PyModule_Check(owner)) {
        PyObject *fn = NULL, *out = NULL;
        PyObject *v = dict_item(PyModule_GetDict(owner) /* borrowed */, ml->ml_name);
        if (entry_method(v, &fn) == ml)
            out = exported_name(fn, ml);
        Py_XDECREF(v);
        Py_XDECREF(fn);
        if (out != NULL || PyErr_Occurred())
            return out;
        const char *mod = PyModule_GetName(owner);
        if (mod == NULL) {
            PyErr_Clear();
            return PyUnicode_FromString(ml->ml_name);
        }
        if (strcmp(mod, "builtins") == 0)
            return PyUnicode_FromString(ml->ml_name);
        return PyUnicode_FromFormat("%s.%s", mod, ml->ml_name);
    }
    if (PyType_Check(owner)) {
        /* A static method re-exported by a module (torch.relu is a static
         * method of torch._C._VariableFunctionsClass whose __module__ is
         * "torch"). Static types of 3.12+ keep their dict per interpreter:
         * PyType_GetDict; earlier, tp_dict. */
#if PY_VERSION_HEX >= 0x030C0000
        PyObject *tdict = PyType_GetDict((PyTypeObject *)owner); /* new reference */
#else
        PyObject *tdict = Py_XNewRef(((PyTypeObject *)owner)->tp_dict);
#endif
        PyObject *fn = NULL, *out = NULL;
        PyObject *v = dict_item(tdict, ml->ml_name);
        Py_XDECREF(tdict);
        if (entry_method(v, &fn) == ml)
            out = exported_name(fn, ml);
        Py_XDECREF(v);
        Py_XDECREF(fn);
        if (out != NULL || PyErr_Occurred())
            return out;
        PyObject *tname = type_display((PyTypeObject *)owner);
        if (tname == NULL)
            return NULL;
        out = PyUnicode_FromFormat("%U.%s", tname, ml->ml_name);
        Py_DECREF(tname);
        return out;
    }
    if (PyUnicode_Check(owner)) {
        PyObject *index = binding_index(owner); /* borrowed */
        if (index == NULL)
            return NULL;
        PyObject *addr = PyLong_FromVoidPtr((void *)ml), *found = NULL;
        if (addr == NULL || PyDict_GetItemRef(index, addr, &found) < 0) {
            Py_XDECREF(addr);
            return NULL;
        }
        Py_DECREF(addr);
        if (found != NULL)
            return found;
        return PyUnicode_FromFormat("%U.%s", owner, ml->ml_name);
    }
    return PyUnicode_FromString(ml->ml_name);
}

int
gp_intern_describe(uint32_t op, PyObject **name, PyObject **file, int *line)
{
    *name = *file = NULL;
    *line = 0;
    if (op >= gp_intern.n_ops) {
        PyErr_Format(PyExc_IndexError, "op id %u out of range", op);
        return -1;
    }
    PyObject *ref = gp_intern.refs[op];
    switch (gp_intern.kinds[op]) {
    case GP_OP_PYTHON: {
        PyCodeObject *code = (PyCodeObject *)ref;
#if PY_VERSION_HEX >= 0x030B0000
        *name = Py_NewRef(code->co_qualname);
#else
        *name = Py_NewRef(code->co_name);
#endif
        *file = Py_NewRef(code->co_filename);
        *line = code->co_firstlineno;
        break;
    }
    case GP_OP_CFUNC:
        if (gp_intern.names[op] == NULL)
            gp_intern.names[op] = cfunc_name(gp_intern.methods[op], ref);
        *name = Py_XNewRef(gp_intern.names[op]);
        *file = PyUnicode_FromString("");
        break;
    case GP_OP_USER:
        *name = Py_NewRef(ref);
        *file = PyUnicode_FromString("");
        break;
    case GP_OP_STEP:
        *name = PyUnicode_FromString("ProfilerStep*");
        *file = PyUnicode_FromString("");
        break;
    default:
        *name = PyUnicode_FromString("<unknown>");
        *file = PyUnicode_FromString("");
        break;
    }
    if (*name == NULL || *file == NULL) {
        Py_CLEAR(*name);
        Py_CLEAR(*file);
        return -1;
    }
    return 0;
}
