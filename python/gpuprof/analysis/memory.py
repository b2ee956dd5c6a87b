"""Memory over time: device curves, allocator curves, host RSS, and a summary of the peaks.

Read through the profile: ``prof.memory_curve(device)``,
``prof.memory_summary()``, ``prof.plot_memory()`` (docs/memory.md). Three
sources, all on the profiler clock:

- ``"cupti"``: the device allocations and frees CUPTI reports (kind
  ``malloc``/``free`` rows of ``prof.gpu_events()``), summed per device.
  Exact and per event, but relative to the window start: memory allocated
  before the window is not known, so the curve starts at 0 (and goes below
  0 when such memory is freed). A caching allocator's ``cudaMalloc`` is what
  it *reserves*, so for PyTorch this is the reserved curve.
- an allocator adapter (``"torch"``, ``"cupy"``; ``_allocators.py``):
  absolute allocated and reserved bytes, sampled every
  ``memory_sample_interval_s``.
- host RSS, sampled by the same thread (``_host_sampler.py``).

Sampled series are cut to the recorded windows, so every curve covers the
same time as the other results.
"""

from __future__ import annotations

import html
import math
import os
import re
from typing import Any

import numpy as np

from ..core._constants import GPU_FREE, GPU_MALLOC, OP_CUDA_API
from ..core._format import format_bytes as _format_bytes
from ..core._paths import source_location, user_location
from ..core._spans import span_at, user_caller
from ..record._allocators import ADAPTERS, ALLOCATOR_DTYPE
from ..record._host_sampler import HOST_DTYPE, HostSampler, SampleSnapshot
from ..results._results import Results

__all__ = [
    "CUDA_CURVE_DTYPE",
    "HOST_CURVE_DTYPE",
    "DeviceMemory",
    "MemorySummary",
    "memory_curve",
    "memory_summary",
    "plot_memory",
]

CUDA_CURVE_DTYPE = np.dtype(
    [("timestamp_ns", "i8"), ("allocated_bytes", "i8"), ("reserved_bytes", "i8")]
)
HOST_CURVE_DTYPE = HOST_DTYPE

LARGEST_N = 5
GAP_RATIO = 2.0
GAP_MIN_BYTES = 16 << 20  # below this a reserved/allocated ratio is noise, not a finding

_DEVICE_RE = re.compile(r"cuda(?::(\d+))?\Z")
_DEVICE_FORMS = "'cuda:N' (N = device index, e.g. 'cuda:0'), 'cuda' (= 'cuda:0') or 'cpu'"


# -- samples (the sampler itself is a part of the profile: gpuprof.record._parts) ----------------
def kept_samples(results: Results, sampler) -> SampleSnapshot | None:
    """The sampler's host and allocator samples inside the recorded windows, frozen
    (what a saved profile keeps); None without a sampler."""
    if sampler is None:
        return None
    return SampleSnapshot.of(sampler, lambda ts: _in_windows(ts, results))


def validate_interval(value) -> float:
    """memory_sample_interval_s as a float, or ValueError naming it."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(
            "profile(): memory_sample_interval_s must be a positive number of "
            f"seconds (e.g. 0.01), got {value!r}"
        )
    return float(value)


# -- argument parsing ------------------------------------------------------------------------
def parse_device(device) -> int | None:
    """'cuda:N' -> N, 'cpu' -> None; anything else raises ValueError naming the forms."""
    if type(device).__name__ == "device" and hasattr(device, "type"):  # torch.device
        device = str(device)
    if isinstance(device, str):
        d = device.strip().lower()
        if d == "cpu":
            return None
        m = _DEVICE_RE.match(d)
        if m:
            return int(m.group(1) or 0)
    raise ValueError(f"memory_curve(): device must be {_DEVICE_FORMS}; got {device!r}")


def parse_source(source) -> str:
    """Check memory_curve's source argument; ValueError naming the valid ones."""
    if not isinstance(source, str) or source not in _sources():
        raise ValueError(
            f"memory_curve(): source must be one of {', '.join(map(repr, _sources()))}"
            f"; got {source!r}"
        )
    return source


def _device_name(index: int | None) -> str:
    return "cpu" if index is None else f"cuda:{index}"


