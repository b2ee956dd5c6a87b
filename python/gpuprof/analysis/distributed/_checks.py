"""The cross-rank diagnosis rules (``RANK_CHECKS``): they read a
:class:`MergedRun`; gpuprof.diagnose runs them for a merged run."""

from __future__ import annotations

import numpy as np

from ...core._format import format_time
from ...results._findings import Diagnosis, Finding

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
