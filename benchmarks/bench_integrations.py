#!/usr/bin/env python3
"""Cost over a whole run of gpuprof's Lightning profiler recording one batch in N.

A Lightning ``Trainer.fit`` on the CPU, or with ``--accelerator gpu`` on one GPU
(an MLP 32-256-256-1 on an in-memory dataset, batch 64, AdamW,
``self.log("loss")`` every batch into a CSVLogger) runs ``--batches`` training
batches in each of these modes:

- ``base``: no profiler (Lightning's PassThroughProfiler);
- ``gpuprof``: ``GpuprofProfiler(schedule=gpuprof.schedule(wait=N-2, warmup=1,
  active=1))``, one batch in N recorded (``--every N``, default 100), its step
  metrics logged to the CSVLogger, files written at the end;
- ``simple``: Lightning's ``SimpleProfiler`` (a peer: action timings only);
- ``pytorch``: Lightning's ``PyTorchProfiler`` with
  ``torch.profiler.schedule(wait=N-2, warmup=1, active=1)`` (a peer; it writes a
  trace per window).

Each run is a fresh process; runs are interleaved (the mode order rotates from
one repeat to the next) so that drift and other load spread over every mode.
Per run three times are taken: the whole ``fit()`` call, and the training loop
alone (from the first training batch to the end of training, by a callback that
every mode has) as wall-clock time and as the process's CPU time. On a machine
shared with other work the CPU time is the steadier figure: time spent
descheduled does not count. Reported: medians over the repeats, each mode's
median over base's, and the median of the ratios of each repeat (a mode's run
over the base run of the same repeat, which ran next to it).

    PYTHONPATH=python python3 benchmarks/bench_integrations.py [--batches N] [--every N]
        [--repeats N] [--modes base,gpuprof,simple,pytorch] [--accelerator cpu|gpu]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO / "python") not in sys.path:
    sys.path.insert(0, str(REPO / "python"))

MODES = ("base", "gpuprof", "simple", "pytorch")


def child(mode: str, batches: int, every: int, accelerator: str, folder: str) -> dict:
    """One fit in this process; returns its times."""
    import lightning as L
    import torch
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Regressor(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(32, 256),
                torch.nn.ReLU(),
                torch.nn.Linear(256, 256),
                torch.nn.ReLU(),
                torch.nn.Linear(256, 1),
            )

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class LoopTimer(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == 0 and batch_idx == 0:
                self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_train_end(self, trainer, pl_module):
            if accelerator == "gpu":
                torch.cuda.synchronize()  # the GPU work queued by the last batches
            self.t1, self.c1 = time.perf_counter(), time.process_time()

    profiler = None
    if mode == "gpuprof":
        import gpuprof
        from gpuprof.integrations.lightning import GpuprofProfiler

        profiler = GpuprofProfiler(schedule=gpuprof.schedule(wait=every - 2, warmup=1, active=1))
    elif mode == "simple":
        from lightning.pytorch.profilers import SimpleProfiler

        profiler = SimpleProfiler()
    elif mode == "pytorch":
        from lightning.pytorch.profilers import PyTorchProfiler

        profiler = PyTorchProfiler(
            schedule=torch.profiler.schedule(wait=every - 2, warmup=1, active=1)
        )
    data = TensorDataset(torch.randn(64 * 256, 32), torch.randn(64 * 256, 1))
    timer = LoopTimer()
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        max_steps=batches,
        profiler=profiler,
        logger=CSVLogger(folder),
        log_every_n_steps=50,
        callbacks=[timer],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    t0 = time.perf_counter()
    trainer.fit(Regressor(), DataLoader(data, batch_size=64, shuffle=True))
    fit_s = time.perf_counter() - t0
    out = {
        "mode": mode,
        "fit_s": fit_s,
        "loop_s": timer.t1 - timer.t0,
        "loop_cpu_s": timer.c1 - timer.c0,
        "batches": trainer.global_step,
    }
    if mode == "gpuprof":
        out["recorded_steps"] = int(len(profiler.steps()))
    return out


def run_child(mode: str, batches: int, every: int, accelerator: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(REPO / "python"), os.environ.get("PYTHONPATH", "")]),
        )
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                mode,
                "--batches",
                str(batches),
                "--every",
                str(every),
                "--accelerator",
                accelerator,
                "--folder",
                folder,
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=folder,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} run failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--every", type=int, default=100, help="record one batch in EVERY (>= 3)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--accelerator", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--modes", default="base,gpuprof,simple,pytorch")
    ap.add_argument("--json", default=str(HERE / "results" / "bench_integrations.json"))
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.batches, a.every, a.accelerator, a.folder)))
        return
    if a.every < 3:
        ap.error(f"--every must be >= 3 (a wait, a warm-up and a recorded batch), got {a.every}")
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or "base" not in modes:
        ap.error(f"--modes: choose from {', '.join(MODES)}, base included; got {a.modes!r}")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(a.repeats):
        order = modes[r % len(modes) :] + modes[: r % len(modes)]
        for m in order:
            res = run_child(m, a.batches, a.every, a.accelerator)
            runs[m].append(res)
            print(
                f"repeat {r + 1}/{a.repeats} {m:8s} fit {res['fit_s']:.3f} s, loop "
                f"{res['loop_s']:.3f} s, loop CPU {res['loop_cpu_s']:.3f} s",
                flush=True,
            )
    keys = ("fit_s", "loop_s", "loop_cpu_s")
    med = {m: {k: statistics.median(x[k] for x in runs[m]) for k in keys} for m in modes}
    paired = {
        m: {k: statistics.median(x[k] / b[k] for x, b in zip(runs[m], runs["base"])) for k in keys}
        for m in modes
    }
    print(
        f"\n{a.batches} batches on {a.accelerator}, one in {a.every} recorded; medians of "
        f"{a.repeats} interleaved processes per mode (ratio: over base; paired: median of "
        f"the repeats' ratios)"
    )
    print(
        f"{'mode':8s} {'fit (s)':>8s} {'ratio':>6s} {'loop (s)':>9s} {'ratio':>6s} "
        f"{'paired':>6s} {'loop CPU (s)':>12s} {'ratio':>6s} {'paired':>6s}"
    )
    for m in modes:
        b = med["base"]
        print(
            f"{m:8s} {med[m]['fit_s']:8.3f} {med[m]['fit_s'] / b['fit_s']:6.3f} "
            f"{med[m]['loop_s']:9.3f} {med[m]['loop_s'] / b['loop_s']:6.3f} "
            f"{paired[m]['loop_s']:6.3f} {med[m]['loop_cpu_s']:12.3f} "
            f"{med[m]['loop_cpu_s'] / b['loop_cpu_s']:6.3f} {paired[m]['loop_cpu_s']:6.3f}"
        )
    import lightning
    import torch

    sys.path.insert(0, str(HERE))
    from _runinfo import run_info

    doc = {
        **run_info("bench_integrations"),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "accelerator": a.accelerator,
        "batches": a.batches,
        "every": a.every,
        "repeats": a.repeats,
        "runs": runs,
        "median": med,
        "ratio": {m: {k: med[m][k] / med["base"][k] for k in med[m]} for m in modes},
        "paired_ratio": paired,
    }
    os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
