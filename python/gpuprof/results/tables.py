"""torch.profiler-style tables over the ops array: ``prof.key_averages().table()``.

Every number in a table comes from a field of ``prof.ops()`` (or of the call
tree when grouped by stack): Self CPU is ``cpu_self_ns``, CPU total is
``cpu_total_ns``, Self CUDA is ``cuda_self_ns`` (GPU time of kernels
launched while the op was innermost), CUDA total is ``cuda_total_ns``.
Iterating a :class:`KeyAverages` gives one :class:`KeyAverage` per row, with
the attribute names of torch.profiler's ``FunctionEventAvg``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..core._format import TIME_UNITS, format_bytes, format_time
from ._flops import parse_sizes
from ._keys import OP_KEY, OP_NAME_KEY
from ._results import Results, display_name, outermost, subtree_sums

__all__ = ["KeyAverage", "KeyAverages", "SORT_KEYS", "TIME_UNITS", "format_time", "format_bytes"]

# sort key -> (field of KeyAverages.rows, per-call average?)
SORT_KEYS = {
    "self_cpu_time_total": ("cpu_self_ns", False),
    "cpu_time_total": ("cpu_total_ns", False),
    "cpu_time": ("cpu_total_ns", True),
    "self_cuda_time_total": ("cuda_self_ns", False),
    "cuda_time_total": ("cuda_total_ns", False),
    "cuda_time": ("cuda_total_ns", True),
    "self_device_time_total": ("cuda_self_ns", False),
    "device_time_total": ("cuda_total_ns", False),
    "device_time": ("cuda_total_ns", True),
    "count": ("calls", False),
    "self_cuda_memory_usage": ("cuda_mem_self_bytes", False),
    "cuda_memory_usage": ("cuda_mem_total_bytes", False),
    "self_device_memory_usage": ("cuda_mem_self_bytes", False),
    "device_memory_usage": ("cuda_mem_total_bytes", False),
    "self_cpu_memory_usage": ("cpu_mem_self_bytes", False),
    "cpu_memory_usage": ("cpu_mem_total_bytes", False),
    "kernels": ("kernels", False),
    # the backward pass joined to the forward (docs/backward.md)
    "backward_cuda_time_total": ("bwd_cuda_total_ns", False),
    "self_backward_cuda_time_total": ("bwd_cuda_self_ns", False),
    "forward_backward_cuda_time_total": ("fwd_bwd_cuda_ns", False),
}

# time_unit= of table(): nanoseconds per unit

# Fields of KeyAverages.rows beyond those of ops()
_EXTRA_FIELDS = [
    ("cuda_mem_total_bytes", "i8"),
    ("cpu_mem_total_bytes", "i8"),
    ("context", "?"),
    ("top_level", "?"),
    ("thread", "i4"),  # row of results.threads() (group_by_thread), else -1
    # the precision the row's kernels ran in and its dense peak on their device
    # (results/_mfu.py; "" and NaN when unknown or without FLOPs)
    ("precision", "U4"),
    ("peak_tflops", "f8"),
]


def _pct(x: float, total: float) -> str:
    return f"{100.0 * x / total:.2f}%" if total else "0.00%"


class KeyAverage:
    """One row of :class:`KeyAverages`, with torch.profiler's ``FunctionEventAvg``
    attribute names. Times are in microseconds (float) and memory in bytes, as in
    torch; ``count`` is the number of calls."""

    def __init__(
        self, row: np.void, key: str, stack: list[str], kind: str, thread: str | None = None
    ) -> None:
        us = 1e-3
        calls = int(row["calls"])
        self.key = key
        self.count = calls
        self.kind = kind
        self.cpu_time_total = float(row["cpu_total_ns"]) * us
        self.self_cpu_time_total = float(row["cpu_self_ns"]) * us
        self.cpu_time = self.cpu_time_total / max(calls, 1)
        self.device_time_total = float(row["cuda_total_ns"]) * us
        self.self_device_time_total = float(row["cuda_self_ns"]) * us
        self.device_time = self.device_time_total / max(calls, 1)
        self.cpu_memory_usage = int(row["cpu_mem_total_bytes"])
        self.self_cpu_memory_usage = int(row["cpu_mem_self_bytes"])
        self.device_memory_usage = int(row["cuda_mem_total_bytes"])
        self.self_device_memory_usage = int(row["cuda_mem_self_bytes"])
        self.kernels = int(row["kernels"])
        # backward GPU time of the autograd nodes this op made (docs/backward.md)
        self.backward_device_time_total = float(row["bwd_cuda_total_ns"]) * us
        self.self_backward_device_time_total = float(row["bwd_cuda_self_ns"]) * us
        self.forward_backward_device_time_total = float(row["fwd_bwd_cuda_ns"]) * us
        # record_shapes=True: an ATen op's input sizes, one list per input ([] for
        # a non-tensor); empty for other rows and for a row of several shapes
        text = row["input_shapes"]
        self.input_shapes: list[Any] = parse_sizes(text) if text else []
        self.stack = list(stack)
        self.is_user_annotation = kind == "user"
        self.is_context = bool(row["context"])
        self.is_idle = bool(row["idle"])
        self.thread = thread  # the thread's name, grouped by thread; else None
        self.flops = int(row["flops"])
        # achieved TFLOPS over the CUDA total, and MFU against the dense peak of the
        # precision the kernels ran in (None: no FLOPs, no kernel time, unknown peak)
        self.precision: str | None = str(row["precision"]) or None
        peak = float(row["peak_tflops"])
        self.peak_tflops: float | None = peak if peak > 0 else None
        cuda_ns = float(row["cuda_total_ns"])
        self.tflops: float | None = self.flops / cuda_ns / 1e3 if self.flops and cuda_ns else None
        self.mfu: float | None = (
            self.tflops / self.peak_tflops if self.tflops and self.peak_tflops else None
        )
        self.node_id = -1
        self.is_legacy = False
        self.overload_name = ""

    # torch's older spellings of the device fields
    cuda_time_total = property(lambda self: self.device_time_total)
    self_cuda_time_total = property(lambda self: self.self_device_time_total)
    cuda_time = property(lambda self: self.device_time)
    backward_cuda_time_total = property(lambda self: self.backward_device_time_total)
    self_backward_cuda_time_total = property(lambda self: self.self_backward_device_time_total)
    forward_backward_cuda_time_total = property(
        lambda self: self.forward_backward_device_time_total
    )
    cuda_memory_usage = property(lambda self: self.device_memory_usage)
    self_cuda_memory_usage = property(lambda self: self.self_device_memory_usage)

    @property
    def name(self) -> str:
        return self.key

    def __repr__(self) -> str:
        return (
            f"<KeyAverage key={self.key!r} count={self.count} "
            f"self_cpu_time_total={self.self_cpu_time_total:.3f}us "
            f"cpu_time_total={self.cpu_time_total:.3f}us "
            f"self_device_time_total={self.self_device_time_total:.3f}us "
            f"device_time_total={self.device_time_total:.3f}us "
            f"cpu_memory_usage={self.cpu_memory_usage} "
            f"device_memory_usage={self.device_memory_usage}>"
        )


class KeyAverages:
    """Op statistics averaged by key, printable as a table; iterate it for one
    :class:`KeyAverage` per row (``for e in prof.key_averages(): e.cpu_time_total``).

    Rows are a structured array (``.rows``) with the ops() fields plus
    ``cuda_mem_total_bytes``/``cpu_mem_total_bytes`` (memory of the op and what it
    called), ``context``, ``top_level`` and ``thread``; ``display`` holds the names
    shown. Frames that were already running when recording began (``context``) are
    left out unless ``include_context=True``.

    Waiting is not CPU time: unless ``idle=True``, the rows of ops that block their
    thread (``ops()["idle"]``: sleeps, lock acquires, polls, queue gets) are left out,
    their time leaves the Self CPU total, and each op's CPU total is the time it
    computed (``cpu_total_ns`` less the waits below it); a footer line says how much
    waiting was left out. ``group_by_thread=True`` gives one row per op and thread.
    """

    def __init__(
        self,
        results: Results,
        group_by_stack_n: int = 0,
        show_memory: bool = False,
        include_context: bool = False,
        idle: bool = False,
        group_by_thread: bool = False,
        group_by_input_shape: bool = False,
    ):
        if (
            isinstance(group_by_stack_n, bool)
            or not isinstance(group_by_stack_n, int)
            or group_by_stack_n < 0
        ):
            raise ValueError(
                f"key_averages(): group_by_stack_n must be an int >= 0, got {group_by_stack_n!r}"
            )
        for name, value in (
            ("include_context", include_context),
            ("idle", idle),
            ("group_by_thread", group_by_thread),
            ("group_by_input_shape", group_by_input_shape),
        ):
            if not isinstance(value, bool):
                raise TypeError(f"key_averages(): {name} must be a bool, got {value!r}")
        self._results = results
        self.group_by_stack_n = group_by_stack_n
        self.show_memory = show_memory
        self.include_context = include_context
        self.idle = idle
        self.group_by_thread = group_by_thread
        ops = results.ops()
        self.cuda = bool(results.cuda.get("active")) or bool((ops["cuda_total_ns"] != 0).any())
        # ops() has a row per ATen op and input shapes: one per op unless grouped by them
        self.shapes = bool((ops["input_shapes"] != "").any())
        self.group_by_input_shape = group_by_input_shape and self.shapes
        merge_shapes = self.shapes and not group_by_input_shape
        stacks: list[list[str]] | None
        if group_by_stack_n or group_by_thread or merge_shapes:
            rows, stacks = self._by_stack(
                group_by_stack_n, group_by_thread, idle, by_shape=not merge_shapes
            )
            if not group_by_stack_n:
                stacks = None
        else:
            rows, stacks = _with_extra_fields(ops), None
            rows["context"] = results.context_rows()
            rows["top_level"] = results.top_level_rows()
            rows["cuda_mem_total_bytes"], rows["cpu_mem_total_bytes"] = results.op_memory()
            rows["thread"] = -1
            if not idle and (rows["idle"] & (rows["cpu_self_ns"] > 0)).any():
                rows["cpu_total_ns"] -= results.op_idle_ns()  # what each op computed
        # what waiting was left out (idle=False) or kept (idle=True), for the footer
        waits = rows["idle"]
        self.idle_self_ns = int(rows["cpu_self_ns"][waits].sum())
        by_name: dict[str, int] = {}
        for n, ns in zip(rows["name"][waits], rows["cpu_self_ns"][waits]):
            by_name[str(n)] = by_name.get(str(n), 0) + int(ns)
        self.idle_ops = sorted(((n, ns) for n, ns in by_name.items() if ns), key=lambda x: -x[1])
        self.idle_threads = len(results.idle_thread_idents()) if self.idle_self_ns else 0
        # shares and the footer's totals cover the whole window, shown rows or not
        # (waiting counts only with idle=True: it is not CPU time)
        counted = np.ones(len(rows), dtype=bool) if idle else ~waits
        self.total_self_cpu_ns = int(rows["cpu_self_ns"][counted].sum())
        self.total_self_cuda_ns = int(rows["cuda_self_ns"].sum())
        ctx = rows["context"]
        self.context_rows = int(ctx.sum())
        self.context_self_ns = int(rows["cpu_self_ns"][ctx].sum())
        keep = np.ones(len(rows), dtype=bool) if include_context else ~ctx
        if not idle:
            keep &= ~waits
        self.rows = rows[keep]
        self.rows["peak_tflops"] = np.nan
        if self.cuda and self.rows["flops"].any():
            self._fill_peaks()
        self.stacks = None if stacks is None else [s for s, k in zip(stacks, keep) if k]
        self.display = [
            display_name(n, f, ln, k)
            for n, f, ln, k in zip(
                self.rows["name"], self.rows["file"], self.rows["line"], self.rows["kind"]
            )
        ]
        self.thread_names = _thread_labels(results) if group_by_thread else []
        # what was measured, for the columns shown and the sort fallback
        self.cuda_memory = show_memory and (
            bool(results.cuda.get("active")) or bool((rows["cuda_mem_self_bytes"] != 0).any())
        )
        self.cpu_memory = show_memory and bool((rows["cpu_mem_self_bytes"] != 0).any())

    def _fill_peaks(self) -> None:
        """Each row's precision and dense peak, from the kernels of its op."""
        from ._mfu import OpPeaks

        res = self._results
        peaks = OpPeaks(res.window(i) for i in range(res.window_count))
        r = self.rows
        for i in np.nonzero(r["flops"] > 0)[0].tolist():
            key = tuple(r[f][i] for f in OP_KEY)
            r["precision"][i] = peaks.precision(key)[0] or ""
            r["peak_tflops"][i] = peaks.peak(key)

    def _by_stack(
        self, n: int, by_thread: bool = False, idle: bool = True, by_shape: bool = True
    ) -> tuple[np.ndarray, list[list[str]]]:
        """Group call-tree nodes by (op, nearest n Python callers), and by thread with
        ``by_thread``; without ``by_shape`` an op's rows of several input shapes are
        one. A group's total time and memory count each outermost node once
        (recursion is not counted again inside itself); without ``idle`` its total
        leaves out the waits below it."""
        res = self._results
        tree = res.call_tree()
        ops = res.ops()
        same_op: dict[tuple[Any, ...], int] = {}
        canon = np.array(
            [
                i if by_shape else same_op.setdefault(k, i)
                for i, k in enumerate(zip(*(ops[f] for f in OP_NAME_KEY)))
            ],
            dtype=np.int64,
        )
        shapes_of: dict[int, set[str]] = {}
        context = res.context_rows()
        parent = tree["parent"]
        op_of = tree["op"]
        is_py = ops["kind"] == "python"
        keys = []
        for i in range(len(tree)):
            stack: list[int] = []
            p = parent[i]
            while p >= 0 and len(stack) < n:
                if is_py[op_of[p]]:
                    stack.append(int(op_of[p]))
                p = parent[p]
            op = int(canon[op_of[i]])
            keys.append((op, tuple(stack), int(tree["thread"][i]) if by_thread else -1))
            shapes_of.setdefault(op, set()).add(ops["input_shapes"][op_of[i]])
        outer = outermost(parent, keys)
        waits = np.where(ops["idle"][op_of], tree["self_ns"], 0) if not idle else None
        wait_sub = (
            subtree_sums(parent, waits)
            if waits is not None and waits.any()
            else np.zeros(len(tree), dtype=np.int64)
        )
        mem_self, mem_sub = res.node_memory()
        top = (parent < 0) | context[op_of[np.maximum(parent, 0)]]
        groups: dict[tuple[int, tuple[int, ...], int], dict[str, Any]] = {}
        for i, key in enumerate(keys):
            g = groups.setdefault(
                key,
                {
                    "calls": 0,
                    "cpu_total_ns": 0,
                    "cpu_self_ns": 0,
                    "cuda_total_ns": 0,
                    "cuda_self_ns": 0,
                    "cuda_mem_self_bytes": 0,
                    "cuda_mem_total_bytes": 0,
                    "flops": 0,
                    "top_level": False,
                },
            )
            g["calls"] += int(tree["calls"][i])
            g["flops"] += int(tree["flops"][i])
            g["cpu_self_ns"] += int(tree["self_ns"][i])
            g["cuda_self_ns"] += int(tree["cuda_self_ns"][i])
            g["cuda_mem_self_bytes"] += int(mem_self[i])
            g["top_level"] = g["top_level"] or bool(top[i])
            if outer[i]:
                g["cpu_total_ns"] += int(tree["total_ns"][i]) - int(wait_sub[i])
                g["cuda_total_ns"] += int(tree["cuda_total_ns"][i])
                g["cuda_mem_total_bytes"] += int(mem_sub[i])
        rows = _with_extra_fields(ops[:0], len(groups))
        stacks = []
        for j, ((op, path, thread), g) in enumerate(groups.items()):
            for f in ops.dtype.names or ():
                rows[f][j] = ops[f][op]
            for f, v in g.items():
                rows[f][j] = v
            rows["thread"][j] = thread
            shapes = shapes_of.get(op, {""})
            rows["input_shapes"][j] = next(iter(shapes)) if len(shapes) == 1 else ""
            rows["context"][j] = context[op]
            rows["top_level"][j] = g["top_level"] and not context[op]
            stacks.append(
                [
                    display_name(ops["name"][s], ops["file"][s], ops["line"][s], "python")
                    for s in path
                ]
            )
        return rows, stacks

    def idle_note(self, unit: str | None = None) -> str | None:
        """The footer line on waiting: how much the table left out (the default) or
        shows (``idle=True``), in how many threads and in which ops; None when no
        thread waited."""
        if not self.idle_self_ns:
            return None
        n = self.idle_threads
        ops = ", ".join(f"{name} {format_time(ns, unit)}" for name, ns in self.idle_ops[:3])
        more = f", {len(self.idle_ops) - 3} more" if len(self.idle_ops) > 3 else ""
        waited = (
            f"{format_time(self.idle_self_ns, unit)} of waiting in {n} "
            f"thread{'s' if n != 1 else ''} ({ops}{more})"
        )
        if self.idle:
            return f"Idle: {waited} shown and counted in the totals (idle=True)"
        return f"Idle: {waited} left out; key_averages(idle=True) shows it"

    # -- torch.profiler's EventList of FunctionEventAvg ---------------------------------
    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> KeyAverage:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"KeyAverages index {i} out of range ({len(self)} rows)")
        return KeyAverage(
            self.rows[i],
            self.display[i],
            self.stacks[i] if self.stacks is not None else [],
            str(self.rows["kind"][i]),
            self.thread_names[self.rows["thread"][i]] if self.group_by_thread else None,
        )

    def __iter__(self) -> Iterator[KeyAverage]:
        for i in range(len(self)):
            yield self[i]

    def total_average(self) -> KeyAverage:
        """All shown rows summed into one (key "Total"), as torch's
        ``key_averages().total_average()``: totals of nested ops add up."""
        r = self.rows
        total = _with_extra_fields(r[:0], 1)
        for f in (
            "calls",
            "cpu_total_ns",
            "cpu_self_ns",
            "cuda_total_ns",
            "cuda_self_ns",
            "kernels",
            "cuda_mem_self_bytes",
            "cpu_mem_self_bytes",
            "cuda_mem_total_bytes",
            "cpu_mem_total_bytes",
            "flops",
        ):
            total[f][0] = r[f].sum()
        return KeyAverage(total[0], "Total", [], "total")

    # -- the table ---------------------------------------------------------------------
    def _sort_field(self, sort_by: str | None) -> tuple[str | None, bool, str | None]:
        """(field, per-call average, note) of a sort key; a key whose figures were not
        recorded falls back to self CPU time, and the note says so."""
        if sort_by is None:
            return None, False, None
        if not isinstance(sort_by, str) or sort_by not in SORT_KEYS:
            raise ValueError(
                f"table(): unknown sort_by {sort_by!r}; valid keys: " + ", ".join(sorted(SORT_KEYS))
            )
        field, avg = SORT_KEYS[sort_by]
        missing = None
        if field.startswith("cuda_mem") and not self.cuda_memory:
            missing = "no device memory was recorded (profile_memory=True with CUDA capture)"
        elif field.startswith("cpu_mem") and not self.cpu_memory:
            missing = "gpuprof does not measure host memory per op"
        elif field.startswith("cuda") and not self.cuda:
            missing = "no CUDA time was recorded"
        if missing is None:
            return field, avg, None
        return (
            "cpu_self_ns",
            False,
            (f"Sorted by self CPU time: sort_by={sort_by!r} has no figures ({missing})"),
        )

    def _order(self, sort_by: str | None) -> np.ndarray:
        field, avg, _ = self._sort_field(sort_by)
        if field is None:
            return np.arange(len(self.rows))
        vals = self.rows[field].astype(np.float64)
        if avg:
            vals = vals / np.maximum(self.rows["calls"], 1)
        return np.argsort(-vals, kind="stable")

    def table(
        self,
        sort_by: str | None = None,
        row_limit: int = 100,
        max_name_column_width: int = 55,
        max_src_column_width: int = 75,
        max_shapes_column_width: int = 80,
        header: str | None = None,
        top_level_events_only: bool = False,
        time_unit: str | None = None,
    ) -> str:
        """Render as text, with the columns and sort keys of torch.profiler's table.

        Args:
            sort_by: one of SORT_KEYS (e.g. "self_cpu_time_total", "cuda_time_total",
                "count"). A key without recorded figures (CUDA time without CUDA
                capture, memory without profile_memory) sorts by self CPU time, and a
                footer line says so.
            row_limit: rows to show; -1 or None for all.
            max_name_column_width: names longer than this are cut with "...".
            max_src_column_width: width of the Source Location column (grouped by stack).
            max_shapes_column_width: width of an Input Shapes column; gpuprof records
                no input shapes, so there is none (accepted for torch.profiler code).
            header: a line printed above the table.
            top_level_events_only: show only ops called with no recorded caller (from
                the frames that were running when recording began).
            time_unit: "s", "ms", "us" or "ns" for every time; None picks per figure.

        Raises:
            ValueError: an unknown sort key or time unit, or a width or limit out of range.
        """
        for name, value, lo in (
            ("row_limit", row_limit, -1),
            ("max_name_column_width", max_name_column_width, 4),
            ("max_src_column_width", max_src_column_width, 4),
            ("max_shapes_column_width", max_shapes_column_width, 4),
        ):
            if value is None and name == "row_limit":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"table(): {name} must be an int >= {lo}, got {value!r}")
        if time_unit is not None and time_unit not in TIME_UNITS:
            raise ValueError(
                f"table(): time_unit must be one of {', '.join(TIME_UNITS)} or "
                f"None, got {time_unit!r}"
            )
        if not isinstance(top_level_events_only, bool):
            raise TypeError(
                f"table(): top_level_events_only must be a bool, got {top_level_events_only!r}"
            )
        order = self._order(sort_by)
        if top_level_events_only:
            order = order[self.rows["top_level"][order]]
        if row_limit is not None and row_limit >= 0:
            order = order[:row_limit]
        note = self._sort_field(sort_by)[2]
        return _render(
            self,
            order,
            max_name_column_width,
            max_src_column_width,
            header,
            time_unit,
            note,
            max_shapes_column_width,
        )

    def __str__(self) -> str:
        return self.table(sort_by="self_cpu_time_total")

    def __repr__(self) -> str:
        return f"<KeyAverages: {len(self)} rows; print(prof.key_averages().table()) for the table>"

    def _repr_html_(self) -> str:
        """The table as HTML for notebooks (top 30 rows by self CUDA, else self CPU time)."""
        from .views import Table

        order = self._order("self_cuda_time_total" if self.cuda else "self_cpu_time_total")[:30]
        cols, lines_cells, footer = _cells(self, order, 80, 80, None, None)
        rows = [
            cells[:-1] + [" \u2190 ".join([cells[-1], *more])] if more else cells
            for cells, more in lines_cells
        ]
        align = "".join("l" if a is None else "r" for _, a in cols)
        return Table(
            "gpuprof key averages", [c for c, _ in cols], rows, align, footer=" | ".join(footer)
        )._repr_html_()


