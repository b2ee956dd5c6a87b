"""Results of recorded windows as NumPy structured arrays.

The C core hands over one dict per window (``Profiler.result``):

  ops, nodes, kernels, gpu, steps, spans, threads   structured arrays (rows)
  _events                                           instead of spans in a CPU-only
                                                    window: its events, kept until the
                                                    spans are first asked for
                                                    (:func:`complete_window`)
  op_names, op_files, op_lines                      per op row
  kernel_names                                      per kernels row ``name`` id
  window_start_ns, window_end_ns                    profiler clock (CLOCK_MONOTONIC)
  dropped_events, dropped_gpu                       what was lost
  attributed_gpu_ns, unattributed_gpu_ns            GPU time joined / not joined to an op
  epoch_offset_ns                                   add to a timestamp for Unix time

:class:`Results` turns them into the public arrays documented in
docs/tables.md. With ``acc_events=True`` several windows are merged.
"""

from __future__ import annotations

import os
import threading
import weakref

import numpy as np

from . import _gpuprof

__all__ = ["Results", "OP_KINDS", "KERNEL_CATEGORIES", "GPU_KINDS", "complete_window"]

OP_KINDS = {0: "none", 1: "python", 2: "c", 3: "user", 4: "step", 5: "cuda_api"}
KERNEL_CATEGORIES = {0: "compute", 1: "memcpy", 2: "memset", 3: "communication", 4: "sync"}
GPU_KINDS = {1: "kernel", 2: "memcpy", 3: "memset", 4: "sync", 5: "malloc", 6: "free", 7: "api"}

OPS_DTYPE = np.dtype([
    ("name", object), ("file", object), ("line", "i4"), ("kind", "U8"),
    ("calls", "i8"), ("cpu_total_ns", "i8"), ("cpu_self_ns", "i8"), ("cpu_min_ns", "i8"),
    ("cpu_max_ns", "i8"), ("cuda_total_ns", "i8"), ("cuda_self_ns", "i8"), ("kernels", "i8"),
    ("cuda_mem_self_bytes", "i8"), ("cpu_mem_self_bytes", "i8"),
])

KERNELS_DTYPE = np.dtype([
    ("name", object), ("device", "i4"), ("calls", "i8"), ("total_ns", "i8"), ("min_ns", "i8"),
    ("max_ns", "i8"), ("bytes", "i8"), ("grid", "u4", (3,)), ("block", "u4", (3,)),
    ("registers", "u4"), ("shared_mem", "u4"), ("category", "U13"),
    # theoretical occupancy (gpuprof.occupancy): 0..1, NaN when unknown
    ("occupancy", "f4"), ("occupancy_limiter", "U13"), ("blocks_per_sm", "i4"),
])

GPU_EVENTS_DTYPE = np.dtype([
    ("name", object), ("kind", "U6"), ("category", "U13"), ("start_ns", "i8"), ("end_ns", "i8"),
    ("device", "i4"), ("stream", "u4"), ("correlation", "u4"), ("op", "i4"), ("op_name", object),
    ("node", "i4"), ("thread", "i4"), ("bytes", "i8"), ("address", "i8"), ("grid", "u4", (3,)),
    ("block", "u4", (3,)), ("registers", "u4"), ("shared_mem", "u4"), ("graph_id", "u4"),
    ("blocked_thread", "?"),
])

CALL_TREE_DTYPE = np.dtype([
    ("id", "i4"), ("parent", "i4"), ("op", "i4"), ("name", object), ("thread", "i4"),
    ("calls", "i8"), ("total_ns", "i8"), ("self_ns", "i8"), ("cuda_total_ns", "i8"),
    ("cuda_self_ns", "i8"),
])


# ``raw`` with its ``spans``, returned: a CPU-only window builds them from its
# kept events the first time they are needed (traces, the diagnosis, memory
# attribution, saving), which also gives the events' memory back; the tables
# never need them.
complete_window = _gpuprof._complete_window


def _display_name(name: str, file: str, line: int, kind: str) -> str:
    if kind == "python":
        return f"{name} ({os.path.basename(file)}:{line})"
    return name


