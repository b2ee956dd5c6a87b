"""Dense peak TFLOPS of NVIDIA GPUs per precision, the precision an op ran in, and the
achieved-TFLOPS and MFU arithmetic on top of them. docs/flops.md is the user's page.

Peaks are dense figures: NVIDIA's datasheets headline tensor-core rates with 2:4
structured sparsity, twice the dense rate no ordinary matmul reaches. Where a datasheet
prints only the sparse figure, the table holds half of it, rounded down to a whole
TFLOPS. A device not in the table has no peak (None): gpuprof does not guess one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "PEAKS",
    "PRECISIONS",
    "CountingError",
    "DevicePeaks",
    "Utilization",
    "achieved_tflops",
    "combine",
    "device_peaks",
    "kernel_precision",
    "mfu",
    "op_precision",
    "peak_tflops",
    "utilization",
]

#: Precision names, lowest first. fp32 is the non-tensor-core rate (CUDA cores); tf32
#: the tensor-core rate for FP32 inputs; fp64 the FP64 tensor-core rate where the GPU
#: has one (DGEMM runs there), else the plain FP64 rate.
PRECISIONS = ("fp4", "fp8", "int8", "bf16", "fp16", "tf32", "fp32", "fp64")


class DevicePeaks(NamedTuple):
    """One row of the peak table: the device's label, the pattern its
    ``torch.cuda.get_device_name()`` string matches, the datasheet the figures come from,
    and {precision: dense TFLOPS} (a precision the datasheet does not publish is absent)."""

    label: str
    pattern: re.Pattern
    source: str
    tflops: dict[str, float]


def _row(label: str, pattern: str, source: str, **tflops: float) -> DevicePeaks:
    unknown = set(tflops) - set(PRECISIONS)
    if unknown:
        raise ValueError(f"peak table row {label}: unknown precisions {sorted(unknown)}")
    return DevicePeaks(label, re.compile(pattern), source, dict(tflops))


_HOPPER_SXM = dict(fp64=67, fp32=67, tf32=494, bf16=989, fp16=989, fp8=1979, int8=1979)
_HOPPER_NVL = dict(fp64=60, fp32=60, tf32=417, bf16=835, fp16=835, fp8=1670, int8=1670)

# Checked in order, the first match wins: the more specific patterns (H200 NVL) come
# before the general ones (H200). Names are matched upper case with '-' and '_' read as
# spaces, so "NVIDIA A100-SXM4-80GB" reads "NVIDIA A100 SXM4 80GB".
PEAKS: tuple[DevicePeaks, ...] = (
    # NVIDIA H200 Tensor Core GPU datasheet (H200 NVL column)
    _row("H200 NVL", r"\bH200\b.*\bNVL\b", "NVIDIA H200 Tensor Core GPU datasheet", **_HOPPER_NVL),
    # NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column); "NVIDIA H200"
    _row("H200 SXM", r"\bH200\b", "NVIDIA H200 Tensor Core GPU datasheet", **_HOPPER_SXM),
    # NVIDIA GH200 Grace Hopper Superchip datasheet (its GPU: the H100 SXM figures)
    _row("GH200", r"\bGH200\b", "NVIDIA GH200 Grace Hopper Superchip datasheet", **_HOPPER_SXM),
    # NVIDIA H100 Tensor Core GPU datasheet (H100 NVL column, per GPU)
    _row("H100 NVL", r"\bH100\b.*\bNVL\b", "NVIDIA H100 Tensor Core GPU datasheet", **_HOPPER_NVL),
    # NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe column); "NVIDIA H100 PCIe"
    _row(
        "H100 PCIe",
        r"\bH100\b.*\bPCIE\b",
        "NVIDIA H100 Tensor Core GPU datasheet",
        fp64=51,
        fp32=51,
        tf32=378,
        bf16=756,
        fp16=756,
        fp8=1513,
        int8=1513,
    ),
    # NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column); "NVIDIA H100 80GB HBM3".
    # A bare "NVIDIA H100" could be either form factor and stays unknown.
    _row(
        "H100 SXM",
        r"\bH100\b.*(\bSXM\d*\b|\bHBM3\b)",
        "NVIDIA H100 Tensor Core GPU datasheet",
        **_HOPPER_SXM,
    ),
    # NVIDIA A100 Tensor Core GPU datasheet: the SXM4 and PCIe, 40 and 80 GB, columns
    # give the same peaks; "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"
    _row(
        "A100",
        r"\bA100\b",
        "NVIDIA A100 Tensor Core GPU datasheet",
        fp64=19.5,
        fp32=19.5,
        tf32=156,
        bf16=312,
        fp16=312,
        int8=624,
    ),
    # NVIDIA L40S GPU datasheet (prints dense and sparse figures; FP64 not published)
    _row(
        "L40S",
        r"\bL40S\b",
        "NVIDIA L40S GPU datasheet",
        fp32=91.6,
        tf32=183,
        bf16=362.05,
        fp16=362.05,
        fp8=733,
        int8=733,
    ),
    # NVIDIA L4 Tensor Core GPU datasheet (FP64 not published)
    _row(
        "L4",
        r"\bL4\b",
        "NVIDIA L4 Tensor Core GPU datasheet",
        fp32=30.3,
        tf32=60,
        bf16=121,
        fp16=121,
        fp8=242,
        int8=242,
    ),
    # NVIDIA HGX B200 datasheet: an eighth of the 8-GPU board's figures
    _row(
        "B200",
        r"\bB200\b",
        "NVIDIA HGX B200 datasheet (per GPU)",
        fp64=37,
        fp32=75,
        tf32=1125,
        bf16=2250,
        fp16=2250,
        fp8=4500,
        int8=4500,
        fp4=9000,
    ),
)

# what people and torch call the precisions
_ALIASES = {
    "float64": "fp64",
    "double": "fp64",
    "float32": "fp32",
    "float": "fp32",
    "tensorfloat32": "tf32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float8": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
    "float4": "fp4",
}


def _precision(precision: str, who: str) -> str:
    if not isinstance(precision, str):
        raise TypeError(f"{who}: precision must be a str such as 'bf16', got {precision!r}")
    p = precision.strip().lower().removeprefix("torch.")
    p = _ALIASES.get(p, p)
    if p.startswith("float8_"):
        p = "fp8"
    if p not in PRECISIONS:
        raise ValueError(
            f"{who}: unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}"
        )
    return p


def device_peaks(device_name: str) -> DevicePeaks | None:
    """The table row for a ``torch.cuda.get_device_name()`` string such as
    "NVIDIA H200" or "NVIDIA A100-SXM4-80GB"; None for a device not in the table."""
    if not isinstance(device_name, str):
        raise TypeError(
            f"device_name: expected a str such as 'NVIDIA H200', got {type(device_name).__name__}"
        )
    key = re.sub(r"[-_]", " ", device_name).upper()
    return next((row for row in PEAKS if row.pattern.search(key)), None)


def peak_tflops(device_name: str, precision: str) -> float | None:
    """Dense peak TFLOPS of ``device_name`` in ``precision`` (one of :data:`PRECISIONS`
    or a torch dtype name), or None when the device is not in the table or its
    datasheet publishes no figure for that precision (A100 and FP8)."""
    p = _precision(precision, "peak_tflops()")
    row = device_peaks(device_name)
    return None if row is None else row.tflops.get(p)


# ------------------------------------------------------------- the precision an op ran


# Tokens in kernel names, tested lowest precision first: the first precision found names
# the kernel, so that "bf16bf16_bf16f32" (BF16 inputs, FP32 accumulate) is BF16,
# "f32f32_tf32f32" is TF32 and "e4m3e4m3_bf16f32" is FP8. cuBLASLt's nvjet kernels spell
# the input type as the first letter after "tst_"-style prefixes: nvjet_tst_... (t
# BF16), nvjet_hsh_... (h FP16), nvjet_sss_... (s FP32), e/q FP8. Demangled templates
# carry c10::BFloat16, c10::Half, cutlass::half_t, cutlass::bfloat16_t,
# cutlass::float_e4m3_t, <float, ...>, <double, ...>. These agree with the precision
# gpuprof.diagnose's mixed-precision check reads (a test holds them together).
_NVJET = r"nvjet_(?:sm\d+_)?"
_KERNEL_PRECISION = (
    ("fp4", re.compile(r"e2m1|fp4|nvf4|mxf4", re.I)),
    ("fp8", re.compile(rf"e4m3|e5m2|fp8|float8|f8f8|f8f6f4|{_NVJET}[qe]", re.I)),
    ("int8", re.compile(r"int8|i8i8|s8s8|imma|i\d{4,5}gemm", re.I)),
    ("bf16", re.compile(rf"bf16|bfloat16|{_NVJET}t", re.I)),
    ("fp16", re.compile(rf"fp16|(?<!b)f16|half|hmma|h\d{{3,5}}gemm|_hgemm|{_NVJET}h", re.I)),
    ("tf32", re.compile(r"tf32|tfloat32", re.I)),
    (
        "fp32",
        re.compile(rf"sgemm|scudnn|f32|fp32|float32|simt|{_NVJET}s|<float\b|\bfloat[,>]", re.I),
    ),
    ("fp64", re.compile(r"dgemm|f64|fp64|float64|dmma|<double\b|\bdouble[,>]", re.I)),
)

# torch dtype names (torch.profiler's "Input type" spelling and torch's) whose precision
# is certain. FP32 inputs are left out: a float32 matmul or convolution may run in TF32
# (torch.backends.*.allow_tf32), which only the kernel's name shows.
_DTYPE_PRECISION = {
    "c10::bfloat16": "bf16",
    "bfloat16": "bf16",
    "c10::half": "fp16",
    "half": "fp16",
    "float16": "fp16",
    "double": "fp64",
    "float64": "fp64",
    "signed char": "int8",
    "int8": "int8",
}


def kernel_precision(kernel_name: str) -> str | None:
    """The precision a kernel's name says it computes in, or None (unknown) when the
    name carries no type, as for most Triton kernels."""
    if not isinstance(kernel_name, str):
        raise TypeError(f"kernel_name: expected a str, got {type(kernel_name).__name__}")
    return next((p for p, rx in _KERNEL_PRECISION if rx.search(kernel_name)), None)


def _dtype_precision(dtype: str) -> str | None:
    d = str(dtype).strip().lower().removeprefix("torch.")
    if "float8" in d:
        return "fp8"
    return _DTYPE_PRECISION.get(d)


def op_precision(kernel_names: Iterable[str] = (), dtypes: Iterable[str] = ()) -> str | None:
    """The precision an op ran in, for its MFU.

    The kernels decide when any of their names carries a type: the op ran in the
    lowest precision any of its kernels names (a BF16 GEMM's helper kernels in FP32 do
    not make the op FP32). Otherwise its input dtypes decide when they are certain
    (bf16, fp16, fp8, int8, fp64; the lowest wins, so an FP8 ``_scaled_mm`` with FP32
    scales is FP8). None means unknown: no kernel name carries a type and the dtypes
    are absent or FP32, which may have run as TF32.
    """
    if isinstance(kernel_names, str) or isinstance(dtypes, str):
        raise TypeError("kernel_names and dtypes: pass lists of str, not one str")
    rank = {p: i for i, p in enumerate(PRECISIONS)}
    found = {kernel_precision(k) for k in kernel_names} - {None}
    if not found:
        found = {_dtype_precision(d) for d in dtypes} - {None}
    return min(found, key=rank.__getitem__) if found else None


# --------------------------------------------------------------- TFLOPS and MFU


class CountingError(ValueError):
    """An op did more FLOPs per second than its GPU's dense peak: the FLOP count (or the
    kernel time it is divided by) is wrong."""


def _check_amounts(flops, kernel_ns, who: str):
    for name, v in (("flops", flops), ("kernel_ns", kernel_ns)):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{who}: {name} must be a number, got {v!r}")
        if v < 0 or v != v:
            raise ValueError(f"{who}: {name} must be >= 0, got {v!r}")


def achieved_tflops(flops: int | None, kernel_ns: int | float) -> float | None:
    """FLOPs over kernel time, in TFLOPS (1e12 FLOP per second). None when the op has
    no count or no kernel time to divide by."""
    _check_amounts(flops, kernel_ns, "achieved_tflops()")
    if flops is None or not kernel_ns:
        return None
    return flops / kernel_ns / 1e3


def mfu(
    flops: int | None,
    kernel_ns: int | float,
    peak: float | None,
    *,
    what: str = "an op",
) -> float | None:
    """Model FLOPs utilization: achieved TFLOPS over the dense ``peak`` TFLOPS (0..1).

    None when there is no count, no kernel time or no peak (an unknown device).

    Raises:
        CountingError: the op ran above the peak, which no GPU does: the count is wrong.
        ValueError: a negative amount or a peak <= 0.
    """
    if peak is not None and (isinstance(peak, bool) or not isinstance(peak, (int, float))):
        raise TypeError(f"mfu(): peak must be a number of TFLOPS or None, got {peak!r}")
    if peak is not None and not peak > 0:
        raise ValueError(f"mfu(): peak must be > 0 TFLOPS, got {peak!r}")
    rate = achieved_tflops(flops, kernel_ns)
    if rate is None or peak is None:
        return None
    if rate > peak:
        raise CountingError(_above_peak(what, rate, peak))
    return rate / peak


def _above_peak(what: str, rate: float, peak: float) -> str:
    return (
        f"{what} ran at {rate:.1f} TFLOPS, above the {peak:g} TFLOPS dense peak of its "
        "precision: its FLOP count is wrong (counted twice, a causal attention counted "
        "as full, or the wrong precision's peak), or its kernel time is missing kernels"
    )


@dataclass(frozen=True)
class Utilization:
    """Achieved TFLOPS and MFU of an op row, a module or a step.

    ``note`` says why ``tflops`` or ``mfu`` is None (no count, no kernel time, an
    unknown device, an unknown precision) or that the figure is above the peak, in
    which case ``counting_error`` is True and ``mfu`` is the (impossible) ratio.
    """

    flops: int | None
    kernel_ns: float
    tflops: float | None
    precision: str | None
    peak_tflops: float | None
    mfu: float | None
    counting_error: bool = False
    note: str | None = None


def utilization(
    flops: int | None,
    kernel_ns: int | float,
    *,
    device_name: str | None,
    precision: str | None,
    what: str = "an op",
) -> Utilization:
    """TFLOPS and MFU of one op row, with the reason wherever a figure is missing.

    Never raises ``CountingError``: a figure above the peak comes back with
    ``counting_error=True`` (``mfu()`` raises instead).
    """
    _check_amounts(flops, kernel_ns, "utilization()")
    p = None if precision is None else _precision(precision, "utilization()")
    rate = achieved_tflops(flops, kernel_ns)
    peak, note = None, None
    if flops is None:
        note = "no FLOP count"
    elif not kernel_ns:
        note = "no kernel time"
    if device_name is None:
        note = note or "no device name"
    elif device_peaks(device_name) is None:
        note = note or f"unknown device {device_name!r}: no published peak in gpuprof's table"
    elif p is None:
        note = note or "unknown precision: no kernel name or input dtype says it"
    else:
        peak = peak_tflops(device_name, p)
        if peak is None:
            note = note or f"{device_name} publishes no {p} peak"
    ratio = None if rate is None or peak is None else rate / peak
    above = ratio is not None and ratio > 1
    if above:
        note = _above_peak(what, rate, peak)
    return Utilization(flops, kernel_ns, rate, p, peak, ratio, above, note)


def combine(parts: Sequence[Utilization], *, what: str = "the group") -> Utilization:
    """TFLOPS and MFU of a module or a step from its op rows' ``utilization()``.

    TFLOPS: all the FLOPs over all the kernel time, rows without a count included (the
    group spent that time). MFU: the FLOPs over what the GPU could have done in that
    time, each row's time at its own precision's peak, so a group that mixes BF16
    matmuls and FP32 matmuls is measured against both. A row without a peak (unknown
    precision: softmax, layer norm) is charged at the peak of the precision that
    carries most of the group's FLOPs. The group's ``precision`` is that one.
    """
    parts = list(parts)
    if not all(isinstance(u, Utilization) for u in parts):
        raise TypeError("combine(): parts must be Utilization objects from utilization()")
    counted = [u for u in parts if u.flops is not None]
    flops = sum(u.flops for u in counted) if counted else None
    kernel_ns = sum(u.kernel_ns for u in parts)
    rate = achieved_tflops(flops, kernel_ns)
    by_precision: dict[tuple[str, float], int] = {}
    for u in counted:
        if u.peak_tflops is not None:
            key = (u.precision, u.peak_tflops)
            by_precision[key] = by_precision.get(key, 0) + u.flops
    if flops is None:
        return Utilization(None, kernel_ns, None, None, None, None, False, "no FLOP count")
    if not by_precision:
        return Utilization(
            flops, kernel_ns, rate, None, None, None, False, "no row has a known peak"
        )
    (precision, main_peak), _ = max(by_precision.items(), key=lambda kv: kv[1])
    # kernel_ns * TFLOPS = 1e3 FLOP
    capacity = sum(u.kernel_ns * (u.peak_tflops or main_peak) for u in parts) * 1e3
    ratio = flops / capacity if capacity else None
    bad = [u for u in parts if u.counting_error]
    above = bool(bad) or (ratio is not None and ratio > 1)
    note = None
    if bad:
        note = f"{len(bad)} of its rows ran above their peak: " + (bad[0].note or "")
    elif above:
        note = _above_peak(what, rate, main_peak)
    effective = None if ratio is None or rate is None else rate / ratio
    return Utilization(flops, kernel_ns, rate, precision, effective, ratio, above, note)
