"""GPU overhead benchmark: gpuprof vs torch.profiler on the same training steps.

Each (workload, mode) runs in its own subprocess, so one profiler's leftovers
(CUPTI stays attached after torch.profiler) cannot slow another mode down.

  python benchmarks/bench_gpu.py [--steps 200] [--json out.json] [--workloads a,b,c]

Workloads: a) launch-bound MLP, 16 x Linear(256)+ReLU, batch 64, SGD;
b) compute-bound MLP, 4 x Linear(4096)+GELU, batch 8192; c) CuPy elementwise loop.
Modes: none, gpuprof_cpu, gpuprof (CPU+CUDA), gpuprof_mem (+profile_memory),
torch (CPU+CUDA), torch_full (with_stack + profile_memory).
Per mode it reports the median step time, the step time after the profiler
stopped (lingering cost), and the time from the end of the window to a
printed table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r'''
import io, json, statistics, sys, time, contextlib
wl, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
import torch
torch.backends.cuda.matmul.allow_tf32 = False

def make():
    if wl == "a":
        layers = []
        for _ in range(16):
            layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers).cuda()
        x = torch.randn(64, 256, device="cuda")
    else:
        layers = []
        for _ in range(4):
            layers += [torch.nn.Linear(4096, 4096), torch.nn.GELU()]
        model = torch.nn.Sequential(*layers).cuda()
        x = torch.randn(8192, 4096, device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
    return step

if wl == "c":
    import cupy as cp
    xs = cp.random.rand(1 << 16, dtype=cp.float32)
    def step():
        y = xs
        for _ in range(20):
            y = cp.tanh(y * 1.0001 + 0.5)
        return y
    sync = cp.cuda.Device().synchronize
else:
    step = make()
    sync = torch.cuda.synchronize

for _ in range(20):
    step()
sync()

def run(n, prof=None):
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        step()
        sync()
        if prof is not None and hasattr(prof, "step"):
            prof.step()
        times.append(time.perf_counter_ns() - t0)
    return times

out = {"workload": wl, "mode": mode, "steps": steps}
if mode == "none":
    out["step_ns"] = run(steps)
    out["after_ns"] = run(steps)
else:
    if mode.startswith("gpuprof"):
        import gpuprof
        acts = [gpuprof.ProfilerActivity.CPU]
        if mode != "gpuprof_cpu":
            acts.append(gpuprof.ProfilerActivity.CUDA)
        prof = gpuprof.profile(activities=acts, profile_memory=(mode == "gpuprof_mem"),
                               max_events=50_000_000)
        sort = "self_cuda_time_total" if mode != "gpuprof_cpu" else "self_cpu_time_total"
    else:
        from torch.profiler import profile, ProfilerActivity
        full = mode == "torch_full"
        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                       with_stack=full, profile_memory=full)
        sort = "self_cuda_time_total"
    prof.__enter__()
    out["step_ns"] = run(steps, prof)
    t0 = time.perf_counter()
    prof.__exit__(None, None, None)
    t1 = time.perf_counter()
    table = prof.key_averages().table(sort_by=sort, row_limit=10)
    t2 = time.perf_counter()
    out["stop_s"] = t1 - t0
    out["table_s"] = t2 - t1
    out["window_to_table_s"] = t2 - t0
    if mode.startswith("gpuprof"):
        res = prof.results
        out["cuda"] = res.cuda
        out["attributed_gpu_fraction"] = res.attributed_gpu_fraction
        ev = prof.gpu_events()
        out["kernels"] = int((ev["kind"] == "kernel").sum())
        out["dropped_events"] = res.dropped_events
        out["dropped_gpu"] = res.dropped_gpu_records
        out["diagnosis"] = str(prof.diagnose())
    out["table"] = table
    out["after_ns"] = run(steps)
print("RESULT " + json.dumps(out))
'''

MODES = ["none", "gpuprof_cpu", "gpuprof", "gpuprof_mem", "torch", "torch_full"]


def run_child(wl, mode, steps):
    """Run one mode in a subprocess. Besides MODES, "gp:a.b.c" runs gpuprof with
    only the CUPTI parts a, b, c switched on (GPUPROF_CUPTI_PARTS: callbacks, kernels,
    copies, sync, events, nodrvcb, nortcb), and "gpact:a.b" the same in activity-only
    mode (GPUPROF_CUPTI_MODE=activity), to measure what each part costs."""
    env = dict(os.environ)
    mode_arg = mode
    if mode.startswith(("gp:", "gpact:")):
        kind, parts = mode.split(":", 1)
        env["GPUPROF_CUPTI_PARTS"] = parts.replace(".", ",")
        if kind == "gpact":
            env["GPUPROF_CUPTI_MODE"] = "activity"
        mode_arg = "gpuprof"
    r = subprocess.run([sys.executable, "-c", CHILD, wl, mode_arg, str(steps)],
                       capture_output=True, text=True, timeout=600, env=env)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"workload": wl, "mode": mode, "error": (r.stderr or r.stdout)[-2000:]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--workloads", default="a,b,c")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", default="benchmarks/results/bench_gpu.json")
    args = ap.parse_args()
    results = []
    for wl in args.workloads.split(","):
        steps = args.steps if wl != "b" else max(20, args.steps // 4)
        base = None
        print(f"\n== workload {wl} ({steps} steps) ==")
        print(f"{'mode':12s} {'step ms':>9s} {'ratio':>7s} {'after':>7s} {'to table s':>10s}"
              "  notes")
        for mode in args.modes.split(","):
            r = run_child(wl, mode, steps)
            r["mode"] = mode
            results.append(r)
            if "error" in r:
                print(f"{mode:12s} ERROR {r['error'][-400:]}")
                continue
            med = statistics.median(r["step_ns"]) / 1e6
            after = statistics.median(r["after_ns"]) / 1e6
            if mode == "none":
                base = (med, after)
            ratio = med / base[0] if base else float("nan")
            after_ratio = after / base[1] if base else float("nan")
            r["ratio"] = ratio
            r["after_ratio"] = after_ratio
            notes = ""
            if "attributed_gpu_fraction" in r:
                notes = (f"attributed {100 * r['attributed_gpu_fraction']:.2f}%, "
                         f"{r['kernels']} kernels, mode {r['cuda'].get('mode')}, "
                         f"dropped {r['dropped_events']}/{r['dropped_gpu']}")
            tt = r.get("window_to_table_s", float("nan"))
            print(f"{mode:12s} {med:9.3f} {ratio:7.3f} {after_ratio:7.3f} {tt:10.3f}  {notes}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    meta = {"python": sys.version, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        import torch
        meta["torch"] = torch.__version__
        meta["gpu"] = torch.cuda.get_device_name(0)
    except Exception as e:  # noqa: BLE001
        meta["torch_error"] = repr(e)
    try:
        meta["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                        text=True).stdout.strip()
    except OSError:
        pass
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    for r in results:
        if r.get("mode") == "gpuprof" and r.get("workload") == "a":
            print("\n" + r["table"])
            print(r["diagnosis"])


if __name__ == "__main__":
    main()
