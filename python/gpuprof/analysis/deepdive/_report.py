"""The deep dive's figures: the bound verdict (:func:`classify`), the metrics and
what is derived from them, the report objects, and the plain-words explanations
of CUPTI failures."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
        from ...core._format import format_time

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


def _fields_from(raw: dict[str, float], chosen: dict[str, list[str]]) -> dict[str, float]:
    """Metric-name values into METRICS fields (``combine="max"`` over candidates)."""
    out = {}
    for f, ms in chosen.items():
        vals = [raw[m] for m in ms if m in raw and raw[m] is not None and not math.isnan(raw[m])]
        if vals:
            out[f] = max(vals) if _SPEC[f].combine == "max" else vals[0]
    return out
