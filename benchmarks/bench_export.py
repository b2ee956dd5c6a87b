"""Chrome-trace export: gpuprof vs torch.profiler on the same training steps.

Both profilers record the same number of steps of bench_gpu.py's workload (a), the
launch-bound MLP (16 x Linear(256)+ReLU, batch 64, SGD), one after the other in this process:
gpuprof first (CPU + CUDA), then torch.profiler (CPU + CUDA, record_shapes=False,
with_stack=False, profile_memory=False), then torch.profiler again with with_stack=True (the
setting that writes the Python calls, as gpuprof does). None has a schedule, so each records
every step. Then each writes its Chrome trace, and the script reports

- the wall time of ``export_chrome_trace(path)``: the median of ``--repeats`` calls for
  gpuprof, ``--torch-repeats`` calls for torch.profiler (default 1: PyTorch 2.11 will
  not export one profile twice);
- the size of the uncompressed file and its events, counted by category (``cat``), with the
  bytes of each category written as compact JSON (of which names and args);
- gpuprof's ``.json.gz`` export: time and size;
- gpuprof's export with ``min_duration_us`` (each of ``--min-duration-us``): time, size and
  the calls it left out;
- the ratios gpuprof / torch for time and size (the target is 0.5x or less for both).

    PYTHONPATH=python python3 benchmarks/bench_export.py [--steps 200] [--json PATH]
                                                         [--out-dir DIR]

Without PyTorch or without a usable GPU the torch.profiler side is skipped with a message,
and gpuprof's export is timed on a CPU-only stand-in step instead (a small pure-Python MLP),
so that the script's own parts can be checked anywhere; those figures are not comparable with
the GPU run.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO / "python") not in sys.path:
    sys.path.insert(0, str(REPO / "python"))

import gpuprof  # noqa: E402
from _runinfo import run_info  # noqa: E402

WARMUP_STEPS = 20  # as bench_gpu.py: optimizer state, cuBLAS handles, workspaces


# ---- workloads ---------------------------------------------------------------------------------


def launch_bound_step(torch):
    """bench_gpu.py's workload (a). bench_gpu.py runs its workloads in subprocesses from the
    source string ``CHILD``; its ``make()`` is taken from there as it is, so that both
    benchmarks time the same model."""
    import bench_gpu

    src = bench_gpu.CHILD
    try:
        start = src.index("def make():")
        end = src.index("\nif wl == ", start)
    except ValueError:
        raise SystemExit(
            "bench_export: bench_gpu.CHILD no longer defines make() before "
            "'if wl == ...'; update launch_bound_step()"
        ) from None
    torch.backends.cuda.matmul.allow_tf32 = False
    ns = {"torch": torch, "wl": "a"}
    exec(compile(src[start:end], "bench_gpu.CHILD", "exec"), ns)
    return ns["make"](), torch.cuda.synchronize


def cpu_stand_in_step():
    """A CPU-only stand-in: a 16-layer MLP of width 16 in pure Python, one forward pass a
    step, so that a step makes a few thousand Python and C calls."""
    import random

    rng = random.Random(0)
    width = 16
    weights = [
        [[rng.uniform(-0.3, 0.3) for _ in range(width)] for _ in range(width)] for _ in range(16)
    ]
    x = [rng.uniform(-1, 1) for _ in range(width)]

    def linear(w, v):
        return [sum(a * b for a, b in zip(row, v)) for row in w]

    def relu(v):
        return [max(0.0, a) for a in v]

    def step():
        v = x
        for w in weights:
            with gpuprof.record_function("layer"):
                v = relu(linear(w, v))
        return sum(v)

    return step, lambda: None


def record(prof, step, sync, steps):
    """Run `steps` steps under an entered profiler, calling its step() after each."""
    with prof:
        for _ in range(steps):
            step()
            sync()
            prof.step()
    return prof


# ---- measuring ---------------------------------------------------------------------------------


def time_export(export, path, repeats):
    """Wall times (s) of `repeats` calls of export(): the first writes `path`, the others a
    copy next to it that is removed again. Returns the times and the size of `path` (bytes).
    A repeat that fails ends the repeats with a warning."""
    path = Path(path)
    again = path.with_name(path.name.replace(".json", ".again.json", 1))
    times = []
    for i in range(max(1, repeats)):
        target = path if i == 0 else again
        t0 = time.perf_counter()
        try:
            export(str(target))
        except Exception as e:  # noqa: BLE001
            if i == 0:
                raise
            print(f"bench_export: export #{i + 1} ({target}) failed ({e!r}); keeping {i}")
            break
        finally:
            if i > 0 and again.exists():
                again.unlink()
        times.append(time.perf_counter() - t0)
    return times, path.stat().st_size


def count_events(path):
    """Events of a plain-JSON Chrome trace: the total, by category (metadata events as
    "(ph M)"), and the host's ProfilerStep#<n> slices."""
    with open(path, "rb") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    by_cat = collections.Counter()
    size = collections.defaultdict(lambda: [0, 0, 0])  # category -> compact, name, args bytes
    name_bytes = collections.Counter()
    for e in events:
        cat = e.get("cat") or f"(ph {e.get('ph')})"
        by_cat[cat] += 1
        row = size[cat]
        row[0] += _compact_len(e)
        row[1] += _compact_len(e.get("name", ""))
        row[2] += _compact_len(e.get("args", {})) if "args" in e else 0
        if cat in ("python_function", "cpu_op"):
            name_bytes[e.get("name", "")] += len(str(e.get("name", "")).encode())
    steps = sum(
        1
        for e in events
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")
    )
    # where each writer puts its step markers and which ranges it draws on the GPU rows
    step_cats = collections.Counter(
        e.get("cat") for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
    )
    gpu_ranges = collections.Counter(
        re.sub(r"#\d+$", "#<n>", str(e.get("name", "")))
        for e in events
        if e.get("cat") == "gpu_user_annotation"
    )
    return {
        "step_marker_cats": dict(step_cats),
        "gpu_range_names": dict(gpu_ranges),
        "events": len(events),
        "omitted_calls": doc.get("gpuprof_omitted_calls", 0) if isinstance(doc, dict) else 0,
        "events_by_cat": dict(by_cat.most_common()),
        "bytes_by_cat": {c: dict(zip(("compact", "name", "args"), size[c])) for c in by_cat},
        "heaviest_host_names": dict(name_bytes.most_common(20)),
        "step_slices": steps,
    }


