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

import csv
import ctypes
import io
import math
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "BUSY_PCT",
    "DeepDiveReport",
    "KernelDeepDive",
    "METRICS",
    "classify",
    "deep_dive",
    "parse_ncu_csv",
]

# -- classification ------------------------------------------------------------------------

#: A unit running at or above this % of its peak is the kernel's bottleneck
#: candidate (Nsight Compute's speed-of-light guidance: below 60% of peak on
#: both compute and memory, a kernel is usually latency-bound).
BUSY_PCT = 60.0

BOUNDS = ("compute-bound", "memory-bound", "latency-bound", "unknown")


def classify(
    sm_pct: float | None,
    dram_pct: float | None,
    *,
    tensor_pct: float | None = None,
    memory_pct: float | None = None,
    achieved_occupancy_pct: float | None = None,
) -> tuple[str, str]:
    """Classify a kernel from its throughputs as % of peak.

    Rules, with ``compute = max(sm_pct, tensor_pct)``:

    1. compute or DRAM at or above :data:`BUSY_PCT` (60%): the busier one
       bounds the kernel (``compute-bound`` when compute >= DRAM, else
       ``memory-bound``);
    2. else, on-chip memory (``memory_pct``, Nsight Compute's "Memory
       Throughput": the busiest of DRAM, L2, L1 and shared memory) at or above
       60%: ``memory-bound`` by L1/L2/shared-memory bandwidth;
    3. else ``latency-bound``: no unit is near its peak, so the kernel waits
       (too few warps in flight, dependent memory accesses, a grid too small
       to fill the GPU, or a launch too short to ramp up).

    Returns ``(bound, why)``: one of "compute-bound", "memory-bound",
    "latency-bound" ("unknown" when SM or DRAM throughput is missing) and a
    sentence giving the figures.
    """

    def num(x):
        return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)

    sm, dram, tensor, mem, occ = map(
        num, (sm_pct, dram_pct, tensor_pct, memory_pct, achieved_occupancy_pct)
    )
    if sm is None or dram is None:
        return "unknown", "SM or DRAM throughput was not measured"
    compute = max(sm, tensor or 0.0)
    what = f"SM {sm:.0f}%" + (f", tensor pipes {tensor:.0f}%" if tensor is not None else "")
    if compute >= BUSY_PCT or dram >= BUSY_PCT:
        if compute >= dram:
            return "compute-bound", (
                f"compute is the busiest unit ({what} of peak; DRAM {dram:.0f}%)"
            )
        return "memory-bound", f"DRAM at {dram:.0f}% of peak bandwidth ({what})"
    if mem is not None and mem >= BUSY_PCT:
        return "memory-bound", (
            f"on-chip memory (L1/L2/shared) at {mem:.0f}% of peak while DRAM "
            f"is at {dram:.0f}% and {what}"
        )
    why = (
        f"no unit near its peak ({what}, DRAM {dram:.0f}%, threshold {BUSY_PCT:.0f}%): "
        "the kernel waits on latency"
    )
    if occ is not None and occ < 25.0:
        why += f"; achieved occupancy is only {occ:.0f}% (too few warps to hide it)"
    return "latency-bound", why


# -- metrics -------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricSpec:
    """One reported quantity: the first (or the largest, ``combine="max"``) of
    the candidate metric names that the chip supports."""

    field: str
    candidates: tuple[str, ...]
    kind: str  # "pct" (averaged, weighted by duration), "count" (summed), "ns" (summed)
    combine: str = "first"


#: What deep_dive collects (Nsight Compute metric names; the same for CUPTI).
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("duration_ns", ("gpu__time_duration.sum",), "ns"),
    MetricSpec("sm_pct", ("sm__throughput.avg.pct_of_peak_sustained_elapsed",), "pct"),
    MetricSpec(
        "dram_pct",
        (
            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        ),
        "pct",
    ),
    MetricSpec(
        "memory_pct", ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",), "pct"
    ),
    MetricSpec(
        "achieved_occupancy_pct", ("sm__warps_active.avg.pct_of_peak_sustained_active",), "pct"
    ),
    MetricSpec("l1_hit_pct", ("l1tex__t_sector_hit_rate.pct",), "pct"),
    MetricSpec("l2_hit_pct", ("lts__t_sector_hit_rate.pct",), "pct"),
    MetricSpec(
        "tensor_pct",
        (
            # HMMA/HGMMA/QGMMA ops up to Hopper; any tensor op (the only one on Blackwell)
            "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
            "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
        ),
        "pct",
        combine="max",
    ),
    MetricSpec("dram_bytes", ("dram__bytes.sum",), "count"),
    MetricSpec("fp32_add", ("smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",), "count"),
    MetricSpec("fp32_mul", ("smsp__sass_thread_inst_executed_op_fmul_pred_on.sum",), "count"),
    MetricSpec("fp32_fma", ("smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",), "count"),
    MetricSpec("fp64_add", ("smsp__sass_thread_inst_executed_op_dadd_pred_on.sum",), "count"),
    MetricSpec("fp64_mul", ("smsp__sass_thread_inst_executed_op_dmul_pred_on.sum",), "count"),
    MetricSpec("fp64_fma", ("smsp__sass_thread_inst_executed_op_dfma_pred_on.sum",), "count"),
    MetricSpec("fp16_add", ("smsp__sass_thread_inst_executed_op_hadd_pred_on.sum",), "count"),
    MetricSpec("fp16_mul", ("smsp__sass_thread_inst_executed_op_hmul_pred_on.sum",), "count"),
    MetricSpec("fp16_fma", ("smsp__sass_thread_inst_executed_op_hfma_pred_on.sum",), "count"),
)

_SPEC = {s.field: s for s in METRICS}


