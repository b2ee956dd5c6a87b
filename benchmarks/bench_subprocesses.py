#!/usr/bin/env python3
"""Cost of ``gpuprof.profile(subprocesses=True)`` in the child processes.

A multiprocessing pool of 2 workers maps a per-item function over N items,
in three modes, for the fork and spawn start methods:

- ``off``: no profiler;
- ``parent``: ``gpuprof.profile()`` (the main process is profiled, the workers not);
- ``children``: ``gpuprof.profile(subprocesses=True)`` (workers profiled too).

Three worker functions: ``calls`` (a pure-Python recursion, ~2,000 calls per
item: the hook's worst case), ``transforms`` (a torchvision-style Compose of
eight small transforms on a 96x96x3 image, ~60 calls per item: a typical
DataLoader worker) and ``numpy`` (sorting 200k floats per item: few calls,
time in C). Reported per mode: the workers' throughput (items/s of
``pool.map``, the pool already warm), the pool's start-up time (creating it
and a first map of one item), and the time of ``prof.stop()`` (the window's
end: children save their data, the parent waits for them and reads it).
Modes rotate from repeat to repeat; medians are reported.

    PYTHONPATH=python python3 benchmarks/bench_subprocesses.py [--quick] [--repeats N]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO / "python") not in sys.path:
    sys.path.insert(0, str(REPO / "python"))

import gpuprof  # noqa: E402


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def work_calls(i):
    return fib(15)  # 1,973 calls


_DATA = None


def work_numpy(i):
    global _DATA
    if _DATA is None:
        _DATA = np.random.default_rng(0).random(200_000)
    return float(np.sort(_DATA)[i % 10])


class Compose:
    def __init__(self, *fs):
        self.fs = fs

    def __call__(self, x):
        for f in self.fs:
            x = f(x)
        return x


def to_float(x):
    return x.astype(np.float32) / 255.0


def random_crop(x, size=80):
    i, j = np.random.randint(0, x.shape[0] - size, 2)
    return x[i : i + size, j : j + size]


def hflip(x):
    return x[:, ::-1] if np.random.rand() < 0.5 else x


def jitter(x):
    return np.clip(x * np.random.uniform(0.8, 1.2), 0.0, 1.0)


def normalize(x, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)):
    return (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)


def to_chw(x):
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def blur(x):
    return (x + np.roll(x, 1, axis=1) + np.roll(x, -1, axis=1)) / 3.0


def label_of(x):
    return int(x.mean() > 0)


_IMAGE = np.random.default_rng(1).integers(0, 255, (96, 96, 3), dtype=np.uint8)
_PIPE = Compose(to_float, random_crop, hflip, jitter, blur, normalize, to_chw)


def work_transforms(i):
    x = _PIPE(_IMAGE)
    return label_of(x)


WORK = {
    "calls": (work_calls, 4000),
    "transforms": (work_transforms, 8000),
    "numpy": (work_numpy, 400),
}
MODES = ("off", "parent", "children")


def one_run(method: str, mode: str, work, n: int) -> dict:
    ctx = mp.get_context(method)
    prof = None
    if mode != "off":
        prof = gpuprof.profile(
            activities=[gpuprof.ProfilerActivity.CPU], subprocesses=(mode == "children")
        )
        prof.start()
    try:
        t0 = time.perf_counter()
        pool = ctx.Pool(2)
        pool.map(work, [0])
        t1 = time.perf_counter()
        pool.map(work, range(n), chunksize=max(1, n // 64))
        t2 = time.perf_counter()
    finally:
        t3 = time.perf_counter()
        if prof is not None:
            prof.stop()
        t4 = time.perf_counter()
    pool.close()
    pool.join()
    out = {"startup_s": t1 - t0, "map_s": t2 - t1, "items_per_s": n / (t2 - t1), "stop_s": t4 - t3}
    if mode == "children":
        w = prof.processes()
        out["worker_events"] = int(w["events"][1:].sum())
        out["workers"] = int(len(w) - 1)
    return out


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except OSError:
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 repeats, fewer items")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--json", default=str(HERE / "results" / "bench_subprocesses.json"))
    args = ap.parse_args()
    repeats = args.repeats or (2 if args.quick else 5)
    scale = 4 if args.quick else 1
    results: dict = {}
    for method in ("fork", "spawn"):
        for wname, (work, n) in WORK.items():
            n //= scale
            runs: dict[str, list[dict]] = {m: [] for m in MODES}
            for r in range(repeats):
                order = MODES[r % 3 :] + MODES[: r % 3]
                for mode in order:
                    runs[mode].append(one_run(method, mode, work, n))
            key = f"{method}/{wname}"
            results[key] = {}
            for mode in MODES:
                med = {k: statistics.median(x[k] for x in runs[mode]) for k in runs[mode][0]}
                results[key][mode] = med
            base = results[key]["off"]["items_per_s"]
            print(f"{key:14s} n={n}")
            for mode in MODES:
                m = results[key][mode]
                extra = f"  worker events {m['worker_events']:,}" if "worker_events" in m else ""
                print(
                    f"  {mode:9s} {m['items_per_s']:10.1f} items/s "
                    f"({100 * (base / m['items_per_s'] - 1):+6.1f}% time)  "
                    f"start-up {1e3 * m['startup_s']:7.1f} ms  stop {1e3 * m['stop_s']:6.1f} ms"
                    + extra
                )
    doc = {
        "benchmark": "bench_subprocesses",
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "commit": commit(),
        "repeats": repeats,
        "results": results,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
