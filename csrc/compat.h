/* The few newer CPython C-API calls gpuprof uses, for older Pythons. */
#ifndef GPUPROF_CSRC_COMPAT_H
#define GPUPROF_CSRC_COMPAT_H

#include <Python.h>

#if PY_VERSION_HEX < 0x030D0000
/* PyDict_GetItemRef (3.13): 1 found (new ref in *result), 0 missing, -1 error. */
static inline int
gp_compat_dict_get_item_ref(PyObject *dict, PyObject *key, PyObject **result)
{
    PyObject *item = PyDict_GetItemWithError(dict, key); /* borrowed */
    if (item == NULL) {
        *result = NULL;
        return PyErr_Occurred() ? -1 : 0;
    }
    *result = Py_NewRef(item);
    return 1;
}
#define PyDict_GetItemRef gp_compat_dict_get_item_ref
#endif

#if PY_VERSION_HEX < 0x030B0000
/* PyFrame_GetLasti (3.11): before 3.11 the frame struct is public, in
 * frameobject.h, which also declares PyFrame_GetBack (3.9). */
#include <frameobject.h>
static inline int
gp_compat_frame_lasti(PyFrameObject *frame)
{
    /* 3.10 counts f_lasti in code units; 3.11's PyFrame_GetLasti in bytes. */
    return frame->f_lasti < 0 ? frame->f_lasti : frame->f_lasti * (int)sizeof(_Py_CODEUNIT);
}
#define PyFrame_GetLasti gp_compat_frame_lasti
#endif

#endif /* GPUPROF_CSRC_COMPAT_H */
