"""What profiling costs a training step on the GPU: gpuprof beside torch.profiler and
the CUPTI floor, as ratios to the same step unprofiled.

    python benchmarks/bench_gpu.py [--reps 5] [--workloads mlp,gpt2,cupy,compute]
                                   [--modes none,floor,gpuprof_cpu,gpuprof,gpuprof_mem,torch]

Every (workload, mode) runs in its own process (one profiler's leftovers, such as
CUPTI staying attached after torch.profiler, never slow another mode down): a child
forked from this script after it imported the frameworks (imports take seconds; CUDA
is first touched in the child), or a fresh interpreter with --no-fork; and
the processes are interleaved: each of --reps rounds runs every mode once per
workload, in an order that rotates from round to round, so that the machine's
drift (about +-15% between processes on the H200 machine) spreads over all modes.
A process times each step (host clock around step + synchronize + prof.step()) in
--blocks pairs of an unprofiled block and a profiled block (its profiler started
before the block and stopped after it), so that the drift inside a process, as
large as 20% over seconds, falls on both halves of a pair. The report gives, per
mode, the paired ratio (the median over a process's pairs of profiled over
unprofiled block medians: drift between and inside processes cancels), median and
min over the processes, and the ratio across processes (the mode's per-process
medians against the `none` processes'). torch.profiler runs one long block: it
leaves CUPTI attached after its window, which would slow the unprofiled blocks.

Workloads:
  mlp      launch-bound: 16 x Linear(256)+ReLU, batch 64, SGD (133 kernels a step)
  gpt2     a transformer training step: Hugging Face GPT-2 (4 layers, n_embd 512,
           batch 8 x 256 tokens, bf16 autocast, AdamW) when `transformers` imports,
           else a hand-built block of the same shape
  cupy     CuPy elementwise loop: 20 x tanh(y * a + b) over 65,536 floats
  compute  compute-bound: 4 x Linear(4096)+GELU, batch 8192, fp32, SGD
Modes:
  none         no profiler
  floor        CUPTI with do-nothing handlers (benchmarks/cupti_floor.c) switching on
               the parts gpuprof's default switches on (gpuprof.cuda_status()["parts"])
  floor:BITS   the floor with other parts (bits in cupti_floor.c)
  cpu+floor:BITS  gpuprof's Python capture (CPU only) with the floor under it: what the
               two cost together when none of gpuprof's CUDA handlers run
  gpuprof_cpu  gpuprof, Python calls only
  gpuprof      gpuprof, CPU + CUDA (the default)
  gpuprof_mem  gpuprof, CPU + CUDA + profile_memory=True
  gpuprof_wait gpuprof under a schedule that is still waiting (WAIT-phase steps)
  gpuprof_nobwd  gpuprof's default with autograd_nodes=False (docs/backward.md)
  gpuprof_noseq  autograd node ranges without the forward join (PyTorch's sequence
               counter left unread): with gpuprof_nobwd, what each part costs
  gp:PARTS     gpuprof with GPUPROF_CUPTI_PARTS=PARTS ('.'-separated), for the decision table
  gpraw:PARTS  the same with CUPTI clearing its buffers itself (GPUPROF_CUPTI_RAWBUF=1)
  gpenv:NAME=VALUE  gpuprof's default with one environment variable set
  gpuprof_aten   gpuprof's default with aten_ops=True (a row per ATen op; docs/aten.md)
  gpuprof_shapes gpuprof's default with record_shapes=True, with_flops=True (the shapes
               asked for on the window's first step, reused on the others)
  gpuprof_shapes_every  the same with reuse_shapes=False (the shapes on every step)
  torch        torch.profiler, CPU + CUDA
  torch_shapes torch.profiler with record_shapes=True, with_flops=True
Besides the step ratio it reports the step after the profiler stopped (lingering
cost), the time from the window's end to a printed table (first round only for
torch.profiler, whose post-processing takes seconds), kernels per step and the
share of kernel time attributed to a Python op.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _gpu_common import build_floor, floor_bits, mlp_step  # noqa: E402


def _workload(wl):
    """(step, sync, description) for a workload, built on the GPU."""
    if wl == "cupy":
        import cupy as cp

        xs = cp.random.rand(1 << 16, dtype=cp.float32)

        def step():
            y = xs
            for _ in range(20):
                y = cp.tanh(y * 1.0001 + 0.5)
            return y

        return step, cp.cuda.Device().synchronize, "cupy elementwise"
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if wl in ("mlp", "compute"):
        width, depth, batch, act = (
            (256, 16, 64, torch.nn.ReLU) if wl == "mlp" else (4096, 4, 8192, torch.nn.GELU)
        )
        step = mlp_step(torch, "cuda", width, depth, batch, act)
        return step, torch.cuda.synchronize, f"{depth} x Linear({width}), batch {batch}, SGD"
    return _gpt2(torch)


def _gpt2(torch):
    vocab, seq, batch = 50257, 256, 8
    try:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=4, n_embd=512, n_head=8, n_positions=seq, vocab_size=vocab)
        model = GPT2LMHeadModel(cfg).cuda()
        what = "transformers GPT2LMHeadModel, 4 layers, n_embd 512, batch 8 x 256, bf16, AdamW"

        def loss_of(ids):
            return model(input_ids=ids, labels=ids).loss
    except ImportError:
        nn = torch.nn

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.ln1, self.ln2 = nn.LayerNorm(512), nn.LayerNorm(512)
                self.attn = nn.MultiheadAttention(512, 8, batch_first=True)
                self.mlp = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))

            def forward(self, x, mask):
                h = self.ln1(x)
                x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
                return x + self.mlp(self.ln2(x))

        emb, pos = nn.Embedding(vocab, 512), nn.Embedding(seq, 512)
        blocks = nn.ModuleList(Block() for _ in range(4))
        head = nn.Linear(512, vocab, bias=False)
        model = nn.ModuleList([emb, pos, blocks, head]).cuda()
        mask = torch.triu(torch.full((seq, seq), float("-inf"), device="cuda"), 1)
        what = "hand-built GPT-2-shaped block (transformers is not installed)"

        def loss_of(ids):
            x = emb(ids) + pos(torch.arange(seq, device="cuda"))
            for b in blocks:
                x = b(x, mask)
            logits = head(x)
            return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())

    ids = torch.randint(0, vocab, (batch, seq), device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(ids)
        loss.backward()
        opt.step()

    return step, torch.cuda.synchronize, what


class _Session:
    """Starts and stops one mode's profiler around each profiled block of a process."""

    def __init__(self, mode, floor_lib, steps):
        self.mode, self.steps, self.prof = mode, steps, None
        self.floor = None
        if mode.startswith(("floor:", "cpu+floor:")):
            import ctypes

            self.floor = ctypes.CDLL(floor_lib)

    def begin(self):
        m = self.mode
        if self.floor is not None and self.floor.floor_start(int(m.split(":")[1])) != 0:
            raise RuntimeError("floor_start failed")
        if m == "none" or m.startswith("floor:"):
            return
        if m in ("torch", "torch_shapes"):
            from torch.profiler import ProfilerActivity, profile

            shapes = m == "torch_shapes"
            self.prof = profile(
                activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                record_shapes=shapes,
                with_flops=shapes,
            )
            self.prof.__enter__()
            return
        import gpuprof

        acts = [gpuprof.ProfilerActivity.CPU]
        if m != "gpuprof_cpu" and not m.startswith("cpu+floor:"):
            acts.append(gpuprof.ProfilerActivity.CUDA)
        # gpuprof_wait: a schedule still waiting for its first window (every step WAIT)
        sched = gpuprof.schedule(wait=10 * self.steps, warmup=0, active=1)
        if m == "gpuprof_noseq":  # node ranges, but no forward join (the counter unread)
            from gpuprof.record import _autograd

            _autograd.seq_peek_address = lambda torch: 0
        self.prof = gpuprof.profile(
            activities=acts,
            autograd_nodes=(m != "gpuprof_nobwd"),
            profile_memory=(m == "gpuprof_mem"),
            max_events=50_000_000,
            schedule=sched if m == "gpuprof_wait" else None,
            aten_ops=(m == "gpuprof_aten"),
            record_shapes=m.startswith("gpuprof_shapes"),
            with_flops=m.startswith("gpuprof_shapes"),
            reuse_shapes=(m != "gpuprof_shapes_every"),
        )
        self.prof.start()

    def end(self, want_table):
        """Stop; with want_table also print the table (timed: window end to table)."""
        t0 = time.perf_counter()
        table = None
        if self.mode.startswith("torch"):
            self.prof.__exit__(None, None, None)
            if want_table:
                table = self.prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=10)
        elif self.prof is not None:
            self.prof.stop()
            if want_table and self.mode != "gpuprof_wait":
                cuda = self.mode not in ("gpuprof_cpu",) and not self.mode.startswith("cpu+")
                table = self.prof.key_averages().table(
                    sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                    row_limit=10,
                )
        seconds = time.perf_counter() - t0
        if self.floor is not None:
            self.floor.floor_stop()
        return table, seconds


