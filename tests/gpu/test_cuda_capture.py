"""GPU capture on a real GPU: PyTorch, CuPy, CUDA graphs, fallback, torch parity.

Marked `gpu`: skipped (with the loader's reason) where GPU capture is unusable.
"""

import inspect
import os
import subprocess
import sys
import textwrap

import gpuprof
import numpy as np
import pytest
from gpu_helpers import cuda_torch

pytestmark = pytest.mark.gpu
CUDA = [gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA]


def _mlp(torch, width=256, depth=4):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).cuda()


def _train(torch, model, opt, x, steps, prof=None, item=False):
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        if item:
            loss.item()
        if prof is not None:
            prof.step()
    torch.cuda.synchronize()


def test_forward_backward_attribution():
    torch = cuda_torch()
    model = _mlp(torch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256, device="cuda")
    _train(torch, model, opt, x, 3)
    # without autograd's node ranges (tests/gpu/test_backward_gpu.py has them), the
    # backward pass falls back to the call that waits for it
    with gpuprof.profile(activities=CUDA, autograd_nodes=False) as prof:
        _train(torch, model, opt, x, 5, prof)
    assert prof.results.cuda["active"], prof.results.cuda
    ops = prof.ops()
    ev = prof.gpu_events()
    kernels = ev[ev["kind"] == "kernel"]
    assert len(kernels) > 5 * 10
    # forward: the linear C call, under Linear.forward
    lin = ops[ops["name"] == "torch._C._nn.linear"]
    assert len(lin) == 1 and lin["cuda_self_ns"][0] > 0 and lin["kernels"][0] >= 5 * 4
    fwd = ops[ops["name"] == "Linear.forward"]
    assert fwd["cuda_total_ns"][0] >= lin["cuda_self_ns"][0]
    # backward kernels come from autograd's device threads: charged to backward on this thread
    bwd = ops[ops["name"] == "torch._C._EngineBase.run_backward"]
    assert len(bwd) == 1, sorted(set(ops["name"]))
    assert bwd["cuda_self_ns"][0] > 0
    assert ev["blocked_thread"].any()
    assert prof.results.attributed_gpu_fraction > 0.99
    steps = prof.steps()  # what runs after the last prof.step() is no step (docs/api.md)
    assert len(steps) == 5 and (steps["gpu_busy_ns"] > 0).all()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12))


def test_kernels_never_start_before_their_launch():
    torch = cuda_torch()
    x = torch.randn(1024, 1024, device="cuda")
    with gpuprof.profile(activities=CUDA) as prof:
        for _ in range(20):
            x = (x @ x).tanh_()
        torch.cuda.synchronize()
    ev = prof.gpu_events()
    spans = prof.results.spans()
    corr_start = {int(c): int(s) for c, s in zip(spans["correlation"], spans["start_ns"]) if c}
    k = ev[ev["kind"] == "kernel"]
    assert len(k) >= 40
    checked = 0
    for c, s in zip(k["correlation"], k["start_ns"]):
        if int(c) in corr_start:
            assert s >= corr_start[int(c)]
            checked += 1
    assert checked >= 40


def test_item_is_a_sync_point_with_its_line():
    torch = cuda_torch()
    torch.backends.cuda.matmul.allow_tf32 = False
    model = _mlp(torch, width=4096, depth=4)  # GPU-heavy: .item() waits for real work
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8192, 4096, device="cuda")
    with gpuprof.profile(activities=CUDA) as prof:
        for _ in range(5):
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            line = inspect.currentframe().f_lineno + 1  # the next line's
            value = loss.item()
            prof.step()
    del value
    diag = prof.diagnose()
    sync = [f for f in diag if f.kind == "sync_point"]
    assert sync, str(diag)
    assert any(f.location.endswith(f"test_cuda_capture.py:{line}") for f in sync), str(diag)
    assert prof.steps()["sync_wait_ns"].sum() > 0


@pytest.mark.parametrize("cupti_sync_records", [False, True])
def test_synchronizations_have_their_kind_stream_device_and_caller(cupti_sync_records):
    # By default syncs come from the API callbacks; cuda_sync_events=True takes CUPTI's
    # SYNCHRONIZATION records. Either way each wait is a "sync" GPU event with its kind,
    # the stream it waited for, the device, and the op that made it.
    torch = cuda_torch()
    x = torch.randn(2048, 2048, device="cuda")
    with gpuprof.profile(activities=CUDA, cuda_sync_events=cupti_sync_records) as prof:
        for _ in range(3):
            y = x @ x
            torch.cuda.current_stream().synchronize()
            y = y @ x
            torch.cuda.synchronize()
            prof.step()
    parts = prof.results.cuda["parts"].split(",")
    assert ("sync" in parts) == cupti_sync_records, parts
    ev = prof.gpu_events()
    kernels = ev[ev["kind"] == "kernel"]
    sync = ev[ev["kind"] == "sync"]
    stream_syncs = sync[sync["name"] == "Stream Sync"]
    context_syncs = sync[sync["name"] == "Context Sync"]
    assert len(stream_syncs) >= 3 and len(context_syncs) >= 3, sorted(set(sync["name"]))
    assert set(stream_syncs["stream"]) <= set(kernels["stream"]), (stream_syncs, kernels)
    assert (sync["device"] == kernels["device"][0]).all()
    assert (sync["end_ns"] >= sync["start_ns"]).all() and (sync["op"] >= 0).all()
    # a sync waits for the GEMM before it: it ends after that kernel does
    assert (stream_syncs["end_ns"] >= kernels["end_ns"][:1]).all()
    assert prof.steps()["sync_wait_ns"].sum() > 0
    assert "Stream Sync" in set(prof.kernels()["name"])