def _all_metric_names() -> list[str]:
    return [m for s in METRICS for m in s.candidates]


def aggregate_launches(launches: list[dict[str, float]]) -> dict[str, float]:
    """Per-launch values (field -> value; absent when not measured) into one
    kernel's: ns and counts summed, percentages averaged weighted by duration."""
    out: dict[str, float] = {}
    if not launches:
        return out
    weights = [max(float(lv.get("duration_ns", 0.0) or 0.0), 0.0) for lv in launches]
    if not any(weights):
        weights = [1.0] * len(launches)
    for spec in METRICS:
        pairs = [
            (lv[spec.field], w)
            for lv, w in zip(launches, weights, strict=True)
            if lv.get(spec.field) is not None and not math.isnan(lv[spec.field])
        ]
        if not pairs:
            continue
        if spec.kind == "pct":
            wsum = sum(w for _, w in pairs)
            out[spec.field] = (
                sum(v * w for v, w in pairs) / wsum
                if wsum
                else sum(v for v, _ in pairs) / len(pairs)
            )
        else:
            out[spec.field] = sum(v for v, _ in pairs)
    return out


def derived(m: dict[str, float]) -> dict[str, float]:
    """FLOP/s by precision (add and mul count 1, FMA 2; non-tensor instructions
    only), DRAM bandwidth (bytes/s) and arithmetic intensity (FLOP per DRAM byte)."""
    out: dict[str, float] = {}
    dur = m.get("duration_ns")
    if not dur:
        return out
    flops_total = 0.0
    have_flops = False
    for p in ("fp32", "fp64", "fp16"):
        parts = [m.get(f"{p}_add"), m.get(f"{p}_mul"), m.get(f"{p}_fma")]
        if all(x is None for x in parts):
            continue
        f = (parts[0] or 0.0) + (parts[1] or 0.0) + 2.0 * (parts[2] or 0.0)
        out[f"{p}_flops_per_s"] = f / (dur * 1e-9)
        flops_total += f
        have_flops = True
    if m.get("dram_bytes") is not None:
        out["dram_bytes_per_s"] = m["dram_bytes"] / (dur * 1e-9)
        if have_flops and m["dram_bytes"] > 0:
            out["flop_per_dram_byte"] = flops_total / m["dram_bytes"]
    return out


# -- report --------------------------------------------------------------------------------


@dataclass
class KernelDeepDive:
    """One hot kernel: where it stood in the recorded window and what the counters say."""

    name: str
    device: int
    gpu_time_ns: int  # in the recorded window(s)
    calls: int  # in the recorded window(s)
    share: float  # of the GPU time of all kernels() rows (copies too), 0..1
    occupancy: float  # theoretical, 0..1 (NaN when unknown)
    occupancy_limiter: str
    launches_profiled: int = 0  # launches measured during the replay
    metrics: dict[str, float] = field(default_factory=dict)  # METRICS fields
    bound: str = "unknown"
    why: str = "not profiled"

    def get(self, key: str) -> float | None:
        return self.metrics.get(key)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "device": self.device,
            "gpu_time_ns": self.gpu_time_ns,
            "calls": self.calls,
            "share": self.share,
            "occupancy": None if math.isnan(self.occupancy) else self.occupancy,
            "occupancy_limiter": self.occupancy_limiter,
            "launches_profiled": self.launches_profiled,
            "metrics": dict(self.metrics),
            "bound": self.bound,
            "why": self.why,
        }


