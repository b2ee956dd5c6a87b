"""A program whose work runs in a multiprocessing pool (fork): `python -m gpuprof run
--subprocesses` shows the workers' rows. Usage: pool_workers.py [items]."""

import multiprocessing as mp
import sys
import time


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def slow_item(x):
    spin(0.003)
    return x * x


def main(n):
    with mp.get_context("fork").Pool(2) as pool:
        total = sum(pool.map(slow_item, range(n), chunksize=1))
    print(f"done {total}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
