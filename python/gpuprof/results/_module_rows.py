"""The modules table of a window: one row per ``torch.nn.Module`` instance that ran,
nested as the calls nest (docs/backward.md, "Modules").

A call of ``Module.__call__`` carries its instance's number in its span (``module``, the
number + 1; csrc/record/hook.c), and the window's raw dict names the numbers
(``module_names``, ``module_classes``; gpuprof.record._modules). Each span's innermost
enclosing module call is found by pointer jumping over the span tree
(gpuprof.core._spans.innermost_marked). GPU work then
belongs to a module as follows: forward work through the CUDA call that launched it,
backward work through the forward call that made its autograd node
(gpuprof.results._backward). Self figures roll up into totals along the instances' nesting.
"""

from __future__ import annotations

import numpy as np

from ..core._constants import GPU_WORK
from ..core._spans import innermost_marked
from ._backward import launch_spans

__all__ = ["MODULES_DTYPE", "module_rows"]

MODULES_DTYPE = np.dtype(
    [
        ("name", object),  # as in the model: transformer.h.3.attn (the top: its class)
        ("cls", object),  # the class: GPT2Attention
        ("parent", "i4"),  # row of the enclosing module, -1 at the top
        ("depth", "i4"),
        ("calls", "i8"),
        ("cpu_total_ns", "i8"),  # forward: time in its calls (the outermost, for recursion)
        ("cuda_fwd_ns", "i8"),  # GPU work launched in its calls, the modules inside included
        ("cuda_bwd_ns", "i8"),  # backward GPU work of the autograd nodes made in its calls
        ("kernels", "i8"),  # forward and backward GPU activities of both
        ("cuda_fwd_self_ns", "i8"),  # the same, less the modules inside it
        ("cuda_bwd_self_ns", "i8"),
        ("share", "f8"),  # (cuda_fwd_ns + cuda_bwd_ns) / the window's GPU work
        # FLOPs of the ATen calls in its forward calls and in the backward of the nodes
        # they made, the modules inside included (record_shapes=True; docs/flops.md)
        ("flops", "i8"),
        # flops over its forward and backward GPU time, against the dense peak of the
        # window's main precision (0..1; NaN: no FLOPs or no known peak)
        ("mfu", "f8"),
    ]
)


