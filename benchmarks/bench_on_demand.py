"""What arming for on-demand capture costs a training loop that is not being captured.

    python benchmarks/bench_on_demand.py [--reps 7] [--steps 400] [--device cpu|cuda]
                                         [--workloads mlp,python] [--modes plain,armed,env,after]
                                         [--threads 1] [--json PATH] [--quick] [--per-step-only]

Each (workload, mode) runs in a process of its own, and the processes are
interleaved: each of --reps rounds runs every mode once per workload, in an order
that rotates from round to round, so that the machine's drift spreads over all
modes. A process runs --warmup steps, then times --steps steps one by one (host
clock around the step and, on CUDA, a synchronize) and reports the median.

Workloads (the programs know nothing of gpuprof):
  mlp     the launch-bound step of bench_gpu.py: 16 x Linear(256)+ReLU, batch 64, SGD,
          on --device (on the CPU, PyTorch's CPU kernels run the same step); steps are
          its optimizer steps, found through PyTorch's optimizer-step hook
  python  a pure-Python step (a tokenizer and a sum over 4,000 items); steps are the
          returns of train_step (`--step-fn __main__:train_step`)
Modes:
  plain   python child.py
  armed   python -m gpuprof run --on-demand child.py
  env     GPUPROF_ON_DEMAND=1, gpuprof's start-up folder on PYTHONPATH, python child.py
          (mlp only: a function of the script cannot be named before the script runs)
  after   armed, and the child has itself captured 5 steps (OnDemand.capture) before the
          timed steps: what remains once a capture has ended

The children run with PYTHONHASHSEED=0 (string hashing, which decides how the python
workload's dict collides, otherwise moves a process's step time by +-15% from one
seed to the next) and MALLOC_MMAP_THRESHOLD_=131072, glibc's default made fixed:
otherwise glibc raises its mmap threshold after the first large free (a capture frees
its event buffers), after which PyTorch's CPU steps run 20-25% faster here, which
`after` would credit to gpuprof (--no-fixed-malloc shows it).

Process-level ratios carry the machine's noise (tens of percent between processes
on a shared machine), so the script first measures, in its own process, against the
same call unarmed in alternating blocks (arm() before each armed block, disarm()
after): the mlp step itself, and what arming adds to an optimizer step (at a
shallow and a deep stack) and to a --step-fn call (see _per_step_cost).
--per-step-only stops there.

The report then gives, per workload and mode, the median over processes of each
process's median step time, its ratio to `plain` (and the same for each process's
10th percentile, which other load disturbs less), and the paired ratios (each
round's process against that round's `plain` process): median, min and max. Each
armed process also reports that it was armed, the steps it found, whether a profile
hook was set while it was timed, and whether gpuprof had loaded CUPTI (only `after`
may have: a capture loads it, and it stays loaded, detached, once the capture
ends); the table's last column says so. Results go to
benchmarks/results/bench_on_demand.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _gpu_common import mlp_step  # noqa: E402
from _runinfo import run_info  # noqa: E402

CHILD = r"""
import json, os, statistics, sys, time
workload, device, steps, warmup, capture_first = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                                  int(sys.argv[4]), sys.argv[5] == "1")

if workload == "mlp":
    import torch
    from _gpu_common import mlp_step  # benchmarks/ is on the child's PYTHONPATH

    step = mlp_step(torch, device, seed=0)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
else:
    WORDS = ("alpha beta gamma delta " * 1000).split()
    sync = lambda: None

    def train_step(words):
        counts = {}
        for w in words:
            counts[w] = counts.get(w, 0) + len(w)
        return sum(counts.values())

    def step():
        train_step(WORDS)

for _ in range(warmup):
    step()
sync()
gp = sys.modules.get("gpuprof")
od = gp.api.ondemand.armed() if gp is not None else None
if capture_first:
    import tempfile
    req = od.capture(steps=5, output=tempfile.mkdtemp(prefix="bench-on-demand-"))
    while not req.done:
        step()
    sync()
    assert req.wait(0)["ok"], req.wait(0)
