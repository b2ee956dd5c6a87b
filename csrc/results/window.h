/* A window's spans: built at once for GPU windows, or from the window's
 * kept events the first time they are asked for, and their call-site lines.
 *
 * Spans are the largest table (one 48-byte row per call) and only traces,
 * the diagnosis and memory attribution read them. A CPU-only window keeps
 * its events instead (16 bytes each, in chunks that were filled anyway) in
 * a capsule in its result dict ("_events"); _complete_window(raw) replays
 * them into spans once, then gives the chunks back for reuse.
 */
#ifndef GPUPROF_CSRC_WINDOW_H
#define GPUPROF_CSRC_WINDOW_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "aggregate.h"
#include "buffer.h"

/* A capsule keeping a closed window's events for its spans. Takes over *ev
 * (zeroed on return, also on failure, when the chunks are given back); `in`
 * gives the rest of the window's aggregation inputs, copied (op kinds and
 * flags, the window's bounds; the intern table must be alive: the capsule
 * takes references to the code objects, for call-site lines). GIL held.
 * New reference, or NULL with an exception. */
PyObject *gp_window_keep(GpWindowEvents *ev, const GpAggInput *in);

/* Module-level _complete_window(raw): give a window dict its "spans",
 * built from its "_events" (which are then given back and the key removed)
 * when it has none yet. Returns raw (new reference), or NULL with an
 * exception (raw unchanged). */
PyObject *gp_window_complete(PyObject *module, PyObject *raw);

/* Resolve each C-call span's call site (caller's f_lasti + 1) to its line,
 * through `refs` (per op id: the code object of Python ops), then move the
 * spans of `t` into a new array without a copy (t->spans is left empty).
 * New reference, or NULL with an exception. */
PyObject *gp_window_spans_array(GpTables *t, PyObject *const *refs, const uint8_t *kinds,
                                uint32_t n_ops);

#endif /* GPUPROF_CSRC_WINDOW_H */
