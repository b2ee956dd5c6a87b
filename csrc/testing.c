/* _test_* entry points. They run the same C paths as a real session:
 * synthetic events go into real thread buffers, synthetic GPU records into
 * the real aggregation, and the result comes back through the same dict
 * builder the profiler uses. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "testing.h"

#include "gp_cuda.h"
#include "aggregate.h"
#include "buffer.h"
#include "intern.h"
#include "nvtx.h"
#include "profiler.h"
#include "schedule.h"
#include "window.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static PyObject *
test_schedule_transition(PyObject *module, PyObject *args)
{
    (void)module;
    int prev, cur;
    if (!PyArg_ParseTuple(args, "ii", &prev, &cur))
        return NULL;
    return PyLong_FromUnsignedLong(gp_schedule_transition((GpAction)prev, (GpAction)cur));
}

/* Kernel names of the running _test_aggregate call (GIL). */
static PyObject *test_kernel_names = NULL;

static const char *
test_kernel_name(uint32_t id)
{
    if (test_kernel_names == NULL || id >= (uint32_t)PyList_GET_SIZE(test_kernel_names))
        return NULL;
    return PyUnicode_AsUTF8(PyList_GET_ITEM(test_kernel_names, id)); /* borrowed */
}

#define GET_U64(dict, key, dst)                                                                    \
    do {                                                                                           \
        PyObject *v_ = PyDict_GetItemString(dict, key); /* borrowed */                             \
        if (v_) {                                                                                  \
            unsigned long long x_ = PyLong_AsUnsignedLongLong(v_);                                 \
            if (PyErr_Occurred()) {                                                                \
                PyErr_Clear();                                                                     \
                long long y_ = PyLong_AsLongLong(v_);                                              \
                if (PyErr_Occurred())                                                              \
                    goto fail;                                                                     \
                x_ = (unsigned long long)y_;                                                       \
            }                                                                                      \
            dst = (__typeof__(dst))x_;                                                             \
        }                                                                                          \
    } while (0)

static int
gpu_from_dict(PyObject *d, GpGpuRecord *g)
{
    memset(g, 0, sizeof(*g));
    g->device = 0;
    g->src_device = g->dst_device = -1;
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "gpu records must be dicts");
        return -1;
    }
    GET_U64(d, "start_ns", g->start_ns);
    GET_U64(d, "end_ns", g->end_ns);
    GET_U64(d, "bytes", g->bytes);
    GET_U64(d, "address", g->address);
    GET_U64(d, "correlation", g->correlation);
    GET_U64(d, "name_id", g->name_id);
    GET_U64(d, "stream", g->stream);
    GET_U64(d, "context", g->context);
    GET_U64(d, "graph_id", g->graph_id);
    GET_U64(d, "thread_id", g->thread_id);
    GET_U64(d, "registers", g->registers);
    GET_U64(d, "static_smem", g->static_smem);
    GET_U64(d, "dynamic_smem", g->dynamic_smem);
    GET_U64(d, "device", g->device);
    GET_U64(d, "kind", g->kind);
    GET_U64(d, "subkind", g->subkind);
    GET_U64(d, "src_mem", g->src_mem);
    GET_U64(d, "dst_mem", g->dst_mem);
    GET_U64(d, "wait_stream", g->wait_stream);
    GET_U64(d, "grid_x", g->grid[0]);
    GET_U64(d, "block_x", g->block[0]);
    return 0;
fail:
    return -1;
}

/* _test_aggregate(ops, threads, gpu, window_start, window_end, kernel_names, step_thread,
 *                 max_events, spans_now, general_only)
 *   ops: list of (kind, name_or_code, flags); op ids are 2, 3, ... in order
 *   threads: list of (ident, os_tid, events); events: list of (ts, kind, arg, payload)
 *   gpu: list of dicts with GpGpuRecord field names
 *   spans_now: build the spans at once (else the dict keeps the events in
 *     "_events", for _complete_window, as a CPU-only window does)
 *   general_only: replay every event through the general path (the fast
 *     path for calls and returns must give the same tables)
 * Returns the result dict a profiler window would produce. */
