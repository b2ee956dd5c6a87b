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
 * meta: dict with
 *   header (str)        JSON members written before "traceEvents", without
 *                       braces or a trailing comma (may be "")
 *   trace_name (str)    value of the final "traceName" key
 *   pid (int)           host process id
 *   process_name (str)
 *   names (list)        display name per op row (str or UTF-8 bytes)
 *   files (list, optional) display file per op row, for a C call's CallFrom
 *                       (default: window['op_files'])
 *   kernel_names (list) name per kernels row
 *   thread_names (list) name per threads row
 *   sm_counts, warp_sizes (list of int, optional) per device index, for
 *                       the kernels' "blocks per SM" and "warps per SM"
 *   part (str, optional) "whole" (default): a complete file. For one file
 *                       holding several processes, written by several calls
 *                       on the same writer: "open" writes the header, the
 *                       opening of traceEvents and this window's events;
 *                       "append" only this window's events (each after a
 *                       comma); "close" this window's events, the window
 *                       markers and the end of the file.
 *   base_ns (int, optional) profiler-clock ns of ts == 0 (default: the
 *                       window's window_start_ns); earlier times become 0
 *   sort_index (int, optional) process_sort_index of the host lane
 *                       (default: pid)
 *   id_base (int, optional, >= 0) added to the Python ids, External ids and
 *                       Ev Idx of this window's host events, so that several
 *                       windows in one file keep them unique (default 0)
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
