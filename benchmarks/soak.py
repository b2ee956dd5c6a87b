#!/usr/bin/env python3
"""Soak run: many short steps under a repeating schedule; memory must stay flat.

Runs ``--steps`` short training-like steps (a small tree of Python calls, C
calls, a ``record_function`` range, a generator) under
``gpuprof.schedule(wait, warmup, active)`` repeating until the end. Every
window's ``on_trace_ready`` renders a table, as a real handler would, and
records ``prof.buffer_stats()``. Optional worker threads run the same work
the whole time.

    PYTHONPATH=python python3 benchmarks/soak.py                  # 100,000 steps
    PYTHONPATH=python python3 benchmarks/soak.py --steps 2000 --threads 2

Reports RSS before profiling, after the first cycles (the event pool and
Python's caches reach their size there), at the last cycle and after stop;
live heap (Python blocks, glibc malloc bytes in use) after the first cycles
and at the last; and the event-buffer bytes held at every window. Prints a
summary, writes JSON (default benchmarks/results/soak.json) and exits 1 if
the buffer bytes grew at a window that was not the largest so far (the pool
grows to the largest window, within max_events, and never otherwise) or RSS
drifted by more than ``--rss-tolerance-mb`` between the first cycles and the
last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO / "python") not in sys.path:
    sys.path.insert(0, str(REPO / "python"))

import gpuprof  # noqa: E402
from _runinfo import run_info  # noqa: E402

WARM_CYCLES = 50  # cycles after which the pool and caches have their size
CHUNK_EVENTS = gpuprof._gpuprof._test_constants()["CHUNK_EVENTS"]  # events per chunk


# -- the work of one step -------------------------------------------------------


def leaf(x):
    return x * 2 + 1


def layer(xs):
    out = []
    for x in xs:
        out.append(leaf(x))
    return out


def batches(n):
    for i in range(n):
        yield list(range(i, i + 4))


def step_work():
    total = 0
    with gpuprof.record_function("forward"):
        for b in batches(4):
            total += sum(layer(b))
    total += len(sorted(range(16), key=leaf))
    return total


# -- measurements ------------------------------------------------------------------


def rss_bytes() -> int:
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # peak, not current


def _mallinfo2():
    """glibc's mallinfo2(), or None elsewhere."""
    import ctypes
    import ctypes.util

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (n, ctypes.c_size_t)
            for n in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = MallInfo2
    return fn


MALLINFO2 = _mallinfo2()


def heap_in_use() -> dict:
    """Live allocations: Python's (sys.getallocatedblocks) and malloc's (glibc)."""
    import gc

    gc.collect()
    out = {"py_blocks": sys.getallocatedblocks()}
    if MALLINFO2 is not None:
        mi = MALLINFO2()
        out["malloc_in_use_bytes"] = mi.uordblks + mi.hblkhd
        out["malloc_free_bytes"] = mi.fordblks  # held by malloc's arenas, not in use
    return out


def metadata(args) -> dict:
    return {
        **run_info("soak"),
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
        "cuda": gpuprof.cuda_status().get("reason") or "usable",
        "args": vars(args),
    }