@dataclass
class DeepDiveReport:
    """What :func:`deep_dive` found. ``print()`` it; ``available`` says whether
    hardware metrics were collected, ``reason`` why not."""

    kernels: list[KernelDeepDive]
    backend: str = "none"  # "cupti", "ncu" or "none"
    available: bool = False
    reason: str = ""
    elapsed_s: float = 0.0  # wall time the replay and the collection took
    replays: int = 0  # how many times the workload ran for it
    passes: int = 0  # hardware passes per kernel (CUPTI)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "backend": self.backend,
            "available": self.available,
            "reason": self.reason,
            "elapsed_s": self.elapsed_s,
            "replays": self.replays,
            "passes": self.passes,
            "notes": list(self.notes),
            "kernels": [k.to_dict() for k in self.kernels],
        }

    def __str__(self) -> str:
        lines = []
        if self.available:
            lines.append(
                f"Kernel deep dive: {self.backend}, {self.replays} replay(s), "
                f"{self.passes or '?'} pass(es) per kernel, {self.elapsed_s:.1f} s"
            )
        else:
            lines.append(f"Kernel deep dive: no hardware metrics: {self.reason}")
        head = (
            f"{'Kernel':48s} {'GPU time':>9s} {'%':>5s} {'Occ':>4s} {'AchOcc':>6s} "
            f"{'SM%':>4s} {'DRAM%':>5s} {'Mem%':>4s} {'Tens%':>5s} {'L1hit':>5s} "
            f"{'L2hit':>5s}  Bound"
        )
        lines.append(head)
        from ._format import format_time

        def pct(v, w):
            return f"{v:{w}.0f}" if v is not None else f"{'-':>{w}s}"

        for k in self.kernels:
            name = k.name if len(k.name) <= 48 else k.name[:45] + "..."
            occ = "-" if math.isnan(k.occupancy) else f"{100 * k.occupancy:.0f}"
            lines.append(
                f"{name:48s} {format_time(k.gpu_time_ns):>9s} {100 * k.share:5.1f} {occ:>4s} "
                f"{pct(k.get('achieved_occupancy_pct'), 6)} {pct(k.get('sm_pct'), 4)} "
                f"{pct(k.get('dram_pct'), 5)} {pct(k.get('memory_pct'), 4)} "
                f"{pct(k.get('tensor_pct'), 5)} {pct(k.get('l1_hit_pct'), 5)} "
                f"{pct(k.get('l2_hit_pct'), 5)}  {k.bound}"
            )
        for k in self.kernels:
            if k.bound != "unknown":
                d = derived(k.metrics)
                extra = [
                    f"{v / 1e12:.2f} {p[:4].upper()} TFLOP/s"
                    for p, v in ((p, d.get(f"{p}_flops_per_s")) for p in ("fp32", "fp64", "fp16"))
                    if v
                ]
                if d.get("dram_bytes_per_s"):
                    extra.append(f"DRAM {d['dram_bytes_per_s'] / 1e9:.0f} GB/s")
                tail = f" [{', '.join(extra)}]" if extra else ""
                lines.append(f"  {k.name[:60]}: {k.bound}: {k.why}{tail}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


# -- entry point ---------------------------------------------------------------------------


def _top_kernels(results, top: int) -> list[KernelDeepDive]:
    import numpy as np

    k = results.kernels()
    if len(k) == 0:
        return []
    total = float(k["total_ns"].sum()) or 1.0
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


def _finish(report: DeepDiveReport, per_kernel: dict[str, list[dict[str, float]]]) -> None:
    for k in report.kernels:
        launches = per_kernel.get(k.name, [])
        k.launches_profiled = len(launches)
        k.metrics = aggregate_launches(launches)
        if not launches:
            k.bound, k.why = "unknown", "no launch of this kernel was measured during the replay"
            continue
        m = k.metrics
        k.bound, k.why = classify(
            m.get("sm_pct"),
            m.get("dram_pct"),
            tensor_pct=m.get("tensor_pct"),
            memory_pct=m.get("memory_pct"),
            achieved_occupancy_pct=m.get("achieved_occupancy_pct"),
        )


# -- plain-words explanations ----------------------------------------------------------------

PRIVILEGES_FIX = (
    "GPU performance counters are restricted to administrators on this machine (the NVIDIA "
    "driver's default, NVreg_RestrictProfilingToAdminUsers=1). Fix: run as root (in a "
    "container add --cap-add=SYS_ADMIN), or allow all users: echo 'options nvidia "
    "NVreg_RestrictProfilingToAdminUsers=0' | sudo tee /etc/modprobe.d/nvidia-profiling.conf, "
    "rebuild the initramfs and reboot (https://developer.nvidia.com/ERR_NVGPUCTRPERM)"
)
VIRTUAL_FIX = (
    "this is a virtual GPU (vGPU or a cloud VM's passthrough without counter access) on which "
    "performance counters are not enabled. Fix: ask the host administrator to enable profiling "
    "for the vGPU (NVIDIA vGPU: the 'enable_profiling' vGPU plugin parameter), or use a "
    "bare-metal GPU"
)
BUSY_FIX = (
    "another profiler holds the GPU's performance counters (Nsight Compute or Systems with GPU "
    "metrics, DCGM profiling metrics as collected by dcgm-exporter, or a second CUPTI "
    "profiling session). Fix: stop it for the duration (e.g. 'dcgmi profile --pause'), then "
    "run deep_dive again"
)

_CUPTI_EXPLAIN = {
    35: PRIVILEGES_FIX,
    33: VIRTUAL_FIX,
    40: VIRTUAL_FIX,
    26: BUSY_FIX,
    36: BUSY_FIX,
    39: BUSY_FIX,
    41: "confidential computing is on for this GPU, which disables performance counters",
    42: "NVIDIA CMP (crypto mining) GPUs do not expose performance counters",
    43: (
        "this is a MIG instance; counters of a MIG slice need CUDA 12.x drivers with MIG "
        "profiling support and a whole-GPU profiler is not allowed: profile on a full GPU"
    ),
    44: "SLI is enabled, which disables performance counters",
    45: "this WSL setup does not support GPU performance counters (needs a recent WSL driver)",
    46: "CUPTI does not know this GPU's chip: install a libcupti at least as new as the GPU",
}


# -- CUPTI range profiler through ctypes ----------------------------------------------------

_sz = ctypes.c_size_t
_vp = ctypes.c_void_p
_cp = ctypes.c_char_p
_u8p = ctypes.POINTER(ctypes.c_uint8)


def _params(name: str, fields: list[tuple[str, object]]):
    """A CUPTI parameter struct: structSize and pPriv first; ``size`` is
    CUPTI_PROFILER_STRUCT_SIZE (the end of the last field, no tail padding)."""
    cls = type(
        name, (ctypes.Structure,), {"_fields_": [("structSize", _sz), ("pPriv", _vp)] + fields}
    )
    last = getattr(cls, cls._fields_[-1][0])
    cls.size = last.offset + last.size
    return cls


#: Parameter structs by short name (entry point -> name in _ENTRY).
CUPTI_PARAMS = {
    "Initialize": _params("CUpti_Profiler_Initialize_Params", []),
    "DeInitialize": _params("CUpti_Profiler_DeInitialize_Params", []),
    "GetChipName": _params(
        "CUpti_Device_GetChipName_Params", [("deviceIndex", _sz), ("pChipName", _cp)]
    ),
    "GetCounterAvailability": _params(
        "CUpti_Profiler_GetCounterAvailability_Params",
        [("ctx", _vp), ("counterAvailabilityImageSize", _sz), ("pCounterAvailabilityImage", _u8p)],
    ),
    "DeviceSupported": _params(
        "CUpti_Profiler_DeviceSupported_Params",
        [
            ("cuDevice", ctypes.c_int),
            ("isSupported", ctypes.c_int),
            ("architecture", ctypes.c_int),
            ("sli", ctypes.c_int),
            ("vGpu", ctypes.c_int),
            ("confidentialCompute", ctypes.c_int),
            ("cmp", ctypes.c_int),
            ("wsl", ctypes.c_int),
            ("api", ctypes.c_int),
        ],
    ),
    "HostInitialize": _params(
        "CUpti_Profiler_Host_Initialize_Params",
        [
            ("profilerType", ctypes.c_int),
            ("pChipName", _cp),
            ("pCounterAvailabilityImage", _u8p),
            ("pHostObject", _vp),
        ],
    ),
    "HostDeinitialize": _params("CUpti_Profiler_Host_Deinitialize_Params", [("pHostObject", _vp)]),
    "HostGetMetricProperties": _params(
        "CUpti_Profiler_Host_GetMetricProperties_Params",
        [
            ("pHostObject", _vp),
            ("pMetricName", _cp),
            ("pDescription", _cp),
            ("pHwUnit", _cp),
            ("pDimUnit", _cp),
            ("metricType", ctypes.c_int),
        ],
    ),
    "HostConfigAddMetrics": _params(
        "CUpti_Profiler_Host_ConfigAddMetrics_Params",
        [("pHostObject", _vp), ("ppMetricNames", ctypes.POINTER(_cp)), ("numMetrics", _sz)],
    ),
    "HostGetConfigImageSize": _params(
        "CUpti_Profiler_Host_GetConfigImageSize_Params",
        [("pHostObject", _vp), ("configImageSize", _sz)],
    ),
    "HostGetConfigImage": _params(
        "CUpti_Profiler_Host_GetConfigImage_Params",
        [("pHostObject", _vp), ("configImageSize", _sz), ("pConfigImage", _u8p)],
    ),
    "HostGetNumOfPasses": _params(
        "CUpti_Profiler_Host_GetNumOfPasses_Params",
        [("configImageSize", _sz), ("pConfigImage", _u8p), ("numOfPasses", _sz)],
    ),
    "HostEvaluateToGpuValues": _params(
        "CUpti_Profiler_Host_EvaluateToGpuValues_Params",
        [
            ("pHostObject", _vp),
            ("pCounterDataImage", _u8p),
            ("counterDataImageSize", _sz),
            ("rangeIndex", _sz),
            ("ppMetricNames", ctypes.POINTER(_cp)),
            ("numMetrics", _sz),
            ("pMetricValues", ctypes.POINTER(ctypes.c_double)),
        ],
    ),
    "Enable": _params(
        "CUpti_RangeProfiler_Enable_Params", [("ctx", _vp), ("pRangeProfilerObject", _vp)]
    ),
    "Disable": _params("CUpti_RangeProfiler_Disable_Params", [("pRangeProfilerObject", _vp)]),
    "Start": _params("CUpti_RangeProfiler_Start_Params", [("pRangeProfilerObject", _vp)]),
    "Stop": _params(
        "CUpti_RangeProfiler_Stop_Params",
        [
            ("pRangeProfilerObject", _vp),
            ("passIndex", _sz),
            ("targetNestingLevel", _sz),
            ("isAllPassSubmitted", ctypes.c_uint8),
        ],
    ),
    "SetConfig": _params(
        "CUpti_RangeProfiler_SetConfig_Params",
        [
            ("pRangeProfilerObject", _vp),
            ("configSize", _sz),
            ("pConfig", _u8p),
            ("counterDataImageSize", _sz),
            ("pCounterDataImage", _u8p),
            ("range", ctypes.c_int),
            ("replayMode", ctypes.c_int),
            ("maxRangesPerPass", _sz),
            ("numNestingLevels", ctypes.c_uint16),
            ("minNestingLevel", ctypes.c_uint16),
            ("passIndex", _sz),
            ("targetNestingLevel", ctypes.c_uint16),
        ],
    ),
    "DecodeData": _params(
        "CUpti_RangeProfiler_DecodeData_Params",
        [("pRangeProfilerObject", _vp), ("numOfRangeDropped", _sz)],
    ),
    "GetCounterDataSize": _params(
        "CUpti_RangeProfiler_GetCounterDataSize_Params",
        [
            ("pRangeProfilerObject", _vp),
            ("pMetricNames", ctypes.POINTER(_cp)),
            ("numMetrics", _sz),
            ("maxNumOfRanges", _sz),
            ("maxNumRangeTreeNodes", ctypes.c_uint32),
            ("counterDataSize", _sz),
        ],
    ),
    "CounterDataImageInitialize": _params(
        "CUpti_RangeProfiler_CounterDataImage_Initialize_Params",
        [("pRangeProfilerObject", _vp), ("counterDataSize", _sz), ("pCounterData", _u8p)],
    ),
    "GetCounterDataInfo": _params(
        "CUpti_RangeProfiler_GetCounterDataInfo_Params",
        [("pCounterDataImage", _u8p), ("counterDataImageSize", _sz), ("numTotalRanges", _sz)],
    ),
}

# enum values (cupti_profiler_target.h, cupti_profiler_host.h)
CUPTI_AUTO_RANGE = 1
CUPTI_KERNEL_REPLAY = 2
CUPTI_PROFILER_TYPE_RANGE_PROFILER = 0
CUPTI_PROFILER_RANGE_PROFILING = 0
CUPTI_ERROR_NOT_INITIALIZED = 15
SUPPORT_UNKNOWN, SUPPORT_UNSUPPORTED, SUPPORT_DISABLED, SUPPORT_SUPPORTED = 0, 1, 2, 3

# entry point -> CUPTI_PARAMS key
_ENTRY = {
    "cuptiProfilerInitialize": "Initialize",
    "cuptiProfilerDeInitialize": "DeInitialize",
    "cuptiDeviceGetChipName": "GetChipName",
    "cuptiProfilerGetCounterAvailability": "GetCounterAvailability",
    "cuptiProfilerDeviceSupported": "DeviceSupported",
    "cuptiProfilerHostInitialize": "HostInitialize",
    "cuptiProfilerHostDeinitialize": "HostDeinitialize",
    "cuptiProfilerHostGetMetricProperties": "HostGetMetricProperties",
    "cuptiProfilerHostConfigAddMetrics": "HostConfigAddMetrics",
    "cuptiProfilerHostGetConfigImageSize": "HostGetConfigImageSize",
    "cuptiProfilerHostGetConfigImage": "HostGetConfigImage",
    "cuptiProfilerHostGetNumOfPasses": "HostGetNumOfPasses",
    "cuptiProfilerHostEvaluateToGpuValues": "HostEvaluateToGpuValues",
    "cuptiRangeProfilerEnable": "Enable",
    "cuptiRangeProfilerDisable": "Disable",
    "cuptiRangeProfilerStart": "Start",
    "cuptiRangeProfilerStop": "Stop",
    "cuptiRangeProfilerSetConfig": "SetConfig",
    "cuptiRangeProfilerDecodeData": "DecodeData",
    "cuptiRangeProfilerGetCounterDataSize": "GetCounterDataSize",
    "cuptiRangeProfilerCounterDataImageInitialize": "CounterDataImageInitialize",
    "cuptiRangeProfilerGetCounterDataInfo": "GetCounterDataInfo",
}


class _CuptiFailure(Exception):
    def __init__(self, call: str, code: int, text: str):
        super().__init__(f"{call} failed: {text} ({code})")
        self.call, self.code, self.text = call, code, text

    def explain(self) -> str:
        fix = _CUPTI_EXPLAIN.get(self.code)
        return f"{self} — {fix}" if fix else str(self)


class _Cupti:
    """The profiler entry points of an already-loaded libcupti, and libcuda's few."""

    def __init__(self, cupti_path: str, driver: bool = True):
        self.lib = ctypes.CDLL(cupti_path)
        self.fns = {}
        for entry in _ENTRY:
            try:
                fn = getattr(self.lib, entry)
            except AttributeError:
                raise RuntimeError(
                    f"libcupti at {cupti_path} lacks {entry}: the range "
                    "profiler needs CUPTI from CUDA 12.6 or newer"
                ) from None
            fn.restype = ctypes.c_int
            fn.argtypes = [_vp]
            self.fns[entry] = fn
        for name, args in (
            ("cuptiSubscribe", [ctypes.POINTER(_vp), _vp, _vp]),
            ("cuptiUnsubscribe", [_vp]),
        ):
            f = getattr(self.lib, name)
            f.restype = ctypes.c_int
            f.argtypes = args
        self._result_string = self.lib.cuptiGetResultString
        self._result_string.restype = ctypes.c_int
        self._result_string.argtypes = [ctypes.c_int, ctypes.POINTER(_cp)]
        if not driver:  # the host API alone (metric names, config images) needs no GPU
            return
        self.cuda = ctypes.CDLL("libcuda.so.1")
        for name, args in (
            ("cuCtxGetCurrent", [ctypes.POINTER(_vp)]),
            ("cuCtxGetDevice", [ctypes.POINTER(ctypes.c_int)]),
            ("cuCtxSynchronize", []),
        ):
            f = getattr(self.cuda, name)
            f.restype = ctypes.c_int
            f.argtypes = args

    def text(self, code: int) -> str:
        s = _cp()
        if self._result_string(code, ctypes.byref(s)) == 0 and s.value:
            return s.value.decode(errors="replace")
        return "unknown CUPTI result"

    def new(self, entry: str, **kw):
        p = CUPTI_PARAMS[_ENTRY[entry]]()
        p.structSize = type(p).size
        for k, v in kw.items():
            setattr(p, k, v)
        return p

    def call(self, entry: str, p=None, **kw):
        if p is None:
            p = self.new(entry, **kw)
        code = self.fns[entry](ctypes.addressof(p))
        if code != 0:
            raise _CuptiFailure(entry, code, self.text(code))
        return p


def _profiler_initialize(api: _Cupti) -> Callable[[], None]:
    """cuptiProfilerInitialize, attaching CUPTI first when it is detached.

    A gpuprof profile detaches CUPTI when it stops (cuptiFinalize), so that
    nothing lingers in the program; the profiler API then answers
    CUPTI_ERROR_NOT_INITIALIZED until a client attaches CUPTI again. A
    subscription without callbacks does that. Returns what undoes it, to call
    after cuptiProfilerDeInitialize.
    """
    try:
        api.call("cuptiProfilerInitialize")
        return lambda: None
    except _CuptiFailure as e:
        if e.code != CUPTI_ERROR_NOT_INITIALIZED:
            raise
    handle = _vp()
    code = api.lib.cuptiSubscribe(ctypes.byref(handle), None, None)
    if code != 0:
        raise _CuptiFailure("cuptiSubscribe", code, api.text(code))
    try:
        api.call("cuptiProfilerInitialize")
    except BaseException:
        api.lib.cuptiUnsubscribe(handle)
        raise
    return lambda: api.lib.cuptiUnsubscribe(handle)


def _names(strings: list[str]):
    arr = (_cp * len(strings))(*[s.encode() for s in strings])
    return arr


def _device_support_reason(s) -> str | None:
    if s.isSupported == SUPPORT_SUPPORTED:
        return None
    parts = []
    if s.architecture == SUPPORT_UNSUPPORTED:
        parts.append("the GPU is older than compute capability 7.0")
    if s.vGpu == SUPPORT_DISABLED:
        parts.append(VIRTUAL_FIX)
    elif s.vGpu == SUPPORT_UNSUPPORTED:
        parts.append("this virtual GPU does not support performance counters")
    if s.confidentialCompute == SUPPORT_UNSUPPORTED:
        parts.append(_CUPTI_EXPLAIN[41])
    if s.cmp == SUPPORT_UNSUPPORTED:
        parts.append(_CUPTI_EXPLAIN[42])
    if s.sli == SUPPORT_UNSUPPORTED:
        parts.append(_CUPTI_EXPLAIN[44])
    if s.wsl == SUPPORT_UNSUPPORTED:
        parts.append(_CUPTI_EXPLAIN[45])
    return "; ".join(parts) or "CUPTI reports that this device does not support profiling"


def _run_cupti(
    report: DeepDiveReport, replay, max_kernels: int, kernel_sequence
) -> tuple[bool, str]:
    from . import _cuda

    st = _cuda.cuda_status()
    if not st["usable"]:
        return False, st["reason"] or "GPU capture is not usable here"
    try:
        api = _Cupti(st["library"] or "libcupti.so")
    except (OSError, RuntimeError) as e:
        return False, str(e)
    try:
        return _collect_cupti(api, report, replay, max_kernels, kernel_sequence)
    except _CuptiFailure as e:
        return False, e.explain()


def _supported_metrics(api: _Cupti, host) -> tuple[list[str], dict[str, list[str]]]:
    """The metric names this chip knows, and field -> the names used for it."""
    chosen: dict[str, list[str]] = {}
    for spec in METRICS:
        ok = []
        for m in spec.candidates:
            try:
                api.call(
                    "cuptiProfilerHostGetMetricProperties", pHostObject=host, pMetricName=m.encode()
                )
            except _CuptiFailure:
                continue
            ok.append(m)
            if spec.combine == "first":
                break
        if ok:
            chosen[spec.field] = ok
    names = sorted({m for v in chosen.values() for m in v})
    return names, chosen


def _collect_cupti(api: _Cupti, report: DeepDiveReport, replay, max_kernels: int, kernel_sequence):
    # 1. name the kernels (this also initialises CUDA when nothing has yet)
    launched = kernel_sequence(replay)
    report.replays += 1
    ctx = _vp()
    if api.cuda.cuCtxGetCurrent(ctypes.byref(ctx)) != 0 or not ctx.value:
        return False, (
            "no CUDA context is current on this thread after running replay(); "
            "call deep_dive from the thread that runs the GPU work"
        )
    dev = ctypes.c_int()
    if api.cuda.cuCtxGetDevice(ctypes.byref(dev)) != 0:
        return False, "cuCtxGetDevice failed on the current CUDA context"
    device = dev.value
    sequence = [name for name, d in launched if d == device]
    if not sequence:
        return False, f"replay() launched no kernels on device {device} (the current context's)"
    wanted = {k.name for k in report.kernels if k.device == device}
    if not wanted & set(sequence):
        return False, (
            "replay() did not launch any of the top kernels of the recorded window "
            f"on device {device} (it launched {len(sequence)} others): pass a replay "
            "that runs the same work"
        )

    # 2. measure them
    detach = _profiler_initialize(api)
    host = None
    obj = None
    try:
        sup = api.call(
            "cuptiProfilerDeviceSupported", cuDevice=device, api=CUPTI_PROFILER_RANGE_PROFILING
        )
        why = _device_support_reason(sup)
        if why:
            return False, why
        chip = api.call("cuptiDeviceGetChipName", deviceIndex=device).pChipName
        avail = api.call("cuptiProfilerGetCounterAvailability", ctx=ctx)
        image = (ctypes.c_uint8 * max(avail.counterAvailabilityImageSize, 1))()
        api.call(
            "cuptiProfilerGetCounterAvailability",
            ctx=ctx,
            counterAvailabilityImageSize=avail.counterAvailabilityImageSize,
            pCounterAvailabilityImage=image,
        )
        host = api.call(
            "cuptiProfilerHostInitialize",
            profilerType=CUPTI_PROFILER_TYPE_RANGE_PROFILER,
            pChipName=chip,
            pCounterAvailabilityImage=image,
        ).pHostObject
        names, chosen = _supported_metrics(api, host)
        if "sm_pct" not in chosen or "dram_pct" not in chosen:
            return False, (
                f"CUPTI on chip {chip.decode(errors='replace')} offers neither "
                "sm__throughput nor dram__throughput metrics"
            )
        try:
            size, config = _config_image(api, host, names)
        except _CuptiFailure as e:
            # Instruction-mix (_sass_) counters are the likeliest to be refused (older
            # chips, some drivers): keep the throughput metrics and drop FLOP/s.
            names = [m for m in names if "_sass_" not in m]
            chosen = {f: [m for m in ms if m in names] for f, ms in chosen.items()}
            chosen = {f: ms for f, ms in chosen.items() if ms}
            _quiet(api, "cuptiProfilerHostDeinitialize", pHostObject=host)
            host = None
            host = api.call(
                "cuptiProfilerHostInitialize",
                profilerType=CUPTI_PROFILER_TYPE_RANGE_PROFILER,
                pChipName=chip,
                pCounterAvailabilityImage=image,
            ).pHostObject
            size, config = _config_image(api, host, names)
            report.notes.append(f"FLOP/s not measured: {e}")
        metric_names = _names(names)
        report.passes = int(
            api.call(
                "cuptiProfilerHostGetNumOfPasses", configImageSize=size, pConfigImage=config
            ).numOfPasses
        )

        n_ranges = min(len(sequence), max_kernels)
        obj = api.call("cuptiRangeProfilerEnable", ctx=ctx).pRangeProfilerObject
        csize = api.call(
            "cuptiRangeProfilerGetCounterDataSize",
            pRangeProfilerObject=obj,
            pMetricNames=metric_names,
            numMetrics=len(names),
            maxNumOfRanges=n_ranges,
            maxNumRangeTreeNodes=n_ranges,
        ).counterDataSize
        counter = (ctypes.c_uint8 * csize)()
        api.call(
            "cuptiRangeProfilerCounterDataImageInitialize",
            pRangeProfilerObject=obj,
            counterDataSize=csize,
            pCounterData=counter,
        )
        pass_index, target_level = 0, 1
        for _ in range(max(report.passes, 1) + 1):
            api.call(
                "cuptiRangeProfilerSetConfig",
                pRangeProfilerObject=obj,
                configSize=size,
                pConfig=config,
                counterDataImageSize=csize,
                pCounterDataImage=counter,
                range=CUPTI_AUTO_RANGE,
                replayMode=CUPTI_KERNEL_REPLAY,
                maxRangesPerPass=n_ranges,
                numNestingLevels=1,
                minNestingLevel=1,
                passIndex=pass_index,
                targetNestingLevel=target_level,
            )
            api.call("cuptiRangeProfilerStart", pRangeProfilerObject=obj)
            try:
                replay()
                api.cuda.cuCtxSynchronize()
            finally:
                stop = api.call("cuptiRangeProfilerStop", pRangeProfilerObject=obj)
            report.replays += 1
            if stop.isAllPassSubmitted:
                break
            pass_index, target_level = stop.passIndex, max(int(stop.targetNestingLevel), 1)
        else:
            return False, "the range profiler did not finish its passes"
        dropped = api.call(
            "cuptiRangeProfilerDecodeData", pRangeProfilerObject=obj
        ).numOfRangeDropped
        n_got = api.call(
            "cuptiRangeProfilerGetCounterDataInfo",
            pCounterDataImage=counter,
            counterDataImageSize=csize,
        ).numTotalRanges
        values = (ctypes.c_double * len(names))()
        per_range: list[dict[str, float]] = []
        for i in range(n_got):
            api.call(
                "cuptiProfilerHostEvaluateToGpuValues",
                pHostObject=host,
                pCounterDataImage=counter,
                counterDataImageSize=csize,
                rangeIndex=i,
                ppMetricNames=metric_names,
                numMetrics=len(names),
                pMetricValues=values,
            )
            raw = dict(zip(names, values, strict=True))
            per_range.append(_fields_from(raw, chosen))
    finally:
        if obj is not None:
            _quiet(api, "cuptiRangeProfilerDisable", pRangeProfilerObject=obj)
        if host is not None:
            _quiet(api, "cuptiProfilerHostDeinitialize", pHostObject=host)
        _quiet(api, "cuptiProfilerDeInitialize")
        detach()

    if dropped:
        report.notes.append(
            f"{dropped} kernel launches past max_kernels={max_kernels} were not measured"
        )
    if len(per_range) > len(sequence) or (
        len(per_range) < len(sequence) and len(per_range) < max_kernels and not dropped
    ):
        return False, (
            f"replay() launched {len(sequence)} kernels when named but "
            f"{len(per_range)} under the profiler: make it launch the same kernels "
            "every time (warm it up first; disable autotuning such as "
            "torch.backends.cudnn.benchmark)"
        )
    per_kernel: dict[str, list[dict[str, float]]] = {}
    for name, vals in zip(sequence, per_range, strict=False):
        if name in wanted:
            per_kernel.setdefault(name, []).append(vals)
    report.backend = "cupti"
    report.available = True
    _finish(report, per_kernel)
    return True, ""


def _config_image(api: _Cupti, host, names: list[str]):
    """The config image that schedules ``names``: (size, ctypes buffer)."""
    api.call(
        "cuptiProfilerHostConfigAddMetrics",
        pHostObject=host,
        ppMetricNames=_names(names),
        numMetrics=len(names),
    )
    size = api.call("cuptiProfilerHostGetConfigImageSize", pHostObject=host).configImageSize
    config = (ctypes.c_uint8 * size)()
    api.call(
        "cuptiProfilerHostGetConfigImage",
        pHostObject=host,
        configImageSize=size,
        pConfigImage=config,
    )
    return size, config


def _quiet(api: _Cupti, entry: str, **kw) -> None:
    try:
        api.call(entry, **kw)
    except _CuptiFailure:
        pass  # teardown: the first failure is the one reported


def _fields_from(raw: dict[str, float], chosen: dict[str, list[str]]) -> dict[str, float]:
    """Metric-name values into METRICS fields (``combine="max"`` over candidates)."""
    out = {}
    for f, ms in chosen.items():
        vals = [raw[m] for m in ms if m in raw and raw[m] is not None and not math.isnan(raw[m])]
        if vals:
            out[f] = max(vals) if _SPEC[f].combine == "max" else vals[0]
    return out


# -- Nsight Compute (plan B) -----------------------------------------------------------------

_UNIT_SCALE = {
    "nsecond": 1.0,
    "usecond": 1e3,
    "msecond": 1e6,
    "second": 1e9,
    "byte": 1.0,
    "kbyte": 1e3,
    "mbyte": 1e6,
    "gbyte": 1e9,
    "tbyte": 1e12,
    "kibyte": 1024.0,
    "mibyte": 1024.0**2,
    "gibyte": 1024.0**3,
}


def _number(text: str) -> float | None:
    t = text.strip().replace(",", "")
    if not t or t.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> list[dict]:
    """Rows of ``ncu --csv --page raw`` (wide: one row per launch, a units row
    under the header) or ``--page details`` (long: one row per metric). Each
    result: ``{"id": int, "kernel": str, "metrics": {name: value}}``, values in
    base units (ns, bytes, %) whatever scaling ncu printed.

    Raises:
        ValueError: no CSV header with "Kernel Name" in ``text``.
    """
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r and "ID" in r), None)
    if head is None:
        raise ValueError(
            "parse_ncu_csv(): no ncu CSV header (a row with 'ID' and 'Kernel "
            "Name') in the text; run ncu with --csv"
        )
    header = rows[head]
    col = {name: i for i, name in enumerate(header)}
    body = rows[head + 1 :]
    out: dict[int, dict] = {}
    if "Metric Name" in col:  # long form
        for r in body:
            if len(r) < len(header):
                continue
            v = _number(r[col["Metric Value"]])
            unit = r[col["Metric Unit"]].strip().lower() if "Metric Unit" in col else ""
            if v is not None:
                v *= _UNIT_SCALE.get(unit, 1.0)
            rid = int(_number(r[col["ID"]]) or 0)
            row = out.setdefault(rid, {"id": rid, "kernel": r[col["Kernel Name"]], "metrics": {}})
            row["metrics"][r[col["Metric Name"]]] = v
        return list(out.values())
    units = [""] * len(header)
    if body and not body[0][col["ID"]].strip():
        units = [u.strip().lower() for u in body[0]] + [""] * (len(header) - len(body[0]))
        body = body[1:]
    first_metric = next((i for i, n in enumerate(header) if "__" in n), len(header))
    for r in body:
        if len(r) < len(header) or not r[col["ID"]].strip():
            continue
        rid = int(_number(r[col["ID"]]) or 0)
        metrics = {}
        for i in range(first_metric, len(header)):
            v = _number(r[i])
            if v is not None:
                v *= _UNIT_SCALE.get(units[i], 1.0)
            metrics[header[i]] = v
        out[rid] = {"id": rid, "kernel": r[col["Kernel Name"]], "metrics": metrics}
    return [out[k] for k in sorted(out)]


