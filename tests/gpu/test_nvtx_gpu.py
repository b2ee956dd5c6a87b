"""NVTX ranges and capture ranges on a real GPU, with PyTorch.

Marked `gpu`: skipped (with the loader's reason) where GPU capture is unusable.
gpuprof is imported before torch here, as users should: NVTX attaches to gpuprof at
torch's first NVTX call.
"""

import gpuprof  # noqa: I001  (first: see the module docstring)

import numpy as np
import pytest
from gpu_helpers import cuda_torch

pytestmark = pytest.mark.gpu
CUDA = [gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA]


def _torch():
    torch = cuda_torch()
    missed = gpuprof.cuda_status()["nvtx"]["missed"]
    assert "torch" not in missed, gpuprof.cuda_status()["nvtx"]["reason"]
    return torch


def _setup(torch):
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)
    ).cuda()
    x = torch.randn(64, 256, device="cuda")
    return model, x


def nvtx_train_step(torch, model, x):
    torch.cuda.nvtx.range_push("forward")
    loss = model(x).square().mean()
    torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.range_push("backward")
    loss.backward()
    torch.cuda.nvtx.range_pop()


def _ancestor_labels(tree, node):
    out = set()
    while node >= 0:
        out.add(tree["name"][node])
        node = tree["parent"][node]
    return out


def test_torch_nvtx_ranges_hold_their_kernels():
    torch = _torch()
    model, x = _setup(torch)
    for _ in range(2):
        nvtx_train_step(torch, model, x)
    torch.cuda.synchronize()
    with gpuprof.profile(activities=CUDA) as prof:
        for _ in range(3):
            nvtx_train_step(torch, model, x)
            prof.step()
        torch.cuda.synchronize()
    assert prof.results.cuda["active"], prof.results.cuda
    ops = prof.ops()
    for label in ("forward", "backward"):
        row = ops[(ops["name"] == label) & (ops["kind"] == "user")]
        assert len(row) == 1, ops[["name", "kind", "file"]]
        assert row["file"][0] == "nvtx" and row["calls"][0] == 3
        assert row["cuda_total_ns"][0] > 0, label
    tree = prof.call_tree()
    ev = prof.gpu_events()
    kernels = ev[(ev["kind"] == "kernel") & (ev["node"] >= 0)]
    under = {"forward": 0, "backward": 0}
    for node in kernels["node"]:
        labels = _ancestor_labels(tree, int(node))
        assert not ({"forward", "backward"} <= labels)
        for label in under:
            under[label] += label in labels
    # the same work every step: the kernels under each range come in threes
    assert under["forward"] > 0 and under["forward"] % 3 == 0, under
    assert under["backward"] > 0 and under["backward"] % 3 == 0, under
    # the forward range sits under the training step function, not torch's helper
    fwd_nodes = [i for i in range(len(tree)) if tree["name"][i] == "forward"]
    for n in fwd_nodes:
        parent = tree["parent"][n]
        assert parent >= 0 and "nvtx_train_step" in tree["name"][parent], tree["name"][parent]


def step_body(torch, x, w):
    for _ in range(4):
        x = torch.relu(x @ w)
    return x.sum()


def _kernels_per_step(torch, x, w):
    with gpuprof.profile(activities=CUDA) as prof:
        step_body(torch, x, w)
        torch.cuda.synchronize()
    ev = prof.gpu_events()
    return int((ev["kind"] == "kernel").sum())


def test_capture_by_cuda_profiler_start_stop():
    torch = _torch()
    x = torch.randn(128, 128, device="cuda")
    w = torch.randn(128, 128, device="cuda")
    step_body(torch, x, w)
    torch.cuda.synchronize()
    per_step = _kernels_per_step(torch, x, w)
    assert per_step > 0
    with gpuprof.profile(activities=CUDA, capture="cudaProfilerApi") as prof:
        for i in range(8):
            if i == 3:
                torch.cuda.profiler.start()
            step_body(torch, x, w)
            if i == 5:
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
            prof.step()
    assert len(prof.results.windows) == 1
    ops = prof.ops()
    assert ops[ops["name"] == "step_body"]["calls"][0] == 3  # steps 3, 4, 5
    steps = prof.steps()
    assert set(steps["step"]) <= {3, 4, 5} and 4 in set(steps["step"])
    ev = prof.gpu_events()
    assert int((ev["kind"] == "kernel").sum()) == 3 * per_step
    lo, hi = prof.results.window_bounds()
    assert (ev["start_ns"] >= lo).all()


def test_capture_by_nvtx_range_on_gpu():
    torch = _torch()
    x = torch.randn(128, 128, device="cuda")
    w = torch.randn(128, 128, device="cuda")
    step_body(torch, x, w)
    torch.cuda.synchronize()
    per_step = _kernels_per_step(torch, x, w)
    with gpuprof.profile(activities=CUDA, capture="nvtx:profile-me") as prof:
        for i in range(6):
            if i == 2:
                torch.cuda.nvtx.range_push("profile-me")
            step_body(torch, x, w)
            if i == 3:
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_pop()
            prof.step()
    ops = prof.ops()
    assert ops[ops["name"] == "step_body"]["calls"][0] == 2
    ev = prof.gpu_events()
    assert int((ev["kind"] == "kernel").sum()) == 2 * per_step
    cap = ops[(ops["name"] == "profile-me") & (ops["kind"] == "user")]
    assert cap["calls"][0] == 1 and cap["cuda_total_ns"][0] > 0


def test_record_function_not_doubled_by_nvtx():
    torch = _torch()
    model, x = _setup(torch)
    with gpuprof.profile(activities=CUDA) as prof:
        with gpuprof.record_function("labelled"):
            model(x)
        torch.cuda.synchronize()
    ops = prof.ops()
    rows = ops[ops["name"] == "labelled"]
    assert len(rows) == 1 and rows["file"][0] == "" and rows["calls"][0] == 1
    assert np.count_nonzero(ops["file"] == "nvtx") == 0
