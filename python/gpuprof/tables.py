"""torch.profiler-style tables over the ops array: ``prof.key_averages().table()``.

Every number in a table comes from a field of ``prof.ops()`` (or of the call
tree when grouped by stack): Self CPU is ``cpu_self_ns``, CPU total is
``cpu_total_ns``, Self CUDA is ``cuda_self_ns`` (GPU time of kernels
launched while the op was innermost), CUDA total is ``cuda_total_ns``.
"""

from __future__ import annotations

import os
import re

import numpy as np

from ._results import Results, _display_name

__all__ = ["KeyAverages", "SORT_KEYS", "format_time", "format_bytes"]

# sort key -> (field, per-call average?)
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
    "cuda_memory_usage": ("cuda_mem_self_bytes", False),
    "self_device_memory_usage": ("cuda_mem_self_bytes", False),
    "device_memory_usage": ("cuda_mem_self_bytes", False),
    "self_cpu_memory_usage": ("cpu_mem_self_bytes", False),
    "cpu_memory_usage": ("cpu_mem_self_bytes", False),
    "kernels": ("kernels", False),
}


def format_time(ns: float) -> str:
    """Nanoseconds as torch.profiler prints durations: us, ms or s with 3 decimals."""
    us = ns / 1e3
    if abs(us) >= 1e6:
        return f"{us / 1e6:.3f}s"
    if abs(us) >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def format_bytes(n: float) -> str:
    for unit, scale in (("Gb", 1 << 30), ("Mb", 1 << 20), ("Kb", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} b"


def _pct(x: float, total: float) -> str:
    return f"{100.0 * x / total:.2f}%" if total else "0.00%"


class KeyAverages:
    """Op statistics averaged by key, printable as a table.

    Rows are a structured array (``.rows``) with the ops() fields plus
    ``display`` (the name shown) and, when grouped by stack, ``stack``.
    """

    def __init__(self, results: Results, group_by_stack_n: int = 0, show_memory: bool = False):
        if isinstance(group_by_stack_n, bool) or not isinstance(group_by_stack_n, int) \
                or group_by_stack_n < 0:
            raise ValueError(f"key_averages(): group_by_stack_n must be an int >= 0, "
                             f"got {group_by_stack_n!r}")
        self._results = results
        self.group_by_stack_n = group_by_stack_n
        self.show_memory = show_memory
        ops = results.ops()
        self.cuda = bool(results.cuda.get("active")) or bool((ops["cuda_total_ns"] != 0).any())
        if group_by_stack_n:
            self.rows, self.stacks = self._by_stack(group_by_stack_n)
        else:
            self.rows, self.stacks = ops, None
        self.display = [_display_name(n, f, ln, k) for n, f, ln, k in
                        zip(self.rows["name"], self.rows["file"], self.rows["line"],
                            self.rows["kind"])]

    def _by_stack(self, n: int):
        """Group call-tree nodes by (op, nearest n Python callers)."""
        tree = self._results.call_tree()
        ops = self._results.ops()
        parent = tree["parent"]
        op_of = tree["op"]
        groups: dict[tuple, dict] = {}
        for i in range(len(tree)):
            stack = []
            p = parent[i]
            while p >= 0 and len(stack) < n:
                if ops["kind"][op_of[p]] == "python":
                    stack.append(int(op_of[p]))
                p = parent[p]
            key = (int(op_of[i]), tuple(stack))
            g = groups.setdefault(key, {"calls": 0, "cpu_total_ns": 0, "cpu_self_ns": 0,
                                        "cuda_total_ns": 0, "cuda_self_ns": 0})
            g["calls"] += int(tree["calls"][i])
            g["cpu_total_ns"] += int(tree["total_ns"][i])
            g["cpu_self_ns"] += int(tree["self_ns"][i])
            g["cuda_total_ns"] += int(tree["cuda_total_ns"][i])
            g["cuda_self_ns"] += int(tree["cuda_self_ns"][i])
        rows = np.zeros(len(groups), dtype=ops.dtype)
        stacks = []
        for j, ((op, stack), g) in enumerate(groups.items()):
            rows[j] = ops[op]
            for f, v in g.items():
                rows[f][j] = v
            stacks.append([_display_name(ops["name"][s], ops["file"][s], ops["line"][s], "python")
                           for s in stack])
        return rows, stacks

    def __len__(self) -> int:
        return len(self.rows)

    def _order(self, sort_by: str | None) -> np.ndarray:
        if sort_by is None:
            return np.arange(len(self.rows))
        if sort_by not in SORT_KEYS:
            raise ValueError(f"table(): unknown sort_by {sort_by!r}; valid keys: "
                             + ", ".join(sorted(SORT_KEYS)))
        field, avg = SORT_KEYS[sort_by]
        vals = self.rows[field].astype(np.float64)
        if avg:
            vals = vals / np.maximum(self.rows["calls"], 1)
        return np.argsort(-vals, kind="stable")

    def table(self, sort_by: str | None = None, row_limit: int = 100,
              max_name_column_width: int = 55, max_src_column_width: int = 75,
              header: str | None = None, top_level_events_only: bool = False) -> str:
        """Render as text, with the columns and sort keys of torch.profiler's table.

        Args:
            sort_by: one of SORT_KEYS (e.g. "self_cpu_time_total", "cuda_time_total", "count").
            row_limit: rows to show; -1 or None for all.
            max_name_column_width: names longer than this are cut with "...".
            max_src_column_width: width of the Source Location column (grouped by stack).
            header: a line printed above the table.
            top_level_events_only: show only ops that have no profiled caller.
        """
        for name, value, lo in (("row_limit", row_limit, -1),
                                ("max_name_column_width", max_name_column_width, 4),
                                ("max_src_column_width", max_src_column_width, 4)):
            if value is None and name == "row_limit":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"table(): {name} must be an int >= {lo}, got {value!r}")
        order = self._order(sort_by)
        if top_level_events_only:
            roots = self._root_ops()
            order = np.array([i for i in order if i in roots], dtype=np.int64)
        if row_limit is not None and row_limit >= 0:
            order = order[:row_limit]
        return _render(self, order, max_name_column_width, max_src_column_width, header)

    def _root_ops(self) -> set[int]:
        tree = self._results.call_tree()
        return {int(o) for o, p in zip(tree["op"], tree["parent"]) if p < 0}

    def __str__(self) -> str:
        return self.table(sort_by="self_cpu_time_total")

    def _repr_html_(self) -> str:
        """The table as HTML for notebooks (top 30 rows by self CUDA, else self CPU time)."""
        from .views import Table

        order = self._order("self_cuda_time_total" if self.cuda else "self_cpu_time_total")[:30]
        cols, lines_cells, footer = _cells(self, order, 80, 80)
        rows = [cells[:-1] + [" \u2190 ".join([cells[-1], *more])] if more else cells
                for cells, more in lines_cells]
        align = "".join("l" if a is None else "r" for _, a in cols)
        return Table("gpuprof key averages", [c for c, _ in cols], rows, align,
                     footer=" | ".join(footer))._repr_html_()


