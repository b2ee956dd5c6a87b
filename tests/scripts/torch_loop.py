"""A plain PyTorch training loop, written with no thought of gpuprof.

    python torch_loop.py [OPTIMIZER] [ITERATIONS] [ACCUMULATE]

OPTIMIZER: sgd, adamw, adamw-foreach, adamw-fused, or lookahead (an optimizer
whose step() calls another optimizer's step()). With ACCUMULATE > 1 the
gradients of that many iterations are summed before each optimizer step
(gradient accumulation), so there are ITERATIONS // ACCUMULATE steps.
"""

import sys

import torch


class Lookahead(torch.optim.Optimizer):
    """Steps an inner optimizer, then pulls slow weights toward the fast ones."""

    def __init__(self, inner, k=2, alpha=0.5):
        self.inner, self.k, self.alpha, self.count = inner, k, alpha, 0
        super().__init__(inner.param_groups, {})
        self.slow = [p.detach().clone() for g in inner.param_groups for p in g["params"]]

    @torch.no_grad()
    def step(self, closure=None):
        loss = self.inner.step(closure)
        self.count += 1
        if self.count % self.k == 0:
            fast = [p for g in self.inner.param_groups for p in g["params"]]
            for s, p in zip(self.slow, fast):
                s.add_(p - s, alpha=self.alpha)
                p.copy_(s)
        return loss


def make_optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    if kind == "adamw-foreach":
        return torch.optim.AdamW(params, lr=1e-3, foreach=True)
    if kind == "adamw-fused":
        return torch.optim.AdamW(params, lr=1e-3, fused=True)
    if kind == "lookahead":
        return Lookahead(torch.optim.AdamW(params, lr=1e-3))
    raise SystemExit(f"unknown optimizer {kind!r}")


def main(kind="adamw", iterations=8, accumulate=1):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = make_optimizer(kind, model.parameters())
    x, y = torch.randn(128, 16), torch.randn(128, 1)
    for i in range(iterations):
        loss = torch.nn.functional.mse_loss(model(x), y) / accumulate
        loss.backward()
        if (i + 1) % accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
    print(
        f"trained: {iterations} iterations, {iterations // accumulate} optimizer steps, "
        f"loss {loss.item() * accumulate:.4f}"
    )


if __name__ == "__main__":
    main(
        sys.argv[1] if len(sys.argv) > 1 else "adamw",
        int(sys.argv[2]) if len(sys.argv) > 2 else 8,
        int(sys.argv[3]) if len(sys.argv) > 3 else 1,
    )