# -- curves ------------------------------------------------------------------------------------
def _windows(results: Results):
    return [results.window(i) for i in range(results.window_count)]


def _in_windows(ts: np.ndarray, results: Results) -> np.ndarray:
    keep = np.zeros(len(ts), dtype=bool)
    for w in _windows(results):
        keep |= (ts >= w.raw["window_start_ns"]) & (ts <= w.raw["window_end_ns"])
    return keep


def _driver_events(results: Results, device: int):
    """CUPTI malloc/free rows of `device` in time order, as (window, row, delta) lists."""
    out = []
    for wi, w in enumerate(_windows(results)):
        g = w.raw["gpu"]
        if not len(g):
            continue
        idx = np.flatnonzero(
            ((g["kind"] == GPU_MALLOC) | (g["kind"] == GPU_FREE)) & (g["device"] == device)
        )
        idx = idx[np.argsort(g["start_ns"][idx], kind="stable")]
        sizes: dict[int, int] = {}
        for i in idx:
            b = int(g["bytes"][i])
            addr = int(g["address"][i])
            if g["kind"][i] == GPU_MALLOC:
                sizes[addr] = b
                out.append((wi, int(i), b))
            else:
                if b == 0:  # a release record without its size: take the allocation's
                    b = sizes.get(addr, 0)
                sizes.pop(addr, None)
                out.append((wi, int(i), -b))
    return out


def _driver_curve(results: Results, device: int):
    """The CUPTI curve and, per row, its (window, gpu row) or None for boundary rows."""
    events = _driver_events(results, device)
    cuda_on = results.cuda.get("active", False) or bool(events)
    if not cuda_on:
        return np.zeros(0, dtype=CUDA_CURVE_DTYPE), []
    by_window: dict[int, list] = {}
    for wi, i, delta in events:
        by_window.setdefault(wi, []).append((i, delta))
    ts: list[int] = []
    val: list[int] = []
    src: list[Any] = []
    running = 0
    for wi, w in enumerate(_windows(results)):
        g = w.raw["gpu"]
        start, end = int(w.raw["window_start_ns"]), int(w.raw["window_end_ns"])
        ts.append(start)
        val.append(running)
        src.append(None)
        for i, delta in by_window.get(wi, ()):
            running += delta
            # a record joined to a call inside the window may be stamped just outside it
            ts.append(min(max(int(g["start_ns"][i]), start), end))
            val.append(running)
            src.append((wi, i))
        ts.append(int(w.raw["window_end_ns"]))
        val.append(running)
        src.append(None)
    out = np.zeros(len(ts), dtype=CUDA_CURVE_DTYPE)
    out["timestamp_ns"] = ts
    out["allocated_bytes"] = val
    out["reserved_bytes"] = val  # at the driver level what is allocated is reserved
    return out, src


def _allocator_samples(results: Results, sampler: HostSampler | None, device: int):
    """(adapter name, ALLOCATOR_DTYPE rows in the windows) for each adapter with samples."""
    if sampler is None:
        return []
    out = []
    with sampler.lock:
        per = [(ad.name, ad.samples().get(device)) for ad in _all_adapters(sampler)]
    for name, rows in per:
        if rows is None:
            continue
        rows = rows[_in_windows(rows["timestamp_ns"], results)]
        if len(rows):
            out.append((name, rows))
    return out


def _all_adapters(sampler: HostSampler):
    return list(sampler.adapters) + list(sampler.dropped_adapters)


def _host_rows(results: Results, sampler: HostSampler | None) -> np.ndarray:
    if sampler is None:
        return np.zeros(0, dtype=HOST_CURVE_DTYPE)
    rows = sampler.host_samples()
    return rows[_in_windows(rows["timestamp_ns"], results)]


def memory_curve(
    results: Results, device="cuda:0", *, sampler: HostSampler | None = None, source: str = "auto"
) -> np.ndarray:
    """Memory over time for one device (see :meth:`gpuprof.profile.memory_curve`)."""
    index = parse_device(device)
    parse_source(source)
    if index is None:
        if source not in ("auto", "host"):
            raise ValueError(
                f"memory_curve(): source={source!r} has no host curve; use "
                "source='auto' with device='cpu'"
            )
        return _host_rows(results, sampler)
    if source == "host":
        raise ValueError("memory_curve(): source='host' needs device='cpu'")
    if source in ("auto", "cupti"):
        if source == "auto":
            allocs = _holding_allocators(_allocator_samples(results, sampler, index))
            if allocs:
                return _summed_curve(allocs)
        return _driver_curve(results, index)[0]
    for name, rows in _allocator_samples(results, sampler, index):
        if name == source:
            return _as_cuda_curve(rows)
    return np.zeros(0, dtype=CUDA_CURVE_DTYPE)