class _Window:
    """One window's raw dict plus the public arrays built from it (lazily)."""

    def __init__(self, raw: dict, device_props=None):
        self._raw = raw  # spans may still be missing: use .raw for them
        self._device_props = device_props  # callable -> device_props() list, for occupancy
        self._ops = None
        self._kernels = None

    @property
    def raw(self) -> dict:
        """The window's dict, spans included (built now if they were not yet)."""
        return complete_window(self._raw)

    def ops(self) -> np.ndarray:
        if self._ops is None:
            r = self._raw["ops"]
            out = np.zeros(len(r), dtype=OPS_DTYPE)
            out["name"] = np.array(self._raw["op_names"] + [None], dtype=object)[:-1]
            out["file"] = np.array(self._raw["op_files"] + [None], dtype=object)[:-1]
            out["line"] = self._raw["op_lines"]
            out["kind"] = [OP_KINDS.get(int(k), "none") for k in r["kind"]]
            for f in OPS_DTYPE.names[4:]:
                out[f] = r[f]
            self._ops = out
        return self._ops

    def kernels(self) -> np.ndarray:
        if self._kernels is None:
            r = self._raw["kernels"]
            names = self._raw["kernel_names"]
            out = np.zeros(len(r), dtype=KERNELS_DTYPE)
            out["name"] = np.array([names[i] for i in r["name"]] + [None], dtype=object)[:-1]
            for f in ("device", "calls", "total_ns", "min_ns", "max_ns", "bytes", "grid", "block",
                      "registers", "shared_mem"):
                out[f] = r[f]
            out["category"] = [KERNEL_CATEGORIES.get(int(c), "compute") for c in r["category"]]
            from .occupancy import annotate_kernels

            annotate_kernels(out, self._device_props or [])
            self._kernels = out
        return self._kernels

    def gpu_events(self) -> np.ndarray:
        g = self._raw["gpu"]
        out = np.zeros(len(g), dtype=GPU_EVENTS_DTYPE)
        if len(g) == 0:
            return out
        kern = self.kernels()
        ops = self.ops()
        krow = g["kernel_row"].astype(np.int64)
        has_k = krow < len(kern)
        kernel_names = np.array(list(kern["name"]) + ["<device memory>"], dtype=object)
        kernel_cats = np.array(list(kern["category"]) + ["memory"], dtype=object)
        idx = np.where(has_k, krow, len(kern))
        out["name"] = kernel_names[idx]
        out["category"] = kernel_cats[idx].astype("U13")
        out["kind"] = [GPU_KINDS.get(int(k), "?") for k in g["kind"]]
        for f in ("start_ns", "end_ns", "device", "stream", "correlation", "node", "thread",
                  "bytes",
                  "address", "grid", "block", "registers", "shared_mem", "graph_id"):
            out[f] = g[f]
        out["op"] = g["op_row"]
        op_names = np.array(
            [_display_name(n, f, ln, k) for n, f, ln, k in
             zip(ops["name"], ops["file"], ops["line"], ops["kind"])] + [None], dtype=object)
        out["op_name"] = op_names[np.where(g["op_row"] >= 0, g["op_row"], len(ops))]
        out["blocked_thread"] = (g["flags"] & 2) != 0
        return out

    def call_tree(self) -> np.ndarray:
        n = self._raw["nodes"]
        ops = self.ops()
        out = np.zeros(len(n), dtype=CALL_TREE_DTYPE)
        for f in ("id", "parent", "thread", "calls", "total_ns", "self_ns", "cuda_total_ns",
                  "cuda_self_ns"):
            out[f] = n[f]
        out["op"] = n["op_row"]
        names = np.array([_display_name(a, b, c, d) for a, b, c, d in
                          zip(ops["name"], ops["file"], ops["line"], ops["kind"])] + [None],
                         dtype=object)
        out["name"] = names[n["op_row"]] if len(n) else names[:0]
        return out


