"""A training-like pure-Python loop of many short steps, for the tests and benchmark of
the files `run --output` writes (tests/cli/test_files.py, benchmarks/bench_files.py).

    python long_loop.py STEPS

Each step, train_step(), runs a forward and a backward pass through four small layers
(about 20 calls). After 100 steps the script prints "stepping" (flushed), so that a test knows
the loop runs; at the end it prints "done STEPS".
"""

import sys


class Layer:
    def __init__(self, n):
        self.w = [0.01 * i for i in range(n)]

    def forward(self, x):
        return [a * b for a, b in zip(self.w, x)]

    def backward(self, g):
        return [a * b for a, b in zip(self.w, g)]


def loss_fn(y):
    return sum(y)


def train_step(model, x):
    h = x
    for layer in model:
        h = layer.forward(h)
    loss = loss_fn(h)
    g = [1.0] * len(h)
    for layer in reversed(model):
        g = layer.backward(g)
    return loss


def main(steps):
    model = [Layer(8) for _ in range(4)]
    x = [1.0] * 8
    for i in range(steps):
        train_step(model, x)
        if i == 100:
            print("stepping", flush=True)
    print("done", steps)


if __name__ == "__main__":
    main(int(sys.argv[1]))
