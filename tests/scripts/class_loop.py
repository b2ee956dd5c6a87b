"""A loop whose step is a method of a class of the script (for --step-fn Class.method).

python class_loop.py [STEPS]
"""

import sys


class Trainer:
    def __init__(self):
        self.total = 0

    @staticmethod
    def load(i):
        return list(range(2000 + i))

    def step(self, batch):
        self.total += sum(x * x for x in batch)


def main(steps):
    trainer = Trainer()
    for i in range(steps):
        trainer.step(Trainer.load(i))
    print(f"class loop done: {trainer.total}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
