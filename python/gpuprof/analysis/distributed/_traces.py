"""The per-rank Chrome traces: reading them, aligning their clocks (or their
steps), and writing the merged timeline with one process per rank."""

from __future__ import annotations

import contextlib
import glob
import gzip
import json
import os
import re
from typing import Any

import numpy as np

from ...core._trace_read import read_trace
from ._overlap import _step_breakdown

# ---- reading per-rank traces ------------------------------------------------------------------

_STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
# ncclDevKernel_AllReduce_Sum_f32_RING_LL(...), ncclKernel_AllGather_RING_LL_Sum_int8_t(...)
_COLLECTIVE = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
_GPU_CATS = frozenset(
    ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync", "gpu_memory")
)
_SPECIAL_PIDS = ("Spans", "Traces", "")
_GPU_TID_BASE = 1_000_000_000  # merged lanes: host threads keep their OS tid (< 2**22)
_OVERHEAD_TID_BASE = 1_500_000_000


def collective_name(kernel_name: str) -> str:
    """The collective an NCCL kernel runs, from its name ("AllReduce", "AllGather",
    "ReduceScatter", "Broadcast", "SendRecv", ...); "" for other kernels."""
    m = _COLLECTIVE.match(kernel_name)
    if m:
        return m.group(1)
    return "other" if kernel_name.startswith("nccl") else ""


def _read_json(path: str) -> dict:
    return read_trace(path, "merge")


def _ns(ts) -> int:
    return int(round(float(ts) * 1000.0))


class _RankTrace:
    """One rank's trace files, read: events on the absolute (epoch ns) clock."""

    def __init__(self, rank: int, files: list[str], docs: list[dict]):
        self.rank = rank
        self.files = files
        self.info = docs[0].get("distributedInfo") or {}
        self.events: list[tuple[int, dict]] = []  # (absolute ns of ts, event)
        self.steps: dict[int, tuple[int, int]] = {}
        self.host_pids: set = set()
        self.collectives: dict[str, tuple[int, int]] = {}  # name -> (calls, total ns)
        iv: dict[str, tuple[list, list]] = {
            "compute": ([], []),
            "comm": ([], []),
            "memory": ([], []),
        }
        for doc in docs:
            base = int(doc.get("baseTimeNanoseconds", 0) or 0)
            for ev in doc["traceEvents"]:
                if not isinstance(ev, dict) or ev.get("pid") in _SPECIAL_PIDS:
                    continue
                ts = ev.get("ts")
                t = base + _ns(ts) if isinstance(ts, (int, float)) else None
                self.events.append((t, ev))
                if ev.get("ph") != "X" or t is None:
                    continue
                dur = max(_ns(ev.get("dur", 0) or 0), 0)
                cat = ev.get("cat")
                name = ev.get("name")
                if cat == "kernel":
                    kind = "comm" if str(name).startswith("nccl") else "compute"
                elif cat in ("gpu_memcpy", "gpu_memset"):
                    kind = "memory"
                else:
                    kind = None
                    # the host's step markers; a step projected onto a stream
                    # (gpu_user_annotation, as Kineto writes too) is not one
                    m = None if cat in _GPU_CATS else _STEP_NAME.match(str(name))
                    if m:
                        self.host_pids.add(ev.get("pid"))
                        self.steps.setdefault(int(m.group(1)), (t, t + dur))
                if kind == "comm":
                    c = collective_name(str(name))
                    calls, total = self.collectives.get(c, (0, 0))
                    self.collectives[c] = (calls + 1, total + dur)
                if kind is not None:
                    iv[kind][0].append(t)
                    iv[kind][1].append(t + dur)
        self.intervals = iv
        self.gpu = any(len(v[0]) for v in iv.values())

    def breakdown(self) -> np.ndarray:
        steps = sorted(self.steps)
        start = [self.steps[k][0] for k in steps]
        end = [self.steps[k][1] for k in steps]
        iv = self.intervals
        return _step_breakdown(
            np.array(steps, dtype=np.int64), start, end, iv["compute"], iv["comm"], iv["memory"]
        )


