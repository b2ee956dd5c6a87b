"""Chrome trace export: one recorded window as Kineto-compatible trace JSON,
with the child processes profiled in that window as their own process lanes.

The events are formatted in C (``_gpuprof._write_trace``, csrc/trace/trace_json.c);
this module prepares what C cannot know: display names, thread names, the
metadata keys before ``traceEvents``, and gzip for ``.gz`` paths. The schema
and what each track means are described in docs/traces.md.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import sys

import numpy as np

from .. import _gpuprof
from .._version import __version__
from ..core._constants import GPU_FREE as _GPU_FREE
from ..core._constants import GPU_MALLOC as _GPU_MALLOC
from ..core._constants import OP_CFUNC as _OP_CFUNC
from ..core._constants import OP_PYTHON as _OP_PYTHON
from ..core._constants import OP_STEP as _OP_STEP
from ..core._output import atomic_output, check_output_path, reraise_os_error
from ..core._paths import display_files
from ..core._ranks import distributed_info as _distributed_info
from ._trace_meta import TraceMeta

__all__ = [
    "atomic_output",
    "check_output_path",
    "export_chrome_trace",
    "reraise_os_error",
    "trace_budget",
    "trace_names",
]

_GZIP_LEVEL = 6  # ~the size of level 9 at a fraction of its time


def builtin_name(name: str) -> str:
    """A C function's name in the form Python and torch.profiler print."""
    owner, dot, meth = name.rpartition(".")
    if not dot or owner in sys.modules:
        return f"<built-in function {name}>"
    return f"<built-in method {meth} of {owner} object>"


def trace_names(window: dict, files: list | None = None) -> list[str]:
    """Display name per op row: ``file(line): qualname`` for Python functions (the file
    relative to its import root: ``files``, default ``display_files(window["op_files"])``),
    the builtin form for C functions, the label or API name otherwise."""
    out = []
    kinds = window["ops"]["kind"].tolist()
    files = display_files(window["op_files"]) if files is None else files
    for kind, name, file, line in zip(
        kinds, window["op_names"], files, window["op_lines"], strict=True
    ):
        if kind == _OP_PYTHON:
            out.append(f"{file}({line}): {name}")
        elif kind == _OP_CFUNC:
            out.append(builtin_name(name))
        else:
            out.append(name)
    return out


def program_name() -> str:
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    return os.path.basename(argv0) or "python"


def distributed_info() -> dict:
    """Rank metadata: torch.distributed when it is initialised (never imported
    here), else torchrun's RANK/WORLD_SIZE, else a single process."""
    # -- distributed (gpuprof.core._ranks): also pg_count, pg_config, nccl_version --
    return _distributed_info()


def device_properties(results) -> list[dict]:
    """deviceProperties entries: saved with the results, else asked of the
    driver only when GPU capture was on (a CPU-only export never touches CUDA)."""
    props = results.meta.device_properties
    if props is None:
        props = _gpuprof.device_props() if results.cuda.get("active") else []
    out = []
    for p in props:
        p = dict(p)
        p.setdefault("maxSharedMemoryPerMultiProcessor", p.get("sharedMemPerMultiprocessor", 0))
        out.append(p)
    return out


def _header(results, window: dict, props: list[dict], thinned: dict | None = None) -> str:
    keys = {
        "schemaVersion": 1,
        "deviceProperties": props,
        "distributedInfo": results.meta.distributed_info or distributed_info(),
        "gpuprof_version": __version__,
    }
    if thinned:
        keys.update(thinned)
    if results.meta.with_stack:
        keys["with_stack"] = 1
    if results.meta.profile_memory:
        keys["profile_memory"] = 1
    keys["displayTimeUnit"] = "ms"
    keys["baseTimeNanoseconds"] = int(window["window_start_ns"]) + int(window["epoch_offset_ns"])
    # json.dumps' default separators put a space after every colon, which HTA's
    # rank lookup in distributedInfo needs.
    fields = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in keys.items()]
    # prof.add_metadata()/add_metadata_json(): JSON text already, as torch writes them
    for k, text in results.meta.trace_metadata.items():
        if k in keys or k == "traceEvents":
            raise ValueError(
                f"add_metadata(): key {k!r} is one gpuprof writes itself in the "
                f"trace; use another key"
            )
        fields.append(f"{json.dumps(k)}: {text}")
    return ",\n  ".join(fields)