def test_cupy_raw_kernel():
    cp = pytest.importorskip("cupy")
    add = cp.RawKernel(
        r"""
    extern "C" __global__ void add_one(float *x, int n) {
        int i = blockDim.x * blockIdx.x + threadIdx.x;
        if (i < n) x[i] += 1.0f;
    }""",
        "add_one",
    )
    x = cp.zeros(1 << 20, dtype=cp.float32)

    def launch_many():
        for _ in range(10):
            add(((1 << 20) // 256,), (256,), (x, cp.int32(1 << 20)))
        cp.cuda.Device().synchronize()

    launch_many()
    with gpuprof.profile(activities=CUDA) as prof:
        launch_many()
    k = prof.kernels()
    row = k[k["name"] == "add_one"]
    assert len(row) == 1 and row["calls"][0] == 10
    assert list(row["block"][0]) == [256, 1, 1]
    ev = prof.gpu_events()
    mine = ev[ev["name"] == "add_one"]
    launcher = "test_cupy_raw_kernel.<locals>.launch_many"
    assert all(
        str(n).startswith(launcher) or "RawKernel" in str(n) or "__call__" in str(n)
        for n in mine["op_name"]
    ), set(mine["op_name"])
    assert float(np.asarray(x[:4].get()).sum()) == 4 * 20


def test_cuda_graph_replay():
    torch = cuda_torch()
    x = torch.randn(512, 512, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            y = (x @ x).relu()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = (x @ x).relu()
    with gpuprof.profile(activities=CUDA) as prof:
        for _ in range(5):
            g.replay()
        torch.cuda.synchronize()
    ev = prof.gpu_events()
    graph_kernels = ev[(ev["kind"] == "kernel") & (ev["graph_id"] != 0)]
    assert len(graph_kernels) >= 10
    assert (graph_kernels["op"] >= 0).mean() > 0.9  # charged to the replay call
    del y


def _run(code):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )


def test_fallback_after_torch_profiler_ran():
    r = _run("""
        import torch, gpuprof
        x = torch.randn(256, 256, device="cuda")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
            (x @ x).sum().item()
        acts = [gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA]
        with gpuprof.profile(activities=acts) as prof:
            for _ in range(10):
                y = (x @ x).relu()
            torch.cuda.synchronize()
        ev = prof.gpu_events()
        k = ev[ev["kind"] == "kernel"]
        print("MODE", prof.results.cuda["mode"])
        print("KERNELS", len(k))
        print("ATTRIBUTED", (k["op"] >= 0).mean())
        print(prof.key_averages().table(row_limit=5))
    """)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    mode = out.split("MODE ")[1].split()[0]
    assert mode in ("activity-only", "callbacks"), out
    assert int(out.split("KERNELS ")[1].split()[0]) >= 20, out
    assert float(out.split("ATTRIBUTED ")[1].split()[0]) > 0.9, out
    if mode == "activity-only":
        assert "activity-only" in out


def test_kernel_count_and_time_match_torch_profiler():
    # In a subprocess: torch.profiler keeps CUPTI's callbacks after it ran, which would put
    # every later GPU test of this process into activity-only mode.
    cuda_torch()
    r = _run("""
        import torch, gpuprof
        from torch.profiler import ProfilerActivity, profile
        torch.backends.cuda.matmul.allow_tf32 = False
        layers = []
        for _ in range(4):
            layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(2048, 1024, device="cuda")
        def train(steps):
            for _ in range(steps):
                opt.zero_grad(set_to_none=True)
                model(x).square().mean().backward()
                opt.step()
            torch.cuda.synchronize()
        train(5)
        acts = [gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA]
        with gpuprof.profile(activities=acts) as prof:
            train(10)
        ours = prof.gpu_events()
        ours = ours[ours["kind"] == "kernel"]
        with profile(activities=[ProfilerActivity.CUDA]) as tp:
            train(10)
        theirs = [e for e in tp.events() if e.device_type.name == "CUDA"
                  and not e.name.startswith(("Memcpy", "Memset"))]
        t_ours = int((ours["end_ns"] - ours["start_ns"]).sum())
        t_theirs = sum(e.device_time_total for e in theirs) * 1000
        print("COUNTS", len(ours), len(theirs))
        print("RATIO", t_ours / t_theirs)
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    ours, theirs = map(int, r.stdout.split("COUNTS ")[1].split()[:2])
    ratio = float(r.stdout.split("RATIO ")[1].split()[0])
    print(f"kernels: gpuprof {ours} torch {theirs}; summed time ratio {ratio:.4f}")
    assert ours == theirs
    assert abs(ratio - 1) < 0.02
