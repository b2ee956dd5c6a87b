"""Diagnosis: name the bottleneck, show the evidence and the Python line, suggest the fix.

``prof.diagnose()`` reads the recorded arrays (never raw buffers) and
returns a :class:`Diagnosis`, a list of :class:`Finding` ranked by
severity, the share of recorded step time the problem costs. Each finding
carries the figures it was derived from, so every statement can be checked
against ``prof.ops()``, ``prof.steps()`` and ``prof.gpu_events()``.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np

from ..core._constants import (
    API_ALLOC,
    API_FREE,
    API_LAUNCH,
    API_MEMCPY_SYNC,
    API_SYNC,
    OP_CUDA_API,
    OPF_GENERATOR,
)
from ..core._format import format_time
from ..core._intervals import cover_split as _cover_split
from ..core._intervals import covered as _covered
from ..core._intervals import intersect as _intersect
from ..core._intervals import overlap as _overlap
from ..core._intervals import union as _union
from ..core._intervals import union_list
from ..core._paths import source_location, user_location
from ..core._spans import span_at, user_caller
from ..results._findings import Diagnosis, Finding
from ..results._results import Results
from .distributed import MergedRun, diagnose_ranks
from .processes import worker_hotspot as _worker_hotspot  # -- subprocesses --

__all__ = [
    "STEP_BREAKDOWN_DTYPE",
    "Diagnosis",
    "cpu_hot_paths",
    "Finding",
    "data_wait_per_step",
    "data_wait_spans",
    "diagnose",
    "step_breakdown",
]


# Matrix kernels (GEMM, convolution, attention) and their precision, from the kernel's
# name: cuBLAS/cuBLASLt (sgemm, s1688tf32gemm, h16816gemm, sm90_xmma_gemm_bf16bf16...,
# nvjet_<types>...), cuDNN (scudnn, implicit_convolve_sgemm, xmma_fprop/dgrad/wgrad
# implicit GEMM, winograd), CUTLASS template arguments (cutlass::half_t, bfloat16_t,
# float_e4m3_t), FlashAttention and PyTorch's memory-efficient attention (fmha_cutlassF_f32).
_MATRIX_FAMILIES = (
    ("attention", re.compile(r"flash|fmha|sdpa|attention|attn", re.I)),
    ("convolution", re.compile(r"conv|fprop|dgrad|wgrad|winograd|scudnn|implicit_gemm", re.I)),
    (
        "gemm",
        re.compile(r"gemm|gemv|matmul|cublas|cutlass|xmma|nvjet|mma|triton_tem_fused_.*mm", re.I),
    ),
)
# Checked in this order: the first that matches names the precision (a BF16 GEMM that
# accumulates in FP32, "bf16bf16_bf16f32", is BF16; "tf32f32" is TF32). cuBLASLt's
# nvjet kernels start their type letters with the input's: t (BF16: what bf16 autocast
# runs on an H200), h (FP16), s (FP32), e or q (FP8).
_NVJET = r"nvjet_(?:sm\d+_)?"
_PRECISIONS = (
    ("fp8", re.compile(rf"e4m3|e5m2|fp8|f8f8|{_NVJET}[qe]", re.I)),
    ("bf16", re.compile(rf"bf16|bfloat16|{_NVJET}t", re.I)),
    ("fp16", re.compile(rf"fp16|(?<!b)f16|half|hmma|h\d{{3,5}}gemm|{_NVJET}h|_hgemm", re.I)),
    ("tf32", re.compile(r"tf32", re.I)),
    ("fp32", re.compile(rf"sgemm|scudnn|f32|fp32|simt|{_NVJET}s|<float\b|\bfloat[,>]", re.I)),
)
PRECISIONS = tuple(p for p, _ in _PRECISIONS) + ("unknown",)
# What bf16 autocast could save of each precision's matrix time: FP32 runs on CUDA cores
# (tensor cores are 8-16x faster, but data movement stays), TF32 tensor cores at half
# the BF16 rate.
_AMP_SAVES = {"fp32": 0.75, "tf32": 0.5}


def matrix_kernel_class(name: str) -> tuple[str | None, str]:
    """``(family, precision)`` of a kernel from its name: family "gemm", "convolution",
    "attention" or None (not a matrix kernel); precision one of :data:`PRECISIONS`
    ("unknown" where the name does not say, as for most Triton kernels)."""
    family = next((f for f, rx in _MATRIX_FAMILIES if rx.search(name)), None)
    precision = next((p for p, rx in _PRECISIONS if rx.search(name)), "unknown")
    return family, precision


def _op_label(ops: np.ndarray, row: int) -> str:
    """An op's name, with its file:line for a Python function."""
    name = str(ops["name"][row])
    if ops["kind"][row] == "python":
        name += f" ({source_location(str(ops['file'][row]), int(ops['line'][row]))})"
    return name


