"""A PyTorch CPU training loop fed by DataLoader(num_workers=2): the main thread waits
for the workers' batches and multiprocessing's feeder threads wait on their queues.
Usage: torch_workers.py [epochs]."""

import sys

import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        x = torch.full((64,), float(i % 7))
        return x, x.sum()


def main(epochs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    loader = DataLoader(Squares(), batch_size=16, num_workers=2)
    for _ in range(epochs):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)  # train line
            opt.zero_grad()
            loss.backward()
            opt.step()
    print("done", float(loss))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
