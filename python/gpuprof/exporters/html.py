"""One self-contained HTML page per profile: ``prof.export_html("report.html")``.

The page holds everything it shows: the figures as one JSON document and the
scripts and styles that draw them (``html_assets/``, inlined), so it opens
from disk, can be mailed, and fetches nothing: a Content-Security-Policy
forbids the page any network access. Only the "Open in Perfetto" button
reaches the network, when clicked, by opening https://ui.perfetto.dev in a new
tab and handing it the trace file the user picks (Perfetto's postMessage
protocol).

Every figure on the page comes from the arrays and analyses that the text
reports print: ``key_averages()`` (op table), :func:`gpuprof.views.kernel_table`
(kernel table), :func:`gpuprof.diagnose.diagnose` (findings),
:func:`gpuprof.diagnose.step_breakdown` (step bars), ``call_tree()`` (flame
graph), :mod:`gpuprof.memory` (curves and peaks),
:func:`gpuprof.distributed.comm_overlap` (per-rank section) and
``processes()`` (per-process section). See docs/report.md.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
from importlib import resources
from typing import Any

import numpy as np

from ..core._paths import source_location
from ..core._steps import startup_note
from ..results._results import Results, display_name
from ..results.tables import KeyAverages, format_time, op_columns
from .chrome import _thread_names, atomic_output, check_output_path, program_name

__all__ = ["export_compare_html", "export_html", "report_data", "compare_data"]

# Call paths below this share of the window's time (in both CPU and CUDA time)
# are left out of the flame graph: at full width they are under a pixel even
# zoomed in 100x, and a long run has tens of thousands of them.
FLAME_MIN_SHARE = 1e-4
# Memory curves are cut to about this many points (each bucket keeps its lowest
# and highest point, so peaks survive).
CURVE_POINTS = 2000
# Steps drawn (and listed in the step table) at most: past it, the fastest and the
# slowest step of each stretch of consecutive steps (a browser draws 100,000 bars slowly,
# and the page would grow with the steps)
STEP_BARS = 2000
_ASSETS = "html_assets"


# ---- the page --------------------------------------------------------------------------------


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(_ASSETS).joinpath(name).read_text(encoding="utf-8")


# Inside <script>, "</script" or "<!--" would end or change the element; JSON escapes
# for <, > and & keep any string (an op named "</script>") inert.
_SCRIPT_UNSAFE = re.compile(r"[<>&\u2028\u2029]")


def _json_for_script(data) -> str:
    text = json.dumps(
        data, ensure_ascii=True, separators=(",", ":"), allow_nan=False, default=_json_default
    )
    return _SCRIPT_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, set):
        return sorted(o)
    return str(o)


def _page(data: dict) -> str:
    import html

    title = html.escape(data["title"])
    # The page may not fetch anything: scripts and styles are inline, images are data:
    csp = (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'<meta name="generator" content="gpuprof {html.escape(data["version"])}">\n'
        f"<title>{title}</title>\n<style>\n{_asset('report.css')}</style>\n</head>\n<body>\n"
        "<noscript>This report draws its tables and charts with JavaScript; allow scripts "
        'for this file to see them.</noscript>\n<div id="app"></div>\n'
        f'<script type="application/json" id="gpuprof-data">{_json_for_script(data)}'
        "</script>\n"
        f"<script>\n{_asset('report.js')}</script>\n</body>\n</html>\n"
    )


def _write(page: str, path, func: str) -> str:
    path = check_output_path(path, func)
    with atomic_output(path, func) as tmp:
        with open(tmp, "w", encoding="utf-8", errors="surrogatepass", newline="\n") as f:
            f.write(page)
    return path


def _check_title(title, func: str) -> None:
    if title is not None and not isinstance(title, str):
        raise TypeError(f"{func}(): title must be a str or None, got {type(title).__name__}")


# ---- tables ----------------------------------------------------------------------------------


def _table(columns, rows, keys, default_sort: int | None, tips=None) -> dict:
    """A sortable table: ``columns`` (title, "l"/"r"), display strings per row, sort keys
    per row (numbers; None for text columns, which sort by their string), the column
    sorted by at first (None: the rows' own order)."""
    return {
        "columns": [{"title": t, "align": a} for t, a in columns],
        "rows": rows,
        "keys": keys,
        "sort": default_sort,
        "tips": tips,
    }


def _pct(x: float, total: float) -> str:
    return f"{100.0 * x / total:.2f}%" if total else "0.00%"


def op_table(ka: KeyAverages) -> dict:
    """Every row of ``ka`` with the columns of ``ka.table()``, sortable."""
    r = ka.rows
    # (title, values for sorting, display strings): the text table's own columns
    cols = [(title, values, [fmt(v) for v in values]) for title, values, fmt in op_columns(ka)]
    columns = [("Name", "l")] + [(c[0], "r") for c in cols]
    rows, keys, tips = [], [], []
    sort_values = [np.asarray(c[1], dtype=np.float64).tolist() for c in cols]
    for i in range(len(r)):
        rows.append([str(ka.display[i])] + [c[2][i] for c in cols])
        keys.append([None] + [v[i] for v in sort_values])
        kind = str(r["kind"][i])
        where = source_location(str(r["file"][i]), int(r["line"][i])) if kind == "python" else ""
        tips.append(f"{r['name'][i]} ({kind}){' at ' + where if where else ''}")
    default = [c[0] for c in columns].index("Self CUDA" if ka.cuda else "Self CPU")
    return _table(columns, rows, keys, default, tips) | {"idle": ka.idle_note()}


def _kernel_table(kernels: np.ndarray) -> dict:
    """The rows of :func:`gpuprof.views.kernel_table`, every one, sortable."""
    from ..results.views import kernel_table

    t = kernel_table(kernels, row_limit=-1, max_name_width=1 << 30)
    order = np.argsort(-kernels["total_ns"].astype(np.float64), kind="stable")
    keys = []
    for i in order:
        k = kernels[i]
        calls = max(int(k["calls"]), 1)
        occ = float(k["occupancy"]) if "occupancy" in kernels.dtype.names else math.nan
        row = [
            None,
            int(k["device"]),
            int(k["calls"]),
            int(k["total_ns"]),
            int(k["total_ns"]),
            k["total_ns"] / calls,
            int(k["max_ns"]),
            int(np.prod(k["grid"].astype(np.int64))),
            int(np.prod(k["block"].astype(np.int64))),
            int(k["registers"]),
            None,
        ]
        if len(t.headers) > len(row):
            row.append(-1.0 if occ != occ else occ)
        keys.append(row)
    columns = list(zip(t.headers, t.align))
    return _table(columns, t.rows, keys, 3, [str(kernels["name"][i]) for i in order]) | {
        "footer": t.footer
    }


def _step_table(steps: np.ndarray) -> dict:
    from ..results.views import step_table

    t = step_table(steps)
    f = (
        "step",
        "cpu_ns",
        "gpu_busy_ns",
        "gpu_idle_ns",
        None,
        "memcpy_ns",
        "comm_ns",
        "sync_wait_ns",
        "kernels",
    )
    keys = []
    for s in steps:
        busy = float(s["gpu_busy_ns"]) / max(int(s["cpu_ns"]), 1)
        keys.append([busy if name is None else int(s[name]) for name in f])
    return _table(list(zip(t.headers, t.align)), t.rows, keys, 0) | {"footer": t.footer}


# ---- sections ------------------------------------------------------------------------------


def _summary(results: Results, title: str | None) -> dict:
    meta = results.meta
    start, end = results.window_bounds()
    steps = results.steps()
    cuda = results.cuda or {}
    warnings = []
    if results.dropped_events:
        warnings.append(
            f"{results.dropped_events} events dropped (event buffer full): pass a "
            "larger max_events to gpuprof.profile()"
        )
    if results.dropped_gpu_records:
        warnings.append(f"{results.dropped_gpu_records} GPU records dropped by CUPTI")
    if cuda.get("active"):
        capture = (
            f"{cuda.get('mode', 'on')}; {100 * results.attributed_gpu_fraction:.1f}% of "
            "GPU time attributed to a Python op"
        )
    else:
        capture = f"off ({cuda['error']})" if cuda.get("error") else "off"
    program = str(meta.process_name or program_name())
    notes = []
    startup = meta.trace_metadata.get("gpuprof_startup")  # run's default
    if startup:
        note = startup_note(json.loads(startup))
        if note:
            notes.append(note[0].upper() + note[1:] + ".")
    return {
        "title": title or f"gpuprof report: {program}",
        "program": program,
        "pid": int(os.getpid() if meta.pid is None else meta.pid),
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "windows": len(results.windows),
        "window_ns": int(end - start),
        "steps": len(steps),
        "step_ns_mean": float(steps["cpu_ns"].mean()) if len(steps) else 0.0,
        "cuda_capture": capture,
        "warnings": warnings,
        "notes": notes,
    }


def _diagnosis(results: Results) -> dict:
    from ..analysis.diagnose import diagnose
    from ..results._findings import _fmt

    d = diagnose(results)
    out = d.to_dict()
    for f, fd in zip(d, out["findings"]):
        fd["evidence_text"] = [[k, _fmt(k, v)] for k, v in f.evidence.items()]
    out["text"] = str(d)
    return out


def _steps(results: Results) -> dict:
    from ..analysis.diagnose import step_breakdown

    b = step_breakdown(results)
    windows = []
    for wi, raw in enumerate(results.windows):
        rows = b[b["window"] == wi]
        windows.append(
            {
                "start_ns": int(raw["window_start_ns"]),
                "end_ns": int(raw["window_end_ns"]),
                "first_step": int(rows["step"].min()) if len(rows) else None,
                "last_step": int(rows["step"].max()) if len(rows) else None,
                "steps_ns": int(rows["step_ns"].sum()),
            }
        )
    fields = (
        "step",
        "window",
        "start_ns",
        "step_ns",
        "gpu_busy_ns",
        "comm_ns",
        "data_wait_ns",
        "sync_wait_ns",
        "idle_ns",
    )
    steps = results.steps()
    totals = {f: int(b[f].sum()) for f in fields[3:]}  # over every step, drawn or not
    drawn = _drawn_steps(b["step_ns"])
    if drawn is not None:
        b, steps = b[drawn], steps[drawn]
    return {
        "breakdown": {f: b[f].tolist() for f in fields},
        "windows": windows,
        "table": _step_table(steps),
        "totals": totals,
        "total_steps": len(results.steps()),
    }


def _drawn_steps(step_ns: np.ndarray) -> np.ndarray | None:
    """Indices of the steps drawn when there are more than STEP_BARS: the first, the
    last, and the fastest and the slowest of each of STEP_BARS / 2 stretches of
    consecutive steps (None: every step is drawn)."""
    n = len(step_ns)
    if n <= STEP_BARS:
        return None
    edges = np.linspace(0, n, STEP_BARS // 2 + 1).astype(np.int64)
    keep = {0, n - 1}
    for a, b in zip(edges[:-1], edges[1:]):
        if b > a:
            keep.add(int(a + np.argmin(step_ns[a:b])))
            keep.add(int(a + np.argmax(step_ns[a:b])))
    return np.array(sorted(keep), dtype=np.int64)


def _flame(results: Results) -> dict:
    """The call tree of the last window as columns, without the paths too small to see."""
    raw = results.windows[-1]
    nodes = raw["nodes"]
    total = nodes["total_ns"].astype(np.int64)
    cuda = nodes["cuda_total_ns"].astype(np.int64)
    roots = nodes["parent"] < 0
    cut_cpu = FLAME_MIN_SHARE * max(int(total[roots].sum()), 1)
    cut_cuda = FLAME_MIN_SHARE * max(int(cuda[roots].sum()), 1)
    keep = (total >= cut_cpu) | ((cuda >= cut_cuda) & (cuda > 0))
    # a kept node's ancestors are at least as large, so they are kept too
    idx = np.flatnonzero(keep)
    new_id = np.full(len(nodes), -1, dtype=np.int64)
    new_id[idx] = np.arange(len(idx))
    parent = nodes["parent"][idx].astype(np.int64)
    parent = np.where(parent >= 0, new_id[np.maximum(parent, 0)], -1)
    return {
        "parent": parent.tolist(),
        "op": nodes["op_row"][idx].tolist(),
        "thread": nodes["thread"][idx].tolist(),
        "calls": nodes["calls"][idx].tolist(),
        "total": total[idx].tolist(),
        "self": nodes["self_ns"][idx].tolist(),
        "cuda_total": cuda[idx].tolist(),
        "cuda_self": nodes["cuda_self_ns"][idx].tolist(),
        "threads": _thread_names(results, raw),
        "omitted": int(len(nodes) - len(idx)),
        "omitted_share": FLAME_MIN_SHARE,
    }


def _thin(ts: np.ndarray, *series: np.ndarray) -> np.ndarray:
    """Indices of at most ~CURVE_POINTS points that keep each bucket's extremes."""
    n = len(ts)
    if n <= CURVE_POINTS:
        return np.arange(n)
    edges = np.linspace(0, n, CURVE_POINTS // 2 + 1).astype(np.int64)
    keep = {0, n - 1}
    for a, b in zip(edges[:-1], edges[1:]):
        if b <= a:
            continue
        for s in series:
            keep.add(int(a + np.argmin(s[a:b])))
            keep.add(int(a + np.argmax(s[a:b])))
    return np.array(sorted(keep), dtype=np.int64)


def _curve(ts, t0, **series) -> dict:
    ts = np.asarray(ts, dtype=np.int64)
    idx = _thin(ts, *[np.asarray(v) for v in series.values()])
    out = {"t_ns": (ts[idx] - t0).tolist(), "points": int(len(ts))}
    for k, v in series.items():
        out[k] = np.asarray(v)[idx].tolist()
    return out


def _memory(results: Results, sampler) -> dict:
    from ..analysis import memory

    t0 = results.window_bounds()[0]
    summary = memory.memory_summary(results, sampler=sampler)
    devices = []
    for name, dm in summary.devices.items():
        d: dict[str, Any] = {
            "device": name,
            "peak_bytes": dm.peak_bytes,
            "peak_source": dm.peak_source,
            "notes": list(dm.notes),
            "curves": [],
        }
        if dm.allocator is not None:
            a = dm.allocator
            c = memory.memory_curve(results, name, sampler=sampler, source=a["name"])
            d["curves"].append(
                {
                    "label": f"{a['name']} allocator (absolute, sampled)",
                    "step": False,
                    **_curve(
                        c["timestamp_ns"],
                        t0,
                        allocated=c["allocated_bytes"],
                        reserved=c["reserved_bytes"],
                    ),
                }
            )
            d["peak"] = {
                "bytes": a["peak_allocated_bytes"],
                "t_ns": a["peak_allocated_ns"] - t0,
                "op": "",
                "location": "",
            }
            d["allocator"] = {k: v for k, v in a.items()}
        if dm.driver is not None:
            r = dm.driver
            c = memory.memory_curve(results, name, sampler=sampler, source="cupti")
            d["curves"].append(
                {
                    "label": "device allocations (CUPTI, from the window start)",
                    "step": True,
                    **_curve(c["timestamp_ns"], t0, allocated=c["allocated_bytes"]),
                }
            )
            driver_peak = {
                "bytes": r["peak_bytes"],
                "t_ns": r["peak_ns"] - t0,
                "op": r["peak_op"],
                "location": r["peak_location"],
            }
            d.setdefault("peak", driver_peak)
            d["driver"] = {
                k: r[k]
                for k in (
                    "peak_bytes",
                    "allocations",
                    "frees",
                    "allocated_bytes_total",
                    "freed_bytes_total",
                )
            }
            d["driver"]["peak"] = driver_peak
            d["largest"] = [
                {
                    "bytes": x["bytes"],
                    "t_ns": x["timestamp_ns"] - t0,
                    "op": x["op"],
                    "location": x["location"],
                }
                for x in r["largest"]
            ]
        devices.append(d)
    host = None
    if summary.host is not None:
        h = summary.host
        c = memory.memory_curve(results, "cpu", sampler=sampler)
        host = {
            "rss_source": h["rss_source"],
            "start_bytes": h["start_bytes"],
            "end_bytes": h["end_bytes"],
            "samples": h["samples"],
            "peak": {
                "bytes": h["peak_bytes"],
                "t_ns": h["peak_ns"] - t0,
                "op": h["peak_op"],
                "location": h["peak_location"],
            },
            "curve": _curve(c["timestamp_ns"], t0, rss=c["rss_bytes"]),
        }
    recorded = results.meta.profile_memory or bool(devices) or host is not None
    return {
        "devices": devices,
        "host": host,
        "notes": list(summary.notes),
        "recorded": recorded,
        "window_ns": results.window_bounds()[1] - t0,
        "text": str(summary),
    }


def _processes(results: Results, processes) -> dict | None:
    """-- subprocesses --: one row per process, and the workers' ops summed."""
    if processes is None or len(processes) < 2:
        return None
    from ..analysis import processes as _proc

    cols = [
        ("PID", "r"),
        ("Parent", "r"),
        ("Role", "l"),
        ("Name", "l"),
        ("Start", "l"),
        ("Status", "l"),
        ("Windows", "r"),
        ("Events", "r"),
        ("Dropped", "r"),
        ("Recorded", "r"),
        ("Self CPU", "r"),
    ]
    rows, keys = [], []
    for p in processes:
        rows.append(
            [
                str(p["pid"]),
                str(p["ppid"]),
                str(p["role"]),
                str(p["name"]),
                str(p["start_method"] or "-"),
                str(p["status"]),
                str(p["windows"]),
                f"{int(p['events']):,}",
                f"{int(p['dropped']):,}",
                format_time(p["recorded_ns"]),
                format_time(p["cpu_self_ns"]),
            ]
        )
        keys.append(
            [
                int(p["pid"]),
                int(p["ppid"]),
                None,
                None,
                None,
                None,
                int(p["windows"]),
                int(p["events"]),
                int(p["dropped"]),
                int(p["recorded_ns"]),
                int(p["cpu_self_ns"]),
            ]
        )
    out: dict[str, Any] = {"table": _table(cols, rows, keys, 10)}
    workers = processes[processes["role"] == "worker"]
    if len(workers) and int(workers["windows"].sum()) > 0:
        ka = _proc.key_averages(results, "workers", True, 0, False)
        out["workers_ops"] = op_table(ka)
        out["workers"] = len(workers)
    return out


def _ranks(results: Results) -> dict | None:
    """-- distributed --: this rank's place in the job and its communication per step."""
    from ..analysis.distributed import comm_overlap
    from .chrome import distributed_info

    info = results.meta.distributed_info or distributed_info()
    world = int(info.get("world_size", 1) or 1)
    k = results.kernels()
    has_comm = bool(len(k)) and bool((k["category"] == "communication").any())
    if world <= 1 and not has_comm:
        return None
    ov = comm_overlap(results)
    fields = ("step_ns", "compute_ns", "comm_ns", "overlap_ns", "exposed_comm_ns", "idle_ns")
    cols = [
        ("Step", "r"),
        ("Step time", "r"),
        ("Compute", "r"),
        ("Comm", "r"),
        ("Overlap", "r"),
        ("Exposed comm", "r"),
        ("GPU idle", "r"),
    ]
    rows = [[str(int(s["step"]))] + [format_time(s[f]) for f in fields] for s in ov]
    keys = [[int(s["step"])] + [int(s[f]) for f in fields] for s in ov]
    return {
        "info": {str(a): b for a, b in info.items() if a != "pg_config"},
        "rank": info.get("rank", 0),
        "world_size": world,
        "table": _table(cols, rows, keys, 0),
    }


def _modules(results: Results) -> dict | None:
    """The modules table (prof.modules()) for the report's collapsible tree, or None
    without module calls. Times in ns; the page formats them."""
    mods = results.modules()
    if not len(mods):
        return None
    gpu = results.gpu_work_ns()
    return {
        "gpu": bool(gpu),
        "gpu_work_ns": int(gpu),
        "rows": [
            {
                "name": str(m["name"]),
                "cls": str(m["cls"]),
                "parent": int(m["parent"]),
                "calls": int(m["calls"]),
                "cpu_ns": int(m["cpu_total_ns"]),
                "fwd_ns": int(m["cuda_fwd_ns"]),
                "bwd_ns": int(m["cuda_bwd_ns"]),
                "kernels": int(m["kernels"]),
                "share": float(m["share"]),
            }
            for m in mods
        ],
    }


def _trace_link(trace, path: str) -> dict | None:
    if trace is None:
        return None
    trace = os.fspath(trace)
    rel = os.path.relpath(os.path.abspath(trace), os.path.dirname(os.path.abspath(path)))
    return {
        "href": rel.replace(os.sep, "/"),
        "name": os.path.basename(trace),
        "exists": os.path.isfile(trace),
    }


# ---- entry points ------------------------------------------------------------------------------


def report_data(
    results: Results,
    *,
    sampler=None,
    processes=None,
    trace=None,
    title: str | None = None,
    path: str = "report.html",
) -> dict:
    """The document the report page draws (plain JSON data); see :func:`export_html`."""
    if not isinstance(results, Results):
        raise TypeError(
            "export_html(): expected a gpuprof.Results (prof.results), got "
            f"{type(results).__name__}"
        )
    _check_title(title, "export_html")
    if trace is not None and not isinstance(trace, (str, os.PathLike)):
        raise TypeError(
            "export_html(): trace must be a path (str or os.PathLike) or None, got "
            f"{type(trace).__name__}"
        )
    summary = _summary(results, title)
    ops = results.ops()
    show_memory = results.meta.profile_memory
    ka = KeyAverages(results, show_memory=show_memory)
    from .._version import __version__

    data = {
        "page": "report",
        "title": summary.pop("title"),
        "version": __version__,
        "summary": summary,
        "op_names": [
            display_name(str(n), str(f), int(ln), str(k))
            for n, f, ln, k in zip(ops["name"], ops["file"], ops["line"], ops["kind"])
        ],
        "op_kinds": [str(k) for k in ops["kind"]],
        "op_locations": [
            source_location(str(f), int(ln)) if k == "python" else ""
            for f, ln, k in zip(ops["file"], ops["line"], ops["kind"])
        ],
        "diagnosis": _diagnosis(results),
        "steps": _steps(results),
        "ops": op_table(ka) | {"cuda": ka.cuda},
        "kernels": _kernel_table(results.kernels()),
        "flame": _flame(results),
        "modules": _modules(results),
        "memory": _memory(results, sampler),
        "processes": _processes(results, processes),
        "ranks": _ranks(results),
        "trace": _trace_link(trace, path),
    }
    return data


def export_html(
    results: Results, path, *, sampler=None, processes=None, trace=None, title: str | None = None
) -> str:
    """Write the report page of ``results`` to ``path`` (one file, no network needed).

    Args:
        results: a :class:`gpuprof.Results` (``prof.results``).
        path: the ``.html`` file to write; written whole or not at all.
        sampler: the memory sampler of a live profile (allocator and host curves).
        processes: ``prof.processes()`` of a profile made with ``subprocesses=True``.
        trace: the Chrome trace of the same profile, when one was written: the page
            links it (by a path relative to ``path``) and offers to open it in Perfetto.
        title: the page title (default: "gpuprof report: <program>").

    Returns:
        ``path``.

    Raises:
        OSError: ``path`` cannot be written (the message names it).
        TypeError: a bad ``results``, ``title`` or ``trace``.
    """
    spath = check_output_path(path, "export_html")
    data = report_data(
        results, sampler=sampler, processes=processes, trace=trace, title=title, path=spath
    )
    return _write(_page(data), spath, "export_html")


def compare_data(comparison, title: str | None = None) -> dict:
    """The document the comparison page draws; see :func:`export_compare_html`."""
    from .._version import __version__
    from ..analysis.comparison import Comparison

    if not isinstance(comparison, Comparison):
        raise TypeError(
            "export_html(): expected a gpuprof.compare(...) result, got "
            f"{type(comparison).__name__}"
        )
    _check_title(title, "export_html")

    def deltas(rows):
        cols = [("Name", "l"), ("Before", "r"), ("After", "r"), ("Change", "r"), ("Change %", "r")]
        cells, keys = [], []
        for d in rows:
            pct = d.change_pct
            cells.append(
                [
                    d.name,
                    format_time(d.before_ns),
                    format_time(d.after_ns),
                    ("+" if d.change_ns > 0 else "") + format_time(d.change_ns),
                    "new" if not d.before_ns else f"{pct:+.1f}%",
                ]
            )
            keys.append(
                [None, d.before_ns, d.after_ns, d.change_ns, pct if math.isfinite(pct) else 1e300]
            )
        return _table(cols, cells, keys, None)  # as compare() orders them: largest change

    c = comparison
    return {
        "page": "compare",
        "title": title or "gpuprof comparison",
        "version": __version__,
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "labels": list(c.labels),
        "step_before_ns": c.step_before_ns,
        "step_after_ns": c.step_after_ns,
        "speedup": c.speedup if math.isfinite(c.speedup) else None,
        "breakdown": [c.breakdown_before, c.breakdown_after],
        "ops": deltas(c.ops),
        "kernels": deltas(c.kernels),
        "findings": {"gone": c.findings_gone, "new": c.findings_new, "kept": c.findings_kept},
        "diagnoses": [c.diagnosis_before, c.diagnosis_after],
        "text": str(c),
    }


def export_compare_html(comparison, path, *, title: str | None = None) -> str:
    """Write the page of a :func:`gpuprof.compare` result to ``path``.

    Raises:
        OSError: ``path`` cannot be written (the message names it).
        TypeError: ``comparison`` is not a comparison, or a bad ``title``.
    """
    spath = check_output_path(path, "export_html")
    return _write(_page(compare_data(comparison, title)), spath, "export_html")