def _compact_len(value):
    """Bytes of `value` written as compact JSON (UTF-8): a measure of what each category of
    event costs that does not depend on how a writer spaces or indents its file."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def export_result(export, path, repeats):
    times, size = time_export(export, path, repeats)
    return {
        "path": str(path),
        "export_s": times,
        "export_s_median": statistics.median(times),
        "size_bytes": size,
        **count_events(path),
    }


# ---- report ------------------------------------------------------------------------------------


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_report(out):
    g, t, ts = out["gpuprof"], out.get("torch") or {}, out.get("torch_stacks") or {}
    mb = 1e6
    print(f"\nbench_export: {out['steps']} steps of {out['workload']}")
    print(f"{'':28s} {'gpuprof':>10s} {'torch':>10s} {'ratio':>7s}  target 0.5x")

    def row(name, a, b, target=False, spec=".3f"):
        q = ratio(a, b)
        verdict = ("met" if q <= 0.5 else "not met") if target and q is not None else ""
        print(
            f"{name:28s} {fmt(a, spec):>10s} {fmt(b, spec):>10s} "
            f"{fmt(q, '.2f') + 'x' if q is not None else '-':>7s}  {verdict}"
        )

    size = lambda d: d["size_bytes"] / mb if "size_bytes" in d else None  # noqa: E731
    row("export .json (s)", g["json"]["export_s_median"], t.get("export_s_median"), True)
    row("file size (MB)", size(g["json"]), size(t), True)
    row("events", g["json"]["events"], t.get("events"), spec=",d")
    row("ProfilerStep slices", g["json"]["step_slices"], t.get("step_slices"), spec=",d")
    row("export .json.gz (s)", g["gz"]["export_s_median"], None)
    row("file size .gz (MB)", g["gz"]["size_bytes"] / mb, None)
    for m, d in g.get("thinned", {}).items():
        print(
            f"min_duration_us={m}: {d['omitted_calls']:,d} of "
            f"{g['json']['events_by_cat'].get('python_function', 0):,d} calls left out"
        )
        row("  export (s)", d["export_s_median"], t.get("export_s_median"), True)
        row("  file size (MB)", size(d), size(t), True)
    if ts:
        print("torch.profiler with_stack=True (the Python calls too, like gpuprof's default):")
        row("  export (s)", g["json"]["export_s_median"], ts.get("export_s_median"), True)
        row("  file size (MB)", size(g["json"]), size(ts), True)
        row("  events", g["json"]["events"], ts.get("events"), spec=",d")
    if "skipped" in t:
        print(f"torch.profiler: skipped ({t['skipped']})")
    cols = [("gpuprof", g["json"]), ("torch", t), ("torch stacks", ts)]
    cats = []
    for _, d in cols:
        cats += [c for c in d.get("events_by_cat", {}) if c not in cats]
    print(f"\n{'events by category':24s}" + "".join(f"{n:>14s}" for n, _ in cols))
    for c in cats:
        print(
            f"  {c:22s}"
            + "".join(
                f"{fmt(d['events_by_cat'].get(c, 0), ',d') if 'events_by_cat' in d else '-':>14s}"
                for _, d in cols
            )
        )
    print(
        f"\n{'MB by category':24s}"
        + "".join(f"{n:>20s}" for n, _ in cols)
        + "   (compact JSON (name/args))"
    )
    for c in cats:
        cells = []
        for _, d in cols:
            x = d.get("bytes_by_cat", {}).get(c)
            cells.append(
                "-"
                if x is None
                else f"{x['compact'] / mb:.2f} ({x['name'] / mb:.1f}/{x['args'] / mb:.1f})"
            )
        print(f"  {c:22s}" + "".join(f"{x:>20s}" for x in cells))


# ---- main --------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="recorded steps (default 200)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="gpuprof export_chrome_trace calls per format (default 5; median)",
    )
    ap.add_argument(
        "--torch-repeats",
        type=int,
        default=1,
        help="torch.profiler export_chrome_trace calls (default 1: PyTorch 2.11 "
        "refuses a second export of one profile, 'Trace is already saved')",
    )
    ap.add_argument(
        "--min-duration-us",
        type=float,
        nargs="*",
        default=[1.0, 10.0],
        help="also export with these min_duration_us (default 1 10)",
    )
    ap.add_argument(
        "--no-torch-stacks",
        action="store_true",
        help="skip the torch.profiler run with with_stack=True",
    )
    ap.add_argument(
        "--json", default=str(HERE / "results" / "bench_export.json"), help="where the results go"
    )
    ap.add_argument(
        "--out-dir",
        default=None,
        help="folder for the trace files (default: a temporary folder, removed)",
    )
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        torch, skip = None, "PyTorch is not installed"
    else:
        status = gpuprof.cuda_status()
        if not torch.cuda.is_available():
            skip = "torch.cuda.is_available() is False"
        elif not status.get("usable"):
            skip = f"gpuprof cannot capture CUDA here: {status.get('reason')}"
        else:
            skip = None
    if skip:
        print(
            f"bench_export: {skip}: skipping torch.profiler and the GPU workload; timing "
            "gpuprof's export on a CPU-only stand-in step (not comparable with a GPU run)"
        )
        step, sync = cpu_stand_in_step()
        workload = "a CPU-only stand-in (16-layer pure-Python MLP; no GPU)"
        activities = [gpuprof.ProfilerActivity.CPU]
    else:
        step, sync = launch_bound_step(torch)
        workload = "bench_gpu.py workload (a), launch-bound MLP"
        activities = [gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA]

    for _ in range(WARMUP_STEPS):
        step()
    sync()

    meta = {
        **run_info("bench_export"),
        "machine": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
        },
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
        },
        "gpuprof": getattr(gpuprof, "__version__", None),
        "cuda": gpuprof.cuda_status(),
        "torch": getattr(torch, "__version__", None),
        "args": vars(args),
    }
    if not skip:
        meta["gpu"] = torch.cuda.get_device_name(0)
    out = {"meta": meta, "workload": workload, "steps": args.steps}
    out_dir = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="bench_export"))
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        # gpuprof first: torch.profiler keeps CUPTI's callbacks after it ran
        prof = record(
            gpuprof.profile(activities=activities, max_events=50_000_000), step, sync, args.steps
        )
        res = prof.results
        out["gpuprof"] = {
            "steps": len(prof.steps()),
            "dropped_events": res.dropped_events,
            "json": export_result(
                prof.export_chrome_trace, out_dir / "gpuprof.pt.trace.json", args.repeats
            ),
        }
        times, size = time_export(
            prof.export_chrome_trace, out_dir / "gpuprof.pt.trace.json.gz", args.repeats
        )
        out["gpuprof"]["gz"] = {
            "export_s": times,
            "export_s_median": statistics.median(times),
            "size_bytes": size,
        }
        out["gpuprof"]["thinned"] = {}
        for m in args.min_duration_us:
            out["gpuprof"]["thinned"][f"{m:g}"] = export_result(
                functools.partial(prof.export_chrome_trace, min_duration_us=m),
                out_dir / f"gpuprof.min{m:g}us.pt.trace.json",
                args.repeats,
            )
        del prof, res

        if skip:
            out["torch"] = {"skipped": skip}
        else:
            from torch.profiler import ProfilerActivity, profile

            for key, stacks in (("torch", False), ("torch_stacks", True)):
                if stacks and args.no_torch_stacks:
                    continue
                tp = record(
                    profile(
                        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                        record_shapes=False,
                        with_stack=stacks,
                        profile_memory=False,
                    ),
                    step,
                    sync,
                    args.steps,
                )
                out[key] = export_result(
                    tp.export_chrome_trace, out_dir / f"{key}.pt.trace.json", args.torch_repeats
                )
                del tp
    finally:
        if args.out_dir is None:
            shutil.rmtree(out_dir, ignore_errors=True)

    g, t, ts = out["gpuprof"]["json"], out["torch"], out.get("torch_stacks") or {}
    out["ratios"] = {
        "export_time": ratio(g["export_s_median"], t.get("export_s_median")),
        "size": ratio(g["size_bytes"], t.get("size_bytes")),
        "events": ratio(g["events"], t.get("events")),
        "size_vs_with_stack": ratio(g["size_bytes"], ts.get("size_bytes")),
        "export_time_vs_with_stack": ratio(g["export_s_median"], ts.get("export_s_median")),
    }
    for m, r in out["gpuprof"]["thinned"].items():
        out["ratios"][f"size_min{m}us"] = ratio(r["size_bytes"], t.get("size_bytes"))
    print_report(out)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"\nJSON: {args.json}" + (f"; traces in {out_dir}" if args.out_dir else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
