"""Save recorded windows to one ``.gpuprof`` file and load them back.

The file is a zip archive in NumPy's ``.npz`` layout: one ``.npy`` entry per
array of every window (``w0/spans.npy``, ``w0/gpu.npy``, ...), readable with
``numpy.load`` and no pickle, plus ``meta.json`` holding everything that is
not an array: op names, files and lines, kernel names, the window's scalars,
the CUDA capture state, thread and process names, device properties and the
format version. Each window is stored as ``gpuprof.core._window_file`` defines, the
layout that child-process pieces share.

Format version 2 adds the child processes of ``profile(subprocesses=True)``
(docs/subprocesses.md): child ``j``'s window ``k`` is stored like a window of
the main process under ``p<j>w<k>/``, and ``meta.json`` lists the children
(``subprocesses``: pid, ppid, name, start method, status and their windows'
scalars). The key is absent when children were not profiled. Version 1 files
(no children) still load.

Format version 3 adds the memory samples of ``profile(profile_memory=True)``
inside the recorded windows (docs/memory.md): host RSS as ``memory/host.npy``,
each framework allocator's samples of device ``d`` as
``memory/<allocator>.<d>.npy``, and the sampler's scalars under ``memory`` in
``meta.json`` (absent without profile_memory). Files of versions 1 and 2 load;
theirs is the memory that CUPTI recorded, in the windows' GPU records.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import zipfile

import numpy as np

from .. import _gpuprof
from ..analysis.processes import ProcessData
from ..core import _window_file
from ..core._constants import GPU_FREE, GPU_MALLOC
from ..results._results import Results, outermost, subtree_sums
from .chrome import (
    atomic_output,
    check_output_path,
    device_properties,
    distributed_info,
    program_name,
)

__all__ = ["FORMAT", "FORMAT_VERSION", "read", "save"]

FORMAT = "gpuprof-saved"
FORMAT_VERSION = 3  # 3: memory samples; 2: child processes; older files load unchanged


def save(results: Results, path) -> str:
    """Write every recorded window of ``results`` to one file (``.gpuprof`` by
    convention); :func:`gpuprof.load` reads it back.

    Raises:
        OSError: ``path`` cannot be written (the message names it).
    """
    from .._version import __version__

    path = check_output_path(path, "save")
    arrays: dict[str, np.ndarray] = {}
    windows = [_window_file.split(raw, f"w{i}", arrays) for i, raw in enumerate(results.windows)]
    m = results.meta
    meta = dataclasses.replace(
        m,
        pid=os.getpid() if m.pid is None else m.pid,
        process_name=program_name() if m.process_name is None else m.process_name,
        ppid=os.getppid() if m.ppid is None else m.ppid,
        thread_names=(
            {str(k): v for k, v in results.thread_names().items()}
            if m.thread_names is None
            else m.thread_names
        ),
        device_properties=(
            device_properties(results) if m.device_properties is None else m.device_properties
        ),
        distributed_info=distributed_info() if m.distributed_info is None else m.distributed_info,
    ).to_json()
    doc = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "gpuprof_version": __version__,
        "cuda": results.cuda,
        "meta": meta,
        "windows": windows,
    }
    # -- subprocesses: the children's windows (format 2) --
    children = results.subprocesses
    if children is not None:
        doc["subprocesses"] = [
            {
                "pid": c.pid,
                "ppid": c.ppid,
                "name": c.name,
                "start_method": c.start_method,
                "status": c.status,
                "windows": [
                    _window_file.split(raw, f"p{j}w{k}", arrays) for k, raw in enumerate(c.windows)
                ],
            }
            for j, c in enumerate(children)
        ]
    # -- end subprocesses --
    # -- memory samples (format 3) --
    samples = results.memory_samples
    if samples is not None:
        doc["memory"] = _split_memory(results, samples, arrays)
    text = _window_file.meta_json(doc, "gpuprof.save()")
    with atomic_output(path, "save") as tmp:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            zf.writestr("meta.json", text)
            for name, arr in arrays.items():
                with zf.open(name, "w", force_zip64=True) as f:
                    _window_file.write_array(f, arr)
    return path


def _split_memory(results: Results, samples, arrays: dict) -> dict:
    """The samples inside the windows go to ``arrays`` under ``memory/``; the
    sampler's scalars are returned."""
    from ..analysis.memory import kept_samples

    kept = kept_samples(results, samples)
    arrays[_window_file.entry_name(_MEMORY, "host")] = kept.host_samples()
    allocators = {}
    for name, per_device in kept.allocators().items():
        allocators[name] = sorted(per_device)
        for device, rows in per_device.items():
            arrays[_window_file.entry_name(_MEMORY, f"{name}.{device}")] = rows
    return {
        "rss_source": kept.rss_source,
        "interval_s": kept.interval_s,
        "dropped": kept.dropped,
        "errors": kept.errors,
        "allocators": allocators,
    }


def _widened(arr: np.ndarray, key: str, values: dict[str, np.ndarray]) -> np.ndarray:
    """``arr`` (an array of a window read from a file) in this version's dtype of
    ``key``, with the fields it lacks taken from ``values``; read-only."""
    out = np.zeros(len(arr), dtype=_gpuprof._row_dtypes()[key])
    for f in arr.dtype.names or ():
        out[f] = arr[f]
    for f, v in values.items():
        out[f] = v
    out.flags.writeable = False
    return out