def base_name(kernel: str) -> str:
    """The function name alone: no return type, namespaces, template
    arguments or parameters (what ncu calls the "function" name base)."""
    s = kernel.strip()
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):  # parameters: the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif ch == "(" and depth == 0 and i > 0:
            cut = i
            break
    s = s[:cut]
    out, depth = [], 0
    for ch in s:  # drop template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    s = "".join(out).strip()
    s = s.split()[-1] if s.split() else s  # return type
    return s.rsplit("::", 1)[-1]


def match_ncu_rows(kernels: list[KernelDeepDive], rows: list[dict]) -> dict[str, list[dict]]:
    """ncu rows per top kernel: the exact name when ncu printed the same one,
    else the same function base name (then template instances share rows)."""
    by_exact: dict[str, list[dict]] = {}
    for r in rows:
        by_exact.setdefault(r["kernel"], []).append(r)
    out: dict[str, list[dict]] = {}
    for k in kernels:
        if k.name in by_exact:
            out[k.name] = by_exact[k.name]
            continue
        b = base_name(k.name)
        got = [r for r in rows if base_name(r["kernel"]) == b]
        if got:
            out[k.name] = got
    return out


def _ncu_known_metrics(exe: str, names: list[str]) -> list[str]:
    """``names`` less those ncu does not know for this GPU (an unknown metric
    makes ncu refuse the whole run); all of them when ncu cannot be asked."""
    try:
        q = subprocess.run([exe, "--query-metrics"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return names
    known = set(re.findall(r"^([a-z0-9]+__[A-Za-z0-9_]+)", q.stdout, re.M))
    return [n for n in names if n.split(".", 1)[0] in known] if known else names


def _run_ncu(
    report: DeepDiveReport, command: list[str], ncu: str | None, timeout_s: float | None
) -> tuple[bool, str]:
    exe = ncu or shutil.which("ncu")
    if not exe:
        return False, (
            "ncu (Nsight Compute) is not on PATH: install it (CUDA toolkit or the "
            "nsight-compute package) or pass ncu='/path/to/ncu'"
        )
    names = _ncu_known_metrics(exe, _all_metric_names())
    bases = sorted({re.escape(base_name(k.name)) for k in report.kernels})
    with tempfile.TemporaryDirectory(prefix="gpuprof-ncu-") as tmp:
        rep = os.path.join(tmp, "deepdive")
        prof_cmd = [
            exe,
            "--clock-control",
            "none",
            "--target-processes",
            "all",
            "--metrics",
            ",".join(names),
            "--kernel-name-base",
            "function",
            "-k",
            "regex:" + "|".join(bases),
            "--launch-count",
            str(20 * len(bases)),
            "--export",
            rep,
            "--force-overwrite",
            *command,
        ]
        try:
            run = subprocess.run(prof_cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False, f"ncu did not finish within timeout_s={timeout_s} s"
        report.replays += 1
        log = (run.stdout or "") + (run.stderr or "")
        if "ERR_NVGPUCTRPERM" in log or "permission to access NVIDIA GPU Performance" in log:
            return False, PRIVILEGES_FIX
        if not os.path.exists(rep + ".ncu-rep"):
            tail = " | ".join(
                ln for ln in log.splitlines() if "==ERROR==" in ln or "==WARNING==" in ln
            )[-600:]
            return False, (
                f"ncu exited with status {run.returncode} and wrote no report"
                + (f": {tail}" if tail else "")
            )
        imp = subprocess.run(
            [exe, "--import", rep + ".ncu-rep", "--csv", "--page", "raw", "--print-units", "base"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    try:
        rows = parse_ncu_csv(imp.stdout)
    except ValueError as e:
        return False, f"could not read ncu's CSV ({e}); ncu said: {imp.stderr.strip()[:300]}"
    matched = match_ncu_rows(report.kernels, rows)
    chosen = {s.field: [m for m in s.candidates] for s in METRICS}
    per_kernel = {
        name: [_fields_from(r["metrics"], chosen) for r in rs] for name, rs in matched.items()
    }
    report.backend = "ncu"
    report.available = True
    if not matched:
        report.notes.append(
            "ncu profiled no launch of the top kernels (does command run the same work?)"
        )
    _finish(report, per_kernel)
    return True, ""