def _thread_labels(results: Results) -> list[str]:
    """The name of each row of ``results.threads()``, as ``thread_names()`` has it; a
    name that two threads share gets the thread's row number beside it."""
    names = results.thread_names()
    labels = [
        names.get(int(ident), f"thread {i}") for i, ident in enumerate(results.threads()["ident"])
    ]
    seen: dict[str, int] = {}
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
    return [f"{lab} [{i}]" if seen[lab] > 1 else lab for i, lab in enumerate(labels)]


def _with_extra_fields(rows: np.ndarray, n: int | None = None) -> np.ndarray:
    """``rows`` (ops() fields) copied into the KeyAverages dtype, or n zero rows."""
    names = rows.dtype.names or ()
    dtype = np.dtype(rows.dtype.descr + [f for f in _EXTRA_FIELDS if f[0] not in names])
    out = np.zeros(len(rows) if n is None else n, dtype=dtype)
    if n is None:
        for f in names:
            out[f] = rows[f]
    return out


# Characters that would break a printed table: C0/C1 controls (line breaks,
# terminal escapes, NUL), Unicode line/paragraph separators, and lone
# surrogates (which cannot even be encoded to print them).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def _cut(s: str, width: int) -> str:
    s = _UNPRINTABLE.sub("?", s)
    return s if len(s) <= width else s[: width - 3] + "..."