def _sources() -> tuple[str, ...]:
    return ("auto", "cupti", "host") + tuple(a.name for a in ADAPTERS)


def _as_cuda_curve(rows: np.ndarray) -> np.ndarray:
    out = np.zeros(len(rows), dtype=CUDA_CURVE_DTYPE)
    for f in CUDA_CURVE_DTYPE.names:
        out[f] = rows[f]
    return out


def _holding_allocators(allocs: list) -> list:
    """The allocators that held device memory in the window (an imported framework that
    allocated nothing adds nothing to the curve), or the first one when none did."""
    held = [
        (name, rows)
        for name, rows in allocs
        if (rows["reserved_bytes"] > 0).any() or (rows["allocated_bytes"] > 0).any()
    ]
    return held or allocs[:1]


def _summed_curve(allocs: list) -> np.ndarray:
    """Every sampled allocator of one device as one curve: at each sample time of any
    of them, the sum of each allocator's latest sample (0 before its first)."""
    if len(allocs) == 1:
        return _as_cuda_curve(allocs[0][1])
    times = np.unique(np.concatenate([rows["timestamp_ns"] for _, rows in allocs]))
    out = np.zeros(len(times), dtype=CUDA_CURVE_DTYPE)
    out["timestamp_ns"] = times
    for _, rows in allocs:
        at = np.searchsorted(rows["timestamp_ns"], times, side="right") - 1
        seen = at >= 0
        for f in ("allocated_bytes", "reserved_bytes"):
            out[f][seen] += rows[f][at[seen]]
    return out


def curve_source(allocs: list) -> str:
    """What the default device curve follows: "torch", "torch + cupy"... or "cupti"."""
    return " + ".join(name for name, _ in allocs) if allocs else "cupti"


# -- where an allocation was made -------------------------------------------------------------
def _op_label(ops: np.ndarray, row: int) -> str:
    if row < 0 or row >= len(ops):
        return ""
    return str(ops["name"][row])


def _python_caller(spans: np.ndarray, ops: np.ndarray, i: int) -> str:
    """The user's line under span i, with the library line beside it (_spans.user_caller)."""
    file, line, _, lib_file, lib_line = user_caller(spans, ops, i)
    return user_location(file, line, lib_file, lib_line)


def _allocation_site(results: Results, wi: int, i: int) -> tuple[str, str]:
    """(op, 'file:line') of GPU row i of window wi: the op that made the call and the
    Python line running it (through the CUDA API span of the same correlation, else the
    innermost span open at that time on the allocating thread)."""
    w = _windows(results)[wi]
    g = w.raw["gpu"]
    spans = w.raw["spans"]
    ops = w.ops()
    op = _op_label(ops, int(g["op_row"][i]))
    span = -1
    corr = int(g["correlation"][i])
    if corr and len(spans):
        hit = np.flatnonzero((spans["correlation"] == corr) & (spans["kind"] == OP_CUDA_API))
        if len(hit):
            span = int(hit[0])
    if span < 0:
        span = span_at(spans, int(g["thread"][i]), int(g["start_ns"][i]))
    where = _python_caller(spans, ops, span) if span >= 0 else ""
    if not where and int(g["op_row"][i]) >= 0 and ops["kind"][int(g["op_row"][i])] == "python":
        row = int(g["op_row"][i])
        where = source_location(str(ops["file"][row]), int(ops["line"][row]))
    return op, where


def _running_at(results: Results, ts: int) -> tuple[str, str]:
    """(op, 'file:line') innermost on the step thread at `ts` (for the host peak)."""
    for w in _windows(results):
        if not (w.raw["window_start_ns"] <= ts <= w.raw["window_end_ns"]):
            continue
        spans = w.raw["spans"]
        steps = w.raw["steps"]
        thread = int(steps["thread"][0]) if len(steps) else 0
        i = span_at(spans, thread, ts)
        if i < 0:
            return "", ""
        ops = w.ops()
        return _op_label(ops, int(spans["op_row"][i])), _python_caller(spans, ops, i)
    return "", ""


