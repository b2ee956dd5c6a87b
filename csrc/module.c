/* gpuprof._gpuprof: module definition, exec slot and method table. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "gp_cuda.h"
#include "arrays.h"
#include "buffer.h"
#include "clock.h"
#include "dump.h"
#include "gil.h"
#include "hook.h"
#include "intern.h"
#include "nvtx.h"
#include "opkinds.h"
#include "profiler.h"
#include "schedule.h"
#include "testing.h"
#include "threads.h"
#include "trace_json.h"
#include "window.h"

static PyObject *
mod_thread_bootstrap(PyObject *module, PyObject *args)
{
    (void)module;
    (void)args;
    /* Called once as a sys.setprofile function in a thread started while
     * profiling (threading.setprofile); replaces itself with the C hook. */
    gp_hook_install_current();
    Py_RETURN_NONE;
}

static PyObject *
mod_set_hidden_prefix(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *prefix, *shown = NULL;
    if (!PyArg_ParseTuple(args, "O|U:_set_hidden_prefix", &prefix, &shown))
        return NULL;
    if (gp_intern_set_hidden_prefix(prefix, shown) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
mod_set_library_roots(PyObject *module, PyObject *roots)
{
    (void)module;
    if (gp_intern_set_library_roots(roots) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
mod_is_library(PyObject *module, PyObject *file)
{
    (void)module;
    if (!PyUnicode_Check(file)) {
        PyErr_Format(PyExc_TypeError, "_is_library: a file name (str) is needed, not %.100s",
                     Py_TYPE(file)->tp_name);
        return NULL;
    }
    return PyBool_FromLong(gp_intern_is_library(file));
}

static PyObject *
mod_cuda_load(PyObject *module, PyObject *path)
{
    (void)module;
    const char *p = PyUnicode_AsUTF8(path);
    if (p == NULL)
        return NULL;
    GpStatus st;
    Py_BEGIN_ALLOW_THREADS
    st = gp_cuda_load(p);
    Py_END_ALLOW_THREADS
    if (st != GP_OK)
        return Py_BuildValue("(Os)", Py_False, gp_cuda_reason());
    return Py_BuildValue("(Os)", Py_True, "");
}

static PyObject *
mod_cuda_info(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    return Py_BuildValue("{sOsOsIssssss}", "compiled", gp_cuda_compiled() ? Py_True : Py_False,
                         "loaded", gp_cuda_loaded() ? Py_True : Py_False, "version",
                         (unsigned int)gp_cuda_version(), "reason", gp_cuda_reason(), "mode",
                         gp_cuda_mode(), "parts", gp_cuda_parts());
}

static PyObject *
mod_cuda_stats(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    GpCudaStats st;
    gp_cuda_stats(&st);
    return Py_BuildValue("{sKsKsK}", "decode_ns", (unsigned long long)st.decode_ns,
                         "decoded_records", (unsigned long long)st.decoded_records,
                         "completed_buffers", (unsigned long long)st.completed_buffers);
}

static PyObject *
mod_device_props(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    int n;
    Py_BEGIN_ALLOW_THREADS
    n = gp_cuda_device_count();
    Py_END_ALLOW_THREADS
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    for (int i = 0; i < n; i++) {
        GpDeviceProps p;
        if (gp_cuda_device_props(i, &p) != GP_OK)
            continue;
        PyObject *d = Py_BuildValue(
            "{sisssK"
            "sisisisisisisisisisisisi}",
            "id", p.id, "name", p.name, "totalGlobalMem", (unsigned long long)p.total_global_mem,
            "computeMajor", p.compute_major, "computeMinor", p.compute_minor, "maxThreadsPerBlock",
            p.max_threads_per_block, "maxThreadsPerMultiprocessor", p.max_threads_per_sm,
            "regsPerBlock", p.regs_per_block, "regsPerMultiprocessor", p.regs_per_sm, "warpSize",
            p.warp_size, "sharedMemPerBlock", p.shared_mem_per_block, "sharedMemPerBlockOptin",
            p.shared_mem_per_block_optin, "sharedMemPerMultiprocessor", p.shared_mem_per_sm,
            "maxBlocksPerMultiprocessor", p.max_blocks_per_sm, "numSms", p.num_sms);
        if (d == NULL || PyList_Append(list, d) < 0) {
            Py_XDECREF(d);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(d);
    }
    return list;
}

static PyObject *
mod_monitoring_configure(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *disable, *restart;
    if (!PyArg_ParseTuple(args, "OO:_monitoring_configure", &disable, &restart))
        return NULL;
    gp_hook_monitoring_configure(disable, restart);
    Py_RETURN_NONE;
}

static PyObject *
mod_ignore_current_thread(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    gp_buffer_ignore_current();
    Py_RETURN_NONE;
}

static PyObject *
mod_ignore_thread(PyObject *module, PyObject *ident)
{
    (void)module;
    unsigned long long id = PyLong_AsUnsignedLongLong(ident);
    if (id == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    gp_buffer_ignore_thread((uint64_t)id);
    Py_RETURN_NONE;
}

static PyObject *
mod_after_fork_child(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    gp_profiler_after_fork_child();
    gp_gil_after_fork_child();
    Py_RETURN_NONE;
}

/* _set_seq_peek(address): the address of at::sequence_number::peek in the
 * loaded libtorch (python/gpuprof/_autograd.py finds it), or 0 for none. The
 * hook calls it on every event while it is set (hook.c). */
static PyObject *
mod_set_seq_peek(PyObject *module, PyObject *address)
{
    (void)module;
    unsigned long long addr = PyLong_AsUnsignedLongLong(address);
    if (addr == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    gp_hook_set_seq_peek((void *)(uintptr_t)addr);
    Py_RETURN_NONE;
}

static PyObject *
mod_set_module_code(PyObject *module, PyObject *code)
{
    (void)module;
    if (gp_hook_set_module_code(code == Py_None ? NULL : code) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
mod_module_instances(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    return gp_hook_module_instances();
}

static PyObject *
mod_clock_ns(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    return PyLong_FromUnsignedLongLong(gp_clock_now());
}

static PyObject *
mod_epoch_offset_ns(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    return PyLong_FromLongLong(gp_clock_epoch_offset());
}

static PyObject *
mod_nvtx_info(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    GpNvtxInfo info;
    gp_nvtx_info(&info);
    return Py_BuildValue("{sisOsssIsIsKsI}", "clients", info.clients, "emit",
                         info.emit ? Py_True : Py_False, "emit_reason", info.emit_reason, "names",
                         info.names, "domains", info.domains, "names_dropped",
                         (unsigned long long)info.names_dropped, "probe_hits", info.probe_hits);
}

static PyObject *
mod_schedule_action(PyObject *module, PyObject *args)
{
    (void)module;
    GpSchedule s;
    long long step;
    if (!PyArg_ParseTuple(args, "LLLLLLL", &s.wait, &s.warmup, &s.active, &s.repeat, &s.skip_first,
                          &s.skip_first_wait, &step))
        return NULL;
    if (gp_schedule_check(&s) != GP_OK || step < 0)
        return gp_status_raise(GP_ERR_VALUE, "schedule_action");
    return PyLong_FromLong(gp_schedule_action(&s, step));
}

static PyMethodDef module_methods[] = {
    {"nvtx_info", mod_nvtx_info, METH_NOARGS,
     "NVTX state: clients attached to gpuprof's injection, whether gpuprof's ranges go out "
     "to another NVTX tool (and why not), names interned this session."},
    {"schedule_action", mod_schedule_action, METH_VARARGS,
     "(wait, warmup, active, repeat, skip_first, skip_first_wait, step): the ACT_* of the "
     "step, as the C core's schedule decides it."},
    {"range_push", gp_profiler_range_push, METH_O,
     "Open a user range (record_function); returns a token for range_pop."},
    {"range_pop", gp_profiler_range_pop, METH_O, "Close the user range opened with the token."},
    {"_thread_bootstrap", mod_thread_bootstrap, METH_VARARGS,
     "threading.setprofile target: installs the C hook on a new thread."},
    {"_set_hidden_prefix", mod_set_hidden_prefix, METH_VARARGS,
     "(prefix, shown=None): code under prefix (a str or a tuple of str) is not shown, "
     "except under shown."},
    {"_set_library_roots", mod_set_library_roots, METH_O,
     "(roots): folders (a tuple of str ending in a separator) whose files are library code "
     "besides installed packages."},
    {"_is_library", mod_is_library, METH_O,
     "_is_library(file) -> bool: library code rather than the user's (frozen, installed "
     "packages, the library roots)."},
    {"cuda_load", mod_cuda_load, METH_O, "dlopen libcupti at path: (ok, reason)."},
    {"cuda_info", mod_cuda_info, METH_NOARGS,
     "compiled/loaded/version/reason/mode/parts of CUDA capture."},
    {"_cuda_stats", mod_cuda_stats, METH_NOARGS,
     "Cumulative cost of decoding CUPTI buffers: decode_ns, decoded_records, completed_buffers."},
    {"device_props", mod_device_props, METH_NOARGS, "Properties of each visible CUDA device."},
#if PY_VERSION_HEX >= 0x030C0000
    {"_mon_start", (PyCFunction)(void (*)(void))gp_hook_mon_start, METH_FASTCALL, "PY_START"},
    {"_mon_resume", (PyCFunction)(void (*)(void))gp_hook_mon_resume, METH_FASTCALL, "PY_RESUME"},
    {"_mon_throw", (PyCFunction)(void (*)(void))gp_hook_mon_throw, METH_FASTCALL, "PY_THROW"},
    {"_mon_return", (PyCFunction)(void (*)(void))gp_hook_mon_return, METH_FASTCALL,
     "PY_RETURN, PY_YIELD"},
    {"_mon_unwind", (PyCFunction)(void (*)(void))gp_hook_mon_unwind, METH_FASTCALL, "PY_UNWIND"},
    {"_mon_call", (PyCFunction)(void (*)(void))gp_hook_mon_call, METH_FASTCALL, "CALL"},
    {"_mon_c_return", (PyCFunction)(void (*)(void))gp_hook_mon_c_return, METH_FASTCALL,
     "C_RETURN, C_RAISE"},
#endif
    {"_monitoring_configure", mod_monitoring_configure, METH_VARARGS,
     "(DISABLE, restart_events) for the sys.monitoring backend; (None, None) clears."},
    {"_set_seq_peek", mod_set_seq_peek, METH_O,
     "(address): the C function the hook reads PyTorch's autograd sequence counter with "
     "(at::sequence_number::peek), or 0 for none."},
    {"_set_module_code", mod_set_module_code, METH_O,
     "(code): record the torch.nn.Module instance of each call of this code object "
     "(Module.__call__'s), or None for none."},
    {"_module_instances", mod_module_instances, METH_NOARGS,
     "The instances numbered so far (spans' module field - 1), as a list."},
    {"_ignore_thread", mod_ignore_thread, METH_O,
     "Leave the thread with this threading ident out of this (or the next) session's results."},
    {"_ignore_current_thread", mod_ignore_current_thread, METH_NOARGS,
     "Never record the calling thread (gpuprof's own helper threads)."},
    {"_after_fork_child", mod_after_fork_child, METH_NOARGS,
     "os.register_at_fork hook: a forked child stops recording the parent's session."},
    {"clock_ns", mod_clock_ns, METH_NOARGS, "The profiler clock (CLOCK_MONOTONIC ns)."},
    {"epoch_offset_ns", mod_epoch_offset_ns, METH_NOARGS, "Unix-epoch ns minus profiler-clock ns."},
    {"_complete_window", gp_window_complete, METH_O,
     "_complete_window(raw) -> raw: a window dict with its spans, built from the events it "
     "kept (raw[\"_events\"], then removed) when it has none yet."},
    {"_row_dtypes", gp_arrays_dtypes, METH_NOARGS,
     "_row_dtypes() -> {key: dtype}: the dtype of each array of a window dict (arrays.c)."},
    {"_write_trace", gp_trace_json_write, METH_VARARGS,
     "_write_trace(dest, window, meta) -> events: one window as a Chrome trace (trace_json.h)."},
    {"_trace_keep", gp_trace_json_keep, METH_VARARGS,
     "_trace_keep(window, min_ns) -> (mask, omitted): spans kept without the shortest calls."},
    {NULL, NULL, 0, NULL},
};

/* The enum values Python reads (python/gpuprof/_constants.py), exported once so
 * that no Python module copies a number. The names drop the GP_ prefix. */
#define GP_CONST(name) {#name, GP_##name}
static const struct {
    const char *name;
    int value;
} module_constants[] = {
    GP_CONST(OP_NONE),
    GP_CONST(OP_PYTHON),
    GP_CONST(OP_CFUNC),
    GP_CONST(OP_USER),
    GP_CONST(OP_STEP),
    GP_CONST(OP_CUDA_API),
    GP_CONST(OPF_HIDDEN),
    GP_CONST(OPF_GENERATOR),
    GP_CONST(OPF_NVTX),
    GP_CONST(OPF_LIBRARY),
    GP_CONST(OPF_WAIT),
    GP_CONST(OPF_AUTOGRAD),
    GP_CONST(GPU_KERNEL),
    GP_CONST(GPU_MEMCPY),
    GP_CONST(GPU_MEMSET),
    GP_CONST(GPU_SYNC),
    GP_CONST(GPU_MALLOC),
    GP_CONST(GPU_FREE),
    GP_CONST(GPU_API),
    GP_CONST(CAT_COMPUTE),
    GP_CONST(CAT_MEMCPY),
    GP_CONST(CAT_MEMSET),
    GP_CONST(CAT_COMMUNICATION),
    GP_CONST(CAT_SYNC),
    GP_CONST(APICLASS_OTHER),
    GP_CONST(APICLASS_LAUNCH),
    GP_CONST(APICLASS_GRAPH),
    GP_CONST(APICLASS_MEMCPY),
    GP_CONST(APICLASS_MEMCPY_SYNC),
    GP_CONST(APICLASS_MEMSET),
    GP_CONST(APICLASS_SYNC),
    GP_CONST(APICLASS_ALLOC),
    GP_CONST(APICLASS_FREE),
    GP_CONST(ACT_NONE),
    GP_CONST(ACT_WARMUP),
    GP_CONST(ACT_RECORD),
    GP_CONST(ACT_RECORD_AND_SAVE),
    GP_CONST(ACT_EXIT),
    GP_CONST(CAPTURE_NONE),
    GP_CONST(CAPTURE_PROFILER_API),
    GP_CONST(CAPTURE_NVTX),
    GP_CONST(GF_ATTRIBUTED),
    GP_CONST(GF_BLOCKED_THREAD),
    GP_CONST(GF_ROLLED_UP),
    GP_CONST(SF_ENTERED),
};
#undef GP_CONST

static int
module_exec(PyObject *module)
{
    gp_clock_init();
    if (gp_arrays_init() < 0)
        return -1;
    if (PyModule_AddFunctions(module, gp_testing_methods) < 0)
        return -1;
    if (PyModule_AddFunctions(module, gp_dump_methods) < 0)
        return -1;
    if (PyModule_AddFunctions(module, gp_gil_methods) < 0)
        return -1;
    PyObject *type = PyType_FromModuleAndSpec(module, &gp_profiler_spec, NULL);
    if (type == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(module, "Profiler", type);
    Py_DECREF(type);
    if (rc < 0)
        return -1;
    type = PyType_FromModuleAndSpec(module, &gp_threads_end_spec, NULL);
    if (type == NULL)
        return -1;
    rc = PyModule_AddObjectRef(module, "_ThreadEnd", type);
    Py_DECREF(type);
    if (rc < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "HAVE_CUPTI", gp_cuda_compiled()) < 0)
        return -1;
    if (PyModule_AddStringConstant(module, "EVENT_CLOCK", gp_clock_raw_name()) < 0)
        return -1;
    for (size_t i = 0; i < sizeof(module_constants) / sizeof(module_constants[0]); i++) {
        if (PyModule_AddIntConstant(module, module_constants[i].name, module_constants[i].value) <
            0)
            return -1;
    }
    return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static void
module_free(void *module)
{
    (void)module;
    gp_arrays_clear();
}

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gpuprof._gpuprof",
    .m_doc = "gpuprof's C core: the profile hook, buffers, aggregation and CUPTI capture. "
             "Single interpreter only (CUPTI and the hook are per process).",
    .m_size = 0,
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_free = module_free,
};

PyMODINIT_FUNC
PyInit__gpuprof(void)
{
    return PyModuleDef_Init(&module_def);
}
