"""The backward pass joined to the forward pass that made it (docs/backward.md).

Two facts from a window meet here:

- each autograd node's call on autograd's thread is a span carrying the node's
  sequence number (csrc/record/nvtx.c reads it from PyTorch's range message), and the
  GPU work it launched hangs below it (the launch's CUDA API span is a child of
  the node's span);
- each forward call that made autograd nodes has rows in the window's ``seqs``
  table: the node numbers ``[lo, hi)`` it made, with its call-tree node and span
  (csrc/record/hook.c reads PyTorch's per-thread counter at every event).

So a backward kernel belongs to the node span above its launch, and that node to
the forward call whose ``[lo, hi)`` holds its number. Sequence numbers are per
forward thread: where several threads' ranges hold a number, the thread waiting
in ``run_backward`` while the node ran wins (the innermost such call: reentrant
checkpointing runs a backward pass inside a node), else the forward call that
began last before the node. All of it is a few sorted searches over the
window's arrays.
"""

from __future__ import annotations

import numpy as np

from ..core._constants import GPU_WORK, OP_CUDA_API, OP_USER, OPF_AUTOGRAD
from ..core._spans import innermost_marked

__all__ = ["BackwardJoin", "join", "launch_spans"]


class BackwardJoin:
    """Per GPU event of a window: the autograd node span that launched it
    (``node_span``, -1 for work launched outside any node) and the forward call
    that made that node (``fwd_node``, a call-tree node, and ``fwd_span``; -1
    where the node has no number, as ``AccumulateGrad``, or none was found).
    ``span_fwd`` is the forward span of each node span (-1 elsewhere), for the
    trace's flow arrows."""

    __slots__ = ("node_span", "fwd_node", "fwd_span", "span_fwd", "is_work")

    def __init__(self, n_gpu: int, n_spans: int):
        self.node_span = np.full(n_gpu, -1, dtype=np.int64)
        self.fwd_node = np.full(n_gpu, -1, dtype=np.int64)
        self.fwd_span = np.full(n_gpu, -1, dtype=np.int64)
        self.span_fwd = np.full(n_spans, -1, dtype=np.int64)
        self.is_work = np.zeros(n_gpu, dtype=bool)

    def node_self_ns(self, gpu: np.ndarray, n_nodes: int) -> np.ndarray:
        """Per forward call-tree node: the backward GPU time of the nodes it made."""
        out = np.zeros(n_nodes, dtype=np.int64)
        m = self.is_work & (self.fwd_node >= 0)
        if m.any():
            dur = (gpu["end_ns"][m] - gpu["start_ns"][m]).astype(np.int64)
            np.add.at(out, self.fwd_node[m], dur)
        return out

    def summary(self, gpu: np.ndarray, names: list[str], spans: np.ndarray) -> dict:
        """Backward GPU time: in nodes, joined to a forward call, and by node name
        where not joined."""
        m = self.is_work & (self.node_span >= 0)
        dur = (gpu["end_ns"] - gpu["start_ns"]).astype(np.int64)
        joined = m & (self.fwd_node >= 0)
        rest: dict[str, int] = {}
        for s, d in zip(self.node_span[m & ~joined].tolist(), dur[m & ~joined].tolist()):
            name = names[int(spans["op_row"][s])]
            rest[name] = rest.get(name, 0) + d
        return {
            "node_ns": int(dur[m].sum()),
            "joined_ns": int(dur[joined].sum()),
            "unjoined_ns": dict(sorted(rest.items(), key=lambda kv: -kv[1])),
        }


def _node_spans(spans: np.ndarray, op_flags: np.ndarray) -> np.ndarray:
    """Per span: whether it is an autograd node's call."""
    if not len(spans):
        return np.zeros(0, dtype=bool)
    rows = spans["op_row"].astype(np.int64)
    ok = rows < len(op_flags)
    flags = np.where(ok, op_flags[np.minimum(rows, len(op_flags) - 1)], 0)
    return (spans["kind"] == OP_USER) & ((flags & OPF_AUTOGRAD) != 0)


def _waiting_thread(start: np.ndarray, spans: np.ndarray, names: list) -> np.ndarray:
    """Per node start: the thread whose backward pass it ran in, the one inside
    ``run_backward`` then that entered it last (a backward pass begun inside a node,
    as reentrant checkpointing's, is inside its caller's); -1 where none."""
    out = np.full(len(start), -1, dtype=np.int64)
    rows = [i for i, n in enumerate(names) if str(n).endswith("_EngineBase.run_backward")]
    if not rows or not len(start):
        return out
    calls = np.flatnonzero(np.isin(spans["op_row"], rows))
    since = np.full(len(start), np.iinfo(np.int64).min, dtype=np.int64)
    for c in calls[np.argsort(spans["start_ns"][calls], kind="stable")].tolist():
        lo, hi = int(spans["start_ns"][c]), int(spans["end_ns"][c])
        inside = (start >= lo) & (start <= hi) & (lo >= since)
        out[inside] = int(spans["thread"][c])
        since[inside] = lo
    return out