# -- summary ----------------------------------------------------------------------------------
def format_bytes(n: int | float) -> str:
    """Bytes in binary units: 512 B, 1.5 KiB, 256.0 MiB, 1.25 GiB (sign kept)."""
    return _format_bytes(n, "binary")


def _ms(ns: int) -> str:
    return f"+{ns / 1e6:.1f} ms"


class DeviceMemory:
    """Memory figures of one CUDA device over the recorded windows.

    Attributes:
        device: "cuda:N".
        peak_bytes: highest allocated bytes: the allocator's (absolute) when an
            adapter sampled the device, else the CUPTI curve's (relative to the
            window start).
        peak_source: "torch", "cupy" or "cupti": where peak_bytes comes from.
        driver: CUPTI figures (None when no device allocation was recorded):
            peak_bytes (relative to the window start), peak_ns (profiler clock),
            peak_op and peak_location (op and Python file:line of the allocation
            that reached the peak), allocations, frees, allocated_bytes_total,
            freed_bytes_total, largest (list of dicts: bytes, timestamp_ns, op,
            location), baseline_bytes (the allocator's reserved bytes at the
            window start when one adapter provides it, else None).
        allocator: adapter figures (None without an adapter): name,
            peak_allocated_bytes, peak_allocated_ns, peak_reserved_bytes,
            peak_reserved_ns, end_allocated_bytes, end_reserved_bytes, gap_bytes
            (peak reserved - peak allocated), samples.
        notes: plain-language observations (e.g. reserved > 2x allocated).
    """

    def __init__(self, device: str):
        self.device = device
        self.peak_bytes = 0
        self.peak_source = ""
        self.driver: dict | None = None
        self.allocator: dict | None = None
        self.notes: list[str] = []

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "peak_bytes": self.peak_bytes,
            "peak_source": self.peak_source,
            "driver": self.driver,
            "allocator": self.allocator,
            "notes": list(self.notes),
        }


class MemorySummary:
    """Peaks per device and on the host, what made them, and allocator overhead.

    ``str()`` prints a report, ``to_dict()`` gives plain data, notebooks show
    ``_repr_html_``. Attributes: ``devices`` (dict "cuda:N" ->
    :class:`DeviceMemory`), ``host`` (dict or None: rss source, start/peak/end
    bytes, peak_ns, peak_op, peak_location, samples, interval_s, dropped),
    ``window_start_ns``, ``notes``.
    """

    def __init__(
        self,
        devices: dict[str, DeviceMemory],
        host: dict | None,
        window_start_ns: int,
        notes: list[str],
    ):
        self.devices = devices
        self.host = host
        self.window_start_ns = window_start_ns
        self.notes = notes

    def to_dict(self) -> dict:
        return {
            "window_start_ns": self.window_start_ns,
            "devices": {k: v.to_dict() for k, v in self.devices.items()},
            "host": dict(self.host) if self.host is not None else None,
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        t0 = self.window_start_ns
        out = ["gpuprof memory summary", "=" * 22]
        if not self.devices:
            out.append("No device memory recorded.")
        for name, d in self.devices.items():
            out.append("")
            out.append(f"{name}: peak {format_bytes(d.peak_bytes)} ({d.peak_source})")
            a = d.allocator
            if a is not None:
                out.append(
                    f"  {a['name']} allocator (absolute, sampled): peak allocated "
                    f"{format_bytes(a['peak_allocated_bytes'])} at "
                    f"{_ms(a['peak_allocated_ns'] - t0)}, peak reserved "
                    f"{format_bytes(a['peak_reserved_bytes'])}; at the end allocated "
                    f"{format_bytes(a['end_allocated_bytes'])}, reserved "
                    f"{format_bytes(a['end_reserved_bytes'])}"
                )
            r = d.driver
            if r is not None:
                out.append(
                    f"  device allocations (CUPTI, relative to the window start): peak "
                    f"{format_bytes(r['peak_bytes'])} at {_ms(r['peak_ns'] - t0)}; "
                    f"{r['allocations']} allocations, {r['frees']} frees"
                )
                if r["peak_op"] or r["peak_location"]:
                    out.append(
                        f"  peak reached by {r['peak_op'] or '?'}"
                        + (f" at {r['peak_location']}" if r["peak_location"] else "")
                    )
                if r["largest"]:
                    out.append("  largest allocations:")
                    for x in r["largest"]:
                        out.append(
                            f"    {format_bytes(x['bytes']):>11}  {x['op'] or '?'}"
                            + (f"  {x['location']}" if x["location"] else "")
                        )
            for n in d.notes:
                out.append(f"  note: {n}")
        h = self.host
        if h is not None:
            out.append("")
            what = "RSS" if h["rss_source"] == "statm" else "max RSS so far (getrusage)"
            out.append(
                f"host {what}, sampled every {h['interval_s'] * 1e3:g} ms "
                f"({h['samples']} samples): start {format_bytes(h['start_bytes'])}, "
                f"peak {format_bytes(h['peak_bytes'])} at {_ms(h['peak_ns'] - t0)}, "
                f"end {format_bytes(h['end_bytes'])}"
            )
            if h["peak_op"]:
                out.append(
                    f"  running at the peak: {h['peak_op']}"
                    + (f" at {h['peak_location']}" if h["peak_location"] else "")
                )
        for n in self.notes:
            out.append(f"note: {n}")
        return "\n".join(out) + "\n"

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(str(self))}</pre>"

    def __repr__(self) -> str:
        peaks = ", ".join(f"{k}={format_bytes(v.peak_bytes)}" for k, v in self.devices.items())
        host = f", host peak={format_bytes(self.host['peak_bytes'])}" if self.host else ""
        return f"<MemorySummary {peaks or 'no device'}{host}>"


