"""Achieved TFLOPS and MFU of op rows and of the recorded steps (docs/aten.md).

An op row's precision is the one its own kernels' names say (``_peaks.op_precision``),
on the device they ran on (its name from the device properties saved with the
results); its MFU is its FLOPs over its CUDA total, against that precision's dense
peak. The steps' MFU is what PaLM's paper calls MFU: all the FLOPs of the steps over
their wall time, against the peak of the precision that carries most of the FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._keys import OP_KEY, OP_NAME_KEY
from ._peaks import PRECISIONS, op_precision, peak_tflops

__all__ = ["OpPeaks", "StepsMfu", "steps_mfu"]

_RANK = {p: i for i, p in enumerate(PRECISIONS)}


def _lowest(precisions) -> str | None:
    found = [p for p in precisions if p is not None]
    return min(found, key=_RANK.__getitem__) if found else None


class OpPeaks:
    """Per op (``ops()``'s name, file, line and kind, and input shapes), the precision
    its kernels ran in and the dense peak of that precision on their device, over
    ``windows`` (``Results.window(i)`` objects)."""

    def __init__(self, windows) -> None:
        self._by_key: dict[tuple[Any, ...], tuple[str | None, str | None]] = {}
        self._by_name: dict[tuple[Any, ...], list[tuple[str | None, str | None]]] = {}
        for window in windows:
            ops = window.ops()
            ev = window.gpu_events()
            kern = ev[(ev["kind"] == "kernel") & (ev["op"] >= 0)]
            if not len(kern):
                continue
            names = window.device_names()
            per_op: dict[int, tuple[set[str], int]] = {}
            for op, name, dev in zip(kern["op"].tolist(), kern["name"], kern["device"].tolist()):
                per_op.setdefault(op, (set(), dev))[0].add(str(name))
            for op, (kernel_names, dev) in per_op.items():
                entry = (op_precision(sorted(kernel_names)), names.get(dev))
                key = tuple(ops[f][op] for f in OP_KEY)
                if key not in self._by_key or entry[0] is not None:
                    self._by_key[key] = entry
                self._by_name.setdefault(key[: len(OP_NAME_KEY)], []).append(entry)

    def precision(self, key: tuple[Any, ...]) -> tuple[str | None, str | None]:
        """(precision, device name) of an ``OP_KEY`` tuple; a row of several input
        shapes (shapes ``""``) takes the lowest precision any of its shapes ran in."""
        if key in self._by_key:
            return self._by_key[key]
        entries = self._by_name.get(key[:-1], [])
        device = next((d for _, d in entries if d is not None), None)
        return _lowest(p for p, _ in entries), device

    def peak(self, key: tuple[Any, ...]) -> float:
        """Dense peak TFLOPS for the row, NaN when the device or precision is unknown."""
        precision, device = self.precision(key)
        if precision is None or device is None:
            return float("nan")
        peak = peak_tflops(device, precision)
        return float("nan") if peak is None else float(peak)


@dataclass(frozen=True)
class StepsMfu:
    """The recorded steps' FLOPs, their wall time and MFU against ``peak_tflops``
    (the dense peak of ``precision``, the precision with most of the FLOPs)."""

    flops: int
    wall_ns: int
    tflops: float
    precision: str | None
    peak_tflops: float | None
    mfu: float | None
    device: str | None
    note: str | None = None


def steps_mfu(ops: np.ndarray, peaks: OpPeaks, wall_ns: int) -> StepsMfu:
    """MFU of the steps (or the window) that lasted ``wall_ns``, from the op rows'
    FLOPs (each FLOP sits on one row: the innermost ATen op that did it)."""
    flops = int(ops["flops"].sum())
    rate = flops / wall_ns / 1e3 if wall_ns > 0 else 0.0
    by_precision: dict[str, int] = {}
    device = None
    for i in np.nonzero(ops["flops"] > 0)[0].tolist():
        precision, dev = peaks.precision(tuple(ops[f][i] for f in OP_KEY))
        device = device or dev
        if precision is not None:
            by_precision[precision] = by_precision.get(precision, 0) + int(ops["flops"][i])
    if not flops:
        return StepsMfu(0, wall_ns, 0.0, None, None, None, device, "no FLOP count")
    if device is None:
        return StepsMfu(flops, wall_ns, rate, None, None, None, None, "no device name")
    if not by_precision:
        return StepsMfu(flops, wall_ns, rate, None, None, None, device, "unknown precision")
    precision = max(by_precision, key=by_precision.__getitem__)
    peak = peak_tflops(device, precision)
    if peak is None:
        note = f"no published {precision} peak for {device}"
        return StepsMfu(flops, wall_ns, rate, precision, None, None, device, note)
    return StepsMfu(flops, wall_ns, rate, precision, peak, rate / peak, device)