def run(args) -> dict:
    # Preallocated: the harness's own bookkeeping must not grow with the windows,
    # or the RSS it reports would measure itself.
    cycle = args.wait + args.warmup + args.active
    cap = args.steps // cycle + 2
    held = np.zeros(cap, dtype=np.int64)
    events = np.zeros(cap, dtype=np.int64)
    dropped = np.zeros(cap, dtype=np.int64)
    chunks = np.zeros(cap, dtype=np.int64)
    n_windows = [0]
    rss_series = np.zeros((cap // args.rss_every + 1, 2), dtype=np.int64)
    n_rss = [0]
    rss_warm = [0]
    rss_last = [0]
    heap_warm: dict = {}
    heap_end: dict = {}

    def on_trace_ready(p):
        table = p.key_averages().table(sort_by="self_cpu_time_total", row_limit=5)
        ops = p.ops()
        calls = int(ops["calls"][ops["name"] == "step_work"].sum())
        if calls < args.active:  # every active step ran it on the main thread
            raise AssertionError(
                f"window {n_windows[0]}: step_work called {calls} times, "
                f"expected >= {args.active}\n{table}"
            )
        i = n_windows[0]
        held[i] = p.buffer_stats()["bytes_held"]
        per_thread = p.results.threads()["events"]
        events[i] = per_thread.sum()
        chunks[i] = (-(-per_thread // CHUNK_EVENTS)).sum()  # whole chunks per thread
        dropped[i] = p.dropped_events
        n = n_windows[0] = i + 1
        if n == WARM_CYCLES:
            rss_warm[0] = rss_bytes()
            heap_warm.update(heap_in_use())
        if n == cap - 2:  # the last full cycle, measured as at WARM_CYCLES (session open)
            heap_end.update(heap_in_use())
            rss_last[0] = rss_bytes()
        if n % args.rss_every == 0:
            rss_series[n_rss[0]] = (n, rss_bytes())
            n_rss[0] += 1

    stop = threading.Event()

    def worker():
        while not stop.is_set():
            step_work()

    workers = [threading.Thread(target=worker, daemon=True) for _ in range(args.threads)]
    if workers:  # hand the GIL around often enough that workers record in every window
        sys.setswitchinterval(1e-4)
    sched = gpuprof.schedule(wait=args.wait, warmup=args.warmup, active=args.active)
    rss_start = rss_bytes()
    t0 = time.perf_counter()
    with gpuprof.profile(
        activities=[gpuprof.ProfilerActivity.CPU],
        schedule=sched,
        on_trace_ready=on_trace_ready,
        max_events=args.max_events,
    ) as prof:
        for t in workers:
            t.start()
        for _ in range(args.steps):
            step_work()
            prof.step()
        stop.set()
        for t in workers:
            t.join()
    elapsed = time.perf_counter() - t0
    rss_end = rss_bytes()

    n = n_windows[0]
    ch = chunks[:n]
    # The chunk pool grows to the largest window seen (in chunks, within
    # max_events) and never otherwise: growth at any other window is a leak.
    growth = [(i, int(held[i]), int(events[i])) for i in range(1, n) if held[i] > held[i - 1]]
    buffer_flat = all(ch[i] > ch[:i].max() for i, _, _ in growth)
    held = [int(b) for b in held[:n]]
    rss_drift = rss_last[0] - rss_warm[0] if rss_warm[0] and rss_last[0] else None
    rss_ok = rss_drift is None or rss_drift <= args.rss_tolerance_mb * 2**20
    return {
        "steps": args.steps,
        "windows": n,
        "elapsed_s": round(elapsed, 3),
        "steps_per_s": round(args.steps / elapsed, 1) if elapsed else None,
        "rss_start_bytes": rss_start,
        "rss_after_warmup_bytes": rss_warm[0] or None,
        "rss_last_cycle_bytes": rss_last[0] or None,
        "rss_end_bytes": rss_end,
        "rss_drift_after_warmup_bytes": rss_drift,
        "rss_series": rss_series[: n_rss[0]].tolist(),
        "heap_after_warmup": heap_warm,
        "heap_end": heap_end,
        "buffer_bytes_first": held[0] if held else None,
        "buffer_bytes_min": min(held) if held else None,
        "buffer_bytes_max": max(held) if held else None,
        "buffer_bytes_last": held[-1] if held else None,
        "buffer_bytes_distinct": sorted(set(held)),
        "buffer_growth": growth,  # (window, bytes held, events of that window)
        "events_per_window_max": int(events[:n].max()) if n else 0,
        "dropped_total": int(dropped[:n].sum()),
        "buffer_flat": buffer_flat,
        "rss_ok": rss_ok,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--wait", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--active", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="worker threads running step_work")
    ap.add_argument("--max-events", type=int, default=1_000_000)
    ap.add_argument("--rss-every", type=int, default=500, help="sample RSS every N windows")
    ap.add_argument(
        "--rss-tolerance-mb",
        type=float,
        default=16.0,
        help="allowed RSS growth between the warm-up cycles and the end",
    )
    ap.add_argument("--json", default=str(HERE / "results" / "soak.json"))
    args = ap.parse_args(argv)
    cycle = args.wait + args.warmup + args.active
    if args.steps < 1 or args.active < 1 or args.wait < 0 or args.warmup < 0:
        ap.error("--steps and --active must be >= 1, --wait and --warmup >= 0")

    res = run(args)
    mib = 2**20

    def fmt(b):
        return "n/a" if b is None else f"{b / mib:.1f} MiB"

    print(
        f"gpuprof soak: {res['steps']:,} steps, schedule wait={args.wait} warmup={args.warmup} "
        f"active={args.active} (cycle {cycle}), {args.threads} worker threads"
    )
    print(
        f"  windows handed to on_trace_ready: {res['windows']:,} in {res['elapsed_s']:.1f} s "
        f"({res['steps_per_s']:,.0f} steps/s)"
    )
    print(
        f"  RSS: start {fmt(res['rss_start_bytes'])}, after {WARM_CYCLES} cycles "
        f"{fmt(res['rss_after_warmup_bytes'])}, last cycle {fmt(res['rss_last_cycle_bytes'])} "
        f"(drift {fmt(res['rss_drift_after_warmup_bytes'])}), after stop "
        f"{fmt(res['rss_end_bytes'])}"
    )
    hw, he = res["heap_after_warmup"], res["heap_end"]
    if hw and he:
        line = (
            f"  live heap after {WARM_CYCLES} cycles -> last cycle: Python blocks "
            f"{hw['py_blocks']:,} -> {he['py_blocks']:,}"
        )
        if "malloc_in_use_bytes" in hw:
            line += (
                f", malloc in use {fmt(hw['malloc_in_use_bytes'])} -> "
                f"{fmt(he['malloc_in_use_bytes'])}"
            )
        print(line)
    print(
        f"  event buffers: {fmt(res['buffer_bytes_first'])} at the first window, "
        f"{fmt(res['buffer_bytes_max'])} max, {fmt(res['buffer_bytes_last'])} at the last; "
        f"values seen: {[fmt(b) for b in res['buffer_bytes_distinct']]}"
    )
    print(
        f"  events per window (max) {res['events_per_window_max']:,}, "
        f"dropped {res['dropped_total']:,}"
    )
    ok = res["buffer_flat"] and res["rss_ok"]
    for i, b, e in res["buffer_growth"]:
        print(
            f"  event pool grew to {fmt(b)} at window {i:,}, the largest so far ({e:,} events)"
            if res["buffer_flat"]
            else f"  event pool grew to {fmt(b)} at window {i:,} ({e:,} events)"
        )
    print(
        f"  flat: buffers {'yes' if res['buffer_flat'] else 'NO'}, "
        f"RSS {'yes' if res['rss_ok'] else 'NO'} (tolerance {args.rss_tolerance_mb} MiB)"
    )
    if args.json:
        out = {"meta": metadata(args), "results": res}
        if args.json != os.devnull:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"  JSON: {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