def _driver_summary(results: Results, device: int) -> dict | None:
    curve, src = _driver_curve(results, device)
    events = [s for s in src if s is not None]
    if not events:
        return None
    k = int(np.argmax(curve["allocated_bytes"]))
    peak = int(curve["allocated_bytes"][k])
    op, where = ("", "")
    if peak > 0 and src[k] is not None:
        op, where = _allocation_site(results, *src[k])
    mallocs = []
    n_free = 0
    freed = 0
    for wi, i, delta in _driver_events(results, device):
        if delta >= 0 and _windows(results)[wi].raw["gpu"]["kind"][i] == GPU_MALLOC:
            mallocs.append((delta, int(_windows(results)[wi].raw["gpu"]["start_ns"][i]), wi, i))
        else:
            n_free += 1
            freed -= delta
    largest = []
    for b, ts, wi, i in sorted(mallocs, key=lambda m: (-m[0], m[1]))[:LARGEST_N]:
        lop, lwhere = _allocation_site(results, wi, i)
        largest.append({"bytes": b, "timestamp_ns": ts, "op": lop, "location": lwhere})
    return {
        "peak_bytes": peak,
        "peak_ns": int(curve["timestamp_ns"][k]),
        "peak_op": op,
        "peak_location": where,
        "allocations": len(mallocs),
        "frees": n_free,
        "allocated_bytes_total": sum(m[0] for m in mallocs),
        "freed_bytes_total": freed,
        "largest": largest,
        "baseline_bytes": None,
    }


def _allocator_summary(name: str, rows: np.ndarray) -> dict:
    alloc = rows["allocated_bytes"]
    reserved = rows["reserved_bytes"]
    ka = int(np.argmax(alloc))
    peak_alloc, peak_alloc_ns = int(alloc[ka]), int(rows["timestamp_ns"][ka])
    # The framework's running maximum catches a peak between two samples: if it rose
    # during the window, its final value is the window's exact peak.
    pk = rows["peak_allocated_bytes"]
    if len(pk) and pk[0] >= 0 and pk[-1] > pk[0] and pk[-1] > peak_alloc:
        peak_alloc = int(pk[-1])
        peak_alloc_ns = int(rows["timestamp_ns"][int(np.argmax(pk >= pk[-1]))])
    kr = int(np.argmax(reserved))
    return {
        "name": name,
        "peak_allocated_bytes": peak_alloc,
        "peak_allocated_ns": peak_alloc_ns,
        "peak_reserved_bytes": int(reserved[kr]),
        "peak_reserved_ns": int(rows["timestamp_ns"][kr]),
        "end_allocated_bytes": int(alloc[-1]),
        "end_reserved_bytes": int(reserved[-1]),
        "gap_bytes": int(reserved[kr]) - peak_alloc,
        "samples": len(rows),
    }