def _thread_names(results, window: dict) -> list[str]:
    return results.thread_row_names(window)  # kept past each thread's end (gpuprof.record._threads)


def trace_meta(results, window: dict, trace_name: str, thinned: dict | None = None) -> TraceMeta:
    """The ``meta`` argument of ``_gpuprof._write_trace`` for one window; ``thinned``:
    header keys saying which calls were left out (see :func:`export_chrome_trace`)."""
    props = device_properties(results)
    n_dev = max((int(p.get("id", i)) for i, p in enumerate(props)), default=-1) + 1
    sm_counts, warp_sizes = [0] * n_dev, [0] * n_dev
    for i, p in enumerate(props):
        d = int(p.get("id", i))
        sm_counts[d] = int(p.get("numSms", 0))
        warp_sizes[d] = int(p.get("warpSize", 0))
    kernel_names = window["kernel_names"]
    files = display_files(window["op_files"])
    return TraceMeta(
        header=_header(results, window, props, thinned),
        trace_name=trace_name,
        pid=int(results.meta.pid or os.getpid()),
        process_name=results.meta.process_name or program_name(),
        names=trace_names(window, files),
        files=files,
        kernel_names=[kernel_names[i] for i in window["kernels"]["name"].tolist()],
        thread_names=_thread_names(results, window),
        sm_counts=sm_counts,
        warp_sizes=warp_sizes,
    )


_FLOW_DTYPE = np.dtype(
    [("from_thread", "i8"), ("from_ns", "i8"), ("to_thread", "i8"), ("to_ns", "i8")]
)


def fwdbwd_flows(results, window: dict) -> np.ndarray:
    """The trace's ``fwdbwd`` arrows (docs/backward.md): one from each forward call to
    each autograd node it made, where both slices are in ``window`` (the last
    recorded window, perhaps thinned) and the node was joined to its forward call."""
    b = results.window(-1).backward()
    if b is None:
        return np.zeros(0, dtype=_FLOW_DTYPE)
    full = results.window(-1).raw["spans"]
    node = np.flatnonzero(b.span_fwd >= 0)
    fwd = b.span_fwd[node]
    out = np.zeros(len(node), dtype=_FLOW_DTYPE)
    out["from_thread"], out["from_ns"] = full["thread"][fwd], full["start_ns"][fwd]
    out["to_thread"], out["to_ns"] = full["thread"][node], full["start_ns"][node]
    kept = window["spans"]
    if kept is not full and len(out):  # thinned: both ends must still be slices
        keys = np.sort(kept["start_ns"].astype(np.int64) * 65536 + kept["thread"])

        def present(ns, thread):
            k = ns * 65536 + thread
            i = np.minimum(np.searchsorted(keys, k), max(len(keys) - 1, 0))
            return (keys[i] == k) if len(keys) else np.zeros(len(k), dtype=bool)

        out = out[
            present(out["from_ns"], out["from_thread"]) & present(out["to_ns"], out["to_thread"])
        ]
    return out


# -- subprocesses (docs/subprocesses.md): child processes as their own process lanes --
def _child_thread_names(pid: int, window: dict) -> list[str]:
    """A child's thread names are not recorded: its main thread is the one whose
    OS thread id is the process id."""
    return [
        "MainThread" if int(tid) == pid else f"thread {i}"
        for i, tid in enumerate(window["threads"]["os_tid"].tolist())
    ]


def _child_process_name(child) -> str:
    name = str(child.name or "")
    # a plain os.fork() child keeps the parent's multiprocessing name
    if not name or name == "MainProcess":
        return f"worker {child.pid}"
    return f"worker {child.pid} ({name})"


def _clip_to(window: dict, lo: int, hi: int) -> dict | None:
    """A child's window cut to the parent's [lo, hi]: its calls inside it, cut at
    the edges, without the session's step marker (a child has no steps). None when
    nothing is left."""
    sp = window["spans"]
    keep = (sp["end_ns"] >= lo) & (sp["start_ns"] <= hi) & (sp["kind"] != _OP_STEP)
    if not keep.any():
        return None
    sp = sp[keep]  # a copy: the child's arrays may be read-only memory maps
    np.minimum(sp["end_ns"], hi, out=sp["end_ns"])
    out = dict(window)
    out["spans"] = sp
    out["gpu"] = window["gpu"][:0]  # children record CPU only
    return out