def measure(wl, mode, steps, want_table, floor_lib, blocks=1):
    """One (workload, mode) measurement; runs in a process of its own: `blocks` pairs of
    an unprofiled block and a profiled block of `steps` steps (the profiler started
    before and stopped after each profiled block), then a block after the last stop."""
    if mode.startswith("gpenv:"):  # gpuprof's default under one environment variable
        name, value = mode.split(":", 1)[1].split("=", 1)
        os.environ[name] = value
    if mode.startswith(("gp:", "gpraw:")):
        os.environ["GPUPROF_CUPTI_PARTS"] = mode.split(":", 1)[1].replace(".", ",")
        if mode.startswith("gpraw:"):
            os.environ["GPUPROF_CUPTI_RAWBUF"] = "1"
    if mode.startswith("torch"):  # one block: CUPTI stays attached after torch.profiler's window
        steps, blocks = steps * blocks, 1
    step, sync, what = _workload(wl)
    # warm-up as long as a measured phase: with 30 steps the second unprofiled phase
    # of a `none` process still ran ~6% faster than the first (clocks, allocator)
    for _ in range(max(30, steps * blocks)):
        step()
    sync()

    def run(n, prof=None):
        times = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            step()
            sync()
            if prof is not None:
                prof.step()
            times.append(time.perf_counter_ns() - t0)
        return times

    out = {"workload": wl, "mode": mode, "steps": steps, "what": what}
    out["base_ns"], out["step_ns"], out["pairs"] = [], [], []
    session = _Session(mode, floor_lib, steps)
    for b in range(blocks):
        base = run(steps)  # this process unprofiled: the paired baseline
        session.begin()
        profiled = run(steps, session.prof)
        last = b == blocks - 1
        # torch.profiler's post-processing takes seconds: its table once per workload
        table, seconds = session.end(last and (want_table or mode.startswith(("gp", "cpu+"))))
        out["base_ns"] += base
        out["step_ns"] += profiled
        out["pairs"].append(statistics.median(profiled) / statistics.median(base))
    if table is not None:
        out["window_to_table_s"] = seconds
    prof = session.prof
    if mode.startswith("torch") and want_table:
        # CUDA-side events minus copies, memsets and the GPU-side copy of each
        # ProfilerStep#N range (a user annotation, one per step, not a kernel)
        out["kernels"] = len(
            [
                e
                for e in prof.events()
                if e.device_type.name == "CUDA"
                and not e.name.startswith(("Memcpy", "Memset"))
                and not getattr(e, "is_user_annotation", False)
            ]
        )
    elif mode.startswith("gp") and mode != "gpuprof_wait":
        res = prof.results
        out["cuda"] = res.cuda
        if mode != "gpuprof_cpu":
            ev = prof.gpu_events()
            out["kernels"] = int((ev["kind"] == "kernel").sum())
            out["attributed"] = res.attributed_gpu_fraction
            out["dropped_gpu"] = res.dropped_gpu_records
            out["backward"] = res.backward_summary()
        out["dropped_events"] = res.dropped_events
        if want_table:
            out["table"] = table
            out["diagnosis"] = str(prof.diagnose())
    out["after_ns"] = run(steps)
    return out