def _forward_of(
    seq: np.ndarray, start: np.ndarray, seqs: np.ndarray, prefer: np.ndarray
) -> np.ndarray:
    """Per node (its number, start and the thread whose backward pass ran it): the
    index of the ``seqs`` row that made it, -1 where none. Numbers are per thread:
    a row of the thread whose backward pass it was wins; else the forward call that
    began last before the node. Per thread, rows are in the order the counter
    moved, so their ranges are sorted and disjoint."""
    best = np.full(len(seq), -1, dtype=np.int64)
    if not len(seqs) or not len(seq):
        return best
    best_ts = np.full(len(seq), np.iinfo(np.int64).min, dtype=np.int64)
    own = np.full(len(seq), -1, dtype=np.int64)  # the row on the preferred thread
    # (a set, not np.unique: NumPy 2's first np.unique imports numpy.ma, 78 ms of
    # the first table on the H200)
    for t in sorted(set(seqs["thread"].tolist())):
        idx = np.flatnonzero(seqs["thread"] == t)
        lo = seqs["lo"][idx].astype(np.int64)
        order = np.argsort(lo, kind="stable")
        idx, lo = idx[order], lo[order]
        hi = seqs["hi"][idx].astype(np.int64)
        k = np.searchsorted(lo, seq, side="right") - 1
        kk = np.maximum(k, 0)
        hit = (k >= 0) & (seq < hi[kk])
        cand = idx[kk]
        ts = seqs["ts"][cand].astype(np.int64)
        in_time = ts <= start  # a forward call cannot have made a node that ran before it
        better = hit & in_time & (ts > best_ts)
        fallback = hit & (best < 0) & ~in_time  # kept only if no thread has one in time
        best = np.where(better | fallback, cand, best)
        best_ts = np.where(better, ts, best_ts)
        own = np.where(hit & (prefer == t), cand, own)
    return np.where(own >= 0, own, best)


def launch_spans(spans: np.ndarray, gpu: np.ndarray) -> np.ndarray:
    """Per GPU record: the span of the CUDA call that launched it (same correlation
    id), -1 where none."""
    api = np.flatnonzero((spans["kind"] == OP_CUDA_API) & (spans["correlation"] != 0))
    out = np.full(len(gpu), -1, dtype=np.int64)
    if not len(api) or not len(gpu):
        return out
    corr = spans["correlation"][api].astype(np.int64)
    order = np.argsort(corr, kind="stable")
    api, corr = api[order], corr[order]
    want = gpu["correlation"].astype(np.int64)
    k = np.minimum(np.searchsorted(corr, want), len(corr) - 1)
    return np.where((want != 0) & (corr[k] == want), api[k], -1).astype(np.int64)


def join(raw: dict) -> BackwardJoin:
    """The join of one window (a raw dict with its spans)."""
    gpu, spans = raw["gpu"], raw.get("spans")
    if spans is None:
        spans = np.zeros(0, dtype=[("op_row", "u4"), ("kind", "u1")])
    out = BackwardJoin(len(gpu), len(spans))
    if not len(gpu) or not len(spans):
        return out
    out.is_work = np.isin(gpu["kind"], GPU_WORK)
    is_node = _node_spans(spans, raw["ops"]["flags"])
    if not is_node.any():
        return out
    cur = launch_spans(spans, gpu)
    # up the parents to the first node span (a custom Function's Python backward
    # puts frames between the node and its launches), unless the way up passes
    # through activation checkpointing's recomputation: that is the checkpointed
    # module's forward, run again inside a node (when it unpacks what it saved)
    files = raw["op_files"]
    recompute = np.array(
        [str(f).replace("\\", "/").endswith("torch/utils/checkpoint.py") for f in files] + [False]
    )
    rows = spans["op_row"].astype(np.int64)
    stop = recompute[np.where(rows < len(files), rows, len(files))]
    node_of = innermost_marked(spans, is_node, stop)
    node_span = np.where(cur >= 0, node_of[np.maximum(cur, 0)], -1)
    out.node_span = node_span
    # each node span's forward call
    nodes = np.flatnonzero(is_node & (spans["seq"] >= 0))
    seqs = raw.get("seqs")
    if seqs is not None and len(nodes):
        start = spans["start_ns"][nodes].astype(np.int64)
        prefer = _waiting_thread(start, spans, raw["op_names"])
        row = _forward_of(spans["seq"][nodes].astype(np.int64), start, seqs, prefer)
        ok = row >= 0
        fwd_node = np.full(len(spans), -1, dtype=np.int64)
        fwd_node[nodes[ok]] = seqs["node"][row[ok]]
        out.span_fwd[nodes[ok]] = seqs["span"][row[ok]]
        has = node_span >= 0
        out.fwd_node[has] = fwd_node[node_span[has]]
        out.fwd_span[has] = out.span_fwd[node_span[has]]
    return out