# one column of the op table: (title, a value per row, the cell of a value)
Column = tuple[str, np.ndarray, Callable[[Any], str]]


def op_columns(ka: KeyAverages, unit: str | None = None) -> list[Column]:
    """The columns of ``ka.table()`` after Name (Source Location aside), in order: one
    ``(title, values, format)`` each, ``values`` a number per row of ``ka.rows``
    and ``format(value)`` its cell. The HTML report builds its op table from these
    too, so both show the same columns and figures."""
    r = ka.rows
    total_self_cpu = float(ka.total_self_cpu_ns)
    total_self_cuda = float(ka.total_self_cuda_ns)
    avg = r["cpu_total_ns"] / np.maximum(r["calls"].astype(np.int64), 1)

    def time(v: float) -> str:
        return format_time(v, unit)

    cols: list[Column] = [
        ("Self CPU %", r["cpu_self_ns"], lambda v: _pct(v, total_self_cpu)),
        ("Self CPU", r["cpu_self_ns"], time),
        ("CPU total %", r["cpu_total_ns"], lambda v: _pct(v, total_self_cpu)),
        ("CPU total", r["cpu_total_ns"], time),
        ("CPU time avg", avg, time),
    ]
    if ka.cuda:
        cuda_avg = r["cuda_total_ns"] / np.maximum(r["calls"].astype(np.int64), 1)
        cols += [
            ("Self CUDA", r["cuda_self_ns"], time),
            ("Self CUDA %", r["cuda_self_ns"], lambda v: _pct(v, total_self_cuda)),
            ("CUDA total", r["cuda_total_ns"], time),
            ("CUDA time avg", cuda_avg, time),
        ]
        if r["bwd_cuda_total_ns"].any():  # docs/backward.md
            cols += [
                ("Bwd CUDA", r["bwd_cuda_total_ns"], time),
                ("Fwd+Bwd CUDA", r["fwd_bwd_cuda_ns"], time),
            ]
    if ka.cpu_memory:
        cols += [
            ("CPU Mem", r["cpu_mem_total_bytes"], format_bytes),
            ("Self CPU Mem", r["cpu_mem_self_bytes"], format_bytes),
        ]
    if ka.cuda_memory:
        cols += [
            ("CUDA Mem", r["cuda_mem_total_bytes"], format_bytes),
            ("Self CUDA Mem", r["cuda_mem_self_bytes"], format_bytes),
        ]
    cols += [("# of Calls", r["calls"], lambda v: str(int(v)))]
    if ka.cuda:
        cols += [("# Kernels", r["kernels"], lambda v: str(int(v)))]
    if r["flops"].any():  # with_flops=True (docs/flops.md)
        cols += _flops_columns(r, ka.cuda)
    return cols