def _cuda_initialized() -> bool:
    """Whether this process has initialized CUDA (then forked children could not use
    it). Importing torch maps libcuda but initializes nothing; with
    PYTORCH_NVML_BASED_CUDA_CHECK=1 neither does torch.cuda.is_available()."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def preload(workloads) -> bool:
    """Import the frameworks once in the parent so that each forked child starts
    with them (imports take seconds; CUDA is only touched in the children). False
    when an import touched the CUDA driver: then children are fresh interpreters."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import gpuprof  # noqa: F401  (never touches CUDA at import)

    if any(w != "cupy" for w in workloads):
        import torch  # noqa: F401
        import torch.profiler  # noqa: F401
    if "gpt2" in workloads:
        try:
            import transformers  # noqa: F401
            from transformers import GPT2Config, GPT2LMHeadModel  # noqa: F401
        except ImportError:
            pass
    if _cuda_initialized():
        print("bench_gpu: an import initialized CUDA in the parent; children start afresh")
        return False
    return True


def run_child(wl, mode, steps, want_table, floor_lib, fork, blocks, timeout=600):
    """measure() in a new process: forked from this one (frameworks already
    imported), or a fresh interpreter."""
    if not fork:
        r = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                wl,
                mode,
                str(steps),
                "1" if want_table else "0",
                floor_lib or "",
                str(blocks),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")),
        )
        for line in r.stdout.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        return {"workload": wl, "mode": mode, "error": (r.stderr or r.stdout)[-2000:]}
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(rfd)
        try:
            payload = json.dumps(measure(wl, mode, steps, want_table, floor_lib, blocks))
        except BaseException as e:  # noqa: BLE001
            import traceback

            payload = json.dumps(
                {
                    "workload": wl,
                    "mode": mode,
                    "error": "".join(traceback.format_exception(e))[-2000:],
                }
            )
        with os.fdopen(wfd, "w") as f:
            f.write(payload)
        os._exit(0)  # no atexit, no CUPTI teardown of a profiler left attached
    os.close(wfd)
    with os.fdopen(rfd) as f:
        data = f.read()
    os.waitpid(pid, 0)
    try:
        return json.loads(data)
    except ValueError:
        return {"workload": wl, "mode": mode, "error": f"child died: {data[-500:]!r}"}