class Results:
    """Read-only view over one or more recorded windows."""

    def __init__(self, windows: list[dict], cuda: dict | None = None, meta: dict | None = None):
        if not windows:
            raise RuntimeError("no recorded window: the profiler has not completed a recording "
                               "window yet (check the schedule and call prof.step())")
        ref = weakref.ref(self)

        def device_props() -> list[dict]:
            # through a weak reference: no cycle keeps the windows alive, and with
            # them the events a CPU-only window holds until its spans are built
            res = ref()
            return res._device_props() if res is not None else []

        self._windows = [_Window(w, device_props) for w in windows]
        self.cuda = cuda or {"active": False, "mode": "off", "error": None}
        self.meta = dict(meta or {})

    def _device_props(self) -> list[dict]:
        """Device properties for occupancy: saved with the results, else the live
        devices' when GPU capture was on (a CPU-only run never touches CUDA)."""
        props = self.meta.get("device_properties")
        if props is None:
            from .occupancy import live_device_props

            props = live_device_props() if self.cuda.get("active") else []
        return props

    # -- scalars ---------------------------------------------------------------
    @property
    def dropped_events(self) -> int:
        """CPU events lost because the event buffer was full (raise max_events)."""
        return int(sum(w._raw["dropped_events"] for w in self._windows))

    @property
    def dropped_gpu_records(self) -> int:
        """GPU activity records lost by CUPTI or gpuprof."""
        return int(max(w._raw["dropped_gpu"] for w in self._windows))

    @property
    def windows(self) -> list[dict]:
        return [w.raw for w in self._windows]

    def window_bounds(self) -> tuple[int, int]:
        return (int(self._windows[0]._raw["window_start_ns"]),
                int(self._windows[-1]._raw["window_end_ns"]))

    @property
    def attributed_gpu_fraction(self) -> float:
        a = sum(w._raw["attributed_gpu_ns"] for w in self._windows)
        u = sum(w._raw["unattributed_gpu_ns"] for w in self._windows)
        return a / (a + u) if a + u else 1.0

    # -- arrays ---------------------------------------------------------------------
    def ops(self) -> np.ndarray:
        if len(self._windows) == 1:
            return self._windows[0].ops()
        return _merge_rows([w.ops() for w in self._windows], ("name", "file", "line", "kind"),
                           mins=("cpu_min_ns",), maxs=("cpu_max_ns",))

    def kernels(self) -> np.ndarray:
        if len(self._windows) == 1:
            return self._windows[0].kernels()
        return _merge_rows([w.kernels() for w in self._windows], ("name", "device"),
                           mins=("min_ns",), maxs=("max_ns",),
                           keep=("grid", "block", "registers", "shared_mem", "category",
                                 "occupancy", "occupancy_limiter", "blocks_per_sm"))

    def gpu_events(self) -> np.ndarray:
        parts = [w.gpu_events() for w in self._windows]
        if len(parts) == 1:
            return parts[0]
        out = np.concatenate(parts)
        out["op"] = -1  # row indices are per window; op_name stays valid
        return out

    def steps(self) -> np.ndarray:
        return np.concatenate([w._raw["steps"] for w in self._windows])

    def call_tree(self) -> np.ndarray:
        if len(self._windows) == 1:
            return self._windows[0].call_tree()
        raise NotImplementedError("call_tree() of accumulated windows: read prof.windows[i]")

    def spans(self) -> np.ndarray:
        """Every call, range and CUDA API call of the last window (for traces)."""
        return self._windows[-1].raw["spans"]

    def threads(self) -> np.ndarray:
        return self._windows[-1]._raw["threads"]

    def thread_names(self) -> dict[int, str]:
        names = {t.ident: t.name for t in threading.enumerate()}
        return {int(t["ident"]): names.get(int(t["ident"]), f"thread {i}")
                for i, t in enumerate(self.threads())}


def _merge_rows(parts: list[np.ndarray], key: tuple[str, ...], mins=(), maxs=(), keep=()):
    """Sum numeric fields of rows with equal keys across windows."""
    out: dict[tuple, np.void] = {}
    order: list[tuple] = []
    dtype = parts[0].dtype
    for arr in parts:
        for row in arr:
            k = tuple(row[f] for f in key)
            if k not in out:
                out[k] = row.copy()
                order.append(k)
                continue
            acc = out[k]
            for f in dtype.names:
                if f in key or f in keep:
                    continue
                if f in mins:
                    acc[f] = min(acc[f], row[f])
                elif f in maxs:
                    acc[f] = max(acc[f], row[f])
                elif dtype[f].kind in "iuf":
                    acc[f] = acc[f] + row[f]
    res = np.zeros(len(order), dtype=dtype)
    for i, k in enumerate(order):
        res[i] = out[k]
    return res
