"""A two-rank data-parallel training job that hangs after a while, to try
`python -m gpuprof dump` on (docs/on-demand.md, "Worked example: a job that hangs").
It knows nothing of gpuprof.

    torchrun --nproc_per_node 2 -m gpuprof run --on-demand examples/hang_train.py

Each rank trains an MLP and averages the gradients with all_reduce (gloo on the CPU,
NCCL with --device cuda). Its batches come from a loader thread through a queue.
On rank 1 the loader meets a corrupt sample at batch --bad-batch and its thread dies
(threading prints the exception, easily lost in a long log). Rank 1's training loop
then waits for a batch that never comes, rank 0 waits in the next all_reduce for
rank 1, and the job stops making progress without an error.
"""

import argparse
import os
import queue
import threading
import time

import torch
import torch.distributed as dist

WIDTH = 256


def decode(i, rank, bad_batch):
    if rank == 1 and i == bad_batch:
        raise ValueError(f"corrupt sample in batch {i}")
    g = torch.Generator().manual_seed(1000 * rank + i)
    x = torch.randn(64, WIDTH, generator=g)
    return x, (x.sum(1, keepdim=True) > 0).float()


def load(batches, rank, bad_batch):
    i = 0
    while True:
        batches.put(decode(i, rank, bad_batch))
        i += 1


def average_gradients(model, world):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--bad-batch", type=int, default=300)
    args = p.parse_args()
    device = torch.device(args.device)
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 1)
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = queue.Queue(maxsize=4)
    threading.Thread(
        target=load, args=(batches, rank, args.bad_batch), name="loader", daemon=True
    ).start()
    started, step = time.monotonic(), 0
    while True:
        x, y = batches.get()
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        average_gradients(model, world)
        opt.step()
        step += 1
        if step % 100 == 0:
            rate = step / (time.monotonic() - started)
            print(f"rank {rank}: step {step}, {rate:.0f} steps/s", flush=True)


if __name__ == "__main__":
    main()