static PyObject *
test_aggregate(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *ops, *threads, *gpu, *knames;
    unsigned long long wstart, wend, step_thread = 0, max_events = 1 << 20;
    int spans_now = 1, general_only = 0;
    if (!PyArg_ParseTuple(args, "O!O!O!KKO!|KKpp", &PyList_Type, &ops, &PyList_Type, &threads,
                          &PyList_Type, &gpu, &wstart, &wend, &PyList_Type, &knames, &step_thread,
                          &max_events, &spans_now, &general_only))
        return NULL;
    if (atomic_load(&gp_buffer_phase) != GP_PHASE_OFF) {
        PyErr_SetString(PyExc_RuntimeError, "_test_aggregate: a profiler is running");
        return NULL;
    }
    if (gp_intern_init() < 0)
        return NULL;
    PyObject *result = NULL;
    GpGpuRecord *recs = NULL;
    int session = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ops); i++) {
        int kind, flags;
        PyObject *what;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(ops, i), "iOi", &kind, &what, &flags))
            goto done;
        uint32_t op;
        if (kind != GP_OP_PYTHON && kind != GP_OP_USER) {
            /* C-function ops are keyed by PyMethodDef, which a test cannot make. */
            PyErr_Format(PyExc_ValueError,
                         "_test_aggregate: op kind must be OP_PYTHON (a code object) or OP_USER "
                         "(a str label), got %d",
                         kind);
            goto done;
        }
        if (kind == GP_OP_PYTHON && PyCode_Check(what)) {
            op = gp_intern_code((PyCodeObject *)what);
        } else if (PyUnicode_Check(what)) {
            op = gp_intern_label(what);
        } else {
            PyErr_SetString(PyExc_TypeError, "_test_aggregate: op must be a code object or str");
            goto done;
        }
        if (op != (uint32_t)(GP_OPID_FIRST + i)) {
            PyErr_SetString(PyExc_ValueError, "_test_aggregate: ops must be distinct");
            goto done;
        }
        gp_intern.kinds[op] = (uint8_t)kind;
        gp_intern.flags[op] = (uint8_t)flags;
    }
    if (gp_buffer_session_begin(max_events) != GP_OK) {
        gp_status_raise(GP_ERR_STATE, "_test_aggregate");
        goto done;
    }
    session = 1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(threads); i++) {
        unsigned long long ident, os_tid;
        PyObject *events;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(threads, i), "KKO!", &ident, &os_tid, &PyList_Type,
                              &events))
            goto done;
        GpThreadBuf *tb = gp_buffer_thread_for(ident);
        if (tb == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        tb->os_tid = os_tid;
        tb->has_python = 1;
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(events); k++) {
            unsigned long long ts;
            unsigned int kind, arg, payload = 0;
            if (!PyArg_ParseTuple(PyList_GET_ITEM(events, k), "KII|I", &ts, &kind, &arg, &payload))
                goto done;
            gp_buffer_push(tb, ts, arg, GP_EV_MAKE(kind, payload)); /* drops are counted */
        }
    }
    Py_ssize_t n_gpu = PyList_GET_SIZE(gpu);
    recs = calloc((size_t)n_gpu + 1, sizeof(GpGpuRecord));
    if (recs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n_gpu; i++)
        if (gpu_from_dict(PyList_GET_ITEM(gpu, i), &recs[i]) < 0)
            goto done;
    test_kernel_names = knames;
    GpWindowEvents ev;
    GpStatus st = gp_buffer_take_window(&ev);
    if (st != GP_OK) {
        gp_status_raise(st, "_test_aggregate");
        goto done;
    }
    /* The test's timestamps are ns already: no anchors, so no conversion
     * (also when the spans are built later from the kept events). */
    free(ev.anchors);
    ev.anchors = NULL;
    ev.n_anchors = 0;
    GpAggInput in = {
        .threads = ev.threads,
        .n_threads = ev.n_threads,
        .anchors = NULL,
        .op_kinds = gp_intern.kinds,
        .op_flags = gp_intern.flags,
        .n_ops = gp_intern.n_ops,
        .gpu = recs,
        .n_gpu = (size_t)n_gpu,
        .window_start_ns = wstart,
        .window_end_ns = wend,
        .step_thread_ident = step_thread,
        .kernel_name = test_kernel_name,
        .want_spans = spans_now,
        .general_only = general_only,
        .nvtx_cross_thread_ends = 1,
        .nvtx_base = gp_nvtx_shaped_names() > 0 ? gp_nvtx_base_key : NULL,
    };
    GpTables t;
    st = gp_aggregate_run(&in, &t);
    test_kernel_names = NULL;
    if (st != GP_OK) {
        gp_buffer_release_window(&ev);
        gp_status_raise(st, "_test_aggregate");
        goto done;
    }
    result = gp_profiler_result_dict(&t);
    int spans_built = t.has_spans;
    gp_aggregate_free(&t);
    if (result != NULL && !spans_built) {
        PyObject *kept = gp_window_keep(&ev, &in);
        if (kept == NULL || PyDict_SetItemString(result, "_events", kept) < 0)
            Py_CLEAR(result);
        Py_XDECREF(kept);
    }
    gp_buffer_release_window(&ev);
