"""Interval arithmetic on nanosecond timestamps (half-open [start, end)): the one
implementation the step breakdown, the diagnosis and the distributed overlap use."""

from __future__ import annotations

import numpy as np

__all__ = ["covered", "cover_split", "intersect", "overlap", "union", "union_list"]


def union(starts, ends, *, keep_empty: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint, sorted intervals covering the given ones; intervals that touch merge.
    Empty intervals (end <= start) are dropped unless ``keep_empty``."""
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    if not keep_empty:
        keep = e > s
        s, e = s[keep], e[keep]
    if not len(s):
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    # a new interval starts where it begins after everything before it ended
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    out_e = np.append(reach[idx[1:] - 1], reach[-1])
    return s[idx], out_e


def union_list(starts, ends) -> list[list[int]]:
    """:func:`union` keeping empty intervals, as ``[start, end]`` lists of Python ints
    (plain data, for findings' evidence)."""
    s, e = union(starts, ends, keep_empty=True)
    return [[a, b] for a, b in zip(s.tolist(), e.tolist(), strict=True)]


def intersect(a, b) -> tuple[np.ndarray, np.ndarray]:
    """Intersection of two disjoint sorted interval sets."""
    (as_, ae), (bs, be) = a, b
    i = j = 0
    out_s, out_e = [], []
    while i < len(as_) and j < len(bs):
        lo, hi = max(as_[i], bs[j]), min(ae[i], be[j])
        if lo < hi:
            out_s.append(lo)
            out_e.append(hi)
        if ae[i] < be[j]:
            i += 1
        else:
            j += 1
    return np.array(out_s, dtype=np.int64), np.array(out_e, dtype=np.int64)


def covered(iv, lo, hi) -> np.ndarray:
    """Time covered by disjoint sorted intervals ``iv`` inside each [lo, hi)."""
    s, e = iv
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.asarray(hi, dtype=np.int64)
    if not len(s):
        return np.zeros(lo.shape, dtype=np.int64)
    before = np.concatenate(([0], np.cumsum(e - s)))

    def upto(t):  # covered time in (-inf, t)
        i = np.searchsorted(s, t, side="right") - 1
        ic = np.clip(i, 0, len(s) - 1)
        part = np.where(i >= 0, np.clip(np.minimum(t, e[ic]) - s[ic], 0, None), 0)
        return np.where(i >= 0, before[ic], 0) + part

    return np.maximum(upto(hi) - upto(lo), 0)


def cover_split(first, second, lo, hi) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inside each [lo, hi): the time covered by ``first``, by ``second``, and by both
    (two disjoint sorted interval sets, as :func:`union` returns them).

    ``second - both`` is the part of ``second`` that ``first`` does not hide. With the
    compute kernels first and the communication kernels second, that is the exposed
    communication, computed here once for :func:`gpuprof.distributed.comm_overlap`
    (per step) and the ``communication_wait`` finding (over the window)."""
    return (
        covered(first, lo, hi),
        covered(second, lo, hi),
        covered(intersect(second, first), lo, hi),
    )


def overlap(iv, s: int, e: int) -> int:
    """Time the intervals ``iv`` (``[start, end]`` pairs) cover inside [s, e)."""
    return sum(max(0, min(b, e) - max(a, s)) for a, b in iv if b > s and a < e)
