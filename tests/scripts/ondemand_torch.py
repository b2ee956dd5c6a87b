"""A PyTorch training loop that runs until told to stop, written with no thought of gpuprof.

    python ondemand_torch.py STOP_FILE [--device cpu|cuda] [--max-steps N]

Each iteration is one optimizer step (SGD on 8 x Linear(256) + ReLU, batch 64). The
loop ends once STOP_FILE exists, or after --max-steps. Under torchrun it trains with
DistributedDataParallel (gloo on the CPU, NCCL on CUDA), and the ranks agree every
step on whether to stop, so that they all run the same steps.
"""

import argparse
import os

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("stop")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--max-steps", type=int, default=1 << 62)
    args = p.parse_args()
    torch.manual_seed(0)
    ddp = "WORLD_SIZE" in os.environ
    rank = 0
    device = torch.device(args.device)
    if ddp:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if args.device == "cuda":
            device = torch.device("cuda", local)
            torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl" if args.device == "cuda" else "gloo")
        rank = torch.distributed.get_rank()
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if args.device == "cuda" else None
        )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device=device)
    steps = 0
    while steps < args.max_steps:
        stop = torch.tensor([float(os.path.exists(args.stop))], device=device)
        if ddp:
            torch.distributed.all_reduce(stop, op=torch.distributed.ReduceOp.MAX)
        if stop.item():
            break
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        steps += 1
    print(f"rank {rank}: stopped after {steps} steps", flush=True)
    if ddp:
        # every rank done with its collectives first: gloo can abort a process that
        # leaves while another still talks to it ("terminate called without an
        # active exception", PyTorch 2.13)
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
