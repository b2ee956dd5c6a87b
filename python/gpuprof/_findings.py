"""What a diagnosis returns: :class:`Finding` (one problem, its evidence and its
fix) and :class:`Diagnosis` (the findings of one run and its summary). The checks
that make them live in gpuprof.diagnose (one process) and gpuprof.distributed
(merged ranks)."""

from __future__ import annotations

import dataclasses

import numpy as np

from ._format import format_time

__all__ = ["Diagnosis", "Finding"]


@dataclasses.dataclass
class Finding:
    """One diagnosed problem.

    Attributes:
        kind: "data_stall", "sync_point", "launch_bound", "gpu_idle", "no_mixed_precision",
            "communication_wait", "memory_churn", or on merged ranks "straggler".
        severity: share of recorded step time (0..1) the problem costs, estimated.
        title: one line saying what is wrong.
        evidence: the figures behind it (names match array fields where they come from one).
        location: "file:line" of the Python code responsible, when known.
        fix: what to change.
    """

    kind: str
    severity: float
    title: str
    evidence: dict
    location: str
    fix: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Diagnosis(list):
    """Findings, most severe first. ``str()`` prints a report; ``to_dict()`` for machines."""

    def __init__(self, findings, summary: dict):
        super().__init__(sorted(findings, key=lambda f: -f.severity))
        self.summary = summary

    def kinds(self) -> list[str]:
        return [f.kind for f in self]

    def to_dict(self) -> dict:
        return {"summary": dict(self.summary), "findings": [f.to_dict() for f in self]}

    def __str__(self) -> str:
        s = self.summary
        lines = [
            "gpuprof diagnosis",
            "=" * 17,
            f"{s['steps']} recorded steps, {format_time(s['step_ns_mean'])} per step; "
            f"GPU busy {100 * s['gpu_busy_share']:.1f}% of step time"
            + ("" if s["gpu"] else " (no GPU activity recorded)"),
        ]
        if not self:
            lines.append("No bottleneck found: nothing costs more than 5% of step time.")
        for i, f in enumerate(self, 1):
            lines.append("")
            lines.append(f"{i}. [{100 * f.severity:4.1f}% of step time] {f.title}")
            if f.location:
                lines.append(f"   at {f.location}")
            ev = ", ".join(f"{k}={_fmt(k, v)}" for k, v in f.evidence.items())
            lines.append(f"   evidence: {ev}")
            lines.append(f"   fix: {f.fix}")
        return "\n".join(lines) + "\n"

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(str(self))}</pre>"


def _fmt(key: str, v) -> str:
    if isinstance(v, float) and key.endswith("share"):
        return f"{100 * v:.1f}%"
    if isinstance(v, (int, np.integer)) and key.endswith("_ns"):
        return format_time(int(v))
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)
