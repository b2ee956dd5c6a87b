"""Where the time from the window's end to the printed table goes (launch-bound MLP, 100
steps, with and without autograd nodes), as cProfile sees it. GPU machine:

    PYTHONPATH=python GPUPROF_HOOK=setprofile python benchmarks/bench_table_time.py
    PYTHONPATH=python python benchmarks/bench_table_time.py --plain   # times only, no cProfile

(cProfile and sys.monitoring's default backend cannot both run on 3.12: hence the
setprofile backend under cProfile. With --plain each mode runs in a fresh process, so
that each pays the first table's one-off costs.)
"""

import cProfile
import pstats
import subprocess
import sys
import time

sys.path.insert(0, "benchmarks")
import gpuprof
import torch
from _gpu_common import mlp_step

PLAIN = "--plain" in sys.argv
if PLAIN and "--child" not in sys.argv:
    for mode in ("nodes", "nobwd"):
        subprocess.run([sys.executable, __file__, "--plain", "--child", mode], check=True)
    sys.exit(0)

step = mlp_step(torch)
for _ in range(20):
    step()
torch.cuda.synchronize()
all_modes = {"nodes": {}, "nobwd": {"autograd_nodes": False}}
if PLAIN:
    all_modes = {sys.argv[-1]: all_modes[sys.argv[-1]]}
for modes in all_modes.values():
    prof = gpuprof.profile(
        activities=[gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA], **modes
    )
    prof.start()
    for _ in range(100):
        step()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    t0 = time.perf_counter()
    if not PLAIN:
        pr.enable()
    prof.stop()
    t1 = time.perf_counter()
    table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=10)
    if not PLAIN:
        pr.disable()
    t2 = time.perf_counter()
    print(modes, f"stop {t1 - t0:.4f}s table {t2 - t1:.4f}s", flush=True)
    if not PLAIN:
        pstats.Stats(pr).sort_stats("cumtime").print_stats(18)