_FLOP_UNITS = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K"), (1.0, ""))


def _flops_columns(r: np.ndarray, cuda: bool) -> list[Column]:
    """torch.profiler's FLOPs column, in the unit its largest figure needs, and with
    CUDA the rate each row's kernels reached: its FLOPs over its CUDA total."""
    top = float(r["flops"].max())
    scale, prefix = next((u for u in _FLOP_UNITS if top >= u[0]), _FLOP_UNITS[-1])
    cols: list[Column] = [
        (
            f"Total {prefix}FLOPs",
            r["flops"] / scale,
            lambda v: f"{v:.3f}" if v else "--",
        )
    ]
    if cuda:
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where(
                (r["flops"] > 0) & (r["cuda_total_ns"] > 0),
                r["flops"] / np.maximum(r["cuda_total_ns"], 1) / 1e3,
                0.0,
            )
        cols += [("TFLOPS", rate, lambda v: f"{v:.1f}" if v else "--")]
        if np.isfinite(r["peak_tflops"]).any():
            with np.errstate(divide="ignore", invalid="ignore"):
                share = np.where(np.isfinite(r["peak_tflops"]), rate / r["peak_tflops"], 0.0)
            cols += [("MFU", share, _mfu_cell)]
    return cols


def _mfu_cell(v: float) -> str:
    # above 100% is a counting error (docs/flops.md): shown, and marked
    return f"{100 * v:.1f}%" + ("!" if v > 1 else "") if v else "--"