class _View:
    """What the checks share: arrays of the last window, steps, spans."""

    def __init__(self, res: Results, window: int = -1, data_fetch=()):
        w = res.window(window)
        self.window_index = window
        self.data_fetch = tuple(data_fetch)  # ops whose calls are waits for data
        self.res = res  # -- subprocesses: res.subprocesses, the child processes' windows --
        self.raw = w.raw
        self.ops = w.ops()
        self.raw_ops = w.raw["ops"]
        self.spans = w.raw["spans"]
        self.gpu = w.gpu_events()
        self.kernels = w.kernels()
        steps = w.raw["steps"]
        self.steps = steps
        self.window_ns = int(w.raw["window_end_ns"] - w.raw["window_start_ns"])
        self.step_ns = int(steps["cpu_ns"].sum()) if len(steps) else self.window_ns
        self.n_steps = max(len(steps), 1)
        self.step_thread = int(steps["thread"][0]) if len(steps) else 0

    @functools.cached_property
    def data_waits(self) -> tuple[np.ndarray, int, int]:
        """The spans in which the loop waited for data (:func:`data_wait_spans`), their
        total ns, and the ns of them the GPU was busy through (its backlog)."""
        sp = self.spans
        idx = data_wait_spans(sp, self.ops, self.raw_ops, self.data_fetch)
        if not len(idx):
            return idx, 0, 0
        wait = int((sp["end_ns"][idx] - sp["start_ns"][idx]).sum())
        busy = 0
        if len(self.gpu):
            busy_iv = _merged(self.gpu, kinds=("kernel", "memcpy", "memset"))
            busy = sum(_overlap(busy_iv, int(sp["start_ns"][i]), int(sp["end_ns"][i])) for i in idx)
        return idx, wait, busy

    def caller(self, span_index: int) -> tuple[tuple, str, str]:
        """The user's line under span `span_index` (_spans.user_caller): a key that
        tells such lines apart, its 'file:line (in library file:line)' text, and the
        user's function."""
        file, line, name, lib_file, lib_line = user_caller(self.spans, self.ops, span_index)
        return (file, line), user_location(file, line, lib_file, lib_line), name

    def c_call_of(self, span_index: int) -> str:
        """Name of the C function whose call contains this span, if any."""
        i = int(self.spans["parent"][span_index])
        while i >= 0:
            row = int(self.spans["op_row"][i])
            if self.ops["kind"][row] == "c":
                return str(self.ops["name"][row])
            if self.ops["kind"][row] == "python":
                return ""
            i = int(self.spans["parent"][i])
        return ""


def _sync_spans(v: _View) -> np.ndarray:
    """Indices of the spans that are synchronizing CUDA API calls."""
    api_rows = np.flatnonzero(
        (v.raw_ops["kind"] == OP_CUDA_API)
        & np.isin(v.raw_ops["flags"], (API_SYNC, API_MEMCPY_SYNC))
    )
    return np.flatnonzero(np.isin(v.spans["op_row"], api_rows))


def _sync_points(v: _View):
    sp = v.spans
    idx = _sync_spans(v)
    if not len(idx):
        return []
    # What a sync costs the step: the host's wait when the GPU then idles anyway
    # (host-bound), but only the GPU's bubble after it when the host was ahead
    # (GPU-bound: the wait overlapped queued work, and the drained queue is the
    # loss). So each sync costs min(wait, time until the GPU's next op starts).
    gpu = v.gpu[np.isin(v.gpu["kind"], ("kernel", "memcpy", "memset"))]
    starts = np.sort(gpu["start_ns"])
    window_end = int(v.steps["end_ns"].max()) if len(v.steps) else None
    step_starts = np.sort(v.steps["start_ns"]) if len(v.steps) else np.zeros(0, np.int64)
    by_site: dict[tuple, dict] = {}
    for i in idx:
        key, where, func = v.caller(int(i))
        call = v.c_call_of(int(i))
        d = by_site.setdefault(
            key,
            {
                "where": where,
                "wait_ns": 0,
                "cost_ns": 0,
                "calls": 0,
                "via": set(),
                "func": func,
                "api": set(),
                "steps": set(),
            },
        )
        d["steps"].add(int(np.searchsorted(step_starts, sp["start_ns"][i], side="right")))
        wait = int(sp["end_ns"][i] - sp["start_ns"][i])
        nxt = np.searchsorted(starts, sp["end_ns"][i])
        if nxt < len(starts):
            bubble = int(starts[nxt] - sp["end_ns"][i])
        else:  # no GPU work after it: idle to the end of the window
            bubble = wait if window_end is None else max(window_end - int(sp["end_ns"][i]), 0)
        d["wait_ns"] += wait
        d["cost_ns"] += min(wait, bubble)
        d["calls"] += 1
        if call:
            d["via"].add(call)
        d["api"].add(str(v.ops["name"][sp["op_row"][i]]))
    out = []
    for d in by_site.values():
        share = d["cost_ns"] / max(v.step_ns, 1)
        # A sync in every step is reported even when it costs little now: it
        # serializes host and GPU, which is what stops other fixes from paying.
        # (Every step but one: the last step, from the last step() to stop(),
        # is often a stub.)
        every_step = len(d["steps"]) >= max(v.n_steps - 1, 1)
        if share < 0.02 and not every_step:
            continue
        via = ", ".join(sorted(d["via"])) or ", ".join(sorted(d["api"]))
        out.append(
            Finding(
                "sync_point",
                share,
                f"Host blocked waiting for the GPU in {via} ({d['calls']} times)",
                {
                    "wait_ns": d["wait_ns"],
                    "cost_ns": d["cost_ns"],
                    "calls": d["calls"],
                    "wait_per_step_ns": d["wait_ns"] // v.n_steps,
                    "api": ", ".join(sorted(d["api"])),
                },
                d["where"],
                _sync_fix(d["via"]),
            )
        )
    return out


# C calls that copy host data to the GPU: they block when the source is pageable.
_TO_DEVICE = ("cuda", "to", "copy_", "pin_memory")


def _sync_fix(via: set) -> str:
    if any(name.rsplit(".", 1)[-1] in _TO_DEVICE for name in via):
        return (
            "Copy from pinned memory without waiting: DataLoader(pin_memory=True) or "
            "tensor.pin_memory(), then .cuda(non_blocking=True) / .to(device, "
            "non_blocking=True)."
        )
    return (
        "Avoid reading GPU values on the host every step (.item(), .cpu(), .numpy(), "
        "print(tensor)): accumulate on the GPU and read every N steps, or log "
        "asynchronously with non_blocking copies into pinned memory."
    )


