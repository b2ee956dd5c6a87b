"""``python -m gpuprof demo``: profile a small bundled training loop and explain it.

With PyTorch and a CUDA GPU it trains an MLP on the GPU; otherwise a NumPy
MLP on the CPU (gpuprof/workloads/training.py).
"""

from __future__ import annotations

import sys
import time

import gpuprof

from ..workloads.training import numpy_training, torch_training

__all__ = ["main"]


def _use_torch() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def main(argv: list[str] | None = None) -> int:
    """Run the demo; return the exit code."""
    steps = 12
    use_torch = _use_torch()
    sched = gpuprof.schedule(wait=1, warmup=1, active=8, repeat=1)
    what = "PyTorch MLP on the GPU" if use_torch else "NumPy MLP on the CPU"
    print(
        f"gpuprof demo: {what}, {steps} steps, recording steps 2-9 "
        f"(schedule wait=1, warmup=1, active=8)\n",
        file=sys.stderr,
    )
    t0 = time.perf_counter()
    with gpuprof.profile(schedule=sched) as prof:
        loss = (torch_training if use_torch else numpy_training)(prof, steps)
    elapsed = time.perf_counter() - t0
    sort = "self_cuda_time_total" if prof.results.cuda.get("active") else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=15))
    steps_arr = prof.steps()
    print(
        f"{len(steps_arr)} steps recorded; mean step {steps_arr['cpu_ns'].mean() / 1e6:.2f} ms; "
        f"final loss {loss:.4f}; run took {elapsed:.2f} s\n"
    )
    print(prof.diagnose())
    status = gpuprof.cuda_status()
    if not status["usable"]:
        print(f"(GPU capture off here: {status['reason']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
