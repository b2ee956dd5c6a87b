"""A CPU training loop that runs until told to stop, for the on-demand tests.

    python ondemand_loop.py STOP_FILE [MAX_STEPS]

Every call of train_step() is one step (``--step-fn __main__:train_step``). The
loop ends when STOP_FILE exists, or after MAX_STEPS steps (default: no limit).
"""

import os
import sys


def load(i):
    return [float((i + j) % 97) for j in range(5_000)]


def train_step(batch):
    return sum(x * x for x in batch)


def main(stop, max_steps):
    steps = 0
    while steps < max_steps and not os.path.exists(stop):
        train_step(load(steps))
        steps += 1
    print(f"stopped after {steps} steps")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 62)
