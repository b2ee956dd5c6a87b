"""A GAN-style PyTorch loop with two optimizers, each stepping once per iteration.

python torch_gan.py [ITERATIONS]
"""

import sys

import torch


def main(iterations=10):
    torch.manual_seed(0)
    gen = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    disc = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    opt_d = torch.optim.SGD(disc.parameters(), lr=1e-2)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    real = torch.randn(64, 16)
    for _ in range(iterations):
        fake = gen(torch.randn(64, 8))
        d_loss = bce(disc(real), torch.ones(64, 1)) + bce(disc(fake.detach()), torch.zeros(64, 1))
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
        g_loss = bce(disc(fake), torch.ones(64, 1))
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
    print(f"gan done: {iterations} iterations, d {d_loss.item():.3f}, g {g_loss.item():.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
