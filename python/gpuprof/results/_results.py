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
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from .. import _gpuprof
from ..core._constants import (
    GF_BLOCKED_THREAD,
    GF_ROLLED_UP,
    GPU_KINDS,
    GPU_WORK,
    KERNEL_CATEGORIES,
    OP_CFUNC,
    OP_KINDS,
    OPF_WAIT,
    SF_ENTERED,
)
from ..core._constants import GPU_SYNC as GPU_KIND_SYNC
from ._keys import OP_KEY
from ._meta import RecordingMeta

__all__ = ["Results", "OP_KINDS", "KERNEL_CATEGORIES", "GPU_KINDS", "complete_window"]


OPS_DTYPE = np.dtype(
    [
        ("name", object),
        ("file", object),
        ("line", "i4"),
        ("kind", "U8"),
        ("calls", "i8"),
        ("cpu_total_ns", "i8"),
        ("cpu_self_ns", "i8"),
        ("cpu_min_ns", "i8"),
        ("cpu_max_ns", "i8"),
        ("cuda_total_ns", "i8"),
        ("cuda_self_ns", "i8"),
        ("kernels", "i8"),
        ("cuda_mem_self_bytes", "i8"),
        ("cpu_mem_self_bytes", "i8"),
        # the backward pass joined to the forward (docs/backward.md): GPU time of the
        # autograd nodes this op made while innermost, and under its outermost calls
        ("bwd_cuda_self_ns", "i8"),
        ("bwd_cuda_total_ns", "i8"),
        # GPU time launched under its outermost calls on their thread, plus the
        # backward GPU time of the nodes made there: forward and backward together
        ("fwd_bwd_cuda_ns", "i8"),
        # a C function that blocks its thread (time.sleep, a lock's acquire, a poll):
        # its time is waiting, which the tables leave out unless key_averages(idle=True)
        ("idle", "?"),
        # an ATen op's input sizes as PyTorch wrote them (record_shapes=True), "" for
        # every other row: one row per op and shapes (docs/aten.md)
        ("input_shapes", object),
        # floating-point operations of its calls, counted where the op ran them
        # (from the input shapes: record_shapes=True or with_flops=True; 0 elsewhere;
        # docs/flops.md)
        ("flops", "i8"),
    ]
)

KERNELS_DTYPE = np.dtype(
    [
        ("name", object),
        ("device", "i4"),
        ("calls", "i8"),
        ("total_ns", "i8"),
        ("min_ns", "i8"),
        ("max_ns", "i8"),
        ("bytes", "i8"),
        ("grid", "u4", (3,)),
        ("block", "u4", (3,)),
        ("registers", "u4"),
        ("shared_mem", "u4"),
        ("category", "U13"),
        # theoretical occupancy (gpuprof.occupancy): 0..1, NaN when unknown
        ("occupancy", "f4"),
        ("occupancy_limiter", "U13"),
        ("blocks_per_sm", "i4"),
    ]
)

GPU_EVENTS_DTYPE = np.dtype(
    [
        ("name", object),
        ("kind", "U6"),
        ("category", "U13"),
        ("start_ns", "i8"),
        ("end_ns", "i8"),
        ("device", "i4"),
        ("stream", "u4"),
        ("correlation", "u4"),
        ("op", "i4"),
        ("op_name", object),
        ("node", "i4"),
        ("thread", "i4"),
        ("bytes", "i8"),
        ("address", "i8"),
        ("grid", "u4", (3,)),
        ("block", "u4", (3,)),
        ("registers", "u4"),
        ("shared_mem", "u4"),
        ("graph_id", "u4"),
        ("blocked_thread", "?"),
        ("rolled_up", "?"),
        # backward work: the forward call that made the autograd node that launched it
        # (call-tree node and op row, -1 elsewhere; docs/backward.md)
        ("fwd_node", "i4"),
        ("fwd_op", "i4"),
        ("fwd_op_name", object),
    ]
)