def module_rows(raw: dict, backward=None, node_flops=None, peak=None) -> np.ndarray:
    """The modules table of one window (its raw dict, spans built); ``backward``: its
    :class:`gpuprof.results._backward.BackwardJoin`, or None; ``node_flops``: the
    FLOPs of each call-tree node (None without input sizes); ``peak``: the dense peak
    TFLOPS the MFU is taken against (None: unknown)."""
    spans = raw.get("spans")
    names = raw.get("module_names") or []
    if spans is None or "module" not in (spans.dtype.names or ()) or not names:
        return np.zeros(0, dtype=MODULES_DTYPE)
    mod = spans["module"].astype(np.int64) - 1
    is_mod = (mod >= 0) & (mod < len(names))
    if not is_mod.any():
        return np.zeros(0, dtype=MODULES_DTYPE)
    inner = innermost_marked(spans, is_mod)
    calls = np.flatnonzero(is_mod)
    parent_span = spans["parent"][calls].astype(np.int64)
    outer_call = np.where(parent_span >= 0, inner[np.maximum(parent_span, 0)], -1)
    outer_inst = np.where(outer_call >= 0, mod[np.maximum(outer_call, 0)], -1)
    inst = mod[calls]
    # rows: the instances that ran, in the order their first call began
    first: dict[int, int] = {}
    for i, s in zip(inst.tolist(), calls.tolist()):
        first.setdefault(i, s)
    order = sorted(first, key=lambda i: (int(spans["start_ns"][first[i]]), first[i]))
    row_of = {i: r for r, i in enumerate(order)}
    n = len(order)
    out = np.zeros(n, dtype=MODULES_DTYPE)
    classes = raw.get("module_classes") or [""] * len(names)
    out["name"] = [names[i] for i in order]
    out["cls"] = [classes[i] for i in order]
    rows = np.array([row_of[i] for i in inst.tolist()], dtype=np.int64)
    parent_of: dict[int, int] = {}
    for r, o in zip(rows.tolist(), outer_inst.tolist()):
        if r not in parent_of:
            parent_of[r] = row_of.get(o, -1)
    out["parent"] = [parent_of.get(r, -1) if parent_of.get(r, -1) != r else -1 for r in range(n)]
    np.add.at(out["calls"], rows, 1)
    dur = (spans["end_ns"][calls] - spans["start_ns"][calls]).astype(np.int64)
    outermost = outer_inst != inst  # recursion: a call inside its own instance's counts once
    np.add.at(out["cpu_total_ns"], rows[outermost], dur[outermost])
    # GPU work: forward by its launch, backward by the forward call that made its node
    gpu = raw["gpu"]
    if len(gpu):
        work = np.isin(gpu["kind"], GPU_WORK)
        at = launch_spans(spans, gpu)
        bwd = np.zeros(len(gpu), dtype=bool)
        if backward is not None:
            bwd = backward.node_span >= 0
            at = np.where(bwd, backward.fwd_span, at)
        m = work & (at >= 0)
        owner = np.full(len(gpu), -1, dtype=np.int64)
        owner[m] = inner[at[m]]
        m &= owner >= 0
        row = np.full(len(gpu), -1, dtype=np.int64)
        row[m] = [row_of[i] for i in mod[owner[m]].tolist()]
        d = (gpu["end_ns"] - gpu["start_ns"]).astype(np.int64)
        np.add.at(out["cuda_fwd_self_ns"], row[m & ~bwd], d[m & ~bwd])
        np.add.at(out["cuda_bwd_self_ns"], row[m & bwd], d[m & bwd])
        self_kernels = np.zeros(n, dtype=np.int64)
        np.add.at(self_kernels, row[m], 1)
        total_work = int(d[work].sum())
    else:
        self_kernels = np.zeros(n, dtype=np.int64)
        total_work = 0
    self_flops = _self_flops(raw, spans, inner, mod, row_of, n, backward, node_flops)
    # depth and totals along the nesting (a parent's first call began before its child's)
    for r in range(n):
        p = int(out["parent"][r])
        out["depth"][r] = out["depth"][p] + 1 if 0 <= p < r else 0
        if not 0 <= p < r:
            out["parent"][r] = -1
    out["cuda_fwd_ns"] = out["cuda_fwd_self_ns"]
    out["cuda_bwd_ns"] = out["cuda_bwd_self_ns"]
    out["kernels"] = self_kernels
    out["flops"] = self_flops
    for r in range(n - 1, -1, -1):
        p = int(out["parent"][r])
        if p >= 0:
            out["cuda_fwd_ns"][p] += out["cuda_fwd_ns"][r]
            out["cuda_bwd_ns"][p] += out["cuda_bwd_ns"][r]
            out["kernels"][p] += out["kernels"][r]
            out["flops"][p] += out["flops"][r]
    if total_work:
        out["share"] = (out["cuda_fwd_ns"] + out["cuda_bwd_ns"]) / total_work
    out["mfu"] = np.nan
    gpu_ns = out["cuda_fwd_ns"] + out["cuda_bwd_ns"]
    if peak:
        m = (out["flops"] > 0) & (gpu_ns > 0)
        out["mfu"][m] = out["flops"][m] / gpu_ns[m] / 1e3 / peak
    return out


def _self_flops(raw, spans, inner, mod, row_of, n, backward, node_flops) -> np.ndarray:
    """Per module row: the FLOPs of the ATen calls whose innermost module it is, in the
    forward, and in the backward through the forward call that made their node."""
    out = np.zeros(n, dtype=np.int64)
    if node_flops is None or not node_flops.any():
        return out
    nodes = raw["nodes"]
    node = spans["node"].astype(np.int64)
    has = (node >= 0) & (node < len(nodes))
    per_call = np.zeros(len(spans), dtype=np.int64)
    per_call[has] = node_flops[node[has]] // np.maximum(nodes["calls"][node[has]], 1)
    at = np.arange(len(spans), dtype=np.int64)  # the span whose module owns the call
    if backward is not None and (backward.span_fwd >= 0).any():
        in_node = innermost_marked(spans, backward.span_fwd >= 0)
        m = in_node >= 0
        at[m] = backward.span_fwd[in_node[m]]
    counted = (per_call > 0) & (at >= 0)
    owner = np.full(len(spans), -1, dtype=np.int64)
    owner[counted] = inner[at[counted]]
    counted &= owner >= 0
    rows = np.array([row_of.get(int(i), -1) for i in mod[owner[counted]].tolist()], dtype=np.int64)
    ok = rows >= 0
    np.add.at(out, rows[ok], per_call[counted][ok])
    return out