def data_wait_spans(
    spans: np.ndarray, ops: np.ndarray, raw_ops: np.ndarray, data_fetch=()
) -> np.ndarray:
    """Indices (in start order) of the spans of one window in which the training loop
    waited for its next batch.

    Two kinds count: a data iterator's ``__next__`` or a generator resumed directly
    under a step, as ``for batch in loader:`` fetches; and the ops named in
    ``data_fetch``, where a framework fetches its batches further down its own loop
    (a ``record_function`` label, or a Python function's name as ``ops()`` shows it).
    A span inside another counted one is not counted again.

    Args:
        spans: the window's raw ``spans`` array.
        ops: the window's ``ops()`` rows (what ``spans["op_row"]`` indexes).
        raw_ops: the window's raw ``ops`` array (for the generator flag).
        data_fetch: op names whose calls are waits for data.
    """
    names = ops["name"]
    is_next = np.array([str(n).endswith("__next__") for n in names], dtype=bool)
    is_gen = (raw_ops["flags"] & OPF_GENERATOR) != 0
    loader = np.flatnonzero((is_next | is_gen) & (ops["kind"] == "python"))
    wanted = set(data_fetch)
    fetch = (
        np.flatnonzero(np.array([n in wanted for n in names], dtype=bool))
        if wanted
        else np.zeros(0, dtype=np.int64)
    )
    if not len(spans) or not (len(loader) or len(fetch)):
        return np.zeros(0, dtype=np.int64)
    # Loader calls made directly under a step (the training loop's own fetch). Without
    # steps there is no loop that waits for its input: a generator or an iterator's
    # __next__ is then just code (a word count's generator expressions, a thread
    # pool's map), never a data stall.
    step_rows = np.flatnonzero(ops["kind"] == "step")
    if not len(step_rows):
        return np.zeros(0, dtype=np.int64)
    under_step = np.isin(spans["op_row"], loader) & (spans["parent"] >= 0)
    parents = spans["parent"][under_step]
    direct = np.flatnonzero(under_step)[np.isin(spans["op_row"][parents], step_rows)]
    named = _inside_steps(spans, np.flatnonzero(np.isin(spans["op_row"], fetch)), step_rows)
    idx = np.union1d(direct, named)
    if not len(named) or len(idx) < 2:
        return idx
    # Outermost only: spans are in start order, and a span inside another one of the
    # same thread starts after it and ends before it does.
    keep = []
    open_end: dict[int, int] = {}
    for i in idx.tolist():
        t = int(spans["thread"][i])
        if int(spans["start_ns"][i]) < open_end.get(t, -1):
            continue
        keep.append(i)
        open_end[t] = int(spans["end_ns"][i])
    return np.asarray(keep, dtype=np.int64)


def _inside_steps(spans: np.ndarray, idx: np.ndarray, step_rows: np.ndarray) -> np.ndarray:
    """The spans of ``idx`` that start inside a step span of their own thread."""
    if not len(idx):
        return idx
    steps = np.flatnonzero(np.isin(spans["op_row"], step_rows))
    keep = np.zeros(len(idx), dtype=bool)
    for t in np.unique(spans["thread"][idx]).tolist():
        st = steps[spans["thread"][steps] == t]
        mine = spans["thread"][idx] == t
        if not len(st):
            continue
        starts, ends = spans["start_ns"][st], spans["end_ns"][st]
        at = spans["start_ns"][idx[mine]]
        k = np.searchsorted(starts, at, side="right") - 1  # a thread's steps follow each other
        keep[mine] = (k >= 0) & (at < ends[np.maximum(k, 0)])
    return idx[keep]


def data_wait_per_step(results: Results, window: int = -1, data_fetch=()) -> np.ndarray:
    """Host time each step of a window waited for data (the spans of
    :func:`data_wait_spans` on the step's thread, clipped to the step), one int64 per
    row of that window's ``steps``, in ns. The data-stall finding counts the same
    spans."""
    raw = results.windows[window]
    steps = raw["steps"]
    out = np.zeros(len(steps), dtype=np.int64)
    if not len(steps):
        return out
    spans = raw["spans"]
    idx = data_wait_spans(spans, results.window_ops(window), raw["ops"], data_fetch)
    if not len(idx):
        return out
    order = np.argsort(steps["start_ns"], kind="stable")
    starts = steps["start_ns"][order]
    for i in idx.tolist():
        s, e = int(spans["start_ns"][i]), int(spans["end_ns"][i])
        k = int(np.searchsorted(starts, s, side="right")) - 1
        if k < 0:
            continue
        row = int(order[k])
        if int(steps["thread"][row]) != int(spans["thread"][i]) or s >= int(steps["end_ns"][row]):
            continue
        out[row] += min(e, int(steps["end_ns"][row])) - s
    return out


def _data_stall(v: _View):
    ops = v.ops
    sp = v.spans
    idx, wait, busy = v.data_waits
    if not len(idx) or wait / max(v.step_ns, 1) < 0.05:
        return []
    # Waiting for data costs the step only while the GPU has nothing queued:
    # a loader that the GPU's backlog covers is not a stall.
    severity = (wait - busy) / max(v.step_ns, 1)
    if severity < 0.05:
        return []
    top = np.bincount(sp["op_row"][idx], weights=(sp["end_ns"][idx] - sp["start_ns"][idx]))
    row = int(np.argmax(top))
    # the user's line in it (a framework's fetch range: the line that opened it)
    where = v.caller(int(idx[np.flatnonzero(sp["op_row"][idx] == row)[0]]))[1]
    # the hottest function inside the loader
    inner = _hottest_below(v, set(int(i) for i in idx))
    ev: dict[str, Any] = {
        "wait_ns": wait,
        "wait_per_step_ns": wait // v.n_steps,
        "gpu_busy_during_wait_share": busy / max(wait, 1),
    }
    if inner:
        ev["hottest_inside"] = inner
    hot = _worker_hotspot(v.res)  # -- subprocesses: what the workers were busy with --
    ev.update(hot)
    return [
        Finding(
            "data_stall",
            severity,
            f"Input pipeline stall: the training loop waits in {ops['name'][row]} "
            f"{format_time(wait // v.n_steps)} per step"
            + (
                f"; workers spent {100 * hot['workers_hottest_share']:.0f}% of their time in "
                f"{hot['workers_hottest']}"
                if hot
                else ""
            ),
            ev,
            where,
            "Load data in parallel and ahead of the GPU: "
            "DataLoader(num_workers>0, pin_memory=True, "
            "persistent_workers=True, prefetch_factor=2+), move per-sample transforms to the "
            "workers or the GPU, and cache decoded samples.",
        )
    ]


