"""What a diagnosis returns: :class:`Finding` (one problem, its evidence and its
fix) and :class:`Diagnosis` (the findings of one run and its summary). The checks
that make them live in gpuprof.diagnose (one process) and gpuprof.distributed
(merged ranks)."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..core._format import format_time

__all__ = ["Diagnosis", "Finding"]


@dataclasses.dataclass
class Finding:
    """One diagnosed problem.

    Attributes:
        kind: "data_stall", "sync_point", "launch_bound", "gpu_idle", "no_mixed_precision",
            "communication_wait", "memory_churn", "cpu_hot_path" (a program without GPU
            activity), "backward_heavy" (the forward line whose backward costs most,
            docs/backward.md), "mfu" (the steps' MFU and the ops furthest below their
            peak, with record_shapes=True; docs/aten.md), or on merged ranks "straggler".
        severity: share (0..1) of ``share_of`` the problem costs, estimated.
        title: one line saying what is wrong.
        evidence: the figures behind it (names match array fields where they come from one).
        location: "file:line" of the Python code responsible, when known.
        fix: what to change.
        share_of: what ``severity`` is a share of: "step time" (the recorded steps'
            wall time), "recorded time" (the window's, when it has no steps) or
            "CPU time" (the self CPU time of every thread, as the table's Self CPU %).
    """

    kind: str
    severity: float
    title: str
    evidence: dict
    location: str
    fix: str
    share_of: str = "step time"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Diagnosis(list):
    """Findings, most severe first; the CPU hot paths (shares of the CPU time, where the
    time goes rather than a fault) after the others. ``str()`` prints a report;
    ``to_dict()`` for machines."""

    def __init__(self, findings, summary: dict):
        super().__init__(sorted(findings, key=lambda f: (f.share_of == "CPU time", -f.severity)))
        self.summary = summary

    def kinds(self) -> list[str]:
        return [f.kind for f in self]

    def to_dict(self) -> dict:
        return {
            "summary": dict(self.summary),
            "headline": self.headline(),
            "findings": [f.to_dict() for f in self],
        }

    def headline(self) -> list[str]:
        """The lines between the title and the findings: what was recorded, and what
        the checks could judge of it."""
        return headline(self.summary, len(self))

    def __str__(self) -> str:
        lines = ["gpuprof diagnosis", "=" * 17, *self.headline()]
        for i, f in enumerate(self, 1):
            lines.append("")
            lines.append(f"{i}. [{100 * f.severity:4.1f}% of {f.share_of}] {f.title}")
            if f.location:
                lines.append(f"   at {f.location}")
            ev = ", ".join(f"{k}={_fmt(k, v)}" for k, v in f.evidence.items())
            lines.append(f"   evidence: {ev}")
            lines.append(f"   fix: {f.fix}")
        return "\n".join(lines) + "\n"

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(str(self))}</pre>"


def headline(summary: dict, n_findings: int) -> list[str]:
    """The diagnosis's first lines for its ``summary``: the steps and how busy the GPU
    was; without steps, how long the window was (a mean step of no steps is no figure);
    without GPU activity, that the checks are about GPU training loops and that the
    findings are where the CPU time goes."""
    s = summary
    if s["steps"]:
        first = f"{s['steps']} recorded steps, {format_time(s['step_ns_mean'])} per step; "
        first += (
            f"GPU busy {100 * s['gpu_busy_share']:.1f}% of step time"
            if s["gpu"]
            else "no GPU activity recorded"
        )
    else:
        first = f"No steps recorded: {format_time(s.get('window_ns', 0))} recorded; "
        first += (
            f"GPU busy {100 * s['gpu_busy_share']:.1f}% of it"
            if s["gpu"]
            else "no GPU activity recorded"
        )
    lines = [first]
    if not s["gpu"]:
        lines.append(
            "The checks look for the bottlenecks of GPU training loops (data stalls, "
            "syncs, launches, GPU idle time); without GPU activity, the findings are "
            "where the CPU time goes (self time of all threads, waiting left out)."
        )
    if not n_findings:
        basis = "step time" if s["steps"] else "recorded time"
        lines.append(f"No bottleneck found: nothing costs more than 5% of {basis}.")
    return lines


def _fmt(key: str, v) -> str:
    if isinstance(v, float) and key.endswith("share"):
        return f"{100 * v:.1f}%"
    if isinstance(v, (int, np.integer)) and key.endswith("_ns"):
        return format_time(int(v))
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)
