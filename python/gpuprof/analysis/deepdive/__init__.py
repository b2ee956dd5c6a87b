"""Hardware metrics for the hottest kernels, and what bounds each of them (the
analysis; gpuprof.deepdive is the public module, which runs the replays under a
gpuprof profile).

``prof.deep_dive(top=5, replay=step)`` takes the ``top`` kernels with the most
GPU time in the recorded window, replays ``step`` (a callable that runs the
same work again, e.g. one training step) under CUPTI's range profiler, and
reports for each kernel: SM throughput and DRAM throughput as % of peak,
achieved occupancy, L1 and L2 hit rates, tensor-pipe utilization, achieved
FP32/FP64/FP16 FLOP/s (non-tensor instructions) and DRAM bandwidth, plus a
verdict: compute-bound, memory-bound or latency-bound (:func:`classify`).

How the CUPTI path works (``backend="cupti"``):

1. ``step`` runs once under a plain gpuprof profile: the kernels it launches,
   in launch order (CUPTI correlation ids), give the name of every range.
2. ``step`` runs again with the range profiler in auto-range / kernel-replay
   mode: every kernel is one range, replayed by CUPTI as many times as the
   metrics need (their values are the same as one undisturbed run's; their
   time is not, which is why this never happens inside a recorded window).
3. Range i is kernel i of step 1; the ranges of the top kernels are averaged
   (percentages weighted by each launch's duration) and summed (counts).

The range profiler is reached through ``ctypes`` on the libcupti that
gpuprof already loaded (``gpuprof.cuda_status()["library"]``): its host API
header is C++-only, and nothing of it is needed on the hot path. The
parameter structs below mirror cupti_range_profiler.h, cupti_profiler_host.h,
cupti_profiler_target.h and cupti_target.h of CUDA 12.6+ (checked against the
headers by tests/unit/test_occupancy.py when they are installed).

Without CUPTI access, ``backend="ncu"`` runs ``command`` (a script that does
the same work) under Nsight Compute (``ncu --clock-control none``) and parses
its CSV for the same metrics. When neither works the report says why, in
plain words, and how to fix it; nothing else of the profile is affected.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable, Sequence

from ._cupti import _run_cupti
from ._ncu import _run_ncu, match_ncu_rows, parse_ncu_csv
from ._report import (
    BUSY_PCT,
    METRICS,
    DeepDiveReport,
    KernelDeepDive,
    aggregate_launches,
    classify,
    derived,
)

__all__ = [
    "BUSY_PCT",
    "DeepDiveReport",
    "KernelDeepDive",
    "METRICS",
    "aggregate_launches",
    "classify",
    "deep_dive",
    "derived",
    "match_ncu_rows",
    "parse_ncu_csv",
]

# -- entry point ---------------------------------------------------------------------------


def _top_kernels(results, top: int) -> list[KernelDeepDive]:
    import numpy as np

    k = results.kernels()
    if len(k) == 0:
        return []
    total = float(k[k["category"] != "sync"]["total_ns"].sum()) or 1.0  # GPU time, no syncs
    keep = np.nonzero(k["category"] == "compute")[0]
    order = keep[np.argsort(-k["total_ns"][keep], kind="stable")][:top]
    return [
        KernelDeepDive(
            name=str(k["name"][i]),
            device=int(k["device"][i]),
            gpu_time_ns=int(k["total_ns"][i]),
            calls=int(k["calls"][i]),
            share=float(k["total_ns"][i]) / total,
            occupancy=float(k["occupancy"][i]),
            occupancy_limiter=str(k["occupancy_limiter"][i]),
        )
        for i in order
    ]


def _check_args(top, replay, command, backend, max_kernels, timeout_s):
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"deep_dive(): top must be a positive int, got {top!r}")
    if replay is not None and not callable(replay):
        raise TypeError(
            f"deep_dive(): replay must be a callable that runs the work again (one "
            f"training step, say), got {replay!r}"
        )
    if command is not None:
        if isinstance(command, str):
            command = shlex.split(command)
        if (
            not isinstance(command, Sequence)
            or not command
            or not all(isinstance(c, (str, os.PathLike)) for c in command)
        ):
            raise TypeError(
                "deep_dive(): command must be a list of str (the program and its "
                f"arguments, run under ncu), got {command!r}"
            )
        command = [os.fspath(c) for c in command]
    if backend not in ("auto", "cupti", "ncu"):
        raise ValueError(f"deep_dive(): backend must be 'auto', 'cupti' or 'ncu', got {backend!r}")
    if backend == "cupti" and replay is None:
        raise ValueError(
            "deep_dive(backend='cupti'): pass replay=<callable that runs the same "
            "work again>, e.g. replay=lambda: train_step(batch)"
        )
    if backend == "ncu" and command is None:
        raise ValueError(
            "deep_dive(backend='ncu'): pass command=['python', 'train.py', ...], "
            "the program ncu should run"
        )
    if replay is None and command is None:
        raise ValueError(
            "deep_dive(): pass replay=<callable that runs the same work again> "
            "(CUPTI, in this process) or command=[program, args...] (Nsight "
            "Compute, in a subprocess)"
        )
    if isinstance(max_kernels, bool) or not isinstance(max_kernels, int) or max_kernels < 1:
        raise ValueError(f"deep_dive(): max_kernels must be a positive int, got {max_kernels!r}")
    if timeout_s is not None and (not isinstance(timeout_s, (int, float)) or timeout_s <= 0):
        raise ValueError(
            f"deep_dive(): timeout_s must be a positive number or None, got {timeout_s!r}"
        )
    return command


def deep_dive(
    results,
    top: int = 5,
    replay: Callable[[], object] | None = None,
    *,
    command: Sequence[str] | str | None = None,
    backend: str = "auto",
    max_kernels: int = 20000,
    timeout_s: float | None = 1800.0,
    ncu: str | None = None,
    kernel_sequence: Callable[[Callable[[], object]], list[tuple[str, int]]] | None = None,
) -> DeepDiveReport:
    """Hardware metrics and a bound verdict for the ``top`` kernels of ``results``.

    Args:
        results: a :class:`gpuprof.Results` (``prof.results``) with GPU kernels.
        top: how many kernels, by GPU time in the recorded window.
        replay: a callable that runs the same work again (one training step):
            it runs twice, once to name the kernels and once under the range
            profiler. It must launch the same kernels in the same order both
            times (warm up first: autotuners and lazy initialisation launch
            extra kernels).
        command: the program to run under Nsight Compute instead (``ncu``
            backend), e.g. ``["python", "train.py", "--steps", "3"]``.
        backend: "cupti" (needs ``replay``), "ncu" (needs ``command`` and ncu on
            PATH) or "auto" (CUPTI when ``replay`` is given, ncu when CUPTI
            cannot be used and ``command`` is given).
        max_kernels: at most this many kernel launches of one replay are
            profiled (the rest are not measured).
        timeout_s: ncu backend: give up after this long.
        ncu: path of the ncu executable (default: found on PATH).
        kernel_sequence: ``kernel_sequence(replay)`` runs ``replay`` once and returns
            (name, device) of the kernels it launched, in launch order; gpuprof.deepdive
            and ``profile.deep_dive`` pass :func:`gpuprof.profiler.kernel_sequence`.

    Returns:
        A :class:`DeepDiveReport`; when no metrics could be collected its
        ``reason`` says why and how to fix it (no exception).

    Raises:
        ValueError, TypeError: bad arguments (the message names the argument).
    """
    command = _check_args(top, replay, command, backend, max_kernels, timeout_s)
    kernels = _top_kernels(results, top)
    report = DeepDiveReport(kernels=kernels)
    if not kernels:
        report.reason = (
            "the recorded window has no GPU kernels (was GPU capture on? see gpuprof.cuda_status())"
        )
        return report
    reasons = []
    t0 = time.perf_counter()
    if backend in ("auto", "cupti") and replay is not None:
        ok, why = _run_cupti(report, replay, max_kernels, kernel_sequence)
        if ok:
            report.elapsed_s = time.perf_counter() - t0
            return report
        reasons.append(f"CUPTI: {why}")
    if backend in ("auto", "ncu") and command is not None:
        ok, why = _run_ncu(report, command, ncu, timeout_s)
        if ok:
            report.elapsed_s = time.perf_counter() - t0
            return report
        reasons.append(f"Nsight Compute: {why}")
    report.elapsed_s = time.perf_counter() - t0
    report.reason = "; ".join(reasons)
    for k in report.kernels:
        k.why = "not profiled"
    return report
