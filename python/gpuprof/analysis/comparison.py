"""Before/after comparison of two profiles, the analysis behind
``gpuprof.compare(before, after)`` (gpuprof.compare, which also opens saved
files and writes the HTML page). Times are compared per recorded step, so
profiles with different step counts compare fairly.
"""

from __future__ import annotations

import dataclasses
import html
import os
from typing import TypeVar

from ..core._format import format_time
from ..results._results import Results, display_name
from .diagnose import diagnose

__all__ = ["Comparison", "Delta", "build"]

_C = TypeVar("_C", bound="Comparison")


def _results(x) -> Results:
    if isinstance(x, Results):
        return x
    res = getattr(x, "results", None)
    if isinstance(res, Results):
        return res
    raise TypeError(
        f"compare(): expected a gpuprof profile, Results or a saved .gpuprof path, "
        f"got {type(x).__name__}"
    )


def _per_step(res: Results) -> tuple[float, int]:
    steps = res.steps()
    n = max(len(steps), 1)
    mean = (
        float(steps["cpu_ns"].mean())
        if len(steps)
        else float(res.window_bounds()[1] - res.window_bounds()[0])
    )
    return mean, n


@dataclasses.dataclass
class Delta:
    name: str
    before_ns: float  # per step
    after_ns: float  # per step

    @property
    def change_ns(self) -> float:
        return self.after_ns - self.before_ns

    @property
    def change_pct(self) -> float:
        return 100.0 * self.change_ns / self.before_ns if self.before_ns else float("inf")


@dataclasses.dataclass
class Comparison:
    """What changed between two profiles (per-step figures)."""

    step_before_ns: float
    step_after_ns: float
    ops: list[Delta]
    kernels: list[Delta]
    findings_gone: list[str]
    findings_new: list[str]
    findings_kept: list[str]
    # for the HTML page (export_html): each side's diagnosis (Diagnosis.to_dict()), the
    # mean per step of gpuprof.diagnose.step_breakdown's parts, and the sides' names
    diagnosis_before: dict = dataclasses.field(default_factory=dict, repr=False)
    diagnosis_after: dict = dataclasses.field(default_factory=dict, repr=False)
    breakdown_before: dict = dataclasses.field(default_factory=dict, repr=False)
    breakdown_after: dict = dataclasses.field(default_factory=dict, repr=False)
    labels: tuple[str, str] = ("before", "after")

    @property
    def speedup(self) -> float:
        return self.step_before_ns / self.step_after_ns if self.step_after_ns else float("inf")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["speedup"] = self.speedup
        return d

    def __str__(self) -> str:
        out = ["gpuprof compare (per step: before -> after)", ""]
        out.append(
            f"step time: {format_time(self.step_before_ns)} -> "
            f"{format_time(self.step_after_ns)} "
            f"({_pct(self.step_before_ns, self.step_after_ns)}"
            f", {self.speedup:.2f}x)"
        )
        for title, rows in (
            ("ops (self CPU time)", self.ops),
            ("GPU activity (kernel time)", self.kernels),
        ):
            if not rows:
                continue
            out += ["", title]
            width = min(max(len(r.name) for r in rows), 60)
            out.append(f"  {'name':{width}s} {'before':>11s} {'after':>11s} {'change':>9s}")
            for r in rows:
                name = r.name if len(r.name) <= width else r.name[: width - 3] + "..."
                out.append(
                    f"  {name:{width}s} {format_time(r.before_ns):>11s} "
                    f"{format_time(r.after_ns):>11s} {_pct(r.before_ns, r.after_ns):>9s}"
                )
        out.append("")
        for label, items in (
            ("findings gone", self.findings_gone),
            ("findings new", self.findings_new),
            ("findings still present", self.findings_kept),
        ):
            out.append(f"{label}: {', '.join(items) if items else 'none'}")
        return "\n".join(out) + "\n"

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(str(self))}</pre>"


def _pct(before: float, after: float) -> str:
    if not before:
        return "new" if after else "0%"
    return f"{100.0 * (after - before) / before:+.1f}%"


def _deltas(before: dict[str, float], after: dict[str, float], limit: int) -> list[Delta]:
    names = set(before) | set(after)
    rows = [Delta(n, before.get(n, 0.0), after.get(n, 0.0)) for n in names]
    rows.sort(key=lambda d: -abs(d.change_ns))
    return rows[:limit]


def _op_times(res: Results, steps: int) -> dict[str, float]:
    ops = res.ops()
    out: dict[str, float] = {}
    for name, file, line, kind, self_ns in zip(
        ops["name"], ops["file"], ops["line"], ops["kind"], ops["cpu_self_ns"]
    ):
        key = display_name(str(name), str(file), int(line), str(kind))
        out[key] = out.get(key, 0.0) + float(self_ns) / steps
    return out


def _kernel_times(res: Results, steps: int) -> dict[str, float]:
    k = res.kernels()
    out: dict[str, float] = {}
    for name, t in zip(k["name"], k["total_ns"]):
        out[str(name)] = out.get(str(name), 0.0) + float(t) / steps
    return out


def build(before: object, after: object, limit: int, cls: type[_C]) -> _C:
    """The comparison of two profiles (loaded profiles or Results) as a ``cls``;
    ``limit``: rows per table, already checked (see :func:`gpuprof.compare`)."""
    rb, ra = _results(before), _results(after)
    sb, nb = _per_step(rb)
    sa, na = _per_step(ra)
    db, da = diagnose(rb), diagnose(ra)
    kb = {f.kind for f in db}
    ka = {f.kind for f in da}
    return cls(
        step_before_ns=sb,
        step_after_ns=sa,
        ops=_deltas(_op_times(rb, nb), _op_times(ra, na), limit),
        kernels=_deltas(_kernel_times(rb, nb), _kernel_times(ra, na), limit),
        findings_gone=sorted(kb - ka),
        findings_new=sorted(ka - kb),
        findings_kept=sorted(kb & ka),
        diagnosis_before=db.to_dict(),
        diagnosis_after=da.to_dict(),
        breakdown_before=_mean_breakdown(rb),
        breakdown_after=_mean_breakdown(ra),
        labels=(_label(before, "before"), _label(after, "after")),
    )


def _mean_breakdown(res: Results) -> dict[str, float]:
    """Mean per step of each part of gpuprof.diagnose.step_breakdown."""
    from .diagnose import step_breakdown

    b = step_breakdown(res)
    return {
        f: float(b[f].mean()) if len(b) else 0.0
        for f in ("step_ns", "gpu_busy_ns", "comm_ns", "data_wait_ns", "sync_wait_ns", "idle_ns")
    }


def _label(x, default: str) -> str:
    """A side's name: "before" or "after", with the saved file's name when there is one."""
    path = x if isinstance(x, str) else getattr(x, "path", None)
    return f"{default} ({os.path.basename(path)})" if isinstance(path, str) and path else default
