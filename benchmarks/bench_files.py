"""Sizes and write times of the files ``python -m gpuprof run --output DIR`` writes, and
how long Ctrl-C takes to end such a run.

The workload is a training-like CPU loop of many short steps, tests/scripts/long_loop.py
(a forward and a backward pass through four small pure-Python layers, about 20 calls a
step), its steps ended by ``--step-fn __main__:train_step``; optionally PyTorch's CPU
loop tests/scripts/torch_loop.py (AdamW; steps from the optimizer, run's default). For
each step count, ``run --no-cuda -o DIR`` runs twice: with the default trace budget
(``--trace-max-events 1000000``) and with ``--trace-max-events 0`` (every event). Each
run is under ``GPUPROF_PROGRESS=1``, whose stderr lines give the time of closing the
recorded window and of writing each file; the script adds the size of each file, the
events of the trace, and the wall time of the whole command next to the program alone.

Then the interrupt: the loop started for 10^9 steps, SIGINT ``--interrupt-after`` seconds
after it printed that it steps; the time from the signal to the command's exit, and the
files it wrote.

    PYTHONPATH=python python3 benchmarks/bench_files.py [--steps 1000,100000,300000]
        [--torch-steps 1000] [--interrupt-after 6] [--json PATH]

Prints a Markdown table; writes JSON (default benchmarks/results/bench_files.json).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _runinfo import run_info  # noqa: E402

LOOP = os.path.join(ROOT, "tests", "scripts", "long_loop.py")
TORCH_LOOP = os.path.join(ROOT, "tests", "scripts", "torch_loop.py")
SUFFIXES = {".pt.trace.json.gz": "trace", ".gpuprof": "saved", ".stacks.txt": "stacks"}
DONE = re.compile(r"gpuprof: (?:writing|saving) (\S+): done in ([\d.]+) s")
CLOSED = re.compile(r"gpuprof: closed the recorded window \(([\d,]+) events\) in ([\d.]+) s")


def _env() -> dict:
    env = dict(os.environ, GPUPROF_PROGRESS="1", PYTHONHASHSEED="0")
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    return env


def _kind(path: str) -> str:
    if os.path.basename(path) == "report.html":
        return "html"
    return next(k for s, k in SUFFIXES.items() if path.endswith(s))


def _files(out: str, stderr: str) -> dict:
    """Per file kind: its size, and its write time from the progress lines."""
    times = {_kind(p): float(t) for p, t in DONE.findall(stderr)}
    files = {}
    for path in glob.glob(os.path.join(out, "*")):
        if path.endswith(".tmp"):
            continue
        kind = _kind(path)
        files[kind] = {"bytes": os.path.getsize(path), "write_s": times.get(kind)}
        if kind == "trace":
            with gzip.open(path, "rt") as f:
                doc = json.load(f)
            files[kind]["events"] = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X")
            files[kind]["omitted_events"] = doc.get("gpuprof_omitted_events", 0)
    return files


def _gpuprof_cmd(out: str, target: list[str], budget: int) -> list[str]:
    step_fn = ["--step-fn", "__main__:train_step"] if target[0] == LOOP else []
    return [
        sys.executable,
        "-m",
        "gpuprof",
        "run",
        "--no-cuda",
        *step_fn,
        "--trace-max-events",
        str(budget),
        "-o",
        out,
        *target,
    ]


def measure(target: list[str], budget: int, tmp: str) -> dict:
    out = tempfile.mkdtemp(dir=tmp)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *target], env=_env(), capture_output=True, check=True)
    alone = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = subprocess.run(
        _gpuprof_cmd(out, target, budget), env=_env(), capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(target)} failed:\n{r.stderr}")
    closed = CLOSED.search(r.stderr)
    row = {
        "program_s": round(alone, 2),
        "run_s": round(wall, 2),
        "recorded_events": int(closed.group(1).replace(",", "")) if closed else None,
        "close_s": float(closed.group(2)) if closed else None,
        "files": _files(out, r.stderr),
    }
    shutil.rmtree(out)
    return row


def interrupt(after: float, tmp: str) -> dict:
    out = tempfile.mkdtemp(dir=tmp)
    proc = subprocess.Popen(
        _gpuprof_cmd(out, [LOOP, "1000000000"], 1_000_000),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout.readline() == "stepping\n"
    time.sleep(after)
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    exit_s = time.perf_counter() - t0
    closed = CLOSED.search(err)
    row = {
        "returncode": proc.returncode,
        "after_s": after,
        "exit_s": round(exit_s, 2),
        "recorded_events": int(closed.group(1).replace(",", "")) if closed else None,
        "files": _files(out, err),
    }
    shutil.rmtree(out)
    return row


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def table(rows: list[dict]) -> str:
    head = (
        "| workload | steps | --trace-max-events | recorded events | trace (events) "
        "| .gpuprof | .stacks.txt | report.html | close + writes | run / program alone |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        f = r["files"]
        writes = (r["close_s"] or 0) + sum(v["write_s"] or 0 for v in f.values())
        tr = f["trace"]
        lines.append(
            f"| {r['workload']} | {r['steps']:,} | {r['budget'] or 'all'} "
            f"| {r['recorded_events']:,} "
            f"| {_mb(tr['bytes'])} ({tr['events']:,}; {tr['omitted_events']:,} left out) "
            f"| {_mb(f['saved']['bytes'])} | {_mb(f['stacks']['bytes'])} "
            f"| {_mb(f['html']['bytes'])} "
            f"| {writes:.2f} s | {r['run_s']:.1f} s / {r['program_s']:.1f} s |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", default="1000,100000,300000", help="step counts of the loop")
    p.add_argument("--torch-steps", type=int, default=1000, help="0: no PyTorch loop")
    p.add_argument("--interrupt-after", type=float, default=6.0, help="0: no interrupt")
    p.add_argument("--json", default=os.path.join(HERE, "results", "bench_files.json"))
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-files-") as tmp:
        for steps in (int(s) for s in args.steps.split(",")):
            for budget in (1_000_000, 0):
                row = measure([LOOP, str(steps)], budget, tmp)
                rows.append(dict(row, workload="long_loop.py", steps=steps, budget=budget))
                print(f"long_loop.py {steps} steps, budget {budget}: done", file=sys.stderr)
        if args.torch_steps:
            try:
                import torch  # noqa: F401
            except ImportError:
                print("PyTorch is not installed: no torch_loop.py row", file=sys.stderr)
            else:
                target = [TORCH_LOOP, "adamw", str(args.torch_steps)]
                row = measure(target, 1_000_000, tmp)
                rows.append(
                    dict(
                        row,
                        workload="torch_loop.py adamw",
                        steps=args.torch_steps,
                        budget=1_000_000,
                    )
                )
        stop = interrupt(args.interrupt_after, tmp) if args.interrupt_after else None
    print(table(rows))
    if stop is not None:
        f = stop["files"]
        print(
            f"\nCtrl-C {stop['after_s']:g} s into the loop: exit code {stop['returncode']}, "
            f"exited {stop['exit_s']:.2f} s after the signal; {stop['recorded_events']:,} "
            "events recorded; files: "
            + ", ".join(f"{k} {_mb(v['bytes'])} ({v['write_s']} s)" for k, v in f.items())
        )
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"run": run_info("bench_files"), "rows": rows, "interrupt": stop}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