def _expand_one(p: str) -> list[str]:
    if os.path.isdir(p):
        found = sorted(
            glob.glob(os.path.join(p, "*.json")) + glob.glob(os.path.join(p, "*.json.gz"))
        )
        if not found:
            raise FileNotFoundError(f"merge(): folder {p!r} holds no .json or .json.gz trace")
        return found
    if glob.has_magic(p) and not os.path.exists(p):
        found = sorted(glob.glob(p))
        if not found:
            raise FileNotFoundError(f"merge(): no file matches {p!r}")
        return found
    return [p]


def _expand_paths(paths) -> list[str]:
    """Trace files from a list of paths, folders (their traces) and glob patterns."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    try:
        names = [os.fsdecode(os.fspath(p)) for p in paths]
    except TypeError:
        raise TypeError(
            "merge(): paths must be trace files (a list of str or os.PathLike), a "
            f"folder or a glob pattern, got {paths!r}"
        ) from None
    if not names:
        raise ValueError(
            "merge(): paths is empty; pass the per-rank trace files, e.g. "
            "glob.glob('traces/*.pt.trace.json')"
        )
    out: list[str] = []
    for p in names:
        out += _expand_one(p)
    return out


def _load_ranks(paths: list[str], ranks) -> list[_RankTrace]:
    if ranks is not None:
        ranks = list(ranks)
        if len(ranks) != len(paths) or not all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks
        ):
            raise ValueError(
                f"merge(): ranks must be one non-negative int per path "
                f"({len(paths)} paths), got {ranks!r}"
            )
    by_rank: dict[int, tuple[list[str], list[dict]]] = {}
    for i, path in enumerate(paths):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"merge(): no such trace file: {path!r}")
        doc = _read_json(path)
        info = doc.get("distributedInfo")
        if ranks is not None:
            rank = ranks[i]
        elif isinstance(info, dict) and isinstance(info.get("rank"), int):
            rank = info["rank"]
        else:
            raise ValueError(
                f"merge(): {path!r} has no distributedInfo rank; pass ranks=[...] "
                "(CLI: --ranks 0,1,...) in the order of the files"
            )
        files, docs = by_rank.setdefault(rank, ([], []))
        files.append(path)
        docs.append(doc)
    out = []
    for rank in sorted(by_rank):
        files, docs = by_rank[rank]
        rt = _RankTrace(rank, files, docs)
        if len(rt.host_pids) > 1:
            raise ValueError(
                f"merge(): several processes claim rank {rank} "
                f"(files {', '.join(files)}); each rank must be one process. "
                "Pass ranks=[...] (CLI: --ranks) to number them yourself"
            )
        out.append(rt)
    return out


# ---- alignment -------------------------------------------------------------------------------


def _align(traces: list[_RankTrace], align: str) -> tuple[str, dict[int, int], int | None]:
    """Return (method, shift ns per rank, the step aligned on)."""
    zero = {t.rank: 0 for t in traces}
    common = set.intersection(*(set(t.steps) for t in traces)) if traces else set()
    if align == "clock" or len(traces) < 2:
        return "clock", zero, None
    if not common:
        if align == "step":
            raise ValueError(
                "merge(): align='step' needs a ProfilerStep#<n> recorded by every "
                "rank; these traces share none (record the same steps on every "
                "rank, or use align='clock')"
            )
        return "clock", zero, None
    k0 = min(common)
    starts = {t.rank: t.steps[k0][0] for t in traces}
    if align == "auto":
        # In synchronous training ranks start a step together; a spread far
        # beyond a step means the hosts' clocks disagree.
        durs = [t.steps[k][1] - t.steps[k][0] for t in traces for k in common]
        tolerance = max(10 * int(np.median(durs)), 100_000_000)
        if max(starts.values()) - min(starts.values()) <= tolerance:
            return "clock", zero, None
    ref = starts[traces[0].rank]
    return "step", {r: ref - s for r, s in starts.items()}, k0


# ---- the merged trace --------------------------------------------------------------------------


def _is_gpu_lane(ev: dict, gpu_lanes: set, host_lanes: set) -> bool:
    cat = ev.get("cat")
    if cat in _GPU_CATS:
        return True
    if cat == "ac2g":
        return ev.get("ph") == "f"
    lane = (ev.get("pid"), ev.get("tid"))
    return lane in gpu_lanes and lane not in host_lanes


def _rank_events(t: _RankTrace, index: int, n_ranks: int, shift: int, base: int):
    """The rank's events, relaid on pid = rank, plus its lane metadata."""
    gpu_lanes: set[tuple[Any, Any]] = set()
    host_lanes: set[tuple[Any, Any]] = set()
    for _, ev in t.events:
        if ev.get("ph") == "X":
            (gpu_lanes if ev.get("cat") in _GPU_CATS else host_lanes).add(
                (ev.get("pid"), ev.get("tid"))
            )
    names: dict[tuple, str] = {}
    for _, ev in t.events:
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            names[(ev.get("pid"), ev.get("tid"))] = str((ev.get("args") or {}).get("name", ""))
    gpu_tid: dict[tuple, int] = {}
    for lane in sorted(gpu_lanes, key=lambda x: (str(x[0]), str(x[1]))):
        gpu_tid[lane] = _GPU_TID_BASE + len(gpu_tid)
    other_tid: dict[tuple, int] = {}
    pid = t.rank
    out = []
    for tabs, ev in t.events:
        ph = ev.get("ph")
        if ph == "M":
            continue  # lanes are renamed below
        if ev.get("pid") == -1:
            lane = ("overhead", ev.get("tid"))
            tid = other_tid.setdefault(lane, _OVERHEAD_TID_BASE + len(other_tid))
        elif _is_gpu_lane(ev, gpu_lanes, host_lanes):
            lane = (ev.get("pid"), ev.get("tid"))
            tid = gpu_tid.get(lane)
            if tid is None:
                tid = gpu_tid[lane] = _GPU_TID_BASE + len(gpu_tid)
        else:
            tid = ev.get("tid")
            if not isinstance(tid, int) or isinstance(tid, bool) or not 0 <= tid < _GPU_TID_BASE:
                lane = ("host", tid)
                tid = other_tid.setdefault(lane, _OVERHEAD_TID_BASE + len(other_tid))
        e = dict(ev)
        e["pid"], e["tid"] = pid, tid
        if tabs is not None:
            e["ts"] = round((tabs + shift - base) / 1000.0, 3)
        if ph in ("s", "f", "t") and isinstance(e.get("id"), int):
            e["id"] = e["id"] * n_ranks + index  # flow ids stay unique across ranks
        out.append(e)
    devices = sorted({lane[0] for lane in gpu_lanes if isinstance(lane[0], int)})
    label = ", ".join(["CPU"] + [f"GPU {d}" for d in devices])
    meta = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}"}},
        {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": label}},
        {
            "ph": "M",
            "name": "process_sort_index",
            "pid": pid,
            "tid": 0,
            "args": {"sort_index": pid},
        },
    ]
    for lane in sorted(host_lanes, key=lambda x: str(x[1])):
        if lane[0] == -1 or lane in gpu_lanes or not isinstance(lane[1], int):
            continue
        name = names.get(lane) or f"thread {lane[1]}"
        meta.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": lane[1], "args": {"name": name}}
        )
        meta.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": pid,
                "tid": lane[1],
                "args": {"sort_index": lane[1]},
            }
        )
    for lane, tid in gpu_tid.items():
        label = names.get(lane) or f"stream {lane[1]}"
        meta.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": tid,
                "args": {"name": f"GPU {lane[0]} {label}"},
            }
        )
        meta.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": tid},
            }
        )
    for lane, tid in other_tid.items():
        what = "gpuprof overhead" if lane[0] == "overhead" else "thread"
        meta.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": tid,
                "args": {"name": f"{what} {lane[1]}"},
            }
        )
    return meta + out


def _write_merged(path: str, header: dict, events: list[dict]) -> None:
    tmp = path + ".tmp"
    try:
        raw = open(tmp, "wb")  # noqa: SIM115 (closed below, also on failure)
        try:
            f = (
                gzip.GzipFile(
                    filename=os.path.basename(path[:-3]), mode="wb", fileobj=raw, compresslevel=6
                )
                if path.endswith(".gz")
                else raw
            )
            parts = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in header.items()]
            f.write(("{\n  " + ",\n  ".join(parts) + ',\n  "traceEvents": [\n').encode())
            for i in range(0, len(events), 4096):
                chunk = events[i : i + 4096]
                text = ",\n".join(json.dumps(e, allow_nan=False) for e in chunk)
                f.write(((",\n" if i else "") + text).encode("utf-8", "replace"))
            f.write(f'\n  ],\n  "traceName": {json.dumps(path)}\n}}\n'.encode())
            if f is not raw:
                f.close()
        finally:
            raw.close()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
