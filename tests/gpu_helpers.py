"""Helpers shared by the GPU tests (tests/gpu): PyTorch on a CUDA device, a warmed
training step and its FlopCounterMode count, and the share of a window's kernel time
that a function's call owns."""

import re

import numpy as np
import pytest


def cuda_torch():
    """PyTorch, or skip the test when it is not installed or sees no CUDA device."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device (CPU-only build?)")
    return torch


def train_step(torch, opt, loss_of, amp=False):
    """A training step: ``loss_of()`` (under bf16 autocast when ``amp``), its backward
    and ``opt``'s step; run three times first (cuBLAS, cuDNN and autograd warmed)."""

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = loss_of()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    return step


def profile_steps(torch, step, steps, **kwargs):
    """A gpuprof profile (CPU and CUDA, ``kwargs`` added) of ``steps`` calls of
    ``step``, each ended by ``prof.step()``."""
    import gpuprof

    activities = [gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA]
    with gpuprof.profile(activities=activities, **kwargs) as prof:
        for _ in range(steps):
            step()
            prof.step()
        torch.cuda.synchronize()
    return prof


def flop_counter(torch, step):
    """torch.utils.flop_counter's total for one call of ``step``."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step()
    torch.cuda.synchronize()
    return counter.get_total_flops()


# an autograd node's name, as gpuprof names node rows (docs/backward.md)
NODE = re.compile(r"(Backward\d*|^torch::autograd::\w+|^AccumulateGrad)$")


def autograd_torch():
    """A CUDA build of PyTorch with GPU capture and autograd node ranges usable here,
    or the test skips saying why not."""
    import gpuprof

    torch = cuda_torch()
    st = gpuprof.cuda_status()
    if not st["usable"]:
        pytest.skip(f"GPU capture is off: {st['reason']}")
    if not st["autograd_nodes"]["usable"]:
        pytest.skip(f"no autograd node ranges here: {st['autograd_nodes']['reason']}")
    return torch


def share_under(prof, fn_name):
    """(cuda_total_ns of the one function named fn_name) / (kernel time of the profile),
    and the profile's kernels. fn_name is the last part of the qualified name."""
    ops = prof.ops()
    mine = np.array([str(n).split(".")[-1] == fn_name for n in ops["name"]])
    assert mine.sum() == 1, ops["name"]
    total = int(ops[mine]["cuda_total_ns"].sum())
    ev = prof.gpu_events()
    kernels = ev[ev["kind"] == "kernel"]
    return total / int(np.sum(kernels["end_ns"] - kernels["start_ns"])), kernels