def _hottest_below(v: _View, roots: set[int]) -> str:
    """The op with the most self time below the ``roots`` spans (not counting them)."""
    sp = v.spans
    self_ns: dict[int, int] = {}
    # spans are in start order and children follow parents: propagate membership
    inside = np.zeros(len(sp), dtype=bool)
    for i in range(len(sp)):
        p = int(sp["parent"][i])
        inside[i] = i in roots or (p >= 0 and inside[p])
    own = _span_self_ns(sp)  # a loader's outer frames only pass the wait down
    for k in np.flatnonzero(inside):
        if k in roots:
            continue
        row = int(sp["op_row"][k])
        self_ns[row] = self_ns.get(row, 0) + int(own[k])
    if not self_ns:
        return ""
    return _op_label(v.ops, max(self_ns, key=lambda r: self_ns[r]))


def _merged(gpu, kinds):
    m = np.isin(gpu["kind"], kinds)
    # Python ints: these end up in findings' evidence, which to_dict() promises as plain data
    return union_list(gpu["start_ns"][m], gpu["end_ns"][m])


def _launch_bound(v: _View):
    if not len(v.gpu) or not len(v.steps):
        return []
    busy = int(v.steps["gpu_busy_ns"].sum())
    # Time the loop stalled on data (the data-stall finding's) is not the launches'
    # doing: how busy the GPU is is judged over the rest of the step.
    _, wait, busy_in_wait = v.data_waits
    launching_ns = max(v.step_ns - (wait - busy_in_wait), 1)
    share_busy = min(busy / launching_ns, 1.0)
    k = v.gpu[v.gpu["kind"] == "kernel"]
    if len(k) < 10 or share_busy > 0.6:
        return []
    dur = (k["end_ns"] - k["start_ns"]).astype(np.int64)
    launch_rows = np.flatnonzero(
        (v.raw_ops["kind"] == OP_CUDA_API) & (v.raw_ops["flags"] == API_LAUNCH)
    )
    sp = v.spans
    lm = np.isin(sp["op_row"], launch_rows)
    launch_ns = float(np.median(sp["end_ns"][lm] - sp["start_ns"][lm])) if lm.any() else 5000.0
    # A kernel replayed from a CUDA graph pays no launch of its own (one
    # cudaGraphLaunch covers the whole graph), so it is never "shorter than
    # its launch".
    short = float(((dur < launch_ns) & (k["graph_id"] == 0)).mean())
    per_step = len(k) / v.n_steps
    severity = (1.0 - share_busy) * launching_ns / max(v.step_ns, 1) * min(1.0, short + 0.25)
    if short < 0.3:
        return []
    return [
        Finding(
            "launch_bound",
            severity,
            f"Launch-bound: {per_step:.0f} kernels per step, "
            f"{100 * short:.0f}% shorter than a launch "
            f"({format_time(launch_ns)}); the GPU is busy only {100 * share_busy:.0f}% of the step"
            + (" outside the data stall" if launching_ns < v.step_ns else ""),
            {
                "kernels_per_step": int(per_step),
                "short_kernel_share": short,
                "median_kernel_ns": int(np.median(dur)),
                "median_launch_ns": int(launch_ns),
                "gpu_busy_share": share_busy,
            },
            "",
            "Give the GPU more work per launch: a larger batch, fused ops (torch.compile), CUDA "
            "graphs (torch.cuda.graphs / mode='reduce-overhead'), or fewer tiny elementwise ops.",
        )
    ]


