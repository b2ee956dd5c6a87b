"""Printable views for terminals and notebooks: kernel, step and module tables, step plot.

``prof.kernel_table()``, ``prof.step_table()`` and ``prof.module_table()`` return :class:`Table`
objects: ``print()`` gives aligned text, and in Jupyter they render as HTML
tables. ``prof.plot_steps()`` draws a stacked bar per step with matplotlib.
"""

from __future__ import annotations

import html

import numpy as np

from ..core._format import format_time

__all__ = ["Table", "kernel_table", "module_table", "plot_steps", "step_table"]


class Table:
    """Rows of strings under headers; text with ``str()``, HTML with ``_repr_html_()``."""

    def __init__(
        self,
        title: str,
        headers: list[str],
        rows: list[list[str]],
        align: str | None = None,
        footer: str = "",
    ):
        self.title = title
        self.headers = headers
        self.rows = rows
        self.align = align or ("l" + "r" * (len(headers) - 1))
        self.footer = footer

    def __len__(self) -> int:
        return len(self.rows)

    def __str__(self) -> str:
        widths = [len(h) for h in self.headers]
        for r in self.rows:
            widths = [max(w, len(c)) for w, c in zip(widths, r)]

        def line(cells):
            return "  ".join(
                c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, self.align)
            ).rstrip()

        sep = "-" * (sum(widths) + 2 * (len(widths) - 1))
        out = [self.title, sep, line(self.headers), sep] + [line(r) for r in self.rows] + [sep]
        if self.footer:
            out.append(self.footer)
        return "\n".join(out) + "\n"

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(
            f"<th style='text-align:{'left' if a == 'l' else 'right'}'>{esc(h)}</th>"
            for h, a in zip(self.headers, self.align)
        )
        body = "".join(
            "<tr>"
            + "".join(
                f"<td style='text-align:{'left' if a == 'l' else 'right'}'>{esc(c)}</td>"
                for c, a in zip(r, self.align)
            )
            + "</tr>"
            for r in self.rows
        )
        foot = f"<p>{esc(self.footer)}</p>" if self.footer else ""
        return (
            f"<div><b>{esc(self.title)}</b><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>{foot}</div>"
        )


def kernel_table(
    kernels: np.ndarray, sort_by: str = "total_ns", row_limit: int = 20, max_name_width: int = 70
) -> Table:
    """The GPU activities with the most time first (fields of ``prof.kernels()``)."""
    if sort_by not in ("total_ns", "calls", "max_ns", "min_ns", "bytes"):
        raise ValueError(
            f"kernel_table(): sort_by must be one of total_ns, calls, max_ns, "
            f"min_ns, bytes; got {sort_by!r}"
        )
    if isinstance(row_limit, bool) or not isinstance(row_limit, int) or row_limit < -1:
        raise ValueError(f"kernel_table(): row_limit must be an int >= -1, got {row_limit!r}")
    order = np.argsort(-kernels[sort_by].astype(np.float64), kind="stable")
    if row_limit >= 0:
        order = order[:row_limit]
    total = max(int(kernels["total_ns"].sum()), 1)
    has_occ = "occupancy" in (kernels.dtype.names or ())
    headers = [
        "Kernel",
        "Device",
        "Calls",
        "Total",
        "%",
        "Avg",
        "Max",
        "Grid",
        "Block",
        "Regs",
        "Category",
    ] + (["Occupancy"] if has_occ else [])
    rows = []
    for i in order:
        k = kernels[i]
        name = str(k["name"])
        name = name if len(name) <= max_name_width else name[: max_name_width - 3] + "..."
        row = [
            name,
            str(k["device"]),
            str(k["calls"]),
            format_time(k["total_ns"]),
            f"{100 * k['total_ns'] / total:.1f}%",
            format_time(k["total_ns"] / max(int(k["calls"]), 1)),
            format_time(k["max_ns"]),
            "x".join(str(int(v)) for v in k["grid"]),
            "x".join(str(int(v)) for v in k["block"]),
            str(k["registers"]),
            str(k["category"]),
        ]
        if has_occ:
            occ = float(k["occupancy"])
            row.append(
                "-"
                if occ != occ
                # NaN: copies, memsets, unknown device
                else f"{100 * occ:.0f}% ({k['occupancy_limiter']})"
            )
        rows.append(row)
    align = "lrrrrrrrrrl" + ("r" if has_occ else "")
    return Table(
        "GPU activity by name",
        headers,
        rows,
        align,
        footer=f"Total GPU time: {format_time(total)} in {int(kernels['calls'].sum())} activities",
    )


