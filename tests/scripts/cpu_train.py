"""A CPU "training" loop for the CLI tests: a step function and an exit code."""

import sys


def load(i):
    return [float(j) for j in range(200_000 + i)]


def train_step(batch):
    return sum(x * x for x in batch)


def main(steps, code):
    total = 0.0
    for i in range(steps):
        total += train_step(load(i))
    print(f"done {total:.0f}")
    return code


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0))