def _gap_note(a: dict) -> str | None:
    res, alloc = a["peak_reserved_bytes"], a["peak_allocated_bytes"]
    if res > GAP_RATIO * alloc and res - alloc >= GAP_MIN_BYTES:
        return (
            f"the {a['name']} allocator reserved {format_bytes(res)} from the device but "
            f"its tensors never used more than {format_bytes(alloc)} at once: "
            f"{format_bytes(res - alloc)} sits cached or fragmented. Memory reserved here "
            "is not available to other processes or libraries; if you run out of memory, "
            "see docs/memory.md (release the cache, or reduce fragmentation, e.g. "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)."
        )
    return None


def memory_summary(results: Results, *, sampler: HostSampler | None = None) -> MemorySummary:
    """Peaks and their causes over the kept windows (see :meth:`gpuprof.profile.memory_summary`)."""
    wins = _windows(results)
    t0 = int(wins[0].raw["window_start_ns"])
    indices: set[int] = set()
    for w in wins:
        g = w.raw["gpu"]
        if len(g):
            m = (g["kind"] == GPU_MALLOC) | (g["kind"] == GPU_FREE)
            indices.update(int(d) for d in np.unique(g["device"][m]) if d >= 0)
    if sampler is not None:
        with sampler.lock:
            for ad in _all_adapters(sampler):
                indices.update(ad.samples().keys())
    devices: dict[str, DeviceMemory] = {}
    notes: list[str] = []
    for index in sorted(indices):
        dm = DeviceMemory(_device_name(index))
        dm.driver = _driver_summary(results, index)
        allocs = _holding_allocators(_allocator_samples(results, sampler, index))
        if len(allocs) > 1:  # several frameworks allocate here: the summed curve
            summed = _summed_curve(allocs)
            rows = np.zeros(len(summed), dtype=ALLOCATOR_DTYPE)
            for f in CUDA_CURVE_DTYPE.names:
                rows[f] = summed[f]
            rows["peak_allocated_bytes"] = -1  # no running maximum of the sum: the samples'
            dm.peak_source = curve_source(allocs)
            dm.allocator = _allocator_summary(dm.peak_source, rows)
            dm.peak_bytes = dm.allocator["peak_allocated_bytes"]
            dm.notes.append(
                f"the device curve sums {len(allocs)} allocators ("
                f"{', '.join(name for name, _ in allocs)}), each at its latest "
                "sample; the peak is the largest sum of those samples"
            )
        elif allocs:
            name, rows = allocs[0]
            dm.allocator = _allocator_summary(name, rows)
            dm.peak_bytes = dm.allocator["peak_allocated_bytes"]
            dm.peak_source = name
            note = _gap_note(dm.allocator)
            if note:
                dm.notes.append(note)
            if dm.driver is not None:
                dm.driver["baseline_bytes"] = int(rows["reserved_bytes"][0])
        elif dm.driver is not None:
            dm.peak_bytes = dm.driver["peak_bytes"]
            dm.peak_source = "cupti"
        else:
            continue
        if dm.driver is not None and dm.allocator is None:
            dm.notes.append(
                "the CUPTI curve is relative to the window start: memory allocated "
                "before it is not counted (no framework allocator was sampled to "
                "give an absolute baseline)"
            )
        devices[dm.device] = dm
    if not devices and not results.cuda.get("active", False) and results.cuda.get("error"):
        notes.append(f"GPU capture was off: {results.cuda['error']}")
    host = None
    if sampler is not None:
        rows = _host_rows(results, sampler)
        if len(rows):
            k = int(np.argmax(rows["rss_bytes"]))
            op, where = _running_at(results, int(rows["timestamp_ns"][k]))
            rss = rows["rss_bytes"]
            host = {
                "rss_source": sampler.rss_source,
                "start_bytes": int(rss[0]),
                "peak_bytes": int(rss[k]),
                "peak_ns": int(rows["timestamp_ns"][k]),
                "end_bytes": int(rss[-1]),
                "peak_op": op,
                "peak_location": where,
                "samples": len(rows),
                "interval_s": sampler.interval_s,
                "dropped": sampler.dropped,
            }
            if sampler.dropped:
                notes.append(
                    f"{sampler.dropped} early host samples were overwritten (the "
                    "sampler keeps the newest ones)"
                )
        notes.extend(sampler.errors)
    return MemorySummary(devices, host, t0, notes)