times = []
hooked = False
for _ in range(steps):
    t0 = time.perf_counter_ns()
    step()
    sync()
    times.append(time.perf_counter_ns() - t0)
    hooked = hooked or sys.getprofile() is not None
mon = getattr(sys, "monitoring", None)
hooked = hooked or (mon is not None and mon.get_tool(mon.PROFILER_ID) is not None)
print(json.dumps({
    "median_ns": statistics.median(times), "mean_ns": statistics.fmean(times),
    "p10_ns": statistics.quantiles(times, n=10)[0],
    "armed": od is not None, "found": od.found if od is not None else None,
    "hook": hooked,
    # gpuprof's own loader state (cuda_status() would load libcupti to answer)
    "cupti_loaded": bool(gp._gpuprof.cuda_info()["loaded"]) if gp is not None else False,
}))
"""


def _command(child: str, workload: str, mode: str, args) -> tuple[list[str], dict]:
    # one hash seed for all: string hashing decides how the python workload's dict
    # collides, which moves a process's step time by +-15% from one seed to another
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONHASHSEED="0")
    if args.fixed_malloc:
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "python"), HERE]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.pop("GPUPROF_ON_DEMAND", None)
    tail = [
        child,
        workload,
        args.device,
        str(args.steps),
        str(args.warmup),
        "1" if mode == "after" else "0",
    ]
    if mode == "plain":
        return [sys.executable, *tail], env
    if mode == "env":
        sys.path.insert(0, os.path.join(ROOT, "python"))
        from gpuprof.cli.boot import BOOT_DIR

        env["GPUPROF_ON_DEMAND"] = "1"
        env["PYTHONPATH"] = os.pathsep.join([BOOT_DIR, env["PYTHONPATH"]])
        return [sys.executable, *tail], env
    step_fn = ["--step-fn", "__main__:train_step"] if workload == "python" else []
    return [sys.executable, "-m", "gpuprof", "run", "--on-demand", *step_fn, *tail], env


def _run(child: str, workload: str, mode: str, args) -> dict:
    cmd, env = _command(child, workload, mode, args)
    with tempfile.TemporaryDirectory(prefix="bench-on-demand-rt-") as rt:
        os.chmod(rt, 0o700)
        env["GPUPROF_RUNTIME_DIR"] = rt
        r = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=1800, cwd=tempfile.gettempdir()
        )
    if r.returncode != 0:
        raise SystemExit(f"{workload}/{mode} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _at_depth(depth: int, fn):
    """fn() called ``depth`` Python frames down (the optimizer hook walks the stack)."""
    if depth <= 0:
        return fn()
    return _at_depth(depth - 1, fn)


def _blocks(fn, calls: int, depth: int) -> int:
    def run():
        for _ in range(calls):
            fn()

    t0 = time.perf_counter_ns()
    _at_depth(depth, run)
    return time.perf_counter_ns() - t0


def _bench_step_fn():
    return None


def _mlp_step(torch, device: str):
    """The launch-bound step, synchronized."""
    step = mlp_step(torch, device, seed=0)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def synced():
        step()
        sync()

    return synced


def _timed_steps(step, n: int) -> list[int]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        step()
        out.append(time.perf_counter_ns() - t0)
    return out


def _per_step_cost(
    device: str = "cpu",
    threads: int = 1,
    blocks: int = 15,
    calls: int = 20_000,
    ab_blocks: int = 20,
    ab_steps: int = 25,
) -> dict:
    """What arming adds to one step, in this process, against the same call unarmed in
    alternating blocks (arm() before each armed block, disarm() after it):

    - PyTorch's optimizer step of a one-parameter SGD, at a shallow and a deep call
      stack (the hook looks up the stack for an enclosing optimizer step), and a
      --step-fn function with its wrapper: the fastest block of each (other load on
      the machine only ever adds time), armed minus bare, in ns;
    - the benchmark's mlp step: the ratio of armed to bare block medians (and of the
      fastest steps of the blocks), per pair of blocks; the median and quartiles.
    """
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import gpuprof

    def fastest(bare_fn, armed_fn, depth: int, step_fn: str | None = None) -> dict:
        """The fastest block of each, bare and armed blocks alternating; ``armed_fn()``
        gives the function to call once armed."""
        bare, armed, found = math.inf, math.inf, 0
        for _ in range(blocks):
            bare = min(bare, _blocks(bare_fn, calls, depth) / calls)
            od = gpuprof.arm(signal=None, step_fn=step_fn)
            armed = min(armed, _blocks(armed_fn(), calls, depth) / calls)
            found = od.found
            gpuprof.disarm()
        return {
            "bare_ns": bare,
            "armed_ns": armed,
            "added_ns": armed - bare,
            "steps_found_per_block": found,
        }

    out: dict = {}
    with tempfile.TemporaryDirectory() as rt:
        os.chmod(rt, 0o700)
        os.environ["GPUPROF_RUNTIME_DIR"] = rt
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
            for depth in (5, 60):
                out[f"optimizer_step_depth{depth}"] = fastest(opt.step, lambda: opt.step, depth)
            torch.set_num_threads(threads)
            step = _mlp_step(torch, device)
            _timed_steps(step, 30)
            ratios, fastest_ratios, bare_all = [], [], []
            for _ in range(ab_blocks):
                bare = _timed_steps(step, ab_steps)
                od = gpuprof.arm(signal=None)
                armed = _timed_steps(step, ab_steps)
                assert od.found == ab_steps, od.found
                gpuprof.disarm()
                ratios.append(statistics.median(armed) / statistics.median(bare))
                fastest_ratios.append(min(armed) / min(bare))
                bare_all += bare
            q = statistics.quantiles(ratios, n=4)
            out["mlp_step_alternating"] = {
                "bare_ns": statistics.median(bare_all),
                "ratio": statistics.median(ratios),
                "ratio_q1": q[0],
                "ratio_q3": q[2],
                "blocks": ab_blocks,
                "steps": ab_steps,
                "fastest_ratio": statistics.median(fastest_ratios),
            }
        main = sys.modules["__main__"]
        bare = main._bench_step_fn  # arm() replaces it by its wrapper, of this function
        out["step_fn_wrapper"] = fastest(
            bare, lambda: main._bench_step_fn, 5, "__main__:_bench_step_fn"
        )
        os.environ.pop("GPUPROF_RUNTIME_DIR", None)
    return out


def _modes_for(workload: str, modes: list[str]) -> list[str]:
    return [m for m in modes if not (m == "env" and workload == "python")]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=7, help="rounds (processes per mode), >= 5")
    p.add_argument("--steps", type=int, default=400, help="timed steps per process")
    p.add_argument("--warmup", type=int, default=30, help="untimed steps first")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the children")
    p.add_argument("--workloads", default="mlp,python")
    p.add_argument("--modes", default="plain,armed,env,after")
    p.add_argument("--json", default=os.path.join(HERE, "results", "bench_on_demand.json"))
    p.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds of 40 steps")
    p.add_argument(
        "--no-fixed-malloc",
        dest="fixed_malloc",
        action="store_false",
        help="leave glibc's mmap threshold dynamic in the children",
    )
    p.add_argument(
        "--per-step-only",
        action="store_true",
        help="only the in-process cost per step, no processes",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.reps, args.steps, args.warmup = 2, 40, 5
    workloads = args.workloads.split(",")
    modes = args.modes.split(",")
    if "plain" not in modes:
        raise SystemExit("--modes must include plain (the baseline)")
    if args.reps < 5 and not args.quick:
        print("note: fewer than 5 rounds; medians of so few processes are noisy", file=sys.stderr)
    out = {
        **run_info("bench_on_demand"),
        "machine": platform.node(),
        "python": sys.version.split()[0],
        "device": args.device,
        "reps": args.reps,
        "steps": args.steps,
        "threads": args.threads,
        "fixed_malloc": args.fixed_malloc,
        "results": {},
    }
    small = {"blocks": 3, "calls": 2000, "ab_blocks": 4, "ab_steps": 5} if args.quick else {}
    cost = out["per_step_cost"] = _per_step_cost(args.device, args.threads, **small)
    print(
        "what arming adds to each step, timed in this process against the same call "
        "unarmed, in alternating blocks:"
    )
    for name, c in cost.items():
        if "added_ns" in c:
            print(
                f"  {name:<24} {c['bare_ns']:>9.0f} ns bare, +{c['added_ns']:.0f} ns armed "
                "(fastest blocks)"
            )
        else:
            print(
                f"  {name:<24} {c['bare_ns'] / 1e3:>9.1f} us bare, armed/bare {c['ratio']:.4f}"
                f" (quartiles {c['ratio_q1']:.4f}-{c['ratio_q3']:.4f} over {c['blocks']} "
                f"pairs of {c['steps']}-step blocks; fastest steps {c['fastest_ratio']:.4f})"
            )
    if args.per_step_only:
        _write(out, args.json)
        return 0
    with tempfile.NamedTemporaryFile("w", suffix="_bench_child.py", delete=False) as f:
        f.write(CHILD)
        child = f.name
    rows: dict = {(w, m): [] for w in workloads for m in _modes_for(w, modes)}
    try:
        for rnd in range(args.reps):
            for w in workloads:
                order = _modes_for(w, modes)
                k = rnd % len(order)
                for m in order[k:] + order[:k]:
                    rows[(w, m)].append(_run(child, w, m, args))
            print(f"round {rnd + 1}/{args.reps} done", file=sys.stderr)
    finally:
        os.unlink(child)

    print(
        f"\nmedian step time per process, median over {args.reps} processes per mode "
        f"({args.device}, OMP_NUM_THREADS={args.threads})"
    )
    print(
        f"{'workload':<8} {'mode':<6} {'step':>10} {'ratio':>7} {'p10 ratio':>9} "
        f"{'paired med':>10} {'paired min':>10} {'paired max':>10}  checks"
    )
    for w in workloads:
        base = [r["median_ns"] for r in rows[(w, "plain")]]
        base10 = [r["p10_ns"] for r in rows[(w, "plain")]]
        for m in _modes_for(w, modes):
            med = [r["median_ns"] for r in rows[(w, m)]]
            paired = [a / b for a, b in zip(med, base)]
            ratio = statistics.median(med) / statistics.median(base)
            ratio10 = statistics.median([r["p10_ns"] for r in rows[(w, m)]]) / statistics.median(
                base10
            )
            checks = "-"
            if m != "plain":
                armed = all(r["armed"] and r["found"] for r in rows[(w, m)])
                hook = any(r["hook"] for r in rows[(w, m)])
                cupti = any(r["cupti_loaded"] for r in rows[(w, m)])
                checks = (
                    ("armed, steps found" if armed else "NOT ARMED")
                    + (", HOOK SEEN" if hook else ", no hook")
                    + (
                        ", CUPTI loaded (detached after the capture)"
                        if cupti and m == "after"
                        else ", CUPTI LOADED"
                        if cupti
                        else ", no CUPTI"
                    )
                )
            print(
                f"{w:<8} {m:<6} {statistics.median(med) / 1e3:>8.1f}us {ratio:>7.3f} "
                f"{ratio10:>9.3f} {statistics.median(paired):>10.3f} {min(paired):>10.3f} "
                f"{max(paired):>10.3f}  {checks}"
            )
            out["results"][f"{w}/{m}"] = {
                "processes": rows[(w, m)],
                "ratio": ratio,
                "p10_ratio": ratio10,
                "paired": paired,
            }
    _write(out, args.json)
    return 0


def _write(out: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
