"""What one kernel launch costs the launching thread, and what gpuprof adds to it.

    python benchmarks/bench_launch.py [--reps 7] [--modes none,floor,gpuprof] [--json PATH]

Empty kernels are launched from C (benchmarks/launch_loop.cu, built here with
nvcc) in batches of 256, through the runtime (<<<>>>) and through the driver
(cuLaunchKernel); after each batch an untimed synchronize drains the queue, so
the figure is the host's own time per launch, without Python in the loop.

Modes, each in its own process, interleaved over --reps rounds:
  none          no profiler
  floor         CUPTI with do-nothing handlers (benchmarks/cupti_floor.c), same
                parts as gpuprof's default (read from gpuprof.cuda_status())
  floor:BITS    the floor with the parts BITS (see cupti_floor.c)
  gpuprof       gpuprof.profile() with its default CUDA capture
  gp:PARTS      gpuprof with GPUPROF_CUPTI_PARTS=PARTS (parts separated by '.')
  gpraw:PARTS   the same with CUPTI clearing its own buffers (GPUPROF_CUPTI_RAWBUF=1)

It prints ns per launch (median of the per-process medians) for each mode,
what each mode adds over `none`, and gpuprof's own work: its callbacks above
the floor of the same parts, the decoding of CUPTI's records (ns per record,
from gpuprof's own counters), and the window's end (flush, decode and
attribution) per launch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _gpu_common import build_floor, build_launch_loop, floor_bits  # noqa: E402

CHILD = r'''
import ctypes, json, os, statistics, sys, time
mode, lib_path, floor_path, batches = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
lib = ctypes.CDLL(lib_path)
BATCH = 256
buf = (ctypes.c_double * batches)()

def measure(driver):
    rc = lib.gp_launch_batches(batches, BATCH, driver, buf)
    if rc != 0:
        raise SystemExit(f"gp_launch_batches failed: CUDA error {rc}")
    return statistics.median(buf[i] for i in range(batches))

measure(0); measure(1)  # context creation, module load
out = {"mode": mode}
if mode == "none":
    out["runtime_ns"], out["driver_ns"] = measure(0), measure(1)
elif mode.startswith("floor:"):
    floor = ctypes.CDLL(floor_path)
    if floor.floor_start(int(mode[6:])) != 0:
        raise SystemExit("floor_start failed")
    out["runtime_ns"], out["driver_ns"] = measure(0), measure(1)
    floor.floor_stop()
else:
    if mode.startswith(("gp:", "gpraw:")):
        os.environ["GPUPROF_CUPTI_PARTS"] = mode.split(":", 1)[1].replace(".", ",")
        if mode.startswith("gpraw:"):
            os.environ["GPUPROF_CUPTI_RAWBUF"] = "1"
    import gpuprof
    from gpuprof import _gpuprof
    prof = gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU,
                                       gpuprof.ProfilerActivity.CUDA])
    prof.start()
    s0 = _gpuprof._cuda_stats()
    out["runtime_ns"], out["driver_ns"] = measure(0), measure(1)
    t0 = time.perf_counter_ns()
    prof.stop()
    out["stop_ns"] = time.perf_counter_ns() - t0
    s1 = _gpuprof._cuda_stats()
    ev = prof.gpu_events()
    out["kernels"] = int((ev["kind"] == "kernel").sum())
    out["launches"] = 2 * batches * BATCH
    out["decode_ns"] = s1["decode_ns"] - s0["decode_ns"]
    out["decoded_records"] = s1["decoded_records"] - s0["decoded_records"]
    out["parts"] = prof.results.cuda.get("parts", "")
    out["cuda_mode"] = prof.results.cuda.get("mode")
print("RESULT " + json.dumps(out))
'''


def run(mode, lib, floor, batches):
    r = subprocess.run([sys.executable, "-c", CHILD, mode, lib, floor or "", str(batches)],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"mode": mode, "error": (r.stderr or r.stdout)[-1500:]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7, help="interleaved rounds (default 7)")
    ap.add_argument("--batches", type=int, default=200, help="batches of 256 per measure")
    ap.add_argument("--modes", default="none,floor,gpuprof")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "bench_launch.json"))
    args = ap.parse_args()
    lib = build_launch_loop()
    floor = build_floor()
    modes = [m if m != "floor" else f"floor:{floor_bits()}" for m in args.modes.split(",")]
    if floor is None:
        modes = [m for m in modes if not m.startswith("floor:")]
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for rep in range(args.reps):
        order = modes[rep % len(modes):] + modes[:rep % len(modes)]
        for m in order:
            r = run(m, lib, floor, args.batches)
            if "error" in r:
                print(f"{m}: ERROR {r['error']}")
                continue
            runs[m].append(r)
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("runtime_ns", "driver_ns")}
           for m, rs in runs.items() if rs}
    base = med.get("none")
    print(f"\n{'mode':28s} {'runtime ns':>10s} {'+ns':>7s} {'driver ns':>10s} {'+ns':>7s}  n")
    for m, v in med.items():
        add_r = v["runtime_ns"] - base["runtime_ns"] if base else float("nan")
        add_d = v["driver_ns"] - base["driver_ns"] if base else float("nan")
        print(f"{m:28s} {v['runtime_ns']:10.0f} {add_r:7.0f} {v['driver_ns']:10.0f} {add_d:7.0f}"
              f"  {len(runs[m])}")
    for m, rs in runs.items():
        if not rs or "stop_ns" not in rs[0]:
            continue
        dec = statistics.median(r["decode_ns"] / max(r["decoded_records"], 1) for r in rs)
        end = statistics.median(r["stop_ns"] / max(r["launches"], 1) for r in rs)
        print(f"{m}: parts {rs[0]['parts']} ({rs[0]['cuda_mode']}), kernels {rs[0]['kernels']}"
              f" of {rs[0]['launches']} launches; decoding {dec:.0f} ns/record;"
              f" window end (flush + decode + attribution) {end:.0f} ns/launch")
        fl = f"floor:{floor_bits(rs[0]['parts'])}"
        if fl in med:
            print(f"  {m} above {fl}: runtime {med[m]['runtime_ns'] - med[fl]['runtime_ns']:.0f} ns,"
                  f" driver {med[m]['driver_ns'] - med[fl]['driver_ns']:.0f} ns per launch")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"medians": med, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
