"""Shared pieces of the examples: the slow and fast training loops' data and model, and
the report every example prints."""

import argparse
import math
import time

import numpy as np
import torch

WIDTH = 256


class Samples(torch.utils.data.Dataset):
    """Synthetic samples with a per-sample Python transform (like decoding + augmenting)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        x = rng.standard_normal(WIDTH).astype(np.float32)
        for k in range(0, WIDTH, 2):  # slow, pure-Python "augmentation"
            x[k] = math.tanh(x[k])
        y = np.float32(x.sum() > 0)
        return torch.from_numpy(x), torch.tensor([y])


class Batches(torch.utils.data.Dataset):
    """The same samples as Samples, made a whole batch at a time with vectorized NumPy
    (the fix for a slow per-sample transform). Item i is batch i: use batch_size=None."""

    def __init__(self, n_batches: int, batch: int):
        self.n, self.batch = n_batches, batch

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        x = rng.standard_normal((self.batch, WIDTH), dtype=np.float32)
        x[:, ::2] = np.tanh(x[:, ::2])
        y = (x.sum(axis=1, keepdims=True) > 0).astype(np.float32)
        return torch.from_numpy(x), torch.from_numpy(y)


def model() -> torch.nn.Module:
    """Many thin layers (short kernels) and a few wide ones (most of the GEMM time)."""
    layers = []
    for _ in range(12):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    layers += [torch.nn.Linear(WIDTH, 4096), torch.nn.ReLU()]
    for _ in range(3):
        layers += [torch.nn.Linear(4096, 4096), torch.nn.ReLU()]
    layers += [torch.nn.Linear(4096, 1)]
    return torch.nn.Sequential(*layers).cuda()


def args(default_batch: int, default_steps: int = 30):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=default_steps)
    p.add_argument("--batch", type=int, default=default_batch)
    p.add_argument("--save", help="write the profile here (.gpuprof)")
    return p.parse_args()


def report(prof, per_step: int, started: float, save: str | None, unit: str = "samples",
           row_limit: int = 12):
    """Print the op table, the step rate (per_step units per step) and the diagnosis;
    save the profile when asked."""
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=row_limit))
    steps = prof.steps()
    step_ms = steps["cpu_ns"].mean() / 1e6
    print(f"recorded steps: {len(steps)}; mean step {step_ms:.2f} ms; "
          f"{per_step / step_ms * 1e3:,.0f} {unit}/s; wall {time.perf_counter() - started:.1f} s\n")
    print(prof.diagnose())
    if len(prof.modules()):  # PyTorch models: where the GPU time goes, module by module
        print(prof.module_table(max_depth=3, min_share=0.01))
    if save:
        prof.save(save)
        print(f"saved {save}")
