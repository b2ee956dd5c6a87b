"""What one kernel launch costs the launching thread, and what gpuprof adds to it.

    python benchmarks/bench_launch.py [--reps 7] [--modes none,floor,gpuprof] [--json PATH]

Empty kernels are launched from C (benchmarks/launch_loop.cu, built here with
nvcc) in batches of 256, through the runtime (<<<>>>) and through the driver
(cuLaunchKernel); after each batch an untimed synchronize drains the queue, so
the figure is the host's own time per launch, without Python in the loop.

Every process (--reps of them) measures every mode --rounds times, in an order that
rotates between processes; gpuprof and the floor detach CUPTI when they stop, so the
modes do not leak into each other. Modes:
  none          no profiler
  floor         CUPTI with do-nothing handlers (benchmarks/cupti_floor.c), same
                parts as gpuprof's default (read from gpuprof.cuda_status())
  floor:BITS    the floor with the parts BITS (see cupti_floor.c)
  gpuprof       gpuprof.profile() with its default CUDA capture
  gp:PARTS      gpuprof with GPUPROF_CUPTI_PARTS=PARTS (parts separated by '.')
  gpraw:PARTS   the same with CUPTI clearing its own buffers (GPUPROF_CUPTI_RAWBUF=1)

It prints ns per launch for each mode (median over processes of each process's
median), what each mode adds over `none` measured in the same process (paired, so the
+-15% drift between processes cancels), and gpuprof's own work: its callbacks above
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

CHILD = r"""
import ctypes, json, os, statistics, sys, time
modes, lib_path, floor_path = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
batches, rounds = int(sys.argv[4]), int(sys.argv[5])
lib = ctypes.CDLL(lib_path)
floor = ctypes.CDLL(floor_path) if floor_path else None
BATCH = 256
buf = (ctypes.c_double * batches)()

def measure(driver):
    rc = lib.gp_launch_batches(batches, BATCH, driver, buf)
    if rc != 0:
        raise SystemExit(f"gp_launch_batches failed: CUDA error {rc}")
    return statistics.median(buf[i] for i in range(batches))

measure(0); measure(1)  # context creation, module load
import gpuprof
from gpuprof import _gpuprof
out = {m: {"runtime_ns": [], "driver_ns": []} for m in modes}
for rnd in range(rounds):
    for mode in modes:
        o = out[mode]
        if mode == "none":
            o["runtime_ns"].append(measure(0)); o["driver_ns"].append(measure(1))
        elif mode.startswith("floor:"):
            if floor.floor_start(int(mode[6:])) != 0:
                raise SystemExit("floor_start failed")
            o["runtime_ns"].append(measure(0)); o["driver_ns"].append(measure(1))
            floor.floor_stop()
        else:
            os.environ.pop("GPUPROF_CUPTI_RAWBUF", None)
            os.environ.pop("GPUPROF_CUPTI_PARTS", None)
            if mode.startswith(("gp:", "gpraw:")):
                os.environ["GPUPROF_CUPTI_PARTS"] = mode.split(":", 1)[1].replace(".", ",")
                if mode.startswith("gpraw:"):
                    os.environ["GPUPROF_CUPTI_RAWBUF"] = "1"
            prof = gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU,
                                               gpuprof.ProfilerActivity.CUDA])
            prof.start()
            s0 = _gpuprof._cuda_stats()
            o["runtime_ns"].append(measure(0)); o["driver_ns"].append(measure(1))
            t0 = time.perf_counter_ns()
            prof.stop()
            o.setdefault("stop_ns", []).append(time.perf_counter_ns() - t0)
            s1 = _gpuprof._cuda_stats()
            ev = prof.gpu_events()
            k = ev[ev["kind"] == "kernel"]
            o["kernels"] = int(len(k))
            o["attributed"] = float((k["op"] >= 0).mean()) if len(k) else 0.0
            o["launches"] = 2 * batches * BATCH
            o.setdefault("decode_ns_per_record", []).append(
                (s1["decode_ns"] - s0["decode_ns"]) / max(s1["decoded_records"]
                                                          - s0["decoded_records"], 1))
            o["parts"] = prof.results.cuda.get("parts", "")
            o["cuda_mode"] = prof.results.cuda.get("mode")
print("RESULT " + json.dumps(out))
"""


def run(modes, lib, floor, batches, rounds):
    r = subprocess.run(
        [sys.executable, "-c", CHILD, ",".join(modes), lib, floor or "", str(batches), str(rounds)],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")),
    )
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (r.stderr or r.stdout)[-1500:]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7, help="processes (default 7)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every mode per process")
    ap.add_argument("--batches", type=int, default=100, help="batches of 256 per measure")
    ap.add_argument("--modes", default="none,floor,gpuprof")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "bench_launch.json"))
    args = ap.parse_args()
    lib = build_launch_loop()
    floor = build_floor()
    modes = [m if m != "floor" else f"floor:{floor_bits()}" for m in args.modes.split(",")]
    if floor is None:
        modes = [m for m in modes if not m.startswith("floor:")]
    procs = []
    for rep in range(args.reps):
        order = modes[rep % len(modes) :] + modes[: rep % len(modes)]
        r = run(order, lib, floor, args.batches, args.rounds)
        if "error" in r:
            print(f"process {rep}: ERROR {r['error']}")
            continue
        procs.append(r)
    if not procs:
        raise SystemExit("no process finished")
    # Per process and mode: the median over rounds; then, per mode, the median over
    # processes of the absolute figure and of the difference to `none` in the same
    # process (paired, so that the drift between processes cancels).
    table = {}
    for m in modes:
        row = {}
        for key in ("runtime_ns", "driver_ns"):
            per = [statistics.median(p[m][key]) for p in procs]
            row[key] = statistics.median(per)
            if "none" in modes:
                row["added_" + key] = statistics.median(
                    statistics.median(p[m][key]) - statistics.median(p["none"][key]) for p in procs
                )
        table[m] = row
    print(f"\n{len(procs)} processes x {args.rounds} rounds, {args.batches} x 256 launches each")
    print(f"{'mode':30s} {'runtime ns':>10s} {'added':>7s} {'driver ns':>10s} {'added':>7s}")
    for m, v in table.items():
        print(
            f"{m:30s} {v['runtime_ns']:10.0f} {v.get('added_runtime_ns', 0):7.0f}"
            f" {v['driver_ns']:10.0f} {v.get('added_driver_ns', 0):7.0f}"
        )
    for m in modes:
        p0 = procs[0][m]
        if "stop_ns" not in p0:
            continue
        dec = statistics.median(x for p in procs for x in p[m]["decode_ns_per_record"])
        end = statistics.median(x for p in procs for x in p[m]["stop_ns"]) / p0["launches"]
        print(
            f"{m}: parts {p0['parts']} ({p0['cuda_mode']}); {p0['kernels']} kernels of "
            f"{p0['launches']} launches, {100 * p0['attributed']:.1f}% attributed; decoding "
            f"{dec:.0f} ns/record; window end (flush + decode + attribution) {end:.0f} ns/launch"
        )
        fl = f"floor:{floor_bits(p0['parts'])}"
        if fl in modes:
            d = {
                key: statistics.median(
                    statistics.median(p[m][key]) - statistics.median(p[fl][key]) for p in procs
                )
                for key in ("runtime_ns", "driver_ns")
            }
            print(
                f"  above {fl} (paired): runtime {d['runtime_ns']:.0f} ns,"
                f" driver {d['driver_ns']:.0f} ns per launch"
            )
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"table": table, "processes": procs}, f, indent=1)


if __name__ == "__main__":
    main()
