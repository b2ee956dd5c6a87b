"""A PyTorch training loop, for comparing step structures (tests/cli/test_step_structure.py).

    python torch_steps.py OPTIMIZER STAMPS [--hand OUT_DIR]

Trains a small MLP for 10 steps and writes, to the JSON file STAMPS, the time
(perf_counter_ns) at which each step ended where gpuprof ends it: without --hand
from the optimizer's own post-step hook, as ``python -m gpuprof run`` does (the loop
is written with no thought of gpuprof); with --hand right before the prof.step()
written after each iteration, as the README shows (its trace and stacks go into
OUT_DIR).
"""

import json
import sys
import time

import torch


def make_optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    raise SystemExit(f"unknown optimizer {kind!r}")


def train_step(model, optimizer, x, y):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


def main(kind, stamps_path, hand_dir=None):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 1),
    )
    optimizer = make_optimizer(kind, model.parameters())
    stamps = []
    if hand_dir is None:
        optimizer.register_step_post_hook(lambda *_: stamps.append(time.perf_counter_ns()))
    data = torch.utils.data.TensorDataset(torch.randn(10 * 256, 256), torch.randn(10 * 256, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=256)
    if hand_dir is None:
        for x, y in loader:
            train_step(model, optimizer, x, y)
    else:
        import gpuprof

        with gpuprof.profile(
            schedule=gpuprof.schedule(wait=1, warmup=1, active=3, repeat=1)
        ) as prof:
            for x, y in loader:
                train_step(model, optimizer, x, y)
                stamps.append(time.perf_counter_ns())
                prof.step()
        prof.export_chrome_trace(f"{hand_dir}/hand.pt.trace.json.gz")
        prof.export_stacks(f"{hand_dir}/hand.stacks.txt")
    with open(stamps_path, "w") as f:
        json.dump(stamps, f)
    print(f"trained: {len(stamps)} optimizer steps")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[4] if sys.argv[3:4] == ["--hand"] else None)
