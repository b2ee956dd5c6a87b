/* Streaming Chrome-trace writer: one recorded window -> one Kineto-compatible
 * JSON trace (docs/traces.md; the schema is the trace-format reference).
 *
 * The writer reads the window's structured arrays through the buffer
 * protocol (no NumPy headers here) and formats every event in C: no Python
 * object is created per event. Names are escaped once per op row.
 */
#ifndef GPUPROF_CSRC_TRACE_JSON_H
#define GPUPROF_CSRC_TRACE_JSON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* _gpuprof._write_trace(dest, window, meta) -> int (events written)
 *
 * dest: a path (str, bytes or os.PathLike): the JSON is written to
 *   dest + ".tmp" with the GIL released, then renamed to dest; on failure the
 *   temporary file is removed and OSError (errno, file name) is raised.
 *   Or any object with write(bytes): the JSON is passed to it in blocks of
 *   1 MiB (the GIL stays held); used for gzip.
 * window: a window dict as Profiler.result returns it (spans, gpu, ops,
 *   steps, threads, op_files, window_start_ns, window_end_ns).
 * meta: a gpuprof.exporters._trace_meta.TraceMeta, a dataclass whose docstring
 *   says what each field is (header, names, part, ...); a field set to None is
 *   left out.
 * Strings may hold lone surrogates or invalid UTF-8: they are replaced
 * with U+FFFD. Returns a new int, or NULL with an exception set (KeyError,
 * TypeError or ValueError for a malformed window or meta, MemoryError,
 * OSError, or whatever dest.write raised). */
PyObject *gp_trace_json_write(PyObject *module, PyObject *args);

/* _gpuprof._trace_keep(window, min_ns) -> (mask, omitted)
 *
 * Which of the window's spans a trace leaving out calls shorter than min_ns
 * keeps: mask is bytes with one 0/1 per spans row; omitted counts the zeros.
 * Kept: every span that is not a Python or C call, every call of min_ns or
 * more, and every call around a CUDA API call on its thread (so kernels keep
 * their launching calls). Raises ValueError for min_ns < 0. */
PyObject *gp_trace_json_keep(PyObject *module, PyObject *args);

#endif /* GPUPROF_CSRC_TRACE_JSON_H */