# What Python adds to C's step rows (csrc/results/arrays.c declares the rest)
STEP_FIELDS_ADDED = [
    # FLOPs of the ATen calls that began in the step (record_shapes=True; docs/flops.md)
    ("flops", "i8"),
    # those FLOPs over the step's wall time, against the dense peak of the precision
    # that carries most of the window's FLOPs (0..1; NaN: no FLOPs or no known peak)
    ("mfu", "f8"),
]

CALL_TREE_DTYPE = np.dtype(
    [
        ("id", "i4"),
        ("parent", "i4"),
        ("op", "i4"),
        ("name", object),
        ("thread", "i4"),
        ("calls", "i8"),
        ("total_ns", "i8"),
        ("self_ns", "i8"),
        ("cuda_total_ns", "i8"),
        ("cuda_self_ns", "i8"),
        # backward GPU time of the autograd nodes made while this node was innermost,
        # and in its subtree (docs/backward.md)
        ("bwd_cuda_self_ns", "i8"),
        ("bwd_cuda_total_ns", "i8"),
        # floating-point operations of its calls (ATen ops, from their input shapes:
        # record_shapes=True or with_flops=True; 0 elsewhere; docs/flops.md)
        ("flops", "i8"),
    ]
)


def pass_through(
    out: np.ndarray,
    raw: np.ndarray,
    skip: tuple[str, ...] = (),
    rename: dict[str, str] | None = None,
) -> None:
    """Copy into the public array ``out`` every field it shares with the C array
    ``raw`` (its dtype comes from csrc/results/arrays.c), ``rename`` mapping a public
    name to C's: each field is named once on each side, and the public dtype above
    declares only what Python adds or converts (names, kinds as text, joins)."""
    have = set(raw.dtype.names or ())
    for f in out.dtype.names or ():
        src = (rename or {}).get(f, f)
        if f not in skip and src in have:
            out[f] = raw[src]