def step_table(steps: np.ndarray) -> Table:
    """One line per recorded step (fields of ``prof.steps()``)."""
    headers = [
        "Step",
        "Wall",
        "GPU busy",
        "GPU idle",
        "Busy %",
        "Memcpy",
        "Comm",
        "Sync wait",
        "Kernels",
    ]
    rows = []
    for s in steps:
        wall = max(int(s["cpu_ns"]), 1)
        rows.append(
            [
                str(s["step"]),
                format_time(s["cpu_ns"]),
                format_time(s["gpu_busy_ns"]),
                format_time(s["gpu_idle_ns"]),
                f"{100 * s['gpu_busy_ns'] / wall:.1f}%",
                format_time(s["memcpy_ns"]),
                format_time(s["comm_ns"]),
                format_time(s["sync_wait_ns"]),
                str(s["kernels"]),
            ]
        )
    mean = float(steps["cpu_ns"].mean()) if len(steps) else 0.0
    return Table(
        "Steps",
        headers,
        rows,
        "r" * len(headers),
        footer=f"{len(steps)} steps, mean {format_time(mean)}",
    )


def module_table(
    modules: np.ndarray,
    total_gpu_ns: int,
    max_depth: int | None = None,
    row_limit: int | None = None,
    min_share: float = 0.0,
) -> Table:
    """One line per ``torch.nn.Module`` instance (fields of ``prof.modules()``), nested
    as the model is: its calls, forward CPU time, forward and backward GPU time and
    their share of the window's GPU work. ``max_depth`` leaves out deeper modules,
    ``min_share`` those below that share of the GPU work; ``row_limit`` cuts the list.
    The footer puts what ran outside every module (optimizer, loss) beside it, so that
    the top modules and it add up to the window's GPU work."""
    gpu = total_gpu_ns > 0  # a CPU program: no GPU columns
    headers = ["Module", "Class", "Calls", "CPU total"]
    if gpu:
        headers += ["Fwd CUDA", "Bwd CUDA", "Kernels", "% of GPU"]
    # record_shapes=True: FLOPs, forward and backward, and MFU over their GPU time
    flops = gpu and "flops" in (modules.dtype.names or ()) and bool(modules["flops"].any())
    mfu = flops and bool(np.isfinite(modules["mfu"]).any())
    if flops:
        headers += ["GFLOPs"] + (["MFU"] if mfu else [])
    rows = []
    for m in modules:
        if max_depth is not None and int(m["depth"]) > max_depth:
            continue
        if total_gpu_ns and float(m["share"]) < min_share:  # (no GPU work: no shares)
            continue
        cells = [
            "  " * int(m["depth"]) + str(m["name"]),
            str(m["cls"]),
            str(int(m["calls"])),
            format_time(m["cpu_total_ns"]),
        ]
        if gpu:
            cells += [
                format_time(m["cuda_fwd_ns"]),
                format_time(m["cuda_bwd_ns"]),
                str(int(m["kernels"])),
                f"{100 * float(m['share']):.1f}%",
            ]
        if flops:
            cells.append(f"{int(m['flops']) / 1e9:.3f}" if m["flops"] else "--")
        if mfu:
            cells.append(f"{100 * float(m['mfu']):.1f}%" if np.isfinite(m["mfu"]) else "--")
        rows.append(cells)
        if row_limit is not None and len(rows) >= row_limit:
            break
    top = modules[modules["parent"] < 0] if len(modules) else modules
    inside = int(top["cuda_fwd_ns"].sum() + top["cuda_bwd_ns"].sum()) if len(top) else 0
    outside = max(int(total_gpu_ns) - inside, 0)
    footer = (
        f"GPU work {format_time(total_gpu_ns)}: in modules {format_time(inside)}, "
        f"outside every module (optimizer, loss, ...) {format_time(outside)}"
        if gpu
        else "No GPU work recorded: forward CPU time per module"
    )
    return Table("Modules", headers, rows, "ll" + "r" * (len(headers) - 2), footer=footer)


def plot_steps(steps: np.ndarray, path_or_ax=None):
    """Stacked bars per step: compute, memcpy, communication, sync wait, idle (ms).

    Returns the matplotlib Figure (or the Axes' figure); saves to a path if given.
    """
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("plot_steps() needs matplotlib: pip install matplotlib") from e
    if isinstance(path_or_ax, str) or path_or_ax is None:
        fig, ax = plt.subplots(figsize=(8, 3.5))
    else:
        ax = path_or_ax
        fig = ax.figure
    x = np.arange(len(steps))
    ms = 1e-6
    busy = steps["gpu_busy_ns"] * ms
    copy = np.minimum(steps["memcpy_ns"] * ms, busy)
    comm = np.minimum(steps["comm_ns"] * ms, busy - copy)
    compute = busy - copy - comm
    sync = np.minimum(steps["sync_wait_ns"] * ms, steps["gpu_idle_ns"] * ms)
    idle = steps["gpu_idle_ns"] * ms - sync
    bottom = np.zeros(len(steps))
    for values, label in (
        (compute, "GPU compute"),
        (copy, "memcpy"),
        (comm, "communication"),
        (sync, "host waits on GPU"),
        (idle, "GPU idle"),
    ):
        ax.bar(x, values, bottom=bottom, label=label)
        bottom = bottom + values
    ax.set_xticks(x, [str(s) for s in steps["step"]])
    ax.set_xlabel("step")
    ax.set_ylabel("ms")
    ax.legend(fontsize="small")
    if isinstance(path_or_ax, str):
        fig.savefig(path_or_ax, bbox_inches="tight")
    return fig
