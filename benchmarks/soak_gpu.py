#!/usr/bin/env python3
"""GPU soak: a training loop profiled for minutes with capture cycling; nothing may be lost.

A small PyTorch MLP trains step after step. A repeating schedule
(``--wait``/``--warmup``/``--active``) opens and closes the CUPTI window every
few steps, and every ``--session-steps`` steps the profile stops (gpuprof
detaches CUPTI with cuptiFinalize) and a new one starts, so both the window
and the session cycle hundreds of times. Every window's ``on_trace_ready``
checks that

- each active step has exactly the kernels of the reference step (measured
  once before profiling with a plain gpuprof window), so no CUPTI record went
  missing or was counted twice;
- every kernel joined the Python op that launched it;
- no CPU event and no CUPTI record was dropped;

and samples RSS. At the end RSS after warm-up is compared with RSS at the
last window: host memory must be flat (``--rss-tolerance-mb``).

    PYTHONPATH=python python3 benchmarks/soak_gpu.py --seconds 420

``--seconds`` bounds the run by time (the default, 1200 s, is the issue's
20 minutes); the report gives steps, windows and sessions so that a shorter
run can be set against a real job: a job at 5 steps/s for 20 minutes makes
6,000 steps, i.e. 1,200 windows at a cycle of 5.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO / "python") not in sys.path:
    sys.path.insert(0, str(REPO / "python"))

import gpuprof  # noqa: E402
from _runinfo import run_info  # noqa: E402
from soak import heap_in_use, rss_bytes  # noqa: E402

CUDA = [gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA]


def make_step(torch, width: int, depth: int, batch: int):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1)).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=1e-4, momentum=0.9)
    x = torch.randn(batch, width, device="cuda")
    y = torch.randn(batch, 1, device="cuda")

    def step():
        with gpuprof.record_function("train_step"):
            loss = torch.nn.functional.mse_loss(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return loss

    return step


def kernels_per_step(torch, step) -> int:
    with gpuprof.profile(activities=CUDA) as p:
        step()
        torch.cuda.synchronize()
    ev = p.gpu_events()
    return int((ev["kind"] == "kernel").sum())


def run(args) -> dict:
    import torch

    step = make_step(torch, args.width, args.depth, args.batch)
    for _ in range(5):  # optimizer state, cuBLAS handles and workspaces
        step()
    torch.cuda.synchronize()
    per_step = kernels_per_step(torch, step)

    st = {
        "windows": 0,
        "sessions": 0,
        "steps": 0,
        "kernels": 0,
        "bad_windows": [],
        "dropped_events": 0,
        "dropped_gpu": 0,
        "unattributed": 0,
        "rss": [],
    }
    rss_warm = rss_last = 0
    heap_warm: dict = {}

    def on_trace_ready(p):
        nonlocal rss_warm, rss_last
        ev = p.gpu_events()
        k = ev[ev["kind"] == "kernel"]
        n_steps = len(p.steps())
        w = st["windows"]
        st["windows"] = w + 1
        st["kernels"] += len(k)
        st["unattributed"] += int((k["op"] < 0).sum())
        st["dropped_events"] += p.dropped_events
        st["dropped_gpu"] = max(st["dropped_gpu"], p.results.dropped_gpu_records)
        if len(k) != per_step * n_steps or (k["op"] < 0).any():
            st["bad_windows"].append((w, n_steps, len(k), int((k["op"] < 0).sum())))
        if w + 1 == args.warm_windows:
            rss_warm = rss_bytes()
            heap_warm.update(heap_in_use())
        if (w + 1) % args.rss_every == 0:
            rss_last = rss_bytes()
            st["rss"].append((w + 1, round(time.perf_counter() - t0, 1), rss_last))

    sched = gpuprof.schedule(wait=args.wait, warmup=args.warmup, active=args.active)
    rss_start = rss_bytes()
    t0 = time.perf_counter()
    deadline = t0 + args.seconds
    while time.perf_counter() < deadline and st["steps"] < args.max_steps:
        with gpuprof.profile(
            activities=CUDA, schedule=sched, on_trace_ready=on_trace_ready
        ) as prof:
            for i in range(args.session_steps):
                loss = step()
                if i % 50 == 49:
                    loss.item()  # a host sync now and then, as a logging loop does
                    if time.perf_counter() >= deadline:
                        break
                prof.step()
        st["sessions"] += 1
        st["steps"] += i + 1
    elapsed = time.perf_counter() - t0
    heap_last = heap_in_use()
    rss_end = rss_bytes()
    drift = rss_last - rss_warm if rss_warm and rss_last else None
    return {
        **{k: v for k, v in st.items() if k != "bad_windows"},
        "bad_windows": st["bad_windows"][:20],
        "n_bad_windows": len(st["bad_windows"]),
        "kernels_per_step": per_step,
        "elapsed_s": round(elapsed, 1),
        "steps_per_s": round(st["steps"] / elapsed, 1),
        "rss_start_bytes": rss_start,
        "rss_after_warmup_bytes": rss_warm,
        "rss_last_window_bytes": rss_last,
        "rss_end_bytes": rss_end,
        "rss_drift_bytes": drift,
        "heap_after_warmup": heap_warm,
        "heap_end": heap_last,
        "ok": (
            not st["bad_windows"]
            and st["dropped_events"] == 0
            and st["dropped_gpu"] == 0
            and drift is not None
            and drift <= args.rss_tolerance_mb * 2**20
        ),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--seconds", type=float, default=1200.0)
    ap.add_argument("--max-steps", type=int, default=10**9)
    ap.add_argument(
        "--session-steps",
        type=int,
        default=500,
        help="steps per profile; a new profile (and CUPTI attach) after each",
    )
    ap.add_argument("--wait", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--active", type=int, default=2)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--warm-windows", type=int, default=200)
    ap.add_argument("--rss-every", type=int, default=200)
    ap.add_argument("--rss-tolerance-mb", type=float, default=16.0)
    ap.add_argument("--json", default=str(HERE / "results" / "soak_gpu.json"))
    args = ap.parse_args(argv)
    if min(args.session_steps, args.active) < 1 or min(args.wait, args.warmup) < 0:
        ap.error("--session-steps and --active must be >= 1, --wait and --warmup >= 0")
    try:
        import torch
    except ImportError:
        print("soak_gpu: needs PyTorch with CUDA; torch is not installed")
        return 2
    if not torch.cuda.is_available() or not gpuprof.cuda_status()["usable"]:
        print(f"soak_gpu: needs a usable GPU: {gpuprof.cuda_status().get('reason')}")
        return 2

    res = run(args)
    mib = 2**20
    print(
        f"gpuprof GPU soak: {res['steps']:,} steps in {res['elapsed_s']} s "
        f"({res['steps_per_s']:,} steps/s), {res['sessions']} sessions, "
        f"{res['windows']:,} windows, {res['kernels']:,} kernels recorded "
        f"({res['kernels_per_step']} per step)"
    )
    print(
        f"  windows with a wrong kernel count or an unattributed kernel: "
        f"{res['n_bad_windows']} {res['bad_windows'][:5]}"
    )
    print(f"  dropped: CPU events {res['dropped_events']}, CUPTI records {res['dropped_gpu']}")
    drift = res["rss_drift_bytes"]
    print(
        f"  RSS: start {res['rss_start_bytes'] / mib:.1f} MiB, after {args.warm_windows} "
        f"windows {res['rss_after_warmup_bytes'] / mib:.1f} MiB, last sample "
        f"{res['rss_last_window_bytes'] / mib:.1f} MiB (drift "
        f"{'n/a' if drift is None else f'{drift / mib:+.1f} MiB'}), end "
        f"{res['rss_end_bytes'] / mib:.1f} MiB"
    )
    hw, he = res["heap_after_warmup"], res["heap_end"]
    if hw and he and "malloc_in_use_bytes" in hw:
        print(
            f"  malloc in use {hw['malloc_in_use_bytes'] / mib:.1f} -> "
            f"{he['malloc_in_use_bytes'] / mib:.1f} MiB, free in its arenas "
            f"{hw['malloc_free_bytes'] / mib:.1f} -> {he['malloc_free_bytes'] / mib:.1f} MiB; "
            f"Python blocks {hw['py_blocks']:,} -> {he['py_blocks']:,}"
        )
    print(f"  {'PASS' if res['ok'] else 'FAIL'}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(
            {"meta": {**run_info("soak_gpu"), "args": vars(args)}, "results": res}, f, indent=1
        )
    print(f"  JSON: {args.json}")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