def _with_memory_totals(raw: dict) -> None:
    """A window from a file written before C rolled device memory up the call tree:
    its ``nodes`` and ``ops`` get the totals computed from its memory events, as the
    aggregation would have (csrc/aggregate/gpu_join.c, charge_up), so that readers,
    the trace writer included, see one layout."""
    nodes, ops, g = raw["nodes"], raw["ops"], raw["gpu"]
    if "cuda_mem_total_bytes" in (nodes.dtype.names or ()):
        return
    own = np.zeros(len(nodes), dtype=np.int64)
    if len(g) and len(nodes):
        mem = ((g["kind"] == GPU_MALLOC) | (g["kind"] == GPU_FREE)) & (g["node"] >= 0)
        sign = np.where(g["kind"][mem] == GPU_MALLOC, 1, -1)
        np.add.at(own, g["node"][mem].astype(np.int64), sign * g["bytes"][mem].astype(np.int64))
    sub = subtree_sums(nodes["parent"], own)
    per_op = np.zeros(len(ops), dtype=np.int64)
    if len(nodes):
        rows = nodes["op_row"].astype(np.int64)
        outer = outermost(nodes["parent"], rows)
        np.add.at(per_op, rows[outer], sub[outer])
    raw["nodes"] = _widened(
        nodes, "nodes", {"cuda_mem_self_bytes": own, "cuda_mem_total_bytes": sub}
    )
    raw["ops"] = _widened(ops, "ops", {"cuda_mem_total_bytes": per_op})


def _load_memory(meta: dict, entries: dict):
    from ..record._host_sampler import SampleSnapshot

    allocators = {
        name: {int(d): entries[f"{name}.{d}"] for d in devices}
        for name, devices in meta.get("allocators", {}).items()
    }
    return SampleSnapshot(
        entries["host"],
        allocators,
        rss_source=meta.get("rss_source", ""),
        interval_s=meta.get("interval_s", 0.0),
        dropped=meta.get("dropped", 0),
        errors=meta.get("errors"),
    )


def read(path) -> Results:
    """The recorded data of a file written by ``prof.save(path)``
    (:func:`gpuprof.load` wraps it in a :class:`gpuprof.exporters.LoadedProfile`).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a gpuprof file, or from a newer gpuprof.
    """
    path = os.fspath(path)
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile as e:
        raise ValueError(f"gpuprof.load(): {path!r} is not a gpuprof file ({e})") from None
    with zf:
        try:
            doc = json.loads(zf.read("meta.json"))
        except (KeyError, ValueError) as e:
            raise ValueError(
                f"gpuprof.load(): {path!r} is not a gpuprof file (meta.json: {e})"
            ) from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"gpuprof.load(): {path!r} is not a gpuprof file")
        if doc.get("version", 0) > FORMAT_VERSION:
            raise ValueError(
                f"gpuprof.load(): {path!r} has format version {doc['version']}; "
                f"this gpuprof reads up to {FORMAT_VERSION}: upgrade gpuprof"
            )
        windows = [dict(w) for w in doc["windows"]]
        children = doc.get("subprocesses")  # format 2, with subprocesses=True
        child_windows = [[dict(w) for w in c["windows"]] for c in children or []]
        memory: dict[str, np.ndarray] = {}
        for name in zf.namelist():
            entry = _window_file.parse_entry(name)
            if entry is None:
                continue
            window, key = entry
            m = _ENTRY.fullmatch(window)
            if m is None and window != _MEMORY:
                raise ValueError(f"gpuprof.load(): {path!r}: unexpected entry {name!r}")
            with zf.open(name) as f:
                arr = _window_file.read_array(f)
            if key == "spans":
                arr = _window_file.spans_with_seq(arr)
            if m is None:
                memory[key] = arr
                continue
            child, k = m.group(1), int(m.group(2))
            try:
                (windows if child is None else child_windows[int(child)])[k][key] = arr
            except IndexError:
                raise ValueError(
                    f"gpuprof.load(): {path!r}: entry {name!r} belongs to no "
                    "window listed in meta.json (damaged file?)"
                ) from None
    for w in windows + [w for ws in child_windows for w in ws]:
        _with_memory_totals(w)
    results = Results(windows, cuda=doc.get("cuda"), meta=doc.get("meta"))
    if "memory" in doc:  # format 3, with profile_memory=True
        try:
            results.memory_samples = _load_memory(doc["memory"], memory)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"gpuprof.load(): {path!r}: its memory samples are damaged ({e!r})"
            ) from None
    if children is not None:  # -- subprocesses --
        results.subprocesses = [
            ProcessData(
                int(c["pid"]),
                int(c["ppid"]),
                str(c["name"]),
                str(c["start_method"]),
                str(c["status"]),
                wins,
            )
            for c, wins in zip(children, child_windows, strict=True)
        ]
    return results


_ENTRY = re.compile(r"(?:p(\d+))?w(\d+)")  # w<k>: the main process; p<j>w<k>: child j
_MEMORY = "memory"  # the memory samples' folder (format 3)