def _cells(
    ka: KeyAverages,
    order: Sequence[int] | np.ndarray,
    name_w: int,
    src_w: int,
    unit: str | None,
    note: str | None,
    shapes_w: int = 80,
) -> tuple[list[tuple[str, str | None]], list[tuple[list[str], list[str]]], list[str]]:
    """Columns (title, alignment), rows (cells, further stack frames) and footer lines."""
    total_self_cpu = float(ka.total_self_cpu_ns)
    total_self_cuda = float(ka.total_self_cuda_ns)
    numeric = op_columns(ka, unit)
    cols: list[tuple[str, str | None]] = [("Name", None)]
    if ka.group_by_thread:
        cols += [("Thread", None)]
    cols += [(title, "r") for title, _, _ in numeric]
    if ka.group_by_input_shape:
        cols += [("Input Shapes", None)]
    if ka.stacks is not None:
        cols += [("Source Location", None)]
    lines_cells = []
    for i in order:
        cells = [_cut(ka.display[i], name_w)]
        if ka.group_by_thread:
            cells += [_cut(ka.thread_names[ka.rows["thread"][i]], name_w)]
        cells += [fmt(values[i]) for _, values, fmt in numeric]
        if ka.group_by_input_shape:
            cells += [_cut(ka.rows["input_shapes"][i], shapes_w)]
        if ka.stacks is not None:
            stack = ka.stacks[i]
            cells += [_cut(stack[0] if stack else "", src_w)]
        lines_cells.append((cells, ka.stacks[i][1:] if ka.stacks is not None else []))
    footer = [f"Self CPU time total: {format_time(total_self_cpu, unit)}"]
    if ka.cuda:
        footer.append(f"Self CUDA time total: {format_time(total_self_cuda, unit)}")
    if ka.context_rows and not ka.include_context:
        n = ka.context_rows
        footer.append(
            f"Not shown: {n} frame{'s' if n != 1 else ''} already running when "
            f"recording began ({format_time(ka.context_self_ns, unit)} self CPU); "
            f"key_averages(include_context=True) shows them"
        )
    if ka.idle_self_ns:
        footer.append(ka.idle_note(unit) or "")
    if note:
        footer.append(note)
    footer += _footer(ka._results)
    return cols, lines_cells, footer


