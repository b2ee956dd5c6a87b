"""A training job that slows down after a while, to try on-demand capture on
(docs/on-demand.md). It knows nothing of gpuprof.

    python -m gpuprof run --on-demand examples/on_demand_train.py [--device cuda]

It trains an MLP on synthetic data, one optimizer step per batch, until Ctrl-C or
--steps, and prints its speed every --report steps. From step --slow-after on, every
sample goes through a slow, pure-Python transform in the main process (the way a new
augmentation or a DataLoader left with num_workers=0 slows a real job down), so the
steps take several times longer.
"""

import argparse
import math
import time

import torch

WIDTH = 256


class Samples(torch.utils.data.Dataset):
    """Synthetic samples; those of batches from ``slow_from`` on get a slow transform."""

    def __init__(self, n: int, batch: int, slow_from: int):
        self.n, self.batch, self.slow_from = n, batch, slow_from

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(WIDTH, generator=g)
        if i // self.batch >= self.slow_from:
            for _ in range(4):  # four passes of a per-value Python "augmentation"
                x = torch.tensor([math.tanh(v) for v in x.tolist()])
        return x, (x.sum() > 0).float().unsqueeze(0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--steps", type=int, default=1 << 40, help="stop after this many steps")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--slow-after", type=int, default=300, help="the step the job slows at")
    p.add_argument("--report", type=int, default=100, help="print the speed this often")
    a = p.parse_args()
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 1)).to(a.device)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(Samples(a.batch * min(a.steps, 1 << 30), a.batch,
                                                 a.slow_after), batch_size=a.batch)
    t0 = time.perf_counter()
    try:
        for step, (x, y) in enumerate(loader):
            if step >= a.steps:
                break
            x, y = x.to(a.device), y.to(a.device)
            loss = torch.nn.functional.mse_loss(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if (step + 1) % a.report == 0:
                now = time.perf_counter()
                print(f"step {step + 1}: {a.report / (now - t0):.0f} steps/s, loss "
                      f"{loss.item():.4f}", flush=True)
                t0 = now
    except KeyboardInterrupt:
        print("interrupted")


if __name__ == "__main__":
    main()
