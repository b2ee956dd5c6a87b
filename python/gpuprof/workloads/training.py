"""Bundled training loops for the demo, tests and benchmarks.

These are user code from gpuprof's point of view: their frames are shown
(everything else under the gpuprof package is hidden). Both loops have a
slow, single-threaded input pipeline, and the GPU one reads the loss back
every step, so the diagnosis has something to find.
"""

from __future__ import annotations

import math

import numpy as np

import gpuprof

__all__ = ["NumpyMLP", "augment", "batches", "numpy_training", "torch_training"]


def augment(sample: np.ndarray) -> np.ndarray:
    """A deliberately slow per-sample transform (pure Python loop)."""
    out = sample.copy()
    for i in range(0, len(out), 4):
        out[i] = math.tanh(out[i]) * 0.5
    return out


def batches(n_batches: int, batch: int, width: int, seed: int = 0):
    """Synthetic data, one sample at a time, like a Dataset without workers."""
    rng = np.random.default_rng(seed)
    for _ in range(n_batches):
        xs = [augment(rng.standard_normal(width).astype(np.float32)) for _ in range(batch)]
        x = np.stack(xs)
        y = (x.sum(axis=1, keepdims=True) > 0).astype(np.float32)
        yield x, y


class NumpyMLP:
    def __init__(self, width: int, hidden: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.w1 = rng.standard_normal((width, hidden)).astype(np.float32) / math.sqrt(width)
        self.w2 = rng.standard_normal((hidden, 1)).astype(np.float32) / math.sqrt(hidden)

    def forward(self, x):
        self.x = x
        self.h = np.maximum(x @ self.w1, 0.0)
        return self.h @ self.w2

    def backward(self, grad_out):
        gw2 = self.h.T @ grad_out
        gh = (grad_out @ self.w2.T) * (self.h > 0)
        gw1 = self.x.T @ gh
        return gw1, gw2

    def sgd(self, grads, lr):
        self.w1 -= lr * grads[0]
        self.w2 -= lr * grads[1]


def numpy_training(prof, steps: int) -> float:
    model = NumpyMLP(width=256, hidden=512)
    loss = 0.0
    for x, y in batches(steps, batch=64, width=256):
        with gpuprof.record_function("forward"):
            pred = model.forward(x)
            diff = pred - y
            loss = float((diff * diff).mean())
        with gpuprof.record_function("backward"):
            grads = model.backward(2 * diff / len(x))
        with gpuprof.record_function("optimizer"):
            model.sgd(grads, 0.01)
        prof.step()
    return loss


def torch_training(prof, steps: int) -> float:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(512, 512), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(512, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_value = 0.0
    for x, y in batches(steps, batch=64, width=512):
        xb = torch.from_numpy(x).cuda()
        yb = torch.from_numpy(y).cuda()
        with gpuprof.record_function("forward"):
            loss = torch.nn.functional.mse_loss(model(xb), yb)
        with gpuprof.record_function("backward"):
            opt.zero_grad(set_to_none=True)
            loss.backward()
        with gpuprof.record_function("optimizer"):
            opt.step()
        loss_value = loss.item()  # a host sync every step
        prof.step()
    return loss_value
