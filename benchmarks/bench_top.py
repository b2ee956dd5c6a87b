"""What `python -m gpuprof top PID` costs the job it watches, as a step-time ratio.

    python benchmarks/bench_top.py [--device cuda|cpu] [--procs 5] [--blocks 6] [--block-s 8]
                                   [--top-args="--overhead 1"] [--skip-s 0] [--threads 1]
                                   [--json PATH]

Each of --procs processes is a job armed with `python -m gpuprof run --on-demand`
that runs the launch-bound step of bench_gpu.py (16 x Linear(256)+ReLU, batch 64,
SGD) on --device (default cuda when PyTorch sees a GPU, else cpu), timing every
step on the host clock (around the step and, on CUDA, a synchronize). The
processes run one after the other. After --warmup steps, a job runs --blocks blocks
of about --block-s seconds each: nobody watches the even blocks (0, 2, ...); during
the odd ones this script runs `python -m gpuprof top PID` beside it, with top's
default refresh and --top-args, stdout a file (so one line per interval), and stops
it with SIGINT (Ctrl-C) at the block's end.

Block boundaries: this script decides them, and the job reads the current block
number from a shared 8-byte file (mmap) before every step and charges the step to
that block. A watched block starts before top is started and ends once top has
exited: top's interpreter start-up, its first answers, its first sample (which
makes the job import gpuprof's analysis and, on a GPU, load CUPTI, once per job)
and its exit (a sample in flight cancelled, the job idle again) all fall inside
it, and none of it can leak into the next unwatched block. By default no step is
dropped, so top's start-up counts as part of its cost; --skip-s S drops the first
S seconds of every block (both kinds) to see the steady state alone. An 8 s watch is
a short one: top does not pace its first sample of a process, and the second comes
a refresh later (docs/on-demand.md, "How it samples"), so over 8 s the samples take
more than top's --overhead; a longer --block-s measures a longer watch.

Per process the report gives:
  steps      timed steps (unwatched + watched blocks)
  w/o top    median step time over the unwatched blocks
  with top   median step time over the watched blocks
  median     with top / w/o top: what top does to the typical step
  mean       the same ratio of mean step times: what the job loses in throughput,
             the sampled steps (a step under the profile hook, its start, stop and
             summary) and top's start-up included; this is the figure to set against
             top's own estimate, and the noisier one (other load adds outliers)
  1st, later the mean ratio of the first pair of blocks (unwatched, watched) alone,
             which pays the one-time costs above, and of the later pairs
  sampled    steps top sampled, by its farewell lines (its interval lines, summed,
             are in the JSON: they miss a sample that ends after the last one) / steps
             the job itself saw under a profile hook in the watched blocks (one more
             where top left during a sample, which is then dropped)
  top says   top's farewell line: the share of the job's time it reckoned its samples
             took, the mean over the watched blocks
  checks     the job was armed and counted its steps, and no hook was seen in the
             unwatched blocks
Then the median and min/max over processes of the median and mean ratios. The
script fails (exit 1, with the process's stderr) when a job was not armed, top
exited with an error, or a watched block had no step sampled.

The children run with PYTHONHASHSEED=0 and MALLOC_MMAP_THRESHOLD_=131072, as in
bench_on_demand.py (left dynamic, glibc raises its mmap threshold after the first
large free, such as a sample's event buffers, after which PyTorch's CPU step runs
20-25% faster, which would be credited to top), and OMP_NUM_THREADS=--threads.
Results go to --json after every process: per block, every step time in ns, and
everything top printed.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import re
import shlex
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _gpu_common import mlp_step  # noqa: E402
from _runinfo import run_info  # noqa: E402

ARMED = re.compile(r"gpuprof: armed: `python -m gpuprof capture (\d+)`")
SAMPLED = re.compile(r"; sampled (\d+) (?:of \d+ )?steps in the last ")
FAREWELL = re.compile(r"gpuprof: top: .*; (\d+) steps? sampled, which cost about ([\d.]+)% of")
READY = "bench_top child: ready"


class BenchError(Exception):
    """A run that cannot be measured: what went wrong, for the user."""


# -- the job (runs under `python -m gpuprof run --on-demand`) ----------------------------------
def _hooked() -> bool:
    """Whether a profile hook is set now, as a top sample sets it (3.12+: sys.monitoring)."""
    if sys.getprofile() is not None:
        return True
    mon = getattr(sys, "monitoring", None)
    return mon is not None and mon.get_tool(mon.PROFILER_ID) is not None


def child(args) -> int:
    import torch

    gp = sys.modules.get("gpuprof")
    od = gp.api.ondemand.armed() if gp is not None else None
    if od is None:
        print("bench_top child: not armed for on-demand capture", file=sys.stderr)
        return 3
    step = mlp_step(torch, args.device, seed=0)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for _ in range(args.warmup):
        step()
    sync()
    times: list[list[int]] = [[] for _ in range(args.blocks)]
    hooked = [0] * args.blocks
    with open(args.control, "r+b") as f:
        control = mmap.mmap(f.fileno(), 8)
    print(READY, flush=True)
    while True:
        block = struct.unpack_from("<q", control)[0]  # -1 before the first block
        if block >= args.blocks:
            break
        t0 = time.perf_counter_ns()
        step()
        sync()
        dt = time.perf_counter_ns() - t0
        if block >= 0:
            times[block].append(dt)
            # a sample's hook is set at the boundary inside opt.step() and removed at
            # the next one: set here after exactly the step it records
            hooked[block] += _hooked()
    result = {
        "times_ns": times,
        "hooked": hooked,
        "found": od.found,
        "cupti_loaded": bool(gp._gpuprof.cuda_info()["loaded"]),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
    }
    with open(args.result, "w") as f:
        json.dump(result, f)
    return 0


# -- one process: the job, and top beside it in the odd blocks ---------------------------------
def _env(args, runtime: str) -> dict:
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(args.threads),
        PYTHONHASHSEED="0",
        MALLOC_MMAP_THRESHOLD_="131072",
        GPUPROF_RUNTIME_DIR=runtime,  # a private folder: top sees this job only
        PYTHONUNBUFFERED="1",
    )
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "python"), HERE]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.pop("GPUPROF_ON_DEMAND", None)
    return env


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def _tail(path: str, n: int = 3000) -> str:
    return _read(path)[-n:] if os.path.exists(path) else ""


class Job:
    """The armed job of one process, started in ``tmp``, with its control file."""

    def __init__(self, args, tmp: str, env: dict):
        self.args, self.tmp = args, tmp
        self.out, self.err = os.path.join(tmp, "job.out"), os.path.join(tmp, "job.err")
        self.result = os.path.join(tmp, "result.json")
        control = os.path.join(tmp, "control")
        with open(control, "wb") as f:
            f.write(struct.pack("<q", -1))
        with open(control, "r+b") as f:
            self.control = mmap.mmap(f.fileno(), 8)
        cmd = [sys.executable, "-m", "gpuprof", "run", "--on-demand", os.path.abspath(__file__)]
        cmd += ["--child", "--device", args.device, "--blocks", str(args.blocks)]
        cmd += ["--warmup", str(args.warmup), "--control", control, "--result", self.result]
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=tmp
            )
        self.pid: int | None = None

    def fail(self, what: str) -> BenchError:
        return BenchError(f"{what}; the job's stderr:\n{_tail(self.err)}")

    def wait_ready(self, timeout: float) -> int:
        """Wait until the job says it is armed and has warmed up; its pid."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise self.fail(f"the job exited with {self.proc.returncode} before its blocks")
            m = ARMED.search(_read(self.err))
            if m and READY in _read(self.out):
                self.pid = int(m.group(1))
                if self.pid != self.proc.pid:
                    raise self.fail(f"armed as pid {self.pid}, started as {self.proc.pid}")
                return self.pid
            time.sleep(0.1)
        raise self.fail(f"the job was not armed and warm within {timeout:g} s")

    def set_block(self, block: int) -> None:
        struct.pack_into("<q", self.control, 0, block)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise self.fail(f"the job exited with {self.proc.returncode} during the blocks")

    def finish(self, timeout: float) -> dict:
        """Tell the job to stop, wait for it, and return what it measured."""
        self.set_block(self.args.blocks)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise self.fail(f"the job did not end within {timeout:g} s of being told to") from None
        if rc != 0:
            raise self.fail(f"the job exited with {rc}")
        with open(self.result) as f:
            return json.load(f)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _sleep_until(deadline: float, job: Job, top: subprocess.Popen | None = None) -> None:
    """Sleep until ``deadline``, failing as soon as the job (or top) exits early."""
    while time.monotonic() < deadline:
        job.check_alive()
        if top is not None and top.poll() is not None:
            return  # top left by itself: _watched says why
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def _unwatched(job: Job, args) -> dict:
    t0 = time.monotonic()
    _sleep_until(t0 + args.block_s, job)
    return {"watched": False, "wall_s": time.monotonic() - t0}


