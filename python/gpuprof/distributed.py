"""Distributed training: rank awareness, communication overlap, merged multi-rank traces.

Every rank profiles itself and writes its own trace (one file per rank, with
``distributedInfo`` so that HTA and TensorBoard find the rank). This module

- tells who this process is: :func:`rank_info` (rank, local rank, world size
  from ``torch.distributed`` when a process group is initialised, else from
  torchrun's ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``) and :func:`distributed_info`
  (the ``distributedInfo`` object of the trace);
- expands ``{rank}``, ``{local_rank}`` and ``{world_size}`` in output names
  (:func:`expand_name`);
- splits each step's GPU time into compute, communication (NCCL kernels),
  their overlap and the communication left exposed (:func:`comm_overlap`);
- merges the per-rank traces into one timeline with one process per rank and
  a cross-rank table that names the slowest rank of every step
  (:func:`merge`, ``python -m gpuprof merge OUT trace_rank*.json``).

torch is never imported here: it is looked up in ``sys.modules``, so a
program that does not use it never pays for it. See docs/distributed.md.
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import json
import os
import re

import numpy as np

from ._findings import Diagnosis, Finding
from ._format import format_time
from ._intervals import covered as _covered
from ._intervals import intersect as _intersect
from ._intervals import union as _union
from ._output import check_output_path
from ._ranks import distributed_info, expand_name, rank_info
from ._trace_read import read_trace
from ._version import __version__

__all__ = [
    "MergedRun",
    "collective_name",
    "diagnose_ranks",
    "comm_overlap",
    "distributed_info",
    "expand_name",
    "merge",
    "rank_info",
]

STEP_FIELDS = (
    "step_ns",
    "compute_ns",
    "comm_ns",
    "overlap_ns",
    "exposed_comm_ns",
    "memcpy_ns",
    "busy_ns",
    "idle_ns",
)

OVERLAP_DTYPE = np.dtype(
    [("step", "i8"), ("start_ns", "i8"), ("end_ns", "i8")] + [(f, "i8") for f in STEP_FIELDS]
)


def _step_breakdown(steps, start, end, compute, comm, memory) -> np.ndarray:
    """One OVERLAP_DTYPE row per step from the GPU activity intervals
    (each a (starts, ends) pair of arrays, any order, may overlap)."""
    out = np.zeros(len(steps), dtype=OVERLAP_DTYPE)
    out["step"], out["start_ns"], out["end_ns"] = steps, start, end
    cu, cm, me = _union(*compute), _union(*comm), _union(*memory)
    busy = _union(np.concatenate([cu[0], cm[0], me[0]]), np.concatenate([cu[1], cm[1], me[1]]))
    out["step_ns"] = out["end_ns"] - out["start_ns"]
    out["compute_ns"] = _covered(cu, start, end)
    out["comm_ns"] = _covered(cm, start, end)
    out["overlap_ns"] = _covered(_intersect(cm, cu), start, end)
    out["exposed_comm_ns"] = out["comm_ns"] - out["overlap_ns"]
    out["memcpy_ns"] = _covered(me, start, end)
    out["busy_ns"] = _covered(busy, start, end)
    out["idle_ns"] = out["step_ns"] - out["busy_ns"]
    return out


def comm_overlap(results) -> np.ndarray:
    """Per step: GPU compute, communication, and how much of it overlapped.

    Communication is the NCCL kernels (category "communication" in
    ``prof.kernels()``), compute every other kernel; time is the union of the
    kernels' intervals inside the step (several streams count once).

    Args:
        results: a :class:`gpuprof.profile` after recording, its ``.results``,
            or a loaded profile (``gpuprof.load``).

    Returns:
        A structured array, one row per recorded step: step, start_ns, end_ns,
        step_ns (wall time), compute_ns, comm_ns, overlap_ns (communication
        running while compute kernels run), exposed_comm_ns (comm_ns -
        overlap_ns: communication nothing hides), memcpy_ns (copies and sets),
        busy_ns (any GPU activity), idle_ns (step_ns - busy_ns). ``comm_ns``
        and ``busy_ns`` equal the fields of ``prof.steps()``.

    Raises:
        TypeError: ``results`` has no ``steps()`` and ``gpu_events()``.
    """
    res = getattr(results, "results", results)
    if not (callable(getattr(res, "steps", None)) and callable(getattr(res, "gpu_events", None))):
        raise TypeError(
            "comm_overlap(): pass a gpuprof.profile, prof.results or a loaded "
            f"profile, got {type(results).__name__}"
        )
    steps = res.steps()
    g = res.gpu_events()

    def pick(mask):
        return g["start_ns"][mask], g["end_ns"][mask]

    kernel = g["kind"] == "kernel"
    comm = g["category"] == "communication"
    return _step_breakdown(
        steps["step"],
        steps["start_ns"],
        steps["end_ns"],
        pick(kernel & ~comm),
        pick(kernel & comm),
        pick(np.isin(g["kind"], ("memcpy", "memset"))),
    )


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
    gpu_lanes, host_lanes = set(), set()
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


# ---- the cross-rank report --------------------------------------------------------------------

RANK_STEP_DTYPE = np.dtype(
    [("rank", "i4")] + OVERLAP_DTYPE.descr + [("work_ns", "i8"), ("slowest", "?")]
)
COLLECTIVES_DTYPE = np.dtype(
    [("rank", "i4"), ("collective", "U32"), ("calls", "i8"), ("total_ns", "i8")]
)
SLOWEST_DTYPE = np.dtype(
    [
        ("step", "i8"),
        ("rank", "i4"),
        ("work_ns", "i8"),
        ("others_wait_ns", "i8"),
        ("max_wait_ns", "i8"),
    ]
)


class MergedRun:
    """The ranks of one distributed run, read from their traces.

    Attributes:
        path: the merged trace written (None when only analysed).
        ranks: the ranks, ascending.
        files: rank -> the trace files read for it.
        alignment: "clock" (the traces' own epoch clock) or "step" (each rank
            shifted so that ProfilerStep#<aligned_step> starts together).
        shifts_ns: rank -> ns added to its timestamps in the merged trace.
        aligned_step: the step aligned on (None when unused).
        distributed_info: rank -> its trace's distributedInfo.
        steps: structured array, one row per (rank, step) each rank recorded:
            rank, step, start_ns, end_ns (epoch ns, before alignment), step_ns,
            compute_ns, comm_ns, overlap_ns, exposed_comm_ns, memcpy_ns,
            busy_ns, idle_ns (as :func:`comm_overlap`), work_ns (step_ns -
            exposed_comm_ns: the step's time not spent waiting in
            communication) and slowest (the rank with the most work_ns in a
            step every rank recorded).
        slowest: structured array, one row per step every rank recorded: step,
            rank (the slowest), work_ns (its), others_wait_ns (mean over the
            other ranks of their exposed communication beyond the slowest
            rank's: the time they waited for it), max_wait_ns.
        collectives: structured array, one row per rank and collective (from
            the NCCL kernel names, :func:`collective_name`): rank, collective,
            calls, total_ns (every recorded step, not only the common ones).
        gpu: whether any rank recorded GPU activity.
    """

    def __init__(
        self,
        traces: list[_RankTrace],
        alignment: str,
        shifts: dict[int, int],
        aligned_step,
        path: str | None,
    ):
        self.path = path
        self.ranks = [t.rank for t in traces]
        self.files = {t.rank: list(t.files) for t in traces}
        self.alignment = alignment
        self.shifts_ns = dict(shifts)
        self.aligned_step = aligned_step
        self.distributed_info = {t.rank: dict(t.info) for t in traces}
        self.gpu = any(t.gpu for t in traces)
        parts = []
        for t in traces:
            b = t.breakdown()
            rows = np.zeros(len(b), dtype=RANK_STEP_DTYPE)
            for f in OVERLAP_DTYPE.names:
                rows[f] = b[f]
            rows["rank"] = t.rank
            rows["work_ns"] = b["step_ns"] - b["exposed_comm_ns"]
            parts.append(rows)
        steps = np.concatenate(parts) if parts else np.zeros(0, dtype=RANK_STEP_DTYPE)
        common = sorted(set.intersection(*(set(t.steps) for t in traces))) if traces else []
        slow = np.zeros(len(common), dtype=SLOWEST_DTYPE)
        for i, k in enumerate(common):
            idx = np.flatnonzero(steps["step"] == k)
            rows = steps[idx]
            j = int(np.argmax(rows["work_ns"]))
            steps["slowest"][idx[j]] = True
            others = np.delete(np.arange(len(rows)), j)
            waits = np.maximum(rows["exposed_comm_ns"][others] - rows["exposed_comm_ns"][j], 0)
            slow[i] = (
                k,
                rows["rank"][j],
                rows["work_ns"][j],
                int(waits.mean()) if len(waits) else 0,
                int(waits.max(initial=0)),
            )
        self.steps = steps
        self.slowest = slow
        coll = [(t.rank, c, n, ns) for t in traces for c, (n, ns) in sorted(t.collectives.items())]
        self.collectives = np.array(coll, dtype=COLLECTIVES_DTYPE)

    @property
    def common_steps(self) -> list[int]:
        """Steps every rank recorded."""
        return [int(s) for s in self.slowest["step"]]

    def rank_summary(self) -> np.ndarray:
        """Per rank, means over the common steps of the :attr:`steps` fields,
        plus ``steps`` (how many) and ``slowest_steps`` (how many it was slowest in)."""
        fields = list(STEP_FIELDS) + ["work_ns"]
        dt = np.dtype(
            [("rank", "i4"), ("steps", "i8"), ("slowest_steps", "i8")] + [(f, "i8") for f in fields]
        )
        out = np.zeros(len(self.ranks), dtype=dt)
        common = np.isin(self.steps["step"], self.slowest["step"])
        for i, r in enumerate(self.ranks):
            rows = self.steps[(self.steps["rank"] == r) & common]
            out["rank"][i] = r
            out["steps"][i] = len(rows)
            out["slowest_steps"][i] = int((self.slowest["rank"] == r).sum())
            for f in fields:
                out[f][i] = int(rows[f].mean()) if len(rows) else 0
        return out

    def diagnose(self):
        """Cross-rank findings (a straggler rank): a :class:`gpuprof.diagnose.Diagnosis`."""
        return diagnose_ranks(self)

    def table(self, max_steps: int | None = None) -> str:
        """The cross-rank report: per-rank means, then per step and rank,
        the slowest rank of each step marked with ``*``."""
        ft = format_time
        lines = []
        n = len(self.common_steps)
        how = (
            "the ranks' own clocks"
            if self.alignment == "clock"
            else f"ProfilerStep#{self.aligned_step} of each rank (clocks disagreed)"
        )
        lines.append(
            f"gpuprof merge: {len(self.ranks)} ranks, {n} steps recorded by every rank; "
            f"timelines aligned on {how}"
        )
        if self.path:
            lines.append(f"merged trace: {self.path}")
        if not self.gpu:
            lines.append("(no GPU activity in the traces: compute and communication are 0)")
        head = (
            f"{'Rank':>5} {'Step time':>11} {'Compute':>11} {'Comm':>11} {'Overlap':>11} "
            f"{'Exposed comm':>13} {'Idle':>11}"
        )
        lines += ["", "Per rank, mean per step", head + f" {'Slowest in':>11}"]
        for r in self.rank_summary():
            lines.append(
                f"{r['rank']:5d} {ft(r['step_ns']):>11} {ft(r['compute_ns']):>11} "
                f"{ft(r['comm_ns']):>11} {ft(r['overlap_ns']):>11} "
                f"{ft(r['exposed_comm_ns']):>13} {ft(r['idle_ns']):>11} "
                f"{r['slowest_steps']:>5d} of {r['steps']:<2d}"
            )
        lines += [
            "",
            "Per step (* = slowest rank: most time outside communication waits)",
            f"{'Step':>6} " + head + f" {'Waited for slowest':>19}",
        ]
        shown = self.slowest if max_steps is None else self.slowest[:max_steps]
        for s in shown:
            rows = self.steps[self.steps["step"] == s["step"]]
            slow_exposed = int(rows["exposed_comm_ns"][rows["rank"] == s["rank"]][0])
            for r in rows:
                mark = "*" if r["slowest"] else " "
                wait = max(int(r["exposed_comm_ns"]) - slow_exposed, 0)
                lines.append(
                    f"{s['step']:6d} {r['rank']:4d}{mark} {ft(r['step_ns']):>11} "
                    f"{ft(r['compute_ns']):>11} {ft(r['comm_ns']):>11} "
                    f"{ft(r['overlap_ns']):>11} {ft(r['exposed_comm_ns']):>13} "
                    f"{ft(r['idle_ns']):>11} "
                    f"{'' if r['slowest'] else ft(wait):>19}"
                )
        if len(shown) < len(self.slowest):
            lines.append(f"... {len(self.slowest) - len(shown)} more steps")
        if len(self.slowest):
            counts = np.bincount(self.slowest["rank"] - min(self.ranks))
            top = int(np.argmax(counts)) + min(self.ranks)
            per_step = ", ".join(str(int(r)) for r in shown["rank"])
            more = ", ..." if len(shown) < len(self.slowest) else ""
            lines += [
                "",
                f"slowest rank per step: {per_step}{more} "
                f"(rank {top} in {int(counts.max())} of {n})",
            ]
        if len(self.collectives):
            lines += [
                "",
                "NCCL kernels per rank (all recorded steps)",
                f"{'Rank':>5} {'Collective':<16} {'Calls':>7} {'Total':>11} {'Mean':>11}",
            ]
            for c in self.collectives:
                lines.append(
                    f"{c['rank']:5d} {c['collective']:<16} {c['calls']:7d} "
                    f"{ft(c['total_ns']):>11} "
                    f"{ft(c['total_ns'] / max(c['calls'], 1)):>11}"
                )
        return "\n".join(line.rstrip() for line in lines) + "\n"

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict:
        """Everything above as plain data (JSON-ready)."""

        def rows(a):
            return [dict(zip(a.dtype.names, r, strict=True)) for r in a.tolist()]

        return {
            "path": self.path,
            "ranks": self.ranks,
            "files": self.files,
            "alignment": self.alignment,
            "aligned_step": self.aligned_step,
            "shifts_ns": self.shifts_ns,
            "steps": rows(self.steps),
            "slowest": rows(self.slowest),
            "rank_summary": rows(self.rank_summary()),
            "collectives": rows(self.collectives),
        }


def merge(out_path, paths, *, align: str = "auto", ranks=None) -> MergedRun:
    """Merge per-rank Chrome traces into one timeline and compare the ranks.

    The merged trace (open it in Perfetto) has one process per rank, named
    "rank N" (pid N), holding that rank's host threads and GPU streams. Flow
    arrows keep binding. Timelines share the traces' epoch clock; when the
    ranks' first common ProfilerStep#<n> starts differ by far more than a
    step (hosts whose clocks disagree), each rank is shifted so that step
    starts together. The per-rank files stay the input for HTA and
    TensorBoard, which want one file per rank: write ``out_path`` outside
    their folder.

    Args:
        out_path: the merged trace to write (``.json`` or ``.json.gz``), or None
            to only analyse. ``{rank}``-style placeholders are not expanded.
        paths: the per-rank traces (gpuprof's, or torch.profiler's): a list of
            paths, a folder (every ``*.json``/``*.json.gz`` in it) or a glob
            pattern. Files of one rank (several recorded windows) are combined.
        align: "auto" (above), "clock" (never shift) or "step" (always shift
            on the first ProfilerStep every rank recorded).
        ranks: the rank of each path, when the traces carry no
            ``distributedInfo`` (or a wrong one).

    Returns:
        A :class:`MergedRun`: ``print(run)`` shows per-rank step time,
        compute, communication, overlap, exposed communication and GPU idle
        time, per step and rank with the slowest rank marked;
        ``run.diagnose()`` names a straggler rank.

    Raises:
        FileNotFoundError, OSError: a trace cannot be read, or ``out_path``
            cannot be written (the message names it).
        ValueError: a file is not a trace, a trace has no rank, two processes
            claim one rank, ``align`` or ``ranks`` is malformed.
    """
    if align not in ("auto", "clock", "step"):
        raise ValueError(f"merge(): align must be 'auto', 'clock' or 'step', got {align!r}")
    files = _expand_paths(paths)
    if out_path is not None:
        out_path = check_output_path(out_path, "merge")
        if os.path.exists(out_path) and any(
            os.path.exists(f) and os.path.samefile(f, out_path) for f in files
        ):
            raise ValueError(
                f"merge(): out_path {out_path!r} is one of the input traces; "
                "write the merged trace to another file"
            )
    traces = _load_ranks(files, ranks)
    method, shifts, k0 = _align(traces, align)
    run = MergedRun(traces, method, shifts, k0, out_path)
    if out_path is None:
        return run
    starts = [
        tabs + shifts[t.rank]
        for t in traces
        for tabs, ev in t.events
        if tabs is not None and ev.get("ph") != "M"
    ]
    base = min(starts) if starts else 0
    events: list[dict] = []
    for i, t in enumerate(traces):
        events += _rank_events(t, i, len(traces), shifts[t.rank], base)
    header = {
        "schemaVersion": 1,
        "deviceProperties": [],
        "gpuprof_version": __version__,
        "gpuprofMerged": {
            "ranks": [
                {
                    "rank": t.rank,
                    "files": t.files,
                    "shift_ns": shifts[t.rank],
                    "distributedInfo": t.info,
                }
                for t in traces
            ],
            "alignment": method,
            "aligned_step": k0,
        },
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": int(base),
    }
    try:
        _write_merged(out_path, header, events)
    except OSError as e:
        raise OSError(
            e.errno, f"merge(): cannot write {out_path!r}: {e.strerror or e}", out_path
        ) from e
    return run


# -- cross-rank checks: they read a gpuprof.distributed.MergedRun (gpuprof.merge) --


def _straggler(m) -> list[Finding]:
    """One rank slowest in most steps while the others wait for it in communication."""
    slow = m.slowest
    if len(m.ranks) < 2 or not len(slow):
        return []
    ranks, counts = np.unique(slow["rank"], return_counts=True)
    rank = int(ranks[np.argmax(counts)])
    mine = slow["rank"] == rank
    n, total = int(mine.sum()), len(slow)
    if 2 * n <= total:
        return []  # no rank is the slowest in most steps: jitter, not a straggler
    rows = m.steps[np.isin(m.steps["step"], slow["step"])]
    step_ns = float(rows["step_ns"].mean())
    wait_total = int(slow["others_wait_ns"][mine].sum())
    wait_per_step = wait_total // total
    share = wait_per_step / max(step_ns, 1.0)
    if share < 0.05:
        return []
    waited = []
    for r in m.ranks:
        if r == rank:
            continue
        w = 0
        for k in slow["step"][mine]:
            at = rows[rows["step"] == k]
            w += max(
                int(at["exposed_comm_ns"][at["rank"] == r][0])
                - int(at["exposed_comm_ns"][at["rank"] == rank][0]),
                0,
            )
        waited.append(f"rank {r}: {format_time(w // total)}")
    me = rows[rows["rank"] == rank]
    others = rows[rows["rank"] != rank]
    return [
        Finding(
            "straggler",
            share,
            f"Rank {rank} is a straggler: slowest in {n} of {total} steps; the other ranks waited "
            f"{format_time(wait_per_step)} per step for it in communication",
            {
                "straggler_rank": rank,
                "slowest_steps": n,
                "steps": total,
                "wait_ns": wait_total,
                "wait_per_step_ns": wait_per_step,
                "straggler_work_ns": int(me["work_ns"].mean()),
                "others_work_ns": int(others["work_ns"].mean()),
                "waited_per_step": "; ".join(waited),
            },
            "",
            f"Find what rank {rank} does that the others do not: open process 'rank {rank}' in the "
            "merged trace next to another rank. Usual causes: uneven input (sequence lengths, "
            "shard sizes), work only that rank does (logging, checkpointing, evaluation), a "
            "slower or throttled GPU, CPU contention on its host (OMP_NUM_THREADS, dataloader "
            "workers), or an "
            "unbalanced model split.",
        )
    ]


RANK_CHECKS = (_straggler,)


def diagnose_ranks(m) -> Diagnosis:
    findings = []
    for check in RANK_CHECKS:
        findings += check(m)
    rows = m.steps[np.isin(m.steps["step"], m.slowest["step"])]
    step_ns = int(rows["step_ns"].mean()) if len(rows) else 0
    busy = int(rows["busy_ns"].mean()) if len(rows) else 0
    summary = {
        "steps": len(m.slowest),
        "step_ns_mean": step_ns,
        "gpu_busy_share": busy / max(step_ns, 1),
        "gpu": bool(m.gpu),
        "ranks": list(m.ranks),
    }
    return Diagnosis(findings, summary)


# -- end cross-rank checks --