def subtree_sums(parent: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Per tree node: ``own`` summed over the node and its descendants. Nodes are
    numbered parents first (a node is created when its path is first entered)."""
    total = own.astype(np.int64).copy()
    parent = parent.astype(np.int64)
    for i in range(len(total) - 1, -1, -1):
        if parent[i] >= 0:
            total[parent[i]] += total[i]
    return total


def outermost(parent: np.ndarray, key: np.ndarray | Sequence[Hashable]) -> np.ndarray:
    """Per tree node: True when no ancestor has the same key (its total time or
    memory is not already inside an enclosing node of that key: recursion)."""
    n = len(parent)
    out = np.ones(n, dtype=bool)
    children: dict[int, list[int]] = {}
    roots: list[int] = []
    for i in range(n):
        p = int(parent[i])
        (roots if p < 0 else children.setdefault(p, [])).append(i)
    on_path: dict[Any, int] = {}
    stack = [(r, False) for r in reversed(roots)]
    while stack:
        i, leaving = stack.pop()
        k = key[i]
        if leaving:
            on_path[k] -= 1
            continue
        if on_path.get(k, 0):
            out[i] = False
        on_path[k] = on_path.get(k, 0) + 1
        stack.append((i, True))
        stack.extend((c, False) for c in reversed(children.get(i, ())))
    return out


# ``raw`` with its ``spans``, returned: a CPU-only window builds them from its
# kept events the first time they are needed (traces, the diagnosis, memory
# attribution, saving), which also gives the events' memory back; the tables
# never need them.
complete_window = _gpuprof._complete_window


def display_name(name: str, file: str, line: int, kind: str) -> str:
    if kind == "python":
        return f"{name} ({os.path.basename(file)}:{line})"
    return name


class _Window:
    """One window's raw dict plus the public arrays built from it (lazily)."""

    def __init__(
        self,
        raw: dict[str, Any],
        device_props: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self._raw = raw  # spans may still be missing: use .raw for them
        self._device_props = device_props  # callable -> device_props() list, for occupancy
        self._ops: np.ndarray | None = None
        self._kernels: np.ndarray | None = None
        self._op_names: np.ndarray | None = None  # _op_display_names()
        self._backward: Any = None  # _backward.join(), when it applies
        self._flops: tuple[np.ndarray | None] | None = None  # (node_flops(),) once counted

    @property
    def raw(self) -> dict[str, Any]:
        """The window's dict, spans included (built now if they were not yet)."""
        return complete_window(self._raw)

    def ops(self) -> np.ndarray:
        if self._ops is None:
            r = self._raw["ops"]
            out = np.zeros(len(r), dtype=OPS_DTYPE)
            out["name"] = np.array(self._raw["op_names"] + [None], dtype=object)[:-1]
            out["file"] = np.array(self._raw["op_files"] + [None], dtype=object)[:-1]
            out["line"] = self._raw["op_lines"]
            out["input_shapes"] = self._raw.get("op_shapes") or ""  # (C adds it with shapes)
            out["kind"] = [OP_KINDS.get(int(k), "none") for k in r["kind"]]
            pass_through(out, r, skip=("kind",))
            out["idle"] = (r["kind"] == OP_CFUNC) & ((r["flags"] & OPF_WAIT) != 0)
            bwd_self = self.node_backward_ns()
            if bwd_self is not None:
                tree = self._raw["nodes"]
                rows = tree["op_row"].astype(np.int64)
                np.add.at(out["bwd_cuda_self_ns"], rows, bwd_self)
                outer = outermost(tree["parent"], rows)
                sub = subtree_sums(tree["parent"], bwd_self)
                np.add.at(out["bwd_cuda_total_ns"], rows[outer], sub[outer])
                both = subtree_sums(tree["parent"], tree["cuda_self_ns"] + bwd_self)
                np.add.at(out["fwd_bwd_cuda_ns"], rows[outer], both[outer])
            flops = self.node_flops()
            if flops is not None:
                np.add.at(out["flops"], self._raw["nodes"]["op_row"].astype(np.int64), flops)
            self._ops = out
        return self._ops

    def kernels(self) -> np.ndarray:
        if self._kernels is None:
            r = self._raw["kernels"]
            names = self._raw["kernel_names"]
            out = np.zeros(len(r), dtype=KERNELS_DTYPE)
            out["name"] = np.array([names[i] for i in r["name"]] + [None], dtype=object)[:-1]
            pass_through(out, r, skip=("name", "category"))
            out["category"] = [KERNEL_CATEGORIES.get(int(c), "compute") for c in r["category"]]
            from .occupancy import annotate_kernels

            annotate_kernels(out, self._device_props or [])
            self._kernels = out
        return self._kernels

    def backward(self) -> Any:
        """The backward pass joined to the forward (:mod:`._backward`), or None for a
        window without autograd sequence numbers (no forward calls made nodes, the
        numbers were off, or a file from before them)."""
        if self._backward is None:
            seqs = self._raw.get("seqs")
            if seqs is None or not len(seqs) or not len(self._raw["gpu"]):
                return None
            from ._backward import join

            self._backward = join(self.raw)
        return self._backward

    def device_names(self) -> dict[int, str]:
        """The GPUs' names by device number, from the device properties (saved with
        the results, else the live devices'); {} when none are known."""
        props = self._device_props() if self._device_props is not None else []
        return {int(p["id"]): str(p["name"]) for p in props if "id" in p and "name" in p}

    def node_flops(self) -> np.ndarray | None:
        """Per call-tree node: the FLOPs of its calls (:mod:`._aten`), or None for a
        window whose ops carry no input sizes."""
        if self._flops is None:
            from ._aten import node_flops

            # with sizes, the spans join a convolution to its backward (_aten)
            shapes = self._raw.get("op_shapes")
            self._flops = (node_flops(self.raw if shapes and any(shapes) else self._raw),)
        return self._flops[0]

    def steps(self) -> np.ndarray:
        """The window's step rows (C's), with the FLOPs of the calls that began in
        each step, from their input sizes (0 without them; docs/flops.md)."""
        raw = self._raw["steps"]
        out = np.zeros(len(raw), dtype=np.dtype(raw.dtype.descr + STEP_FIELDS_ADDED))
        pass_through(out, raw)
        out["mfu"] = np.nan
        flops = self.node_flops()
        if flops is None or not len(raw) or not flops.any():
            return out
        spans = self.raw["spans"]
        nodes = self._raw["nodes"]
        counted = (spans["node"] >= 0) & (spans["node"] < len(nodes))
        node = spans["node"][counted].astype(np.int64)
        calls = np.maximum(nodes["calls"][node], 1)
        per_call = flops[node] // calls  # a node's calls share one op and one shape
        start = spans["start_ns"][counted]
        for j in range(len(raw)):
            inside = (start >= raw["start_ns"][j]) & (start < raw["end_ns"][j])
            out["flops"][j] = int(per_call[inside].sum())
        from ._mfu import OpPeaks, steps_mfu

        wall = np.maximum(out["end_ns"] - out["start_ns"], 1)
        peak = steps_mfu(self.ops(), OpPeaks([self]), int(wall.sum())).peak_tflops
        if peak:
            out["mfu"] = out["flops"] / wall / 1e3 / peak
        return out

    def modules(self) -> np.ndarray:
        """The modules table (:mod:`._module_rows`): one row per ``torch.nn.Module``
        instance that ran."""
        from ._mfu import OpPeaks, steps_mfu
        from ._module_rows import module_rows

        flops = self.node_flops()
        peak = None
        if flops is not None and flops.any():
            peak = steps_mfu(self.ops(), OpPeaks([self]), 1).peak_tflops
        return module_rows(self.raw, self.backward(), flops, peak)

    def node_backward_ns(self) -> np.ndarray | None:
        """Per call-tree node: the backward GPU time of the autograd nodes it made
        while innermost (None where :meth:`backward` is None)."""
        b = self.backward()
        if b is None:
            return None
        return b.node_self_ns(self._raw["gpu"], len(self._raw["nodes"]))

    def gpu_events(self) -> np.ndarray:
        g = self._raw["gpu"]
        out = np.zeros(len(g), dtype=GPU_EVENTS_DTYPE)
        if len(g) == 0:
            return out
        kern = self.kernels()
        krow = g["kernel_row"].astype(np.int64)
        has_k = krow < len(kern)
        kernel_names = np.array(list(kern["name"]) + ["<device memory>"], dtype=object)
        kernel_cats = np.array(list(kern["category"]) + ["memory"], dtype=object)
        idx = np.where(has_k, krow, len(kern))
        out["name"] = kernel_names[idx]
        out["category"] = kernel_cats[idx].astype("U13")
        codes = g["kind"].astype(np.intp)
        kinds = np.array([GPU_KINDS.get(i, "?") for i in range(int(codes.max()) + 1)])
        out["kind"] = kinds[codes]
        pass_through(out, g, skip=("kind",), rename={"op": "op_row"})
        out["op_name"] = self._op_display_names()[np.where(g["op_row"] >= 0, g["op_row"], -1)]
        out["blocked_thread"] = (g["flags"] & GF_BLOCKED_THREAD) != 0
        out["rolled_up"] = (g["flags"] & GF_ROLLED_UP) != 0
        out["fwd_node"] = out["fwd_op"] = -1
        b = self.backward()
        if b is not None:
            out["fwd_node"] = b.fwd_node
            has = b.fwd_node >= 0
            rows = self._raw["nodes"]["op_row"].astype(np.int64)
            out["fwd_op"][has] = rows[b.fwd_node[has]]
        out["fwd_op_name"] = self._op_display_names()[out["fwd_op"]]
        return out

    def context_rows(self) -> np.ndarray:
        """Per op row: True for a frame that was already running when the window
        opened and was never called or resumed inside it (the script's ``<module>``,
        a notebook's IPython frames, a test runner's): context, not a result."""
        ops = self.ops()
        spans = self.raw["spans"]
        entered = np.zeros(len(ops), dtype=bool)
        if len(spans):
            fresh = (spans["flags"] & SF_ENTERED) == 0  # entered before the window
            entered[spans["op_row"][fresh].astype(np.int64)] = True
        return (ops["calls"] == 0) & ~entered & (ops["kind"] == "python")

    def node_memory(self) -> tuple[np.ndarray, np.ndarray]:
        """Device bytes allocated minus freed per call-tree node: (while the node was
        innermost, in the node and everything below it), as C rolled them up."""
        nodes = self._raw["nodes"]
        return nodes["cuda_mem_self_bytes"], nodes["cuda_mem_total_bytes"]

    def call_tree(self) -> np.ndarray:
        n = self._raw["nodes"]
        out = np.zeros(len(n), dtype=CALL_TREE_DTYPE)
        pass_through(out, n, rename={"op": "op_row"})
        out["name"] = self._op_display_names()[n["op_row"]] if len(n) else None
        bwd = self.node_backward_ns()
        if bwd is not None:
            out["bwd_cuda_self_ns"] = bwd
            out["bwd_cuda_total_ns"] = subtree_sums(n["parent"], bwd)
        flops = self.node_flops()
        if flops is not None:
            out["flops"] = flops
        return out

    def _op_display_names(self) -> np.ndarray:
        """Each op row's name as the tables show it ("name (file:line)" for Python
        functions), then None (index -1: no op)."""
        if self._op_names is None:
            ops = self.ops()
            rows = zip(ops["name"], ops["file"], ops["line"], ops["kind"])
            self._op_names = np.array(
                [display_name(n, f, ln, k) for n, f, ln, k in rows] + [None], dtype=object
            )
        return self._op_names


class _DevicePropsOf:
    """``results._device_props`` for its windows, through a weak reference: no cycle
    keeps the windows alive, and with them the events a CPU-only window holds until
    its spans are built. Pickles (Lightning's ddp_spawn pickles the profiler with its
    results); the unpickled Results binds its windows to itself again."""

    def __init__(self, results: Results) -> None:
        self._ref = weakref.ref(results)

    def __call__(self) -> list[dict[str, Any]]:
        res = self._ref()
        return res._device_props() if res is not None else []

    def __reduce__(self) -> tuple[Callable[[], list[dict[str, Any]]], tuple[()]]:
        return (_no_device_props, ())


def _no_device_props() -> list[dict[str, Any]]:
    return []


class Results:
    """Read-only view over one or more recorded windows."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("subprocesses", None)  # pickled before it was set here
        props = _DevicePropsOf(self)
        for w in self._windows:
            w._device_props = props

    def __init__(
        self,
        windows: list[dict[str, Any]],
        cuda: dict[str, Any] | None = None,
        meta: RecordingMeta | Mapping[str, Any] | None = None,
    ) -> None:
        if not windows:
            raise RuntimeError(
                "no recorded window: the profiler has not completed a recording "
                "window yet (check the schedule and call prof.step())"
            )
        props = _DevicePropsOf(self)
        self._windows = [_Window(w, props) for w in windows]
        self.cuda = cuda or {"active": False, "mode": "off", "error": None}
        self.meta = RecordingMeta.of(meta)
        # host and allocator memory samples (profile_memory=True): the live sampler
        # (gpuprof.record._host_sampler.HostSampler) or the saved ones (SampleSnapshot)
        self.memory_samples: Any = None
        # the child processes (subprocesses=True): one gpuprof.processes.ProcessData
        # per child, [] when none was recorded; None when they were not profiled
        self.subprocesses: list[Any] | None = None

    def _device_props(self) -> list[dict[str, Any]]:
        """Device properties for occupancy: saved with the results, else the live
        devices' when GPU capture was on (a CPU-only run never touches CUDA)."""
        props = self.meta.device_properties
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
    def windows(self) -> list[dict[str, Any]]:
        return [w.raw for w in self._windows]

    def raw_windows(self) -> list[dict[str, Any]]:
        """The windows' dicts as they are: a CPU-only window's spans not built yet (the
        parts that add keys to them use this: :attr:`windows` builds the spans)."""
        return [w._raw for w in self._windows]

    def window_bounds(self) -> tuple[int, int]:
        return (
            int(self._windows[0]._raw["window_start_ns"]),
            int(self._windows[-1]._raw["window_end_ns"]),
        )

    @property
    def attributed_gpu_fraction(self) -> float:
        a = sum(w._raw["attributed_gpu_ns"] for w in self._windows)
        u = sum(w._raw["unattributed_gpu_ns"] for w in self._windows)
        return a / (a + u) if a + u else 1.0

    @property
    def launched_before_window_ns(self) -> int:
        """GPU time (ns) of the activity that ran in a window but was launched before it
        began: a GPU that runs behind the host is still busy with the launches of the
        steps before the window. It has no Python op (its launch was not recorded);
        CUPTI's correlation ids grow, so it is the unattributed activity whose id is
        below every attributed one of the window."""
        total = 0
        for w in self._windows:
            g = w._raw["gpu"]
            own = g["op_row"] >= 0
            if not own.any():
                continue
            early = (
                ~own
                & (g["correlation"] != 0)
                & (g["correlation"] < g["correlation"][own].min())
                & (g["kind"] != GPU_KIND_SYNC)
            )
            total += int((g["end_ns"][early] - g["start_ns"][early]).sum())
        return total

    # -- arrays ---------------------------------------------------------------------
    def ops(self) -> np.ndarray:
        if len(self._windows) == 1:
            return self._windows[0].ops()
        return merge_rows(
            [w.ops() for w in self._windows],
            OP_KEY,
            mins=("cpu_min_ns",),
            maxs=("cpu_max_ns",),
        )

    def kernels(self) -> np.ndarray:
        if len(self._windows) == 1:
            return self._windows[0].kernels()
        return merge_rows(
            [w.kernels() for w in self._windows],
            ("name", "device"),
            mins=("min_ns",),
            maxs=("max_ns",),
            keep=(
                "grid",
                "block",
                "registers",
                "shared_mem",
                "category",
                "occupancy",
                "occupancy_limiter",
                "blocks_per_sm",
            ),
        )

    def _per_op(
        self,
        per_window: Callable[[_Window], np.ndarray],
        combine: Callable[[Any, Any], Any],
    ) -> np.ndarray:
        """A per-op-row value of every window (``per_window(window)``), merged like
        ``ops()`` merges rows (by name, file, line and kind) with ``combine``."""
        if len(self._windows) == 1:
            return per_window(self._windows[0])
        ops = self.ops()
        index = {k: i for i, k in enumerate(zip(*(ops[f] for f in OP_KEY)))}
        out: np.ndarray | None = None
        seen = np.zeros(len(ops), dtype=bool)
        for w in self._windows:
            wops = w.ops()
            vals = per_window(w)
            if out is None:
                out = np.zeros(len(ops), dtype=vals.dtype)
            for k, v in zip(zip(*(wops[f] for f in OP_KEY)), vals):
                i = index.get(k)
                if i is None:  # a row the caller's ops() left out
                    continue
                out[i] = combine(out[i], v) if seen[i] else v
                seen[i] = True
        return out  # type: ignore[return-value]  # None only for no windows, which never are

    def context_rows(self) -> np.ndarray:
        """Per row of ``ops()``: True for frames that were already running when
        recording began and were never entered inside the window (in every window):
        they are context, not results, and ``key_averages()`` leaves them out."""
        return self._per_op(_Window.context_rows, lambda a, b: a and b)

    def top_level_rows(self) -> np.ndarray:
        """Per row of ``ops()``: True when some call of it had no caller inside the
        window (its parent is a thread's root or a frame that was already running)."""

        def top(w: _Window) -> np.ndarray:
            tree = w.raw["nodes"]
            ctx = w.context_rows()
            rows = tree["op_row"].astype(np.int64)
            parent = tree["parent"].astype(np.int64)
            is_top = (parent < 0) | ctx[rows[np.maximum(parent, 0)]]
            is_top &= ~ctx[rows]
            out = np.zeros(len(ctx), dtype=bool)
            out[rows[is_top]] = True
            return out

        return self._per_op(top, lambda a, b: a or b)

    def node_memory(self) -> tuple[np.ndarray, np.ndarray]:
        """Per row of ``call_tree()``: device bytes allocated minus freed while the node
        was innermost, and in its whole subtree."""
        if len(self._windows) == 1:
            return self._windows[0].node_memory()
        raise NotImplementedError("node_memory() of accumulated windows: read prof.windows[i]")

    def op_memory(self) -> tuple[np.ndarray, np.ndarray]:
        """Per row of ``ops()``: (device bytes allocated minus freed under the op, each
        outermost call counted once; the same on the host, which gpuprof does not
        measure per op and leaves at 0)."""

        def cuda_total(w: _Window) -> np.ndarray:
            return w._raw["ops"]["cuda_mem_total_bytes"].astype(np.int64)

        cuda = self._per_op(cuda_total, lambda a, b: a + b)
        return cuda, np.zeros(len(cuda), dtype=np.int64)

    def op_idle_ns(self) -> np.ndarray:
        """Per row of ``ops()``: the time its outermost calls spent waiting, in the
        ``idle`` ops below them (all of an idle op's own time). ``cpu_total_ns`` less
        this is the time the op computed; read from the call tree."""

        def below(w: _Window) -> np.ndarray:
            tree = w._raw["nodes"]
            idle = w.ops()["idle"]
            out = np.zeros(len(idle), dtype=np.int64)
            if not len(tree) or not idle.any():
                return out
            rows = tree["op_row"].astype(np.int64)
            own = np.where(idle[rows], tree["self_ns"], 0).astype(np.int64)
            if not own.any():
                return out
            sub = subtree_sums(tree["parent"], own)
            outer = outermost(tree["parent"], rows)
            np.add.at(out, rows[outer], sub[outer])
            return out

        return self._per_op(below, lambda a, b: a + b)

    def idle_thread_idents(self) -> set[int]:
        """The threads (by ident) that spent time waiting in an ``idle`` op."""
        out: set[int] = set()
        for w in self._windows:
            tree = w._raw["nodes"]
            if not len(tree):
                continue
            waited = w.ops()["idle"][tree["op_row"].astype(np.int64)] & (tree["self_ns"] > 0)
            idents = w._raw["threads"]["ident"]
            out.update(int(idents[t]) for t in np.unique(tree["thread"][waited]).tolist())
        return out

    def modules(self) -> np.ndarray:
        """One row per ``torch.nn.Module`` instance that ran (docs/backward.md,
        "Modules"); with several windows, rows of one name are summed (the nesting and
        the shares are the first window's, the times of all)."""
        parts = [w.modules() for w in self._windows]
        if len(parts) == 1:
            return parts[0]
        out = merge_rows(parts, ("name", "cls"), keep=("parent", "depth", "share"))
        total = self.gpu_work_ns()
        if total:
            out["share"] = (out["cuda_fwd_ns"] + out["cuda_bwd_ns"]) / total
        first = parts[0]
        rows = {n: i for i, n in enumerate(out["name"].tolist())}
        out["parent"] = [
            rows.get(first["name"][p], -1) if 0 <= p < len(first) else -1
            for p in out["parent"].tolist()
        ]
        return out

    def gpu_work_ns(self) -> int:
        """GPU time of the kernels, copies and sets of every window (what Self CUDA
        counts)."""
        total = 0
        for w in self._windows:
            g = w._raw["gpu"]
            if len(g):
                work = np.isin(g["kind"], GPU_WORK)
                total += int((g["end_ns"][work] - g["start_ns"][work]).sum())
        return total

    def backward_summary(self) -> dict[str, Any]:
        """Backward GPU time (kernels, copies, sets) launched in autograd nodes
        (``node_ns``), the part joined to the forward call that made its node
        (``joined_ns``), and the rest by node name (``unjoined_ns``); zeros where
        no window has the join (docs/backward.md)."""
        out: dict[str, Any] = {"node_ns": 0, "joined_ns": 0, "unjoined_ns": {}}
        for w in self._windows:
            b = w.backward()
            if b is None:
                continue
            s = b.summary(w.raw["gpu"], w.raw["op_names"], w.raw["spans"])
            out["node_ns"] += s["node_ns"]
            out["joined_ns"] += s["joined_ns"]
            for k, v in s["unjoined_ns"].items():
                out["unjoined_ns"][k] = out["unjoined_ns"].get(k, 0) + v
        out["unjoined_ns"] = dict(sorted(out["unjoined_ns"].items(), key=lambda kv: -kv[1]))
        return out

    def gpu_events(self) -> np.ndarray:
        parts = [w.gpu_events() for w in self._windows]
        if len(parts) == 1:
            return parts[0]
        out = np.concatenate(parts)
        out["op"] = -1  # row indices are per window; op_name stays valid
        return out

    def steps(self) -> np.ndarray:
        return np.concatenate([w.steps() for w in self._windows])

    def call_tree(self) -> np.ndarray:
        if len(self._windows) == 1:
            return self._windows[0].call_tree()
        raise NotImplementedError("call_tree() of accumulated windows: read prof.windows[i]")

    @property
    def window_count(self) -> int:
        """How many recorded windows these results hold."""
        return len(self._windows)

    def window(self, i: int = -1) -> _Window:
        """Window ``i``'s arrays alone (``ops()``, ``kernels()``, ``gpu_events()``,
        ``raw``...), for the analyses that work window by window."""
        return self._windows[i]

    def window_ops(self, i: int = -1) -> np.ndarray:
        """The ops() rows of window ``i`` alone (what its spans' ``op_row`` index)."""
        return self._windows[i].ops()

    def window_gpu_events(self, i: int = -1) -> np.ndarray:
        """The gpu_events() rows of window ``i`` alone."""
        return self._windows[i].gpu_events()

    def spans(self) -> np.ndarray:
        """Every call, range and CUDA API call of the last window (for traces)."""
        return self._windows[-1].raw["spans"]

    def threads(self) -> np.ndarray:
        return self._windows[-1]._raw["threads"]

    def thread_row_names(self, window: dict[str, Any] | None = None) -> list[str]:
        """One name per thread row of ``window`` (a raw window dict; default the
        last), as the trace and the report show them: the name the profile kept for
        that OS thread (taken when the thread ended, or when profiling started or
        stopped), else a saved profile's name for its ident, else (in a live profile)
        the name of the running thread of that ident, else ``thread N`` (N the row)."""
        threads = self.threads() if window is None else window["threads"]
        by_tid = {int(k): v for k, v in (self.meta.thread_names_by_tid or {}).items()}
        by_ident = {int(k): v for k, v in (self.meta.thread_names or {}).items()}
        # a saved profile's threads are not this process's
        saved = self.meta.thread_names is not None
        running = {} if saved else {t.ident: t.name for t in threading.enumerate()}
        return [
            by_tid.get(tid) or by_ident.get(ident) or running.get(ident) or f"thread {i}"
            for i, (ident, tid) in enumerate(
                zip(threads["ident"].tolist(), threads["os_tid"].tolist(), strict=True)
            )
        ]

    def thread_names(self) -> dict[int, str]:
        """ident (``threading.get_ident()``) -> name of the last window's threads (see
        :meth:`thread_row_names`). The system gives an ended thread's ident to the
        next thread, so threads that ran one after the other may share an ident: the
        later one's name is given; ``thread_row_names()`` has one per row."""
        idents = self.threads()["ident"].tolist()
        return dict(zip(idents, self.thread_row_names(), strict=True))


def merge_rows(
    parts: list[np.ndarray],
    key: tuple[str, ...],
    mins: Collection[str] = (),
    maxs: Collection[str] = (),
    keep: Collection[str] = (),
) -> np.ndarray:
    """One row per distinct ``key`` over the rows of ``parts`` (arrays of one dtype), in
    order of first appearance: numeric fields summed, ``mins`` and ``maxs`` the least and
    the greatest, ``keep`` and the key fields as the first row with that key has them."""
    rows = np.concatenate(parts) if len(parts) != 1 else parts[0]
    ids: dict[tuple[Any, ...], int] = {}
    group = np.fromiter(
        (ids.setdefault(k, len(ids)) for k in zip(*(rows[f].tolist() for f in key))),
        dtype=np.int64,
        count=len(rows),
    )
    first = np.full(len(ids), len(rows), dtype=np.int64)
    np.minimum.at(first, group, np.arange(len(rows)))
    out = rows[first].copy()
    combine: np.ufunc
    for f in rows.dtype.names or ():
        if f in key or f in keep or rows.dtype[f].kind not in "iuf":
            continue
        if f in mins or f in maxs:
            acc, combine = rows[f][first], np.minimum if f in mins else np.maximum
        else:
            acc, combine = np.zeros_like(out[f]), np.add
        combine.at(acc, group, rows[f])
        out[f] = acc
    return out