def _watched(job: Job, args, env: dict, block: int) -> dict:
    """Run top beside the job for one block, stop it with SIGINT, and read what it said."""
    out = os.path.join(job.tmp, f"top{block}.out")
    err = os.path.join(job.tmp, f"top{block}.err")
    cmd = [sys.executable, "-m", "gpuprof", "top", str(job.pid), *shlex.split(args.top_args)]
    t0 = time.monotonic()
    with open(out, "w") as fo, open(err, "w") as fe:
        top = subprocess.Popen(cmd, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, env=env)
    try:
        _sleep_until(t0 + args.block_s, job, top)
        left_early = top.poll() is not None
        stopped = time.monotonic()
        top.send_signal(signal.SIGINT)
        rc = top.wait(timeout=args.top_exit_timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(
            f"top did not exit within {args.top_exit_timeout:g} s of SIGINT; its stderr:\n"
            f"{_tail(err)}"
        ) from None
    finally:
        if top.poll() is None:
            top.kill()
            top.wait()
    lines, stderr = _read(out).splitlines(), _read(err)
    if rc != 0 or left_early:
        raise BenchError(f"top exited with {rc} during block {block}; its stderr:\n{stderr}")
    return {
        "watched": True,
        "wall_s": time.monotonic() - t0,
        "exit_s": time.monotonic() - stopped,
        "command": cmd,
        "lines": lines,
        "stderr": stderr,
        **_top_said(lines, stderr, block),
    }


def _top_said(lines: list[str], stderr: str, block: int) -> dict:
    """The steps top printed it sampled, and its farewell's count and cost estimate."""
    m = FAREWELL.search(stderr)
    if m is None:
        raise BenchError(f"top printed no farewell line in block {block}; its stderr:\n{stderr}")
    printed = sum(int(s.group(1)) for ln in lines for s in [SAMPLED.search(ln)] if s)
    return {"printed_samples": printed, "samples": int(m.group(1)), "cost_pct": float(m.group(2))}


def run_process(args) -> dict:
    """One job through its blocks; the raw numbers of each block."""
    with tempfile.TemporaryDirectory(prefix="bench-top-") as tmp:
        runtime = os.path.join(tmp, "runtime")
        os.mkdir(runtime, 0o700)
        env = _env(args, runtime)
        job = Job(args, tmp, env)
        try:
            job.wait_ready(args.start_timeout)
            blocks = []
            for b in range(args.blocks):
                job.set_block(b)
                blocks.append(_watched(job, args, env, b) if b % 2 else _unwatched(job, args))
            measured = job.finish(timeout=60)
            for b, block in enumerate(blocks):
                block.update(steps_ns=measured["times_ns"][b], hooked=measured["hooked"][b])
            _check(measured, blocks, job)
        finally:
            job.kill()
    del measured["times_ns"]  # in the blocks now
    return {"pid": job.pid, "blocks": blocks, **measured}


def _check(measured: dict, blocks: list[dict], job: Job) -> None:
    timed = sum(len(b["steps_ns"]) for b in blocks)
    if measured["found"] < timed:
        raise job.fail(f"the job counted {measured['found']} steps, fewer than the {timed} timed")
    for b, block in enumerate(blocks):
        if block["watched"] and not (block["samples"] and block["hooked"]):
            raise BenchError(
                f"top sampled no step in block {b} (top: {block['samples']}, the job saw "
                f"{block['hooked']} under a hook); a longer --block-s may help. top's "
                f"stderr:\n{block['stderr']}"
            )


# -- the report ----------------------------------------------------------------------------------
def _kept(steps: list[int], skip_s: float) -> list[int]:
    """The block's steps after its first ``skip_s`` seconds (of summed step time)."""
    if skip_s <= 0:
        return steps
    out, clock = [], 0
    for dt in steps:
        clock += dt
        if clock > skip_s * 1e9:
            out.append(dt)
    return out


def _ratios(blocks: list[dict], skip_s: float) -> dict:
    def pool(watched: bool, which) -> list[int]:
        return [
            t
            for b, block in enumerate(blocks)
            if block["watched"] == watched and which(b)
            for t in _kept(block["steps_ns"], skip_s)
        ]

    def mean_ratio(which) -> float | None:
        w, u = pool(True, which), pool(False, which)
        return statistics.fmean(w) / statistics.fmean(u) if w and u else None

    def everything(b: int) -> bool:
        return True

    unwatched, watched = pool(False, everything), pool(True, everything)
    return {
        "steps": len(unwatched) + len(watched),
        "without_ns": statistics.median(unwatched),
        "with_ns": statistics.median(watched),
        "median_ratio": statistics.median(watched) / statistics.median(unwatched),
        "mean_ratio": mean_ratio(everything),
        "first_pair_mean_ratio": mean_ratio(lambda b: b < 2),
        "later_pairs_mean_ratio": mean_ratio(lambda b: b >= 2),
    }


def summarize(proc: dict, skip_s: float) -> dict:
    watched = [b for b in proc["blocks"] if b["watched"]]
    return {
        **_ratios(proc["blocks"], skip_s),
        "printed_samples": sum(b["printed_samples"] for b in watched),
        "top_samples": sum(b["samples"] for b in watched),
        "job_hooked": sum(b["hooked"] for b in watched),
        "baseline_hooked": sum(b["hooked"] for b in proc["blocks"] if not b["watched"]),
        "top_cost_pct": statistics.fmean(b["cost_pct"] for b in watched),
        "top_exit_s": max(b["exit_s"] for b in watched),
        "found": proc["found"],
    }


HEAD = (
    f"{'proc':>4} {'steps':>6} {'w/o top':>9} {'with top':>9} {'median':>7} {'mean':>7} "
    f"{'1st':>7} {'later':>7} {'sampled':>9} {'top says':>8}  checks"
)


def _ratio(r: float | None) -> str:
    return f"{r:.3f}x" if r is not None else "-"


def row(k: int, s: dict) -> str:
    checks = f"armed, {s['found']} steps found, " + (
        "baseline hook-free"
        if not s["baseline_hooked"]
        else f"HOOK SEEN IN {s['baseline_hooked']} UNWATCHED STEPS"
    )
    return (
        f"{k:>4} {s['steps']:>6} {s['without_ns'] / 1e6:>7.3f}ms {s['with_ns'] / 1e6:>7.3f}ms "
        f"{_ratio(s['median_ratio']):>7} {_ratio(s['mean_ratio']):>7} "
        f"{_ratio(s['first_pair_mean_ratio']):>7} {_ratio(s['later_pairs_mean_ratio']):>7} "
        f"{s['top_samples']:>4}/{s['job_hooked']:<4} {s['top_cost_pct']:>7.2f}%  {checks}"
    )


def overall(summaries: list[dict]) -> dict:
    def spread(key: str) -> dict:
        vals = [s[key] for s in summaries if s[key] is not None]
        return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}

    return {
        "median_ratio": spread("median_ratio"),
        "mean_ratio": spread("mean_ratio"),
        "later_pairs_mean_ratio": spread("later_pairs_mean_ratio")
        if any(s["later_pairs_mean_ratio"] for s in summaries)
        else None,
        "top_cost_pct": spread("top_cost_pct"),
    }