def child_trace_calls(results, window: dict, trace_name: str) -> list[tuple[dict, TraceMeta]]:
    """(window, meta) for ``_write_trace`` per piece of child data that overlaps
    ``window`` (the parent's), in pid order: each child is its own process lane
    (pid = its OS pid, sorted after the main process), on the parent's time base,
    its calls cut to the parent's window. The caller writes them with part
    "open"/"append" before the parent's window with part "close"."""
    children = results.subprocesses or []
    lo, hi = int(window["window_start_ns"]), int(window["window_end_ns"])
    main_pid = int(results.meta.pid or os.getpid())
    id_base = len(window["spans"])
    calls = []
    for i, child in enumerate(children):
        for raw in child.windows:
            if int(raw["window_end_ns"]) < lo or int(raw["window_start_ns"]) > hi:
                continue
            part = _clip_to(raw, lo, hi)
            if part is None:
                continue
            files = display_files(part["op_files"])
            calls.append(
                (
                    part,
                    TraceMeta(
                        trace_name=trace_name,
                        part="append",
                        pid=int(child.pid),
                        process_name=_child_process_name(child),
                        sort_index=main_pid + 1 + i,
                        base_ns=lo,
                        id_base=id_base,
                        names=trace_names(part, files),
                        files=files,
                        kernel_names=[],
                        thread_names=_child_thread_names(int(child.pid), part),
                    ),
                )
            )
            id_base += len(part["spans"])
    return calls


# -- end subprocesses --


def check_min_duration(min_duration_us, func: str) -> float:
    """``min_duration_us`` as a float, or a ValueError/TypeError that names it."""
    if isinstance(min_duration_us, bool) or not isinstance(min_duration_us, (int, float)):
        raise TypeError(
            f"{func}(): min_duration_us must be a number of microseconds, got {min_duration_us!r}"
        )
    if not (0 <= min_duration_us < float("inf")):
        raise ValueError(
            f"{func}(): min_duration_us must be >= 0 and finite (0 keeps every "
            f"call), got {min_duration_us!r}"
        )
    return float(min_duration_us)


def _thin(window: dict, min_ns: int) -> tuple[dict, int]:
    """The window without the Python and C calls shorter than ``min_ns`` that launched
    no CUDA work (csrc/trace/trace_json.c, keep_spans), and how many calls that leaves out."""
    mask, omitted = _gpuprof._trace_keep(window, min_ns)
    if not omitted:
        return window, 0
    out = dict(window)
    out["spans"] = window["spans"][np.frombuffer(mask, dtype=np.bool_)]
    return out, omitted


def check_max_events(max_events, func: str) -> int | None:
    """``max_events`` as an int >= 1, or None (every event); else a ValueError/TypeError
    that names it."""
    if max_events is None:
        return None
    if isinstance(max_events, bool) or not isinstance(max_events, int):
        raise TypeError(
            f"{func}(): max_events must be an int or None (every event), got {max_events!r}"
        )
    if max_events < 2:
        raise ValueError(
            f"{func}(): max_events must be >= 2 (half for the first steps, half for the "
            f"last), or None for every event; got {max_events!r}"
        )
    return max_events