done:
    free(recs);
    if (session)
        gp_buffer_session_end();
    gp_intern_clear();
    return result;
}

static PyObject *
test_constants(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    PyObject *d = Py_BuildValue(
        "{sisisisisisisisisisisisi sisisisisisisi sisisisisisi sisisisisisisisisi sIsI}", "EV_CALL",
        GP_EV_CALL, "EV_RESUME", GP_EV_RESUME, "EV_RETURN", GP_EV_RETURN, "EV_CCALL", GP_EV_CCALL,
        "EV_CRETURN", GP_EV_CRETURN, "EV_RANGE_PUSH", GP_EV_RANGE_PUSH, "EV_RANGE_POP",
        GP_EV_RANGE_POP, "EV_STEP_BEGIN", GP_EV_STEP_BEGIN, "EV_STEP_END", GP_EV_STEP_END,
        "EV_API_ENTER", GP_EV_API_ENTER, "EV_API_EXIT", GP_EV_API_EXIT, "EV_FRAME", GP_EV_FRAME,
        "GPU_KERNEL", GP_GPU_KERNEL, "GPU_MEMCPY", GP_GPU_MEMCPY, "GPU_MEMSET", GP_GPU_MEMSET,
        "GPU_SYNC", GP_GPU_SYNC, "GPU_MALLOC", GP_GPU_MALLOC, "GPU_FREE", GP_GPU_FREE, "GPU_API",
        GP_GPU_API, "OP_PYTHON", GP_OP_PYTHON, "OP_CFUNC", GP_OP_CFUNC, "OP_USER", GP_OP_USER,
        "OP_STEP", GP_OP_STEP, "OP_CUDA_API", GP_OP_CUDA_API, "OPF_HIDDEN", GP_OPF_HIDDEN,
        "COPY_HTOD", GP_COPY_HTOD, "COPY_DTOH", GP_COPY_DTOH, "MEM_PAGEABLE", GP_MEM_PAGEABLE,
        "MEM_PINNED", GP_MEM_PINNED, "MEM_DEVICE", GP_MEM_DEVICE, "SYNC_STREAM", GP_SYNC_STREAM,
        "SYNC_CONTEXT", GP_SYNC_CONTEXT, "API_RUNTIME", GP_API_RUNTIME, "API_DRIVER", GP_API_DRIVER,
        "CHUNK_EVENTS", GP_CHUNK_EVENTS, "EVENT_BYTES", (unsigned int)sizeof(GpEvent));
    /* NVTX events and PyTorch's range flags: a second dict, so the format above stays readable */
    PyObject *nv = Py_BuildValue(
        "{sisisisisisisisisisi}", "EV_NVTX_PUSH", GP_EV_NVTX_PUSH, "EV_NVTX_POP", GP_EV_NVTX_POP,
        "EV_NVTX_START", GP_EV_NVTX_START, "EV_NVTX_END", GP_EV_NVTX_END, "EV_NVTX_TORCH",
        GP_EV_NVTX_TORCH, "NVTXT_SEQ", GP_NVTXT_SEQ, "NVTXT_AUTOGRAD", GP_NVTXT_AUTOGRAD,
        "NVTXT_ENGINE", GP_NVTXT_ENGINE, "EV_SEQ", GP_EV_SEQ, "EV_MODULE", GP_EV_MODULE);
    if (d == NULL || nv == NULL || PyDict_Update(d, nv) < 0)
        Py_CLEAR(d);
    Py_XDECREF(nv);
    return d;
}

static PyObject *
test_api_key(PyObject *module, PyObject *args)
{
    (void)module;
    unsigned int domain, cbid;
    if (!PyArg_ParseTuple(args, "II", &domain, &cbid))
        return NULL;
    uint32_t key = GP_API_KEY(domain, cbid);
    return Py_BuildValue("{sIsssi}", "key", key, "name", gp_cuda_api_name(key), "class",
                         gp_cuda_api_class(key));
}

/* Native threads that write CUDA API enters and exits without pause, through
 * the function CUPTI's callbacks call, in and out of windows and sessions:
 * as callbacks keep firing on a job's threads while a profile stops. */
#define STORM_MAX 16
static atomic_int storm_on;
static atomic_uint_fast64_t storm_writes;
static pthread_t storm_threads[STORM_MAX];
static int storm_n;

static void *
storm_thread(void *arg)
{
    (void)arg;
    uint32_t key = GP_API_KEY(GP_API_RUNTIME, 1), correlation = 0;
    while (atomic_load_explicit(&storm_on, memory_order_relaxed)) {
        correlation++;
        gp_buffer_record_api(gp_clock_raw(), correlation, key, 1);
        gp_buffer_record_api(gp_clock_raw(), correlation, key, 0);
        atomic_fetch_add_explicit(&storm_writes, 1, memory_order_relaxed);
    }
    return NULL;
}