def _render(
    ka: KeyAverages,
    order: Sequence[int] | np.ndarray,
    name_w: int,
    src_w: int,
    header: str | None,
    unit: str | None = None,
    note: str | None = None,
    shapes_w: int = 80,
) -> str:
    cols, lines_cells, footer = _cells(ka, order, name_w, src_w, unit, note, shapes_w)
    widths = [len(c[0]) for c in cols]
    for cells, more in lines_cells:
        for j, c in enumerate(cells):
            widths[j] = max(widths[j], len(c))
        for frame in more:  # continuation lines of the Source Location column
            widths[-1] = max(widths[-1], len(_cut(frame, src_w)))

    def fmt(cells: list[str]) -> str:
        parts = []
        for j, c in enumerate(cells):
            parts.append(c.ljust(widths[j]) if cols[j][1] is None else c.rjust(widths[j]))
        return "  ".join(parts).rstrip()

    sep = "-" * len(fmt(["" for _ in cols]).ljust(sum(widths) + 2 * (len(cols) - 1)))
    out = []
    if header:
        out.append(header)
    out += [sep, fmt([c[0] for c in cols]), sep]
    for cells, more in lines_cells:
        out.append(fmt(cells))
        for frame in more:  # further stack frames under Source Location
            blank = ["" for _ in cols]
            blank[-1] = _cut(frame, src_w)
            out.append(fmt(blank))
    out.append(sep)
    out += footer
    return "\n".join(out) + "\n"


