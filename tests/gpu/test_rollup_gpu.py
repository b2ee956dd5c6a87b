"""Backward kernels launched by Python on autograd's device thread belong to the user's
step: a custom autograd.Function's backward, and Inductor's compiled backward under
torch.compile. Each stays on its own thread and op, and rolls up into the totals of
`loss.backward()`'s call and of the step function that made it."""

import gpuprof
import numpy as np
import pytest
from gpu_helpers import cuda_torch, share_under

pytestmark = pytest.mark.gpu
CUDA = [gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA]


def _profile(torch, train_step, steps=3):
    for _ in range(3):  # warm-up: allocator, cuBLAS handles, compilation
        train_step()
    torch.cuda.synchronize()
    with gpuprof.profile(activities=CUDA) as prof:
        for _ in range(steps):
            train_step()
            torch.cuda.synchronize()
            prof.step()
    assert prof.results.cuda["active"], prof.results.cuda
    return prof


def test_a_custom_functions_python_backward_rolls_up_under_the_step():
    torch = cuda_torch()

    class ScaledTanh(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.tanh(x) * 2

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 2 * (1 - torch.tanh(x) ** 2)  # kernels launched from Python

    model = torch.nn.Linear(512, 512).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 512, device="cuda")

    def train_step():
        loss = ScaledTanh.apply(model(x)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()

    prof = _profile(torch, train_step)
    share, kernels = share_under(prof, "train_step")
    ops = prof.ops()
    # the backward's own kernels (tanh, pow, sub, mul) were launched on another thread,
    # from Python; the Linear's (AddmmBackward0, charged to that node's row when
    # autograd's node ranges are on: docs/backward.md) roll up too, and are left out
    from_python = np.array([o < 0 or ops["file"][o] != "autograd" for o in kernels["op"]])
    rolled = kernels[kernels["rolled_up"] & from_python]
    assert len(rolled) >= 4, kernels[["name", "op_name", "thread"]]
    # all of them under the Function's backward (their ops are the C calls it made)
    backward = ops[np.array([str(n).endswith("ScaledTanh.backward") for n in ops["name"]])]
    assert int(backward["cuda_total_ns"].sum()) == int(
        np.sum(rolled["end_ns"] - rolled["start_ns"])
    ), (backward, rolled[["name", "op_name"]])
    assert set(rolled["thread"]) != set(kernels[~kernels["rolled_up"]]["thread"])
    assert share >= 0.95, share


def test_torch_compile_training_step_is_under_the_step_function():
    torch = cuda_torch()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 512),
        torch.nn.LayerNorm(512),
    ).cuda()
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, 512, device="cuda")

    def train_step():
        loss = compiled(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    prof = _profile(torch, train_step)
    share, kernels = share_under(prof, "train_step")
    # Inductor's backward runs as Python (CompiledFxGraph.__call__) on autograd's thread
    assert kernels["rolled_up"].any(), kernels[["name", "op_name", "thread"]]
    assert share >= 0.95, share