static PyObject *
test_api_storm(PyObject *module, PyObject *arg)
{
    (void)module;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n > 0) { /* start n threads */
        if (storm_n != 0 || n > STORM_MAX) {
            PyErr_Format(PyExc_ValueError,
                         "_test_api_storm(%ld): stop the running storm first "
                         "(0), and start at most %d threads",
                         n, STORM_MAX);
            return NULL;
        }
        atomic_store(&storm_on, 1);
        atomic_store(&storm_writes, 0);
        for (; storm_n < n; storm_n++)
            if (pthread_create(&storm_threads[storm_n], NULL, storm_thread, NULL) != 0)
                break;
        return PyLong_FromLong(storm_n);
    }
    atomic_store(&storm_on, 0); /* 0: stop them, and return the enter/exit pairs written */
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < storm_n; i++)
        pthread_join(storm_threads[i], NULL);
    Py_END_ALLOW_THREADS
    storm_n = 0;
    return PyLong_FromUnsignedLongLong((unsigned long long)atomic_load(&storm_writes));
}

/* A free function the way pybind11 binds one: a C function whose self is a
 * private capsule and whose __module__ is a string. Calling it returns its
 * argument. */
static PyObject *
bound_identity(PyObject *self, PyObject *arg)
{
    (void)self;
    return Py_NewRef(arg);
}

static PyMethodDef bound_identity_def = {"bound_identity", bound_identity, METH_O,
                                         "Return the argument."};

static PyObject *
test_binding_function(PyObject *module, PyObject *module_name)
{
    (void)module;
    if (!PyUnicode_Check(module_name)) {
        PyErr_SetString(PyExc_TypeError, "_test_binding_function: module_name must be a str");
        return NULL;
    }
    PyObject *record = PyCapsule_New(&bound_identity_def, "gpuprof.test_record", NULL);
    if (record == NULL)
        return NULL;
    PyObject *fn = PyCFunction_NewEx(&bound_identity_def, record, module_name);
    Py_DECREF(record);
    return fn;
}

/* _test_nvtx_name(message): how a push of `message` is named (csrc/record/nvtx.c,
 * "PyTorch's range messages"): {"name", "flags" (GP_NVTXT_*), "seq" (-1 none),
 * "torch" (it follows PyTorch's grammar), "id" (the name id a push on the
 * default domain records, interned now), "sizes" (the input sizes field's
 * list, or None)}. New reference, NULL on error. */
static PyObject *
test_nvtx_name(PyObject *module, PyObject *arg)
{
    (void)module;
    Py_ssize_t len;
    const char *text = PyUnicode_Check(arg) ? PyUnicode_AsUTF8AndSize(arg, &len) : NULL;
    if (text == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "_test_nvtx_name: message must be a str");
        return NULL;
    }
    GpNvtxTorchName t;
    int torch = gp_nvtx_torch_parse(text, (size_t)len, 0, &t);
    uint32_t id = gp_nvtx_intern_default(text, (size_t)len);
    if (id == 0)
        return PyErr_NoMemory();
    return Py_BuildValue("{ss#sIsLsOsIsz#}", "name", t.name, (Py_ssize_t)t.len, "flags", t.flags,
                         "seq", (t.flags & GP_NVTXT_SEQ) ? (long long)t.seq : -1LL, "torch",
                         torch ? Py_True : Py_False, "id", id, "sizes", t.sizes,
                         (Py_ssize_t)t.sizes_len);
}

PyMethodDef gp_testing_methods[] = {
    {"_test_nvtx_name", test_nvtx_name, METH_O,
     "How an NVTX push of a message is named and what PyTorch's grammar gave."},
    {"_test_binding_function", test_binding_function, METH_O,
     "A C function bound as pybind11 binds free functions (capsule self, __module__ str)."},
    {"_test_schedule_transition", test_schedule_transition, METH_VARARGS,
     "Transition bits for (prev, cur) actions."},
    {"_test_aggregate", test_aggregate, METH_VARARGS,
     "Aggregate synthetic events and GPU records through the real C paths."},
    {"_test_constants", test_constants, METH_NOARGS, "Event, record and op-kind constants."},
    {"_test_api_key", test_api_key, METH_VARARGS, "Name and class of a CUDA API (domain, cbid)."},
    {"_test_api_storm", test_api_storm, METH_O,
     "n > 0: start n native threads writing CUDA API events; 0: stop them, return the pairs."},
    {NULL, NULL, 0, NULL},
};
