"""A deliberately slow training loop with four planted problems.

1. input pipeline: DataLoader(num_workers=0) with a slow per-sample transform
2. a host sync every step: the loss is read and printed right after the forward
3. FP32 only: no autocast, so the wide GEMMs miss the tensor cores
4. a tiny batch: many short kernels, the GPU waits on launches

    python examples/slow_training.py --save slow.gpuprof
    python examples/fast_training.py --save fast.gpuprof
    python -m gpuprof compare slow.gpuprof fast.gpuprof
"""

import time

import gpuprof
import torch
from _common import Samples, args, model, report

torch.backends.cuda.matmul.allow_tf32 = False


def main():
    a = args(default_batch=64)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(Samples(a.batch * (a.steps + 2)), batch_size=a.batch,
                                         num_workers=0)
    started = time.perf_counter()
    sched = gpuprof.schedule(wait=1, warmup=2, active=a.steps - 4, repeat=1)
    with gpuprof.profile(schedule=sched) as prof:
        for step, (x, y) in enumerate(loader):
            x, y = x.cuda(), y.cuda()
            loss = torch.nn.functional.mse_loss(net(x), y)
            print(f"step {step} loss {loss.item():.4f}", end="\r")  # host sync every step
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            prof.step()
            if step + 1 >= a.steps:
                break
    print()
    report(prof, a.batch, started, a.save)


if __name__ == "__main__":
    main()