def _joined_line(joined: dict[str, Any]) -> str:
    """The footer's line on the backward pass joined to the forward."""
    share = joined["joined_ns"] / joined["node_ns"]
    line = (
        f"Backward joined to the forward: {100 * share:.1f}% of backward GPU time "
        "(Bwd CUDA, Fwd+Bwd CUDA columns)"
    )
    rest = joined["unjoined_ns"]
    if rest:
        parts = [f"{name} {100 * ns / joined['node_ns']:.1f}%" for name, ns in rest.items()]
        line += "; not joined: " + ", ".join(parts[:3]) + (", ..." if len(parts) > 3 else "")
    return line


def _aten_line(aten: dict[str, Any]) -> str:
    """The footer's line on the ATen op ranges and, with reuse_shapes, on which steps
    carry the input shapes (csrc/aggregate/shapes.c)."""
    if not aten["on"]:
        return f"ATen ops: off ({aten['reason'] or 'no window recorded'})"
    if aten["wanted"] != "shapes":
        return "ATen ops: on"
    line = "ATen ops: on, with input shapes"
    sh = aten.get("shapes")
    if not sh or not sh["reuse"] or not (sh["reused"] or sh["unmatched"]):
        return line
    line += (
        f" (recorded on {sh['sampled']} step{'s' * (sh['sampled'] != 1)}, given to "
        f"{sh['reused']} that ran the same launches"
    )
    if sh["unmatched"]:
        line += (
            f"; {sh['unmatched']} ran other launches and show no shapes: "
            "reuse_shapes=False records them on every step"
        )
    return line + ")"


