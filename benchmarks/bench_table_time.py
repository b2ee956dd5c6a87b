"""Where the time from the window's end to the printed table goes (launch-bound MLP, 100
steps, with and without autograd nodes), as cProfile sees it. GPU machine:

    PYTHONPATH=python python benchmarks/bench_table_time.py
"""

import cProfile
import pstats
import sys
import time

sys.path.insert(0, "benchmarks")
import gpuprof
import torch
from _gpu_common import mlp_step

step = mlp_step(torch)
for _ in range(20):
    step()
torch.cuda.synchronize()
for modes in ({}, {"autograd_nodes": False}):
    prof = gpuprof.profile(
        activities=[gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA], **modes
    )
    prof.start()
    for _ in range(100):
        step()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    t0 = time.perf_counter()
    pr.enable()
    prof.stop()
    t1 = time.perf_counter()
    table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=10)
    pr.disable()
    t2 = time.perf_counter()
    print(modes, f"stop {t1 - t0:.4f}s table {t2 - t1:.4f}s")
    pstats.Stats(pr).sort_stats("cumtime").print_stats(18)