def print_overall(o: dict, n: int) -> None:
    def fmt(d: dict, pct: bool = False) -> str:
        if pct:
            return f"{d['median']:.2f}% (min {d['min']:.2f}%, max {d['max']:.2f}%)"
        return f"{d['median']:.3f}x (min {d['min']:.3f}x, max {d['max']:.3f}x)"

    print(f"\npaired ratios, with top / without, over {n} processes:")
    print(f"  median step   {fmt(o['median_ratio'])}")
    print(f"  mean step     {fmt(o['mean_ratio'])}")
    if o["later_pairs_mean_ratio"]:
        print(f"  mean, later   {fmt(o['later_pairs_mean_ratio'])}")
    print(f"  top's own estimate of its cost: {fmt(o['top_cost_pct'], pct=True)}")


def print_top_output(proc: dict) -> None:
    """What top printed in a process's first watched block: its first and last
    lines, and its farewell."""
    block = next(b for b in proc["blocks"] if b["watched"])
    print("\nwhat top printed in process 1's first watched block (first and last line, farewell):")
    for text in [block["lines"][0], block["lines"][-1], *block["stderr"].strip().splitlines()]:
        print("  " + text)


# -- the command ---------------------------------------------------------------------------------
def _default_device() -> str:
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    p.add_argument("--procs", type=int, default=5, help="processes, one after the other (>= 5)")
    p.add_argument("--blocks", type=int, default=6, help="blocks per process; top in the odd ones")
    p.add_argument("--block-s", type=float, default=8.0, help="seconds per block (default 8)")
    p.add_argument("--warmup", type=int, default=50, help="untimed steps before the blocks")
    p.add_argument("--skip-s", type=float, default=0.0, help="drop each block's first S seconds")
    p.add_argument(
        "--top-args",
        default="",
        help='more arguments for gpuprof top, as one string: --top-args="--overhead 5"',
    )
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the job")
    p.add_argument("--start-timeout", type=float, default=300.0, help="for a job to be armed")
    p.add_argument("--top-exit-timeout", type=float, default=30.0, help="for top to leave")
    p.add_argument("--json", default=os.path.join(HERE, "results", "bench_top.json"))
    # the job's side (this script, run by `python -m gpuprof run --on-demand`)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--control", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.child:
        return child(args)
    args.device = args.device or _default_device()
    if args.blocks < 2 or args.block_s < 2:
        raise SystemExit("--blocks must be at least 2 and --block-s at least 2 s")
    out = {
        **run_info("bench_top"),
        "machine": platform.node(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        **{k: getattr(args, k) for k in ("device", "procs", "blocks", "block_s", "warmup")},
        **{k: getattr(args, k) for k in ("skip_s", "top_args", "threads")},
        "processes": [],
    }
    print(
        f"bench_top: {args.procs} processes x {args.blocks} blocks of {args.block_s:g} s, "
        f"`gpuprof top PID {args.top_args}` in the odd blocks ({args.device}, "
        f"OMP_NUM_THREADS={args.threads}, {os.cpu_count()} CPUs)"
        + ("; fewer than 5 processes: their median is noisy" if args.procs < 5 else "")
        + f"\n\n{HEAD}",
        flush=True,
    )
    summaries = []
    for k in range(args.procs):
        try:
            proc = run_process(args)
        except BenchError as e:
            print(f"bench_top: process {k + 1}: {e}", file=sys.stderr)
            return 1
        proc["summary"] = summarize(proc, args.skip_s)
        summaries.append(proc["summary"])
        out["processes"].append(proc)
        print(row(k + 1, proc["summary"]), flush=True)
        _write(out, args.json)  # after every process: a cut-off run keeps its processes
    out["overall"] = overall(summaries)
    out["gpu"] = out["processes"][0].get("gpu")
    print_overall(out["overall"], len(summaries))
    print_top_output(out["processes"][0])
    _write(out, args.json)
    print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


def _write(out: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
