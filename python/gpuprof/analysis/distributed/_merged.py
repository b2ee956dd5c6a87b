"""The merged run: :func:`merge` and :class:`MergedRun`, the cross-rank table
that names the slowest rank of every step."""

from __future__ import annotations

import os

import numpy as np

from ..._version import __version__
from ...core._format import format_time
from ...core._output import check_output_path
from ._checks import diagnose_ranks
from ._overlap import OVERLAP_DTYPE, STEP_FIELDS
from ._traces import (
    _align,
    _expand_paths,
    _load_ranks,
    _rank_events,
    _RankTrace,
    _write_merged,
)

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
