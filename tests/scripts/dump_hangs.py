"""A program that hangs in one of the ways `gpuprof dump` must see through, for the
dump tests; run it under `python -m gpuprof run --on-demand`.

    python dump_hangs.py MODE WORK_DIR [SPIN_LIB]

MODE is one of:

- ``deadlock``: threads "worker-a" and "worker-b" take two locks in opposite orders
  and wait for each other forever;
- ``socket``: thread "reader" waits in ``recv()`` on a socket nobody writes to;
- ``spin``: the main thread calls SPIN_LIB's ``gil_spin_until`` through
  ``ctypes.PyDLL``, a C loop that holds the GIL until WORK_DIR/release exists;
  thread "bystander" wants the GIL meanwhile;
- ``gloo``: a torch.distributed gloo job of WORLD_SIZE 2 (RANK, MASTER_ADDR,
  MASTER_PORT from the environment): rank 0 calls all_reduce, which never returns,
  since rank 1 never calls it and steps on elsewhere;
- ``cuda_sync`` (a GPU): each step keeps a CUDA stream busy for about 10 s
  (``torch.cuda._sleep``), then waits for it in ``Stream.synchronize()``
  (cudaStreamSynchronize); WORK_DIR/syncing.0 appears before the first wait.

Whatever does not hang steps: ``train_step()`` runs in a loop and every 20 ms the
step count goes to WORK_DIR/steps.RANK (written whole). WORK_DIR/ready.RANK appears
once the hang is in place. The program ends when WORK_DIR/stop exists (the test
kills what cannot end).
"""

import ctypes
import os
import socket
import sys
import threading
import time

_KEEP = []


def train_step(batch):
    return sum(x * x for x in batch)


def put(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def step_until_stopped(work, rank):
    steps, last = 0, 0.0
    batch = [float(i % 7) for i in range(2000)]
    while not os.path.exists(os.path.join(work, "stop")):
        train_step(batch)
        steps += 1
        now = time.monotonic()
        if now - last > 0.02:
            put(os.path.join(work, f"steps.{rank}"), str(steps))
            last = now
        time.sleep(0.001)
    put(os.path.join(work, f"steps.{rank}"), str(steps))


def deadlock(work):
    a, b = threading.Lock(), threading.Lock()
    both = threading.Barrier(2)

    def take_a_then_b():
        with a:
            both.wait()
            with b:
                pass

    def take_b_then_a():
        with b:
            both.wait()
            with a:
                pass

    threading.Thread(target=take_a_then_b, name="worker-a", daemon=True).start()
    threading.Thread(target=take_b_then_a, name="worker-b", daemon=True).start()


def blocked_socket(work):
    quiet, _other_end = socket.socketpair()

    def wait_for_data():
        quiet.recv(1024)

    threading.Thread(target=wait_for_data, name="reader", daemon=True).start()
    _KEEP.append(_other_end)  # open, and silent, for the program's life


def spin(work, lib_path):
    def bystander():
        while True:
            time.sleep(0.01)

    threading.Thread(target=bystander, name="bystander", daemon=True).start()
    # A real program has run a while before it hangs: let gpuprof's thread, which
    # looks every poll interval (1 s), see the threads' names before the GIL is gone.
    time.sleep(2.5)
    lib = ctypes.PyDLL(lib_path)  # PyDLL: the call keeps the GIL
    lib.gil_spin_until.argtypes = [ctypes.c_char_p]
    lib.gil_spin_until.restype = ctypes.c_long
    release = os.path.join(work, "release").encode()
    put(os.path.join(work, "ready.0"), "spinning")
    lib.gil_spin_until(release)


def elsewhere(work, rank):
    """Slow steps, nearly all of their time in one sleep: where a dump finds it."""
    steps = 0
    while not os.path.exists(os.path.join(work, "stop")):
        time.sleep(0.05)
        steps += 1
        put(os.path.join(work, f"steps.{rank}"), str(steps))


def gloo(work):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        t = torch.ones(4)
        put(os.path.join(work, "ready.0"), "all_reduce")
        dist.all_reduce(t)  # rank 1 never joins: this never returns
    else:
        put(os.path.join(work, f"ready.{rank}"), "elsewhere")
        elsewhere(work, rank)
    os._exit(0)  # a rank that stops early must not wait for the other at exit


def cuda_sync(work):
    import torch

    stream = torch.cuda.Stream()
    steps = 0
    while not os.path.exists(os.path.join(work, "stop")):
        with torch.cuda.stream(stream):
            torch.cuda._sleep(20_000_000_000)  # GPU clock cycles: about 10 s
        put(os.path.join(work, "syncing.0"), str(steps))
        stream.synchronize()
        steps += 1
        put(os.path.join(work, "steps.0"), str(steps))


def main():
    mode, work = sys.argv[1], sys.argv[2]
    if mode == "cuda_sync":
        cuda_sync(work)
        return
    rank = int(os.environ.get("RANK", "0"))
    if mode == "gloo":
        gloo(work)
        return
    if mode == "deadlock":
        deadlock(work)
    elif mode == "socket":
        blocked_socket(work)
    elif mode == "spin":
        spin(work, sys.argv[3])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    if mode != "spin":
        time.sleep(0.3)  # the hang is in place
        put(os.path.join(work, f"ready.{rank}"), mode)
    step_until_stopped(work, rank)


if __name__ == "__main__":
    main()
