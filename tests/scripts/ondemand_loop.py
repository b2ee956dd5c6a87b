"""A CPU training loop that runs until told to stop, for the on-demand tests.

    python ondemand_loop.py STOP_FILE [MAX_STEPS] [SIZE]

Every call of train_step() is one step (``--step-fn __main__:train_step``) over a
batch of SIZE numbers (default 5,000). The loop ends when STOP_FILE exists, or after
MAX_STEPS steps (default: no limit).
"""

import os
import sys


def load(i, size=5_000):
    return [float((i + j) % 97) for j in range(size)]


def train_step(batch):
    return sum(x * x for x in batch)


def main(stop, max_steps, size):
    steps = 0
    while steps < max_steps and not os.path.exists(stop):
        train_step(load(steps, size))
        steps += 1
    print(f"stopped after {steps} steps")


if __name__ == "__main__":
    main(
        sys.argv[1],
        int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 62,
        int(sys.argv[3]) if len(sys.argv) > 3 else 5_000,
    )