STEPS = {"mlp": 100, "gpt2": 20, "cupy": 100, "compute": 8}
# gpuprof_nobwd: autograd_nodes=False (the backward pass one call); gpuprof_noseq: node
# ranges without the forward join (docs/backward.md, "Cost")
MODES = ["none", "floor", "gpuprof_cpu", "gpuprof", "gpuprof_mem", "torch"]
EXTRA_MODES = [
    "gpuprof_nobwd",
    "gpuprof_noseq",
    "gpuprof_wait",
    "gpuprof_aten",
    "gpuprof_shapes",
    "gpuprof_shapes_every",
    "torch_shapes",
]


def summarize(results, workloads, modes):
    """Per workload and mode: the median and min of per-process median step times,
    as ratios to none's."""
    rows = []
    for wl in workloads:
        per = {
            m: [r for r in results if r["workload"] == wl and r["mode"] == m and "step_ns" in r]
            for m in modes
        }
        meds = {m: [statistics.median(r["step_ns"]) for r in rs] for m, rs in per.items() if rs}
        if "none" not in meds:
            continue
        base_med = statistics.median(meds["none"])
        base_min = min(meds["none"])
        paired = {m: [statistics.median(r["pairs"]) for r in rs] for m, rs in per.items() if rs}
        after_base = statistics.median(statistics.median(r["after_ns"]) for r in per["none"])
        for m, ms in meds.items():
            afters = [statistics.median(r["after_ns"]) for r in per[m] if r.get("after_ns")]
            first = next((r for r in per[m] if "window_to_table_s" in r), {})
            k = [r["kernels"] for r in per[m] if "kernels" in r]
            att = [r["attributed"] for r in per[m] if "attributed" in r]
            rows.append(
                {
                    "workload": wl,
                    "mode": m,
                    "n": len(ms),
                    "step_ms": statistics.median(ms) / 1e6,
                    "ratio_median": statistics.median(ms) / base_med,
                    "ratio_min": min(ms) / base_min,
                    "paired_median": statistics.median(paired[m]),
                    "paired_min": min(paired[m]),
                    "after_ratio": statistics.median(afters) / after_base if afters else None,
                    "to_table_s": first.get("window_to_table_s"),
                    "kernels_per_step": (statistics.median(k) / per[m][0]["steps"]) if k else None,
                    "attributed": min(att) if att else None,
                    "what": per[m][0].get("what", ""),
                }
            )
    return rows