def _gpu_idle(v: _View):
    if not len(v.gpu) or not len(v.steps):
        return []
    busy = _merged(v.gpu, ("kernel", "memcpy", "memset"))
    gaps = []
    for st in v.steps:
        s, e = int(st["start_ns"]), int(st["end_ns"])
        prev = s
        for a, b in busy:
            if b <= s or a >= e:
                continue
            if a > prev:
                gaps.append((a - prev, prev, a))
            prev = max(prev, b)
        if e > prev:
            gaps.append((e - prev, prev, e))
    if not gaps:
        return []
    gaps.sort(reverse=True)
    total = sum(g[0] for g in gaps)
    share = total / max(v.step_ns, 1)
    if share < 0.2:
        return []
    top = []
    file_line = ""
    for dur, a, b in gaps[:3]:
        name, where = _running_at(v, (a + b) // 2)
        top.append(f"{format_time(dur)} during {name}")
        file_line = file_line or where  # the Python line running in the largest gap
    return [
        Finding(
            "gpu_idle",
            share * 0.5,
            f"GPU idle {100 * share:.0f}% of step time; largest gaps: " + "; ".join(top),
            {"idle_ns": total, "gaps": len(gaps), "largest_gap_ns": gaps[0][0]},
            file_line,
            "Look at what the host runs during the gaps (above): move it off the critical path, "
            "overlap it with GPU work, or batch it.",
        )
    ]


def _running_at(v: _View, ts: int) -> tuple[str, str]:
    """(name, file:line) of the innermost op the step thread runs at ts: a Python
    function's own definition line, or for a C call its Python caller's line."""
    i = span_at(v.spans, v.step_thread, ts)
    if i < 0:
        return "nothing recorded", ""
    return _op_label(v.ops, int(v.spans["op_row"][i])), v.caller(i)[1]


def _mixed_precision(v: _View):
    k = v.kernels
    if not len(k):
        return []
    compute = k[k["category"] == "compute"]
    # GPU time: kernels, copies, memsets, communication; not the host's waits in syncs
    total_gpu = int(k[k["category"] != "sync"]["total_ns"].sum())
    # Shares are of the compute kernels' time: copies (a data-pipeline matter, with
    # findings of their own) and communication are not what autocast changes.
    kernel_ns = max(int(compute["total_ns"].sum()), 1)
    by_precision = dict.fromkeys(PRECISIONS, 0)
    by_family: dict[str, int] = {}
    slow_rows = []
    for row in compute:
        family, precision = matrix_kernel_class(str(row["name"]))
        if family is None:
            continue
        ns = int(row["total_ns"])
        by_precision[precision] += ns
        by_family[family] = by_family.get(family, 0) + ns
        if precision in _AMP_SAVES:
            slow_rows.append(row)
    slow_ns = by_precision["fp32"] + by_precision["tf32"]
    share = slow_ns / kernel_ns
    if share < 0.25:
        return []
    # what bf16 autocast could save, as a share of all GPU time, then of the step
    saved = sum(by_precision[p] * f for p, f in _AMP_SAVES.items()) / max(total_gpu, 1)
    busy_share = float(v.steps["gpu_busy_ns"].sum()) / max(v.step_ns, 1) if len(v.steps) else 1
    top = max(slow_rows, key=lambda r: int(r["total_ns"]))
    parts = [
        f"{p.upper()} {100 * by_precision[p] / kernel_ns:.0f}%"
        for p in PRECISIONS
        if by_precision[p]
    ]
    families = ", ".join(
        f"{f} {100 * ns / kernel_ns:.0f}%"
        for f, ns in sorted(by_family.items(), key=lambda kv: -kv[1])
    )
    fp32_first = by_precision["fp32"] >= by_precision["tf32"]
    fix = (
        "Use tensor cores: torch.autocast(device_type='cuda', dtype=torch.bfloat16) around "
        "the forward pass (BF16 runs matrix kernels several times faster than FP32)"
    )
    fix += (
        ", or at least TF32: torch.set_float32_matmul_precision('high') and "
        "torch.backends.cudnn.allow_tf32 = True."
        if fp32_first
        else "; TF32 tensor cores run at half the BF16 rate."
    )
    return [
        Finding(
            "no_mixed_precision",
            saved * busy_share,
            f"FP32/TF32 matrix kernels take {100 * share:.0f}% of kernel time ({', '.join(parts)} "
            f"by precision; {families} by kind; e.g. {str(top['name'])[:60]})",
            {
                "matrix_ns": sum(by_family.values()),
                "kernel_time_ns": kernel_ns,
                "gpu_time_ns": total_gpu,
                **{f"{p}_ns": by_precision[p] for p in PRECISIONS},
                **{f"{f}_ns": ns for f, ns in by_family.items()},
                "fp32_tf32_share": share,
                "amp_saving_share": saved,
            },
            "",
            fix,
        )
    ]


def _communication(v: _View):
    if not len(v.gpu):
        return []
    comm = v.gpu[v.gpu["category"] == "communication"]
    if not len(comm):
        return []
    cm = _union(comm["start_ns"], comm["end_ns"])
    if not len(cm[0]):
        return []
    k = v.gpu[(v.gpu["category"] == "compute") & (v.gpu["kind"] == "kernel")]
    # the exposed communication of distributed.comm_overlap, over the window, not per step
    _, covered, hidden = _cover_split(_union(k["start_ns"], k["end_ns"]), cm, cm[0][0], cm[1][-1])
    total, exposed = int(covered), int(covered - hidden)
    share = exposed / max(v.step_ns, 1)
    if share < 0.05:
        return []
    return [
        Finding(
            "communication_wait",
            share,
            "Communication not overlapped with compute: "
            f"{format_time(exposed // v.n_steps)} per step",
            {"comm_ns": total, "exposed_comm_ns": exposed},
            "",
            "Overlap gradients' all-reduce with backward "
            "(DDP bucket_cap_mb, gradient_as_bucket_view)"
            ", reduce communication volume (bf16 gradients), or check for a slow rank.",
        )
    ]


def _memory_churn(v: _View):
    rows = np.flatnonzero(
        (v.raw_ops["kind"] == OP_CUDA_API) & np.isin(v.raw_ops["flags"], (API_ALLOC, API_FREE))
    )
    if not len(rows):
        return []
    calls = int(v.raw_ops["calls"][rows].sum())
    t = int(v.raw_ops["cpu_total_ns"][rows].sum())
    per_step = calls / v.n_steps
    share = t / max(v.step_ns, 1)
    if per_step < 1 or share < 0.02:
        return []
    return [
        Finding(
            "memory_churn",
            share,
            f"cudaMalloc/cudaFree inside steps: {per_step:.1f} calls per step",
            {"calls": calls, "time_ns": t},
            "",
            "Let the caching allocator reuse memory: keep tensor shapes stable across steps, "
            "preallocate buffers, avoid torch.cuda.empty_cache() in the loop.",
        )
    ]


# -- where the CPU time goes, for a program with no GPU activity --

# A hot path is reported when the code under one user line takes this share of the CPU
# time; at most this many are.
_HOT_SHARE = 0.05
_HOT_PATHS = 3
# Call paths read for their user line, most self time first: together they hold all but
# a sliver of the CPU time; the rest counts in the total only (reading each path's line
# walks its frames in Python, a cost per distinct path).
_HOT_COVER = 0.995
_HOT_NODES = 2000


def _span_self_ns(sp: np.ndarray) -> np.ndarray:
    """Each span's own time: its duration less its children's."""
    dur = (sp["end_ns"] - sp["start_ns"]).astype(np.int64)
    nested = np.zeros(len(sp), dtype=np.int64)
    has_parent = sp["parent"] >= 0
    np.add.at(nested, sp["parent"][has_parent], dur[has_parent])
    return dur - nested


def cpu_hot_paths(results: Results, window: int = -1) -> list[dict]:
    """Where the CPU time of one window goes, by the user's line.

    Every call path's self time (``call_tree()`` nodes, all threads) is charged to the
    user's line on it, found by the rule of every finding's location (see
    docs/diagnosis.md): the line of your code that called on into the library or C
    function doing the work, else your function's definition line; on paths with no
    code of yours (a library's own thread), the library's line. Ranges and steps
    (``record_function``, ``ProfilerStep*``) pass their time to the code around them.
    Waiting is not CPU time: the ``idle`` ops (sleeps, lock acquires, polls, queue
    gets) count neither in a line's time nor in the total.

    Returns:
        One dict per line, most CPU time first: ``location`` (as a finding's),
        ``function`` (the user function it is in), ``self_ns`` (CPU time under the
        line), ``share`` (of the window's self CPU time), ``ops`` (``[(label,
        self_ns)]``, the ops that time was spent in, most first), ``threads``.
    """
    w = results.window(window)
    raw = w.raw
    tree, ops, sp = raw["nodes"], w.ops(), raw["spans"]
    # waiting is not CPU time: the idle ops' own time (a sleep, a lock) counts nowhere
    waits = ops["idle"][tree["op_row"].astype(np.int64)]
    node_self = np.where(waits, 0, tree["self_ns"]).astype(np.int64)
    total = int(node_self.sum())
    if not total or not len(sp):
        return []
    # one span per node, the one with the most own time: the path, and the line the
    # call was made from, that most of the node's time took
    own = _span_self_ns(sp)
    node = sp["node"].astype(np.int64)
    ok = np.flatnonzero((node >= 0) & (node < len(tree)))
    most = np.full(len(tree), -1, dtype=np.int64)
    np.maximum.at(most, node[ok], own[ok])
    best = ok[own[ok] == most[node[ok]]]
    rep = np.full(len(tree), -1, dtype=np.int64)
    rep[node[best]] = best  # one of the spans with the most own time, for each node
    lines: dict[tuple, dict] = {}
    covered = 0
    for n in np.argsort(-node_self, kind="stable")[:_HOT_NODES].tolist():
        ns = int(node_self[n])
        if ns <= 0 or covered >= _HOT_COVER * total:
            break
        covered += ns
        i = int(rep[n])
        if i < 0:
            continue
        file, line, func, lib_file, lib_line = user_caller(sp, ops, i)
        d = lines.setdefault(
            (file, line),
            {"function": func, "self_ns": 0, "ops": {}, "threads": set(), "lib": {}},
        )
        d["self_ns"] += ns
        row = int(tree["op_row"][n])
        if ops["kind"][row] in ("step", "user"):  # a range's own time is its caller's code
            row = _python_row_above(sp, ops, i)
        d["ops"][row] = d["ops"].get(row, 0) + ns
        d["threads"].add(int(tree["thread"][n]))
        lib = (lib_file, lib_line)
        d["lib"][lib] = d["lib"].get(lib, 0) + ns
    out = []
    for (file, line), d in lines.items():
        lib_file, lib_line = max(d["lib"], key=d["lib"].get)
        by_op = sorted(d["ops"].items(), key=lambda kv: -kv[1])
        out.append(
            {
                "location": user_location(file, line, lib_file, lib_line),
                "function": d["function"],
                "self_ns": d["self_ns"],
                "share": d["self_ns"] / total,
                "ops": [(_op_label(ops, r) if r >= 0 else "?", ns) for r, ns in by_op],
                "threads": len(d["threads"]),
            }
        )
    out.sort(key=lambda d: -d["self_ns"])
    return out


def _python_row_above(sp: np.ndarray, ops: np.ndarray, i: int) -> int:
    """The op row of the innermost Python frame around span i (-1: none)."""
    while i >= 0:
        row = int(sp["op_row"][i])
        if ops["kind"][row] == "python":
            return row
        i = int(sp["parent"][i])
    return -1


def _cpu_hot_path(v: _View):
    """Without GPU activity the other checks have nothing to judge: the findings are
    the user lines under which the CPU time goes."""
    if len(v.gpu):
        return []
    out = []
    for d in cpu_hot_paths(v.res, v.window_index)[:_HOT_PATHS]:
        if d["share"] < _HOT_SHARE:
            break
        top = d["ops"][0][0]
        inside = ", ".join(f"{label} {100 * ns / d['self_ns']:.0f}%" for label, ns in d["ops"][:3])
        out.append(
            Finding(
                "cpu_hot_path",
                d["share"],
                f"CPU hot path: {d['location'].split(' (in ', 1)[0]}"
                + (f" in {d['function']}" if d["function"] else "")
                + f", {format_time(d['self_ns'])} of CPU time: {inside}",
                {
                    "self_ns": d["self_ns"],
                    "cpu_share": d["share"],
                    "hottest": top,
                    "hottest_self_ns": d["ops"][0][1],
                    "threads": d["threads"],
                },
                d["location"],
                "Make the work under this line cheaper or do less of it: vectorize loops "
                "over elements (NumPy, PyTorch), cache what is computed again, move work "
                "out of the loop, or spread it over processes; "
                "key_averages(group_by_stack_n=5).table() shows the paths into the "
                "hottest calls.",
                share_of="CPU time",
            )
        )
    return out


def _module_class_of(v: _View):
    """span -> the class of the innermost torch.nn.Module call around it ("" where
    none or the window has no module calls)."""
    classes = v.raw.get("module_classes") or []
    sp = v.spans
    if not classes or "module" not in (sp.dtype.names or ()):
        return lambda span: ""
    from ..core._spans import innermost_marked

    mod = sp["module"].astype(np.int64) - 1
    inner = innermost_marked(sp, (mod >= 0) & (mod < len(classes)))

    def of(span: int) -> str:
        m = int(inner[span])
        return str(classes[int(mod[m])]) if m >= 0 else ""

    return of


def _backward_heavy(v: _View):
    """The forward line whose backward costs the GPU the most, when the backward pass is
    a large part of the GPU's work (docs/backward.md: the join of each backward node to
    the forward call that made it)."""
    b = v.res.window(v.window_index).backward()
    g = v.raw["gpu"]
    if b is None or not len(g):
        return []
    dur = (g["end_ns"] - g["start_ns"]).astype(np.int64)
    total = int(dur[b.is_work].sum())
    bwd = b.is_work & (b.node_span >= 0)
    bwd_ns = int(dur[bwd].sum())
    joined = bwd & (b.fwd_span >= 0)
    if total <= 0 or bwd_ns < 0.4 * total or not joined.any():
        return []
    # by the forward op and the module it ran in (the user's line alone would be the
    # one line that calls the model, for every layer of a library model)
    rows = v.spans["op_row"].astype(np.int64)
    module_of = _module_class_of(v)
    by_op: dict[tuple, list] = {}
    for span, ns in zip(b.fwd_span[joined].tolist(), dur[joined].tolist()):
        key = (int(rows[span]), module_of(span))
        entry = by_op.setdefault(key, [0, span])
        entry[0] += ns
    (row, module), (ns, span) = max(by_op.items(), key=lambda kv: kv[1][0])
    _, where, _ = v.caller(span)
    op = _op_label(v.ops, row) + (f" in {module}" if module else "")
    return [
        Finding(
            "backward_heavy",
            ns / max(v.step_ns, 1),
            f"The backward pass is {100 * bwd_ns / total:.0f}% of GPU time; "
            f"{100 * ns / bwd_ns:.0f}% of it is the backward of {op}",
            {
                "backward_ns": bwd_ns,
                "gpu_work_ns": total,
                "op_backward_ns": ns,
                "joined_ns": int(dur[joined].sum()),
            },
            where,
            "The backward of a layer costs about twice its forward: shrink the forward at "
            "that line (fused ops with torch.compile, bf16 autocast, fewer recomputed "
            "activations), and see prof.key_averages().table("
            "sort_by='forward_backward_cuda_time_total') for the lines next to it.",
        )
    ]


def _op_context(v: _View, row: int) -> str:
    """ "aten::mm in AddmmBackward0": the op and the caller of its heaviest call-tree
    node (an autograd node, a module's forward, the Python call that ran it)."""
    tree = v.res.window(v.window_index).call_tree()
    nodes = np.nonzero(tree["op"] == row)[0]
    name = str(v.ops["name"][row])
    if not len(nodes):
        return name
    node = int(nodes[np.argmax(tree["cuda_total_ns"][nodes])])
    parent = int(tree["parent"][node])
    if parent < 0:
        return name
    caller = str(tree["name"][parent])
    return name if caller.startswith("ProfilerStep") else f"{name} in {caller}"


def _distinct_contexts(v: _View, rows: list[int]) -> dict[int, str]:
    """:func:`_op_context` of each row, with the row's input shapes where two rows
    would read the same ("aten::mm in MmBackward0 [[1024, 768], [768, 50257]]": the
    input's and the weight's gradients are two rows of one op under one node)."""
    names = {i: _op_context(v, i) for i in rows}
    seen = [names[i] for i in rows]
    for i in rows:
        shapes = str(v.ops["input_shapes"][i])
        if seen.count(names[i]) > 1 and shapes:
            names[i] += f" {shapes}"
    return names


def _mfu(v: _View):
    """The steps' MFU (FLOPs over wall time, PaLM's definition) and the ops that lose
    the most GPU time against their precision's dense peak (record_shapes=True)."""
    from ..results._keys import OP_KEY
    from ..results._mfu import OpPeaks, steps_mfu

    ops = v.ops
    if not len(v.gpu) or not (ops["flops"] > 0).any():
        return []
    peaks = OpPeaks([v.res.window(v.window_index)])
    whole = steps_mfu(ops, peaks, v.step_ns)
    if whole.mfu is None:
        return []
    lost = []  # (ns lost against the peak, row, MFU)
    for i in np.nonzero((ops["flops"] > 0) & (ops["cuda_total_ns"] > 0))[0].tolist():
        peak = peaks.peak(tuple(ops[f][i] for f in OP_KEY))
        if peak != peak:
            continue
        at_peak = float(ops["flops"][i]) / (peak * 1e3)
        ns = float(ops["cuda_total_ns"][i])
        lost.append((ns - at_peak, i, at_peak / ns))
    lost.sort(reverse=True)
    worst = [x for x in lost if x[0] > 0][:3]
    span = "steps run" if len(v.steps) else "recording runs"
    title = (
        f"The {span} at {100 * whole.mfu:.1f}% MFU ({whole.tflops:.1f} TFLOPS over wall time "
        f"against the {whole.precision.upper()} peak of {whole.peak_tflops:g} on {whole.device})"
    )
    names = _distinct_contexts(v, [i for _, i, _ in worst])
    if worst:
        title += "; " + ", ".join(f"{names[i]} at {100 * share:.0f}%" for _, i, share in worst)
    lost_ns = sum(x[0] for x in worst)
    return [
        Finding(
            "mfu",
            min(lost_ns / max(v.step_ns, 1), 1.0),
            title,
            {
                "flops": whole.flops,
                "wall_ns": whole.wall_ns,
                "tflops": whole.tflops,
                "mfu": whole.mfu,
                "precision": whole.precision,
                "peak_tflops": whole.peak_tflops,
                "device": whole.device,
                "lost_ns": int(lost_ns),
                "ops": [
                    {"op": names[i], "mfu": share, "lost_ns": int(ns)} for ns, i, share in worst
                ],
            },
            "",
            "Keep the GPU fed first (the other findings); then give the matrix ops more work "
            "per kernel (larger batch or fused projections), run them in BF16 or FP8 "
            "(torch.autocast, torch.set_float32_matmul_precision('high')), use "
            "F.scaled_dot_product_attention for attention, and try torch.compile to fuse "
            "the element-wise ops between them.",
        )
    ]


CHECKS = (
    _data_stall,
    _sync_points,
    _launch_bound,
    _gpu_idle,
    _mixed_precision,
    _communication,
    _memory_churn,
    _cpu_hot_path,
    _backward_heavy,
    _mfu,
)


def diagnose(results: Results, *, data_fetch=()) -> Diagnosis:
    """Run every check over the last recorded window; for merged ranks
    (:func:`gpuprof.merge`), the cross-rank checks.

    ``data_fetch``: names of ops (``record_function`` labels or Python functions, as
    ``ops()`` names them) in which a framework's loop fetches its batches; their calls
    count as waits for data, next to the loader calls made directly under a step (see
    :func:`data_wait_spans`).
    """
    if isinstance(results, MergedRun):
        return diagnose_ranks(results)
    if isinstance(data_fetch, str) or not all(isinstance(n, str) for n in data_fetch):
        raise TypeError(
            f"diagnose(): data_fetch must be a list of op names (str), got {data_fetch!r}"
        )
    v = _View(results, data_fetch=data_fetch)
    findings = []
    for check in CHECKS:
        findings += check(v)
    if not len(v.steps):  # shares of the step time are of the window's time
        for f in findings:
            if f.share_of == "step time":
                f.share_of = "recorded time"
    if len(v.steps):
        busy = int(v.steps["gpu_busy_ns"].sum())
    else:
        busy = sum(b - a for a, b in _merged(v.gpu, ("kernel", "memcpy", "memset")))
    summary = {
        "steps": len(v.steps),
        "step_ns_mean": v.step_ns // v.n_steps if len(v.steps) else 0,
        "window_ns": v.window_ns,
        "gpu_busy_share": busy / max(v.step_ns, 1),
        "gpu": bool(len(v.gpu)),
    }
    return Diagnosis(findings, summary)


# -- where each step's time goes: one part per instant, for the step bars of reports --

STEP_BREAKDOWN_DTYPE = np.dtype(
    [
        ("step", "i8"),
        ("window", "i4"),
        ("start_ns", "i8"),
        ("end_ns", "i8"),
        ("step_ns", "i8"),
        ("gpu_busy_ns", "i8"),
        ("comm_ns", "i8"),
        ("data_wait_ns", "i8"),
        ("sync_wait_ns", "i8"),
        ("idle_ns", "i8"),
    ]
)


def step_breakdown(results: Results) -> np.ndarray:
    """Each recorded step's wall time cut into five parts that add up to it.

    Every nanosecond of a step counts once, under the first of these that holds:

    - ``gpu_busy_ns``: a kernel other than communication, a copy or a memset runs;
    - ``comm_ns``: only communication (NCCL) kernels run: communication that
      compute does not hide;
    - ``data_wait_ns``: the GPU is idle while the training loop waits in its data
      iterator (a ``__next__`` or generator called directly under the step, as
      the ``data_stall`` finding counts it);
    - ``sync_wait_ns``: the GPU is idle after the host synchronized with it,
      from the end of the synchronizing call until the GPU's next operation, at
      most as long as the call waited (the cost the ``sync_point`` finding
      counts);
    - ``idle_ns``: the GPU is idle for any other reason (the host runs Python,
      launches work, or nothing was recorded).

    Args:
        results: a :class:`gpuprof.Results` (``prof.results``).

    Returns:
        A structured array (:data:`STEP_BREAKDOWN_DTYPE`), one row per row of
        ``results.steps()``, with ``window`` the index of the recorded window and
        ``step_ns = end_ns - start_ns``.
    """
    parts = []
    for wi in range(results.window_count):
        v = _View(results, wi)
        st = v.steps
        out = np.zeros(len(st), dtype=STEP_BREAKDOWN_DTYPE)
        out["step"], out["window"] = st["step"], wi
        out["start_ns"], out["end_ns"] = st["start_ns"], st["end_ns"]
        out["step_ns"] = out["end_ns"] - out["start_ns"]
        lo, hi = out["start_ns"], out["end_ns"]
        g = v.gpu
        work = np.isin(g["kind"], ("kernel", "memcpy", "memset"))
        comm_m = work & (g["category"] == "communication")
        busy = _union(g["start_ns"][work & ~comm_m], g["end_ns"][work & ~comm_m])
        comm = _union(g["start_ns"][comm_m], g["end_ns"][comm_m])
        gpu_any = _union(np.concatenate([busy[0], comm[0]]), np.concatenate([busy[1], comm[1]]))
        sp = v.spans
        li = data_wait_spans(sp, v.ops, v.raw_ops)
        loader = _union(sp["start_ns"][li], sp["end_ns"][li])
        # the GPU's idle bubble after each sync: until its next operation starts,
        # at most as long as the sync waited
        si = _sync_spans(v)
        s_end = sp["end_ns"][si].astype(np.int64)
        starts = np.sort(g["start_ns"][work])
        nxt = np.searchsorted(starts, s_end)
        nxt_start = np.where(
            nxt < len(starts), starts[np.minimum(nxt, len(starts) - 1)], np.iinfo(np.int64).max
        )
        bubble = _union(s_end, np.minimum(s_end + (s_end - sp["start_ns"][si]), nxt_start))
        gpu_or_loader = _union(
            np.concatenate([gpu_any[0], loader[0]]), np.concatenate([gpu_any[1], loader[1]])
        )
        out["gpu_busy_ns"] = _covered(busy, lo, hi)
        out["comm_ns"] = _covered(gpu_any, lo, hi) - out["gpu_busy_ns"]
        out["data_wait_ns"] = _covered(loader, lo, hi) - _covered(
            _intersect(loader, gpu_any), lo, hi
        )
        out["sync_wait_ns"] = _covered(bubble, lo, hi) - _covered(
            _intersect(bubble, gpu_or_loader), lo, hi
        )
        out["idle_ns"] = (
            out["step_ns"]
            - out["gpu_busy_ns"]
            - out["comm_ns"]
            - out["data_wait_ns"]
            - out["sync_wait_ns"]
        )
        parts.append(out)
    return np.concatenate(parts)
