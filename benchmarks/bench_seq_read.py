"""What reading PyTorch's autograd sequence counter adds to the Python hook, per event.

With autograd node ranges on, the hook reads ``at::sequence_number::peek`` at every
event while a window records (csrc/record/hook.c, "autograd sequence numbers"), so that each
backward node joins the forward call that made it (docs/backward.md). This times the
same recorded work with the counter read and without, in one process, interleaved:

- ``calls``: a pure-Python call chain (no nodes made: the read and its compare only);
- ``torch``: a small PyTorch forward on the CPU wheel that makes a node at most C calls
  (the read, plus a GP_EV_SEQ event where the counter moved).

It prints the median over ``--repeats`` rounds of each figure, in ns per recorded event
(the events are counted from the window), and the difference.

    PYTHONPATH=python python benchmarks/bench_seq_read.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import gpuprof
from gpuprof import _gpuprof
from gpuprof.record import _autograd


def _chain(n):
    return 0 if n == 0 else _chain(n - 1) + 1


def calls_work():
    for _ in range(2000):
        _chain(20)


def torch_work(torch, lin, x):
    def work():
        for _ in range(300):
            lin(x).relu().sum()

    return work


def one(work, peek) -> tuple[float, int]:
    """(ns of the recorded work, events recorded)."""
    _gpuprof._set_seq_peek(peek)
    try:
        with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU], modules=False) as prof:
            t0 = time.perf_counter_ns()
            work()
            dt = time.perf_counter_ns() - t0
    finally:
        _gpuprof._set_seq_peek(0)
    events = int(prof.results.threads()["events"].sum())
    return dt, events


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    import torch

    peek = _autograd.seq_peek_address(torch)
    if not peek:
        raise SystemExit("this PyTorch has no at::sequence_number::peek")
    lin, x = torch.nn.Linear(8, 8), torch.randn(4, 8, requires_grad=True)
    works = {"calls": calls_work, "torch": torch_work(torch, lin, x)}
    print(f"torch {torch.__version__}; ns per recorded event, median of {args.repeats} rounds")
    for name, work in works.items():
        work()  # warm
        off, on = [], []
        for _ in range(args.repeats):
            for peek_of, out in ((0, off), (peek, on)):
                dt, events = one(work, peek_of)
                out.append(dt / max(events, 1))
        a, b = statistics.median(off), statistics.median(on)
        print(f"{name:6s} counter unread {a:7.1f}  read {b:7.1f}  added {b - a:+6.1f} ns/event")


if __name__ == "__main__":
    main()
