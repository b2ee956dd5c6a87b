"""Cost of one NVTX push + pop through gpuprof's injection, per message kind.

PyTorch's autograd node ranges ("AddmmBackward0, seq = 1646, op_id = 168") reach
gpuprof's NVTX injection on autograd's thread, once per node; csrc/record/nvtx.c parses
each message into its name and sequence number. This measures what a push + pop
costs there, in ns, from C (tests/helpers/nvtx_client.c, compiled against the real
nvtx3 headers, so the figures hold no Python call):

- ``plain``: one fixed message ("forward"), the user-range case;
- ``nodes``: PyTorch node messages in the order a small MLP's backward makes them
  (5 node names), each written afresh with its own seq and op_id, as autograd
  pushes them (the writing is in every figure, idle included);
- ``nodes-many``: the same with 24 node names (a transformer's backward);
- each while a window records, and ``idle`` (a profile in its WAIT phase).

Run it against two builds to compare them (the extension NVTX attaches to is the one
imported):

    PYTHONPATH=python python benchmarks/bench_nvtx_parse.py [--rounds 200000 --repeats 7]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import gpuprof

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(os.path.dirname(HERE), "tests", "helpers", "nvtx_client.c")

MLP_NODES = [
    "MseLossBackward0",
    "AddmmBackward0",
    "ReluBackward0",
    "TBackward0",
    "torch::autograd::AccumulateGrad",
]
MANY_NODES = MLP_NODES + [
    f"{n}Backward0"
    for n in (
        "NativeLayerNorm",
        "View",
        "Permute",
        "Transpose",
        "Split",
        "Mul",
        "Add",
        "Gelu",
        "ScaledDotProductFlashAttention",
        "Embedding",
        "UnsafeView",
        "Clone",
        "Expand",
        "Slice",
        "Select",
        "Div",
        "Softmax",
        "ToCopy",
        "NllLoss",
    )
]


def _include() -> str:
    for c in ("/usr/local/cuda/include", os.environ.get("CUDA_HOME", "") + "/include"):
        if os.path.isfile(os.path.join(c, "nvtx3", "nvToolsExt.h")):
            return c
    for p in sys.path:
        c = os.path.join(p, "nvidia", "nvtx", "include")
        if os.path.isfile(os.path.join(c, "nvtx3", "nvToolsExt.h")):
            return c
    sys.exit("nvtx3 headers not found (CUDA toolkit or the nvidia-nvtx wheel)")


def _client(tmp: str) -> ctypes.CDLL:
    out = os.path.join(tmp, "libnvtx_client.so")
    cc = shutil.which(os.environ.get("CC", "cc")) or sys.exit("no C compiler")
    cmd = [cc, "-shared", "-fPIC", "-O2", "-o", out, CLIENT, f"-I{_include()}", "-ldl", "-lpthread"]
    subprocess.run(cmd, check=True)
    lib = ctypes.CDLL(out)
    lib.c_push_pop_ns.restype = ctypes.c_double
    lib.c_push_pop_ns.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, ctypes.c_int]
    return lib


def _measure(lib, names: list[bytes], fresh: bool, rounds: int, recording: bool) -> float:
    arr = (ctypes.c_char_p * len(names))(*names)
    sched = None if recording else gpuprof.schedule(wait=1_000_000, warmup=1, active=1)
    prof = gpuprof.profile(
        activities=[gpuprof.ProfilerActivity.CPU], schedule=sched, max_events=4 * rounds + 1000
    )
    prof.start()
    try:
        return lib.c_push_pop_ns(arr, len(names) if fresh else 0, rounds)
    finally:
        prof.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--cases", default="plain,nodes,nodes-many", help="comma-separated")
    ap.add_argument("--idle", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lib = _client(tmp)
        lib.c_push_pop_ns((ctypes.c_char_p * 1)(b"warm-up"), 0, 10)  # attaches the client
        cases = {
            "plain": ([b"forward"], False),
            "nodes": ([n.encode() for n in MLP_NODES], True),
            "nodes-many": ([n.encode() for n in MANY_NODES], True),
        }
        runs: dict[str, list[float]] = {}
        for _ in range(args.repeats):  # interleaved: drift spreads over every case
            for name, (names, fresh) in cases.items():
                if name not in args.cases.split(","):
                    continue
                for recording in (True, False) if args.idle else (True,):
                    key = f"{name}, {'recording' if recording else 'idle'}"
                    ns = _measure(lib, names, fresh, args.rounds, recording)
                    runs.setdefault(key, []).append(ns)
    print(f"gpuprof from {os.path.dirname(gpuprof.__file__)}")
    print(f"ns per push + pop, median of {args.repeats} x {args.rounds} rounds")
    for key, v in runs.items():
        print(f"  {key:28s} {statistics.median(v):8.1f}  (min {min(v):.1f}, max {max(v):.1f})")


if __name__ == "__main__":
    main()