# Characters that would break a printed table: C0/C1 controls (line breaks,
# terminal escapes, NUL), Unicode line/paragraph separators, and lone
# surrogates (which cannot even be encoded to print them).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def _cut(s: str, width: int) -> str:
    s = _UNPRINTABLE.sub("?", s)
    return s if len(s) <= width else s[: width - 3] + "..."


def _cells(ka: KeyAverages, order, name_w: int, src_w: int):
    """Columns (title, alignment), rows (cells, further stack frames) and footer lines."""
    r = ka.rows
    total_self_cpu = float(r["cpu_self_ns"].sum())
    total_self_cuda = float(r["cuda_self_ns"].sum())
    cols = [("Name", None), ("Self CPU %", "r"), ("Self CPU", "r"), ("CPU total %", "r"),
            ("CPU total", "r"), ("CPU time avg", "r")]
    if ka.cuda:
        cols += [("Self CUDA", "r"), ("Self CUDA %", "r"), ("CUDA total", "r"),
                 ("CUDA time avg", "r")]
    if ka.show_memory:
        cols += [("Self CPU Mem", "r")]
        if ka.cuda:
            cols += [("Self CUDA Mem", "r")]
    cols += [("# of Calls", "r")]
    if ka.cuda:
        cols += [("# Kernels", "r")]
    if ka.stacks is not None:
        cols += [("Source Location", None)]
    lines_cells = []
    for i in order:
        calls = int(r["calls"][i])
        avg_div = max(calls, 1)
        cells = [_cut(ka.display[i], name_w),
                 _pct(r["cpu_self_ns"][i], total_self_cpu), format_time(r["cpu_self_ns"][i]),
                 _pct(r["cpu_total_ns"][i], total_self_cpu), format_time(r["cpu_total_ns"][i]),
                 format_time(r["cpu_total_ns"][i] / avg_div)]
        if ka.cuda:
            cells += [format_time(r["cuda_self_ns"][i]),
                      _pct(r["cuda_self_ns"][i], total_self_cuda),
                      format_time(r["cuda_total_ns"][i]),
                      format_time(r["cuda_total_ns"][i] / avg_div)]
        if ka.show_memory:
            cells += [format_bytes(r["cpu_mem_self_bytes"][i])]
            if ka.cuda:
                cells += [format_bytes(r["cuda_mem_self_bytes"][i])]
        cells += [str(calls)]
        if ka.cuda:
            cells += [str(int(r["kernels"][i]))]
        if ka.stacks is not None:
            stack = ka.stacks[i]
            cells += [_cut(stack[0] if stack else "", src_w)]
        lines_cells.append((cells, ka.stacks[i][1:] if ka.stacks is not None else []))
    footer = [f"Self CPU time total: {format_time(total_self_cpu)}"]
    if ka.cuda:
        footer.append(f"Self CUDA time total: {format_time(total_self_cuda)}")
    footer += _footer(ka._results)
    return cols, lines_cells, footer


def _render(ka: KeyAverages, order, name_w: int, src_w: int, header: str | None) -> str:
    cols, lines_cells, footer = _cells(ka, order, name_w, src_w)
    widths = [len(c[0]) for c in cols]
    for cells, more in lines_cells:
        for j, c in enumerate(cells):
            widths[j] = max(widths[j], len(c))
        for frame in more:  # continuation lines of the Source Location column
            widths[-1] = max(widths[-1], len(_cut(frame, src_w)))

    def fmt(cells):
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


def _footer(res: Results) -> list[str]:
    lines = []
    mode = res.cuda.get("mode", "off")
    if res.cuda.get("active"):
        frac = res.attributed_gpu_fraction
        lines.append(f"CUDA capture: {mode}; {100 * frac:.1f}% of GPU time attributed to a "
                     f"Python op")
    elif res.cuda.get("error"):
        lines.append(f"CUDA capture: off ({res.cuda['error']})")
    if res.dropped_events:
        lines.append(f"WARNING: {res.dropped_events} events dropped (event buffer full); "
                     f"pass a larger max_events to gpuprof.profile()")
    if res.dropped_gpu_records:
        lines.append(f"WARNING: {res.dropped_gpu_records} GPU records dropped by CUPTI")
    if os.environ.get("GPUPROF_TABLE_WINDOWS") and len(res.windows) > 1:
        lines.append(f"Accumulated windows: {len(res.windows)}")
    return lines