# -- plot ------------------------------------------------------------------------------------
def _matplotlib():
    try:
        import matplotlib  # noqa: F401
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(
            "plot_memory() needs matplotlib, an optional dependency: "
            "pip install matplotlib (or pip install 'gpuprof[plot]')"
        ) from e
    return Figure


def plot_memory(results: Results, path_or_ax=None, *, sampler: HostSampler | None = None):
    """Draw the memory curves (see :meth:`gpuprof.profile.plot_memory`)."""
    is_ax = path_or_ax is not None and hasattr(path_or_ax, "plot") and hasattr(path_or_ax, "figure")
    if path_or_ax is not None and not is_ax and not isinstance(path_or_ax, (str, os.PathLike)):
        raise TypeError(
            "plot_memory(): path_or_ax must be None, a file path or a matplotlib "
            f"Axes, got {type(path_or_ax).__name__}"
        )
    Figure = _matplotlib()
    t0 = int(_windows(results)[0].raw["window_start_ns"])
    summary = memory_summary(results, sampler=sampler)
    device_lines = []
    for name, d in summary.devices.items():
        idx = parse_device(name)
        if d.allocator is not None:
            for src, rows in _allocator_samples(results, sampler, idx):
                device_lines.append(
                    (
                        f"{name} {src} allocated",
                        rows["timestamp_ns"],
                        rows["allocated_bytes"],
                        "-",
                        False,
                    )
                )
                device_lines.append(
                    (
                        f"{name} {src} reserved",
                        rows["timestamp_ns"],
                        rows["reserved_bytes"],
                        "--",
                        False,
                    )
                )
        if d.driver is not None:
            c = _driver_curve(results, idx)[0]
            device_lines.append(
                (
                    f"{name} device allocations (CUPTI, from window start)",
                    c["timestamp_ns"],
                    c["allocated_bytes"],
                    "-",
                    True,
                )
            )
    host = _host_rows(results, sampler)
    if is_ax:
        axes = [path_or_ax, path_or_ax]
        fig = path_or_ax.figure
    else:
        n = int(bool(device_lines)) + int(bool(len(host))) or 1
        fig = Figure(figsize=(9, 3.2 * n), layout="constrained")
        made = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
        axes = [made[0], made[-1]]
    scale, unit = _unit(
        max(
            [int(np.max(np.abs(v))) for _, _, v, _, _ in device_lines if len(v)]
            + ([int(host["rss_bytes"].max())] if len(host) else [])
            + [1]
        )
    )
    if device_lines:
        ax = axes[0]
        for label, ts, v, style, steps in device_lines:
            ax.plot(
                (ts - t0) / 1e9,
                v / scale,
                style,
                label=label,
                drawstyle="steps-post" if steps else "default",
            )
        ax.set_ylabel(f"device memory ({unit})")
    if len(host):
        ax = axes[1]
        ax.plot(
            (host["timestamp_ns"] - t0) / 1e9,
            host["rss_bytes"] / scale,
            "-",
            color="gray",
            label="host RSS",
        )
        ax.set_ylabel(f"memory ({unit})" if is_ax else f"host RSS ({unit})")
    for ax in set(axes):
        ax.set_xlabel("seconds since window start")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize="small")
    if not device_lines and not len(host):
        axes[0].text(
            0.5, 0.5, "no memory recorded", ha="center", va="center", transform=axes[0].transAxes
        )
    if is_ax:
        return path_or_ax
    if path_or_ax is not None:
        fig.savefig(os.fspath(path_or_ax))
    return fig


def _unit(peak: int) -> tuple[float, str]:
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if peak >= scale:
            return float(scale), unit
    return 1.0, "B"