def _footer(res: Results) -> list[str]:
    lines = []
    mode = res.cuda.get("mode", "off")
    if res.cuda.get("active"):
        frac = res.attributed_gpu_fraction
        line = f"CUDA capture: {mode}; {100 * frac:.1f}% of GPU time attributed to a Python op"
        if frac < 1.0:
            gpu_ns = sum(w["attributed_gpu_ns"] + w["unattributed_gpu_ns"] for w in res.windows)
            before = res.launched_before_window_ns / max(gpu_ns, 1)
            if before >= 0.0005:
                line += f"; {100 * before:.1f}% was launched before recording began"
        lines.append(line)
        nodes = res.cuda.get("autograd_nodes")  # docs/backward.md
        if nodes is not None:
            lines.append(
                "Autograd nodes: on (backward kernels charged to their node)"
                if nodes["on"] and not nodes["reason"]
                else f"Autograd nodes: {'on, ' if nodes['on'] else 'off '}({nodes['reason']})"
            )
        aten = res.cuda.get("aten_ops")  # docs/aten.md
        if aten is not None:
            lines.append(_aten_line(aten))
        joined = res.backward_summary()
        if joined["node_ns"]:
            lines.append(_joined_line(joined))
    elif res.cuda.get("error"):
        lines.append(f"CUDA capture: off ({res.cuda['error']})")
    else:
        lines.append("CUDA capture: off")
    if res.dropped_events:
        lines.append(
            f"WARNING: {res.dropped_events} events dropped (event buffer full); "
            f"pass a larger max_events to gpuprof.profile()"
        )
    if res.dropped_gpu_records:
        lines.append(f"WARNING: {res.dropped_gpu_records} GPU records dropped by CUPTI")
    if os.environ.get("GPUPROF_TABLE_WINDOWS") and len(res.windows) > 1:
        lines.append(f"Accumulated windows: {len(res.windows)}")
    return lines