def _budget_cut(window: dict, others: list[dict], max_events: int) -> dict | None:
    """Where a trace of at most about ``max_events`` events (calls, ranges, CUDA calls
    and GPU activity, of ``window`` and the child windows ``others``) cuts: the events
    inside [cut_start, cut_end], whole steps where there are steps, are left out, so
    that the first and the last steps, each about half the budget, stay. Memory
    allocations and frees always stay (the memory counter adds them up). None when
    everything fits."""
    spans, gpu = window["spans"], window["gpu"]
    kept_gpu = (gpu["kind"] != _GPU_MALLOC) & (gpu["kind"] != _GPU_FREE)
    starts = np.concatenate(
        [spans["start_ns"], gpu["start_ns"][kept_gpu]] + [w["spans"]["start_ns"] for w in others]
    )
    n = len(starts)
    if n <= max_events:
        return None
    half = max_events // 2
    lo = int(np.partition(starts, half)[half])  # `half` events start before it
    hi = int(np.partition(starts, n - half - 1)[n - half - 1])  # `half` start at/after it
    cut_start, cut_end = lo, hi
    steps = window["steps"]
    if len(steps):
        # Whole steps: from the start of lo's step to the end of hi's, where that still
        # keeps at least half of each side's share (a few long steps are cut inside).
        first = steps["start_ns"]
        i = int(np.searchsorted(first, lo, side="right")) - 1
        j = int(np.searchsorted(first, hi, side="right")) - 1
        if i >= 0 and lo > steps["end_ns"][i]:  # between two steps: from the next one
            i = i + 1 if i + 1 < len(steps) else -1
        if i >= 0 and first[i] <= hi and np.count_nonzero(starts < first[i]) >= half // 2:
            cut_start = int(first[i])
        if j >= 0 and hi <= steps["end_ns"][j]:
            end = int(steps["end_ns"][j])
            if np.count_nonzero(starts > end) >= half // 2:
                cut_end = end
    if cut_start >= cut_end:
        return None
    inside = (steps["start_ns"] >= cut_start) & (steps["end_ns"] <= cut_end)
    omitted_steps = steps["step"][inside]
    return {
        "start_ns": cut_start,
        "end_ns": cut_end,
        "steps": (int(omitted_steps[0]), int(omitted_steps[-1])) if len(omitted_steps) else None,
        "n_steps": int(len(omitted_steps)),
        "total_steps": int(len(steps)),
        "events": n,
    }


def _cut_window(window: dict, cut: dict, gpu: bool = True) -> tuple[dict, int]:
    """The window without the events inside the cut (a call that began before it or
    ends after it stays), and how many that leaves out."""
    lo, hi = cut["start_ns"], cut["end_ns"]
    sp = window["spans"]
    keep = (sp["start_ns"] < lo) | (sp["end_ns"] > hi)
    out = dict(window)
    out["spans"] = sp[keep]
    omitted = int(len(sp) - len(out["spans"]))
    if gpu:
        g = window["gpu"]
        keep_g = (g["start_ns"] < lo) | (g["end_ns"] > hi)
        keep_g |= (g["kind"] == _GPU_MALLOC) | (g["kind"] == _GPU_FREE)
        out["gpu"] = g[keep_g]
        omitted += int(len(g) - len(out["gpu"]))
    return out, omitted


def _budget_header(window: dict, cut: dict, max_events: int, omitted: int) -> dict:
    base = int(window["window_start_ns"])
    return {
        "gpuprof_max_events": max_events,
        "gpuprof_omitted_events": omitted,
        "gpuprof_omitted_steps": list(cut["steps"]) if cut["steps"] else [],
        "gpuprof_omitted_us": [
            round((cut["start_ns"] - base) / 1000, 3),
            round((cut["end_ns"] - base) / 1000, 3),
        ],
    }


def _prepared(results, min_us: float, max_events: int | None):
    """The window and the child windows as the trace writes them, and the header keys
    saying what was left out (None when nothing was)."""
    window = results.windows[-1]
    calls = child_trace_calls(results, window, "")  # -- subprocesses --
    thinned: dict = {}
    if min_us > 0:
        min_ns = round(min_us * 1000)
        window, omitted = _thin(window, min_ns)
        for i, (w, m) in enumerate(calls):
            w, n = _thin(w, min_ns)
            calls[i] = (w, m)
            omitted += n
        thinned = {"gpuprof_min_duration_us": min_us, "gpuprof_omitted_calls": omitted}
    cut = None if max_events is None else _budget_cut(window, [w for w, _ in calls], max_events)
    if cut is not None:
        window, omitted = _cut_window(window, cut)
        for i, (w, m) in enumerate(calls):
            w, n = _cut_window(w, cut, gpu=False)
            calls[i] = (w, m)
            omitted += n
        thinned.update(_budget_header(window, cut, max_events, omitted))
    return window, calls, thinned or None, cut


