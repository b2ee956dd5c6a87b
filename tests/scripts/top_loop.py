"""A plain Python loop for `gpuprof top`'s tests: it runs until told to stop.

    python top_loop.py STOP_FILE [SIZE] [PAUSE]

Each step is one call of crunch() (``--step-fn __main__:crunch``) over a batch of
SIZE numbers (default 20,000) that the generator batches() makes (sleeping PAUSE
seconds for each, default 0: a slow source); crunch() is a Python loop, so it
holds the most self CPU time after the batches. The loop ends once STOP_FILE
exists, and prints how many steps it ran in how many seconds.
"""

import os
import sys
import time


def batches(size, pause):
    i = 0
    while True:
        if pause:
            time.sleep(pause)
        yield [float((i + j) % 97) for j in range(size)]
        i += 1


def crunch(batch):
    total = 0.0
    for x in batch:
        total += x * x
    return total


def main(stop, size, pause):
    steps = 0
    t0 = time.monotonic()
    for batch in batches(size, pause):
        if os.path.exists(stop):
            break
        crunch(batch)
        steps += 1
    print(f"stopped after {steps} steps in {time.monotonic() - t0:.3f} s", flush=True)


if __name__ == "__main__":
    main(
        sys.argv[1],
        int(sys.argv[2]) if len(sys.argv) > 2 else 20_000,
        float(sys.argv[3]) if len(sys.argv) > 3 else 0.0,
    )
