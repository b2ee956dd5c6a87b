/* The first argument of a frame just entered (frames.c): borrowed, or NULL. */
#ifndef GPUPROF_CSRC_FRAMES_H
#define GPUPROF_CSRC_FRAMES_H

#include <Python.h>

/* Of `frame` (a profile callback's). */
PyObject *gp_frames_self(PyFrameObject *frame);

/* Of the calling thread's innermost frame, complete or not (a sys.monitoring
 * PY_START callback's: the frame being started). */
PyObject *gp_frames_current_self(void);

#endif /* GPUPROF_CSRC_FRAMES_H */