def trace_budget(results, max_events: int | None, *, min_duration_us: float = 0.0):
    """What ``export_chrome_trace(results, path, max_events=max_events,
    min_duration_us=min_duration_us)`` leaves out to stay within the budget: a dict
    with ``events`` (what the window holds), ``omitted_events``, ``steps`` (the
    first and last step number left out, or None), ``n_steps`` and ``total_steps``;
    None when every event fits."""
    max_events = check_max_events(max_events, "trace_budget")
    min_us = check_min_duration(min_duration_us, "trace_budget")
    _, _, thinned, cut = _prepared(results, min_us, max_events)
    if cut is None:
        return None
    return dict(cut, omitted_events=thinned["gpuprof_omitted_events"])


def export_chrome_trace(
    results, path, *, min_duration_us: float = 0.0, max_events: int | None = None
) -> str:
    """Write the last recorded window of ``results`` as a Chrome trace.

    The file opens in Perfetto (ui.perfetto.dev), chrome://tracing, the
    TensorBoard profiler plugin and Holistic Trace Analysis. A path ending in
    ``.gz`` is gzip-compressed. The file appears atomically: it is written
    under ``path + ".tmp"`` and renamed when complete. Child processes profiled
    with ``subprocesses=True`` are their own process lanes (docs/subprocesses.md).

    Args:
        results: a :class:`gpuprof.Results` (``prof.results``).
        path: the output file (str or os.PathLike).
        min_duration_us: leave out the Python and C calls shorter than this many
            microseconds, except those around a CUDA API call (so every kernel keeps
            the calls that launched it). 0 (the default) writes every call. The
            header then holds ``gpuprof_min_duration_us`` and
            ``gpuprof_omitted_calls``, the number left out; tables and
            ``key_averages()`` still count every call.
        max_events: write at most about this many events (calls, ranges, CUDA calls
            and GPU activity): the first and the last steps, about half the budget
            each, stay whole, and the events between are left out (a call that began
            before that stretch or ends after it stays; memory events always stay).
            The header then holds ``gpuprof_max_events``, ``gpuprof_omitted_events``,
            ``gpuprof_omitted_steps`` (the first and last step left out) and
            ``gpuprof_omitted_us`` (the stretch, in the trace's microseconds). None
            (the default) writes every event. ``python -m gpuprof run --output``
            passes 1,000,000.

    Returns:
        The path written.

    Raises:
        OSError: ``path`` is a directory or cannot be written (the message names it).
        RuntimeError: nothing has been recorded yet.
        ValueError, TypeError: ``min_duration_us`` is negative, infinite or not a
            number; ``max_events`` is not None or an int >= 2.
    """
    path = check_output_path(path, "export_chrome_trace")
    min_us = check_min_duration(min_duration_us, "export_chrome_trace")
    max_events = check_max_events(max_events, "export_chrome_trace")
    window, calls, thinned, _ = _prepared(results, min_us, max_events)
    for _, m in calls:
        m.trace_name = path
    meta = trace_meta(results, window, path, thinned)
    flows = fwdbwd_flows(results, window)
    if len(flows):
        meta.fwdbwd = flows
    if window.get("module_names"):  # module call slices named by instance
        meta.module_names = [
            f"nn.Module: {n} ({c})"
            for n, c in zip(window["module_names"], window["module_classes"])
        ]
    if calls:
        # one file from several calls on one writer: the children's lanes first,
        # the parent's window last (it ends the file with the window end marker)
        calls[0][1].part, calls[0][1].header = "open", meta.header
        calls.append((window, dataclasses.replace(meta, part="close")))
    else:
        calls = [(window, meta)]
    if not path.endswith(".gz") and len(calls) == 1:
        try:  # written in C without the GIL, renamed into place there
            _gpuprof._write_trace(path, window, meta)
        except OSError as e:
            reraise_os_error(e, "export_chrome_trace", path)
        return path
    with atomic_output(path, "export_chrome_trace") as tmp, open(tmp, "wb") as raw:
        if path.endswith(".gz"):
            with gzip.GzipFile(
                filename=os.path.basename(path[:-3]),
                mode="wb",
                fileobj=raw,
                compresslevel=_GZIP_LEVEL,
            ) as gz:
                for w, m in calls:
                    _gpuprof._write_trace(gz, w, m)
        else:
            for w, m in calls:
                _gpuprof._write_trace(raw, w, m)
    return path
