"""Chrome trace export: one recorded window as Kineto-compatible trace JSON,
with the child processes profiled in that window as their own process lanes.

The events are formatted in C (``_gpuprof._write_trace``, csrc/trace_json.c);
this module prepares what C cannot know: display names, thread names, the
metadata keys before ``traceEvents``, and gzip for ``.gz`` paths. The schema
and what each track means are described in docs/traces.md.
"""

from __future__ import annotations

import gzip
import json
import os
import sys

import numpy as np

from .. import _gpuprof
from .._constants import OP_CFUNC as _OP_CFUNC
from .._constants import OP_PYTHON as _OP_PYTHON
from .._constants import OP_STEP as _OP_STEP
from .._output import atomic_output, check_output_path, reraise_os_error
from .._paths import display_files
from .._ranks import distributed_info as _distributed_info
from .._version import __version__

__all__ = [
    "atomic_output",
    "check_output_path",
    "export_chrome_trace",
    "reraise_os_error",
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
    # -- distributed (gpuprof._ranks): also pg_count, pg_config, nccl_version --
    return _distributed_info()


def device_properties(results) -> list[dict]:
    """deviceProperties entries: saved with the results, else asked of the
    driver only when GPU capture was on (a CPU-only export never touches CUDA)."""
    props = results.meta.get("device_properties")
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
        "distributedInfo": results.meta.get("distributed_info") or distributed_info(),
        "gpuprof_version": __version__,
    }
    if thinned:
        keys.update(thinned)
    if results.meta.get("with_stack"):
        keys["with_stack"] = 1
    if results.meta.get("profile_memory"):
        keys["profile_memory"] = 1
    keys["displayTimeUnit"] = "ms"
    keys["baseTimeNanoseconds"] = int(window["window_start_ns"]) + int(window["epoch_offset_ns"])
    # json.dumps' default separators put a space after every colon, which HTA's
    # rank lookup in distributedInfo needs.
    fields = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in keys.items()]
    # prof.add_metadata()/add_metadata_json(): JSON text already, as torch writes them
    for k, text in (results.meta.get("trace_metadata") or {}).items():
        if k in keys or k == "traceEvents":
            raise ValueError(
                f"add_metadata(): key {k!r} is one gpuprof writes itself in the "
                f"trace; use another key"
            )
        fields.append(f"{json.dumps(k)}: {text}")
    return ",\n  ".join(fields)


def _thread_names(results, window: dict) -> list[str]:
    return results.thread_row_names(window)  # kept past each thread's end (gpuprof._threads)


def trace_meta(results, window: dict, trace_name: str, thinned: dict | None = None) -> dict:
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
    return {
        "header": _header(results, window, props, thinned),
        "trace_name": trace_name,
        "pid": int(results.meta.get("pid") or os.getpid()),
        "process_name": results.meta.get("process_name") or program_name(),
        "names": trace_names(window, files),
        "files": files,
        "kernel_names": [kernel_names[i] for i in window["kernels"]["name"].tolist()],
        "thread_names": _thread_names(results, window),
        "sm_counts": sm_counts,
        "warp_sizes": warp_sizes,
    }


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


def child_trace_calls(results, window: dict, trace_name: str) -> list[tuple[dict, dict]]:
    """(window, meta) for ``_write_trace`` per piece of child data that overlaps
    ``window`` (the parent's), in pid order: each child is its own process lane
    (pid = its OS pid, sorted after the main process), on the parent's time base,
    its calls cut to the parent's window. The caller writes them with part
    "open"/"append" before the parent's window with part "close"."""
    children = results.subprocesses or []
    lo, hi = int(window["window_start_ns"]), int(window["window_end_ns"])
    main_pid = int(results.meta.get("pid") or os.getpid())
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
                    {
                        "header": "",
                        "trace_name": trace_name,
                        "part": "append",
                        "pid": int(child.pid),
                        "process_name": _child_process_name(child),
                        "sort_index": main_pid + 1 + i,
                        "base_ns": lo,
                        "id_base": id_base,
                        "names": trace_names(part, files),
                        "files": files,
                        "kernel_names": [],
                        "thread_names": _child_thread_names(int(child.pid), part),
                    },
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
    no CUDA work (csrc/trace_json.c, keep_spans), and how many calls that leaves out."""
    mask, omitted = _gpuprof._trace_keep(window, min_ns)
    if not omitted:
        return window, 0
    out = dict(window)
    out["spans"] = window["spans"][np.frombuffer(mask, dtype=np.bool_)]
    return out, omitted


def export_chrome_trace(results, path, *, min_duration_us: float = 0.0) -> str:
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

    Returns:
        The path written.

    Raises:
        OSError: ``path`` is a directory or cannot be written (the message names it).
        RuntimeError: nothing has been recorded yet.
        ValueError, TypeError: ``min_duration_us`` is negative, infinite or not a number.
    """
    path = check_output_path(path, "export_chrome_trace")
    min_us = check_min_duration(min_duration_us, "export_chrome_trace")
    window = results.windows[-1]
    calls = child_trace_calls(results, window, path)  # -- subprocesses --
    thinned = None
    if min_us > 0:
        min_ns = round(min_us * 1000)
        window, omitted = _thin(window, min_ns)
        for i, (w, m) in enumerate(calls):
            w, n = _thin(w, min_ns)
            calls[i] = (w, m)
            omitted += n
        thinned = {"gpuprof_min_duration_us": min_us, "gpuprof_omitted_calls": omitted}
    meta = trace_meta(results, window, path, thinned)
    if calls:
        # one file from several calls on one writer: the children's lanes first,
        # the parent's window last (it ends the file with the window end marker)
        calls[0][1].update(part="open", header=meta["header"])
        calls.append((window, dict(meta, part="close")))
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
