"""DDP training under torchrun, profiled on every rank, merged into one report.

    torchrun --nproc_per_node=2 examples/ddp_train.py --out traces/ddp
    torchrun --nproc_per_node=2 examples/ddp_train.py --out traces/ddp --inject-delay-rank 1

The model is the launch-bound MLP (16 x Linear(256) + ReLU, batch 64, SGD),
wrapped in DistributedDataParallel (NCCL on GPUs, gloo without). Every rank
profiles itself with gpuprof and writes ``<out>/rank<N>.<ns>.pt.trace.json``
(the ``{rank}`` placeholder of ``tensorboard_trace_handler``), which HTA and
TensorBoard read as one run. Rank 0 then merges the ranks' traces into
``<out>-merged.json`` (open it in Perfetto: one process per rank) and prints
the cross-rank table and the straggler diagnosis.

``--inject-delay-rank N`` makes rank N sleep ``--delay-ms`` at the start of
every step, a stand-in for a slow input pipeline or extra work on one rank:
the other ranks then wait for it inside the gradient all-reduce, and the
merged report names rank N. The same merge runs offline:

    python -m gpuprof merge merged.json traces/ddp/rank*.pt.trace.json
"""

import argparse
import glob
import os
import time

import gpuprof
import torch
import torch.distributed as dist
from gpuprof.distributed import comm_overlap, rank_info
from torch.nn.parallel import DistributedDataParallel

WAIT, WARMUP = 2, 3  # NCCL communicators and DDP buckets are built in the first steps


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="ddp_traces", help="folder shared by all ranks")
    p.add_argument("--merge", help="merged trace (default: <out>-merged.json); '' to skip")
    p.add_argument("--steps", type=int, default=20, help="recorded steps")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=16)
    p.add_argument("--inject-delay-rank", type=int, default=-1,
                   help="this rank sleeps --delay-ms at the start of every step")
    p.add_argument("--delay-ms", type=float, default=20.0)
    p.add_argument("--backend", default=None, help="default: nccl with CUDA, else gloo")
    p.add_argument("--no-sync", action="store_true",
                   help="do not read the loss every step (the hosts may then run ahead)")
    a = p.parse_args()
    if a.steps < 1:
        p.error("--steps must be at least 1")
    if a.merge is None:
        a.merge = os.path.normpath(a.out) + "-merged.json"
    return a


def main():
    a = parse_args()
    info = rank_info()  # torchrun's RANK / LOCAL_RANK / WORLD_SIZE, before the process group
    cuda = torch.cuda.is_available()
    if cuda:
        device = torch.device("cuda", info["local_rank"])
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=a.backend or ("nccl" if cuda else "gloo"))
    rank = dist.get_rank()

    def barrier():
        if dist.get_backend() == "nccl":
            dist.barrier(device_ids=[info["local_rank"]])
        else:
            dist.barrier()

    os.makedirs(a.out, exist_ok=True)
    if rank == 0:  # traces of an earlier run in the same folder would be merged too
        for old in glob.glob(os.path.join(a.out, "rank*.pt.trace.json")):
            os.remove(old)
    barrier()

    torch.manual_seed(0)
    layers = []
    for _ in range(a.depth):
        layers += [torch.nn.Linear(a.width, a.width), torch.nn.ReLU()]
    model = DistributedDataParallel(torch.nn.Sequential(*layers).to(device),
                                    device_ids=[info["local_rank"]] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(1 + rank)  # each rank its own shard of the data
    x = torch.randn(a.batch, a.width, device=device)
    y = torch.randn(a.batch, a.width, device=device)
    delay = a.delay_ms / 1e3 if rank == a.inject_delay_rank else 0.0

    handler = gpuprof.tensorboard_trace_handler(a.out, worker_name="rank{rank}")
    sched = gpuprof.schedule(wait=WAIT, warmup=WARMUP, active=a.steps, repeat=1)
    started = time.perf_counter()
    with gpuprof.profile(schedule=sched, on_trace_ready=handler) as prof:
        for _ in range(WAIT + WARMUP + a.steps):
            if delay:
                time.sleep(delay)  # the straggler
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if not a.no_sync:
                loss.item()  # log the loss: one host sync per step, as most loops do
            prof.step()
    elapsed = time.perf_counter() - started

    ov = comm_overlap(prof)
    ms = 1e-6
    print(f"rank {rank}/{dist.get_world_size()}: {len(ov)} steps, "
          f"step {ov['step_ns'].mean() * ms:.2f} ms, compute {ov['compute_ns'].mean() * ms:.2f} ms"
          f", comm {ov['comm_ns'].mean() * ms:.2f} ms (exposed "
          f"{ov['exposed_comm_ns'].mean() * ms:.2f} ms), GPU idle {ov['idle_ns'].mean() * ms:.2f}"
          f" ms; wall {elapsed:.1f} s", flush=True)
    barrier()  # every rank's trace is written
    if rank == 0 and a.merge:
        traces = sorted(glob.glob(os.path.join(a.out, "rank*.pt.trace.json")))
        run = gpuprof.merge(a.merge, traces)
        print(run.table(max_steps=6))
        print(run.diagnose(), flush=True)
    barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
