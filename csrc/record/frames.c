/* The first local variable of a frame being entered: `self` of a method, read
 * without building the frame's locals (a dict, about a microsecond). CPython
 * has no public call for it, so this file, alone in the package, reads the
 * interpreter's own frame struct (internal/pycore_frame.h; its layout is
 * stable within a minor version, which an extension is built for). The hook
 * uses it for the calls of torch.nn.Module's __call__ (hook.c, "module
 * instances"): a handful per layer and step. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX >= 0x030B0000
#define Py_BUILD_CORE 1
#include "internal/pycore_frame.h"
#undef Py_BUILD_CORE
#endif

#include "frames.h"

#if PY_VERSION_HEX >= 0x030B0000
static PyObject *
first_local(const _PyInterpreterFrame *f)
{
    if (f == NULL)
        return NULL;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *code = f->f_executable;
    if (code == NULL || !PyCode_Check(code) || ((PyCodeObject *)code)->co_argcount < 1)
        return NULL;
#else
    if (f->f_code == NULL || f->f_code->co_argcount < 1)
        return NULL;
#endif
    return f->localsplus[0];
}
#endif

PyObject *
gp_frames_self(PyFrameObject *frame)
{
#if PY_VERSION_HEX >= 0x030B0000
    return frame ? first_local(frame->f_frame) : NULL;
#else
    (void)frame;
    return NULL;
#endif
}

PyObject *
gp_frames_current_self(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return first_local(PyThreadState_Get()->current_frame);
#elif PY_VERSION_HEX >= 0x030B0000
    return first_local(PyThreadState_Get()->cframe->current_frame);
#else
    return NULL;
#endif
}
