"""Hardware metrics for the hottest kernels, and what bounds each of them
(docs/kernels.md). The analysis is in gpuprof.analysis.deepdive; this module adds what
needs a profile: :func:`deep_dive` replays the work under one to name each
kernel's CUPTI range.
"""

from __future__ import annotations

from ..analysis import deepdive as _deepdive
from ..analysis.deepdive import (
    BUSY_PCT,
    METRICS,
    DeepDiveReport,
    KernelDeepDive,
    classify,
    derived,
    match_ncu_rows,
    parse_ncu_csv,
)
from .profiler import kernel_sequence

__all__ = [
    "BUSY_PCT",
    "DeepDiveReport",
    "KernelDeepDive",
    "METRICS",
    "classify",
    "deep_dive",
    "derived",
    "match_ncu_rows",
    "parse_ncu_csv",
]


def deep_dive(
    results,
    top: int = 5,
    replay=None,
    *,
    command=None,
    backend: str = "auto",
    max_kernels: int = 20000,
    timeout_s: float | None = 1800.0,
    ncu: str | None = None,
) -> DeepDiveReport:
    """Hardware metrics and a bound verdict for the ``top`` kernels of ``results``:
    :func:`gpuprof.analysis.deepdive.deep_dive` (every argument is documented there), with
    the replay's kernels named by a plain gpuprof profile."""
    return _deepdive.deep_dive(
        results,
        top,
        replay,
        command=command,
        backend=backend,
        max_kernels=max_kernels,
        timeout_s=timeout_s,
        ncu=ncu,
        kernel_sequence=kernel_sequence,
    )
