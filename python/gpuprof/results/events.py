"""Per-call events, as torch.profiler's ``prof.events()``: one :class:`FunctionEvent`
per recorded call, range and CUDA API call of the last window.

The events are a view over ``prof.results.spans()``: an event object is made
when it is read, so a window of millions of calls costs a few arrays, not
millions of objects. Times are in microseconds, as in torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, overload

import numpy as np

from ..core._constants import OP_CUDA_API, SF_ENTERED
from ._results import Results, display_name

__all__ = ["EventList", "FunctionEvent", "Interval"]

_API_KIND = OP_CUDA_API


class Interval:
    """A call's start and end in microseconds on the profiler clock."""

    __slots__ = ("start", "end")

    def __init__(self, start: float, end: float):
        self.start = start
        self.end = end

    def elapsed_us(self) -> float:
        return self.end - self.start

    def __repr__(self) -> str:
        return f"Interval(start={self.start:.3f}, end={self.end:.3f})"


class FunctionEvent:
    """One call: torch.profiler's ``FunctionEvent`` attribute names (``name``,
    ``key``, ``id``, ``thread``, ``time_range``, ``cpu_time_total``,
    ``self_cpu_time_total``, ``device_time_total``, ``self_device_time_total``,
    ``cpu_parent``, ``cpu_children``, ``count``, ``input_shapes``, ``stack``), plus
    ``kind`` (python, c, user, step, cuda_api), ``line`` (the line of the Python
    caller that made the call: recorded for C calls, for library code called by the
    user's code and for frames running when the window opened; else 0) and
    ``is_context`` (entered before the window opened)."""

    def __init__(self, events: EventList, i: int):
        self._events = events
        self.id = i
        ev = events
        self.name = ev._names[ev._op[i]]
        self.key = self.name
        self.kind = ev._kinds[ev._op[i]]
        self.thread = int(ev._spans["thread"][i])
        self.time_range = Interval(float(ev._start_us[i]), float(ev._end_us[i]))
        self.cpu_time_total = float(ev._end_us[i] - ev._start_us[i])
        self.self_cpu_time_total = float(ev._self_us[i])
        self.device_time_total = float(ev._dev_total_us[i])
        self.self_device_time_total = float(ev._dev_self_us[i])
        self.line = int(ev._spans["line"][i])
        self.is_context = bool(ev._spans["flags"][i] & SF_ENTERED)
        self.count = 1
        self.input_shapes: list[Any] = []  # not recorded (docs/api.md)
        self.stack: list[str] = []
        self.is_async = False
        self.device_type = "CPU"

    cuda_time_total = property(lambda self: self.device_time_total)
    self_cuda_time_total = property(lambda self: self.self_device_time_total)

    @property
    def cpu_parent(self) -> FunctionEvent | None:
        p = int(self._events._spans["parent"][self.id])
        return self._events[p] if p >= 0 else None

    @property
    def cpu_children(self) -> list[FunctionEvent]:
        return [self._events[int(c)] for c in self._events._children(self.id)]

    def __repr__(self) -> str:
        return (
            f"<FunctionEvent id={self.id} name={self.name!r} thread={self.thread} "
            f"cpu_time_total={self.cpu_time_total:.3f}us "
            f"self_cpu_time_total={self.self_cpu_time_total:.3f}us "
            f"device_time_total={self.device_time_total:.3f}us>"
        )


class EventList:
    """The calls of the last window in recording order (a sequence of
    :class:`FunctionEvent`); ``len()``, indexing and iteration."""

    def __init__(self, results: Results):
        spans = results.spans()
        ops = results.window_ops(-1)
        self._spans = spans
        self._names = [
            display_name(n, f, ln, k)
            for n, f, ln, k in zip(ops["name"], ops["file"], ops["line"], ops["kind"])
        ]
        self._kinds = [str(k) for k in ops["kind"]]
        self._op = spans["op_row"].astype(np.int64)
        n = len(spans)
        start = spans["start_ns"].astype(np.int64)
        end = spans["end_ns"].astype(np.int64)
        self._start_us = start / 1e3
        self._end_us = end / 1e3
        parent = spans["parent"].astype(np.int64)
        child_sum = np.zeros(n, dtype=np.int64)
        has_parent = parent >= 0
        np.add.at(child_sum, parent[has_parent], (end - start)[has_parent])
        self._self_us = (end - start - child_sum) / 1e3
        dev_self, dev_total = _device_times(spans, parent, results.window_gpu_events(-1))
        self._dev_self_us = dev_self / 1e3
        self._dev_total_us = dev_total / 1e3
        self._parent = parent
        self._child_index: tuple[np.ndarray, np.ndarray] | None = None

    def _children(self, i: int) -> np.ndarray:
        if self._child_index is None:
            order = np.argsort(self._parent, kind="stable")
            self._child_index = (order, self._parent[order])
        order, sorted_parent = self._child_index
        lo, hi = np.searchsorted(sorted_parent, [i, i + 1])
        return order[lo:hi]

    def __len__(self) -> int:
        return len(self._spans)

    @overload
    def __getitem__(self, i: int) -> FunctionEvent: ...

    @overload
    def __getitem__(self, i: slice) -> list[FunctionEvent]: ...

    def __getitem__(self, i: int | slice) -> FunctionEvent | list[FunctionEvent]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"event index {i} out of range ({len(self)} events)")
        return FunctionEvent(self, i)

    def __iter__(self) -> Iterator[FunctionEvent]:
        for i in range(len(self)):
            yield FunctionEvent(self, i)

    def __repr__(self) -> str:
        return f"<EventList: {len(self)} events of the last window>"


def _device_times(
    spans: np.ndarray, parent: np.ndarray, gpu: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """GPU time (ns) per span: of the work launched by the CUDA API calls directly
    under it (self), and under it at any depth (total), joined by correlation id."""
    n = len(spans)
    dev_self = np.zeros(n, dtype=np.int64)
    dev_total = np.zeros(n, dtype=np.int64)
    if not n or not len(gpu):
        return dev_self, dev_total
    is_api = (spans["kind"] == _API_KIND) & (spans["correlation"] != 0)
    api_idx = np.flatnonzero(is_api)
    corr_of_api = spans["correlation"][api_idx]
    order = np.argsort(corr_of_api, kind="stable")
    corr_sorted = corr_of_api[order]
    work = np.isin(gpu["kind"], ("kernel", "memcpy", "memset"))
    corr = gpu["correlation"][work]
    dur = (gpu["end_ns"][work] - gpu["start_ns"][work]).astype(np.int64)
    pos = np.searchsorted(corr_sorted, corr)
    found = (pos < len(corr_sorted)) & (corr_sorted[np.minimum(pos, len(corr_sorted) - 1)] == corr)
    api = api_idx[order[pos[found]]]
    dur = dur[found]
    launcher = parent[api]
    ok = launcher >= 0
    np.add.at(dev_self, launcher[ok], dur[ok])
    cur = api
    while len(cur):  # every ancestor of the API call, one depth level at a time
        np.add.at(dev_total, cur, dur)
        up = parent[cur]
        keep = up >= 0
        cur, dur = up[keep], dur[keep]
    return dev_self, dev_total