def print_rows(rows):
    print(
        "\nratios to `none`: paired = each process's profiled steps over its own unprofiled"
        " steps\n(median and min over processes); across = against the `none` processes"
    )
    print(
        f"\n{'workload':9s} {'mode':26s} {'n':>2s} {'step ms':>8s} {'paired':>7s} {'min':>7s}"
        f" {'across':>7s} {'min':>7s} {'after':>6s} {'table s':>8s} {'k/step':>7s}"
        f" {'attrib':>7s}"
    )
    for r in rows:
        after = f"{r['after_ratio']:.3f}" if r["after_ratio"] else "-"
        tt = f"{r['to_table_s']:.3f}" if r["to_table_s"] is not None else "-"
        ks = f"{r['kernels_per_step']:.1f}" if r["kernels_per_step"] else "-"
        att = f"{100 * r['attributed']:.2f}%" if r["attributed"] is not None else "-"
        print(
            f"{r['workload']:9s} {r['mode']:26s} {r['n']:2d} {r['step_ms']:8.3f}"
            f" {r['paired_median']:6.3f}x {r['paired_min']:6.3f}x"
            f" {r['ratio_median']:6.3f}x {r['ratio_min']:6.3f}x {after:>6s} {tt:>8s}"
            f" {ks:>7s} {att:>7s}"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--workloads", default="mlp,gpt2,cupy,compute")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument(
        "--steps-scale",
        type=float,
        default=1.0,
        help="multiply each workload's step count (default 1)",
    )
    ap.add_argument("--json", default=os.path.join(HERE, "results", "bench_gpu.json"))
    ap.add_argument(
        "--no-fork",
        action="store_true",
        help="start every measurement as a fresh interpreter instead of forking "
        "one that has imported the frameworks",
    )
    ap.add_argument(
        "--blocks",
        type=int,
        default=5,
        help="unprofiled/profiled block pairs per process (default 5); each block has "
        "the workload's steps divided by this, at least 5",
    )
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        wl, mode, steps, want, floor_lib, blocks = args.child
        sys.path.insert(0, os.path.join(ROOT, "python"))
        r = measure(wl, mode, int(steps), want == "1", floor_lib, int(blocks))
        print("RESULT " + json.dumps(r))
        return
    workloads = args.workloads.split(",")
    floor_lib = build_floor()
    modes = []
    for m in args.modes.split(","):
        if m in ("floor", "cpu+floor"):
            m = f"{m}:{floor_bits()}"
        if "floor:" in m and floor_lib is None:
            continue
        modes.append(m)
    fork = not args.no_fork and preload(workloads)
    meta = {
        "python": sys.version.split()[0],
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "reps": args.reps,
        "floor_default_bits": floor_bits() if floor_lib else None,
        "forked": fork,
        "blocks": args.blocks,
    }
    meta["commit"] = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    results = []
    t_start = time.time()
    for rep in range(args.reps):
        for wl in workloads:
            order = modes[rep % len(modes) :] + modes[: rep % len(modes)]
            for mode in order:
                steps = max(5, int(STEPS[wl] * args.steps_scale) // args.blocks)
                # torch.profiler's table only once, on the first workload
                want = rep == 0 and (not mode.startswith("torch") or wl == workloads[0])
                r = run_child(wl, mode, steps, want, floor_lib, fork, args.blocks)
                r["rep"] = rep
                results.append(r)
                if "error" in r:
                    print(f"{wl} {mode}: ERROR {r['error'][-600:]}", flush=True)
        rows = summarize(results, workloads, modes)
        with open(args.json, "w") as f:  # after every round: a cut-off run keeps its rounds
            json.dump({"meta": meta, "summary": rows, "results": results}, f, indent=1)
        print(f"round {rep + 1}/{args.reps} done at {time.time() - t_start:.0f} s", flush=True)
    meta["seconds"] = round(time.time() - t_start)
    for r in results:
        if r.get("mode") == "gpuprof" and r.get("workload") == workloads[0] and "table" in r:
            print("\n" + r["table"])
            print(r["diagnosis"])
    try:
        import torch

        meta["torch"] = torch.__version__
        meta["gpu"] = torch.cuda.get_device_name(0)  # the parent touches CUDA only now
    except Exception as e:  # noqa: BLE001
        meta["torch_error"] = repr(e)
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "summary": rows, "results": results}, f, indent=1)
    print(f"\n{meta}")
    for wl in workloads:
        what = next((r["what"] for r in rows if r["workload"] == wl), "")
        print(f"{wl}: {what}")
    print_rows(rows)


if __name__ == "__main__":
    main()
