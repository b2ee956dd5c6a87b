"""Achieved TFLOPS and MFU on a real GPU (docs/flops.md, docs/diagnosis.md): a GPT-2
step under bf16 autocast, its op rows, steps, modules and the diagnosis's MFU finding.

Marked `gpu`: skipped where GPU capture is unusable or PyTorch sees no CUDA device.
gpuprof is imported before torch: NVTX attaches to gpuprof at torch's first NVTX call.
"""

import gpuprof  # noqa: I001  (first: see the module docstring)

import math
import os

import numpy as np
import pytest
from gpu_helpers import autograd_torch, flop_counter, profile_steps, train_step

from gpuprof.results._peaks import peak_tflops

pytestmark = pytest.mark.gpu
CUDA = [gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA]
STEPS = 4


def _gpt2(torch, batch=8, seq=256):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=4, n_embd=512, n_head=8)
    model = transformers.GPT2LMHeadModel(cfg).cuda().train()  # fp32 parameters
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")
    return model, train_step(torch, opt, lambda: model(input_ids=ids, labels=ids).loss, amp=True)


def test_gpt2_under_autocast_runs_bf16_below_its_peak():
    torch = autograd_torch()
    _, step = _gpt2(torch)
    expected = flop_counter(torch, step)
    prof = profile_steps(torch, step, STEPS, record_shapes=True, with_flops=True)
    device = torch.cuda.get_device_name()
    peak = peak_tflops(device, "bf16")
    if peak is None:
        pytest.skip(f"no published BF16 peak for {device}")
    ka = prof.key_averages()
    mm = [r for r in ka if r.key in ("aten::mm", "aten::addmm") and r.flops]
    assert mm, sorted(r.key for r in ka)[:40]
    # autocast: the matmuls ran in bf16 although the parameters are fp32
    assert {r.precision for r in mm} == {"bf16"}, [(r.key, r.precision) for r in mm]
    for r in ka:
        if r.mfu is not None:  # above 100% is a counting error
            assert 0 < r.mfu <= 1.0, (r.key, r.tflops, r.peak_tflops)
    text = ka.table(sort_by="self_cuda_time_total", row_limit=15)
    assert "MFU" in text
    # steps: FLOPs over wall time, each step the same work
    steps = prof.steps()
    assert len(steps) == STEPS
    flops = steps["flops"].astype(float)
    assert flops.min() > 0 and flops.max() == pytest.approx(flops.min(), rel=0.01)
    # FlopCounterMode's count of the same step (attention forward and backward in it)
    assert flops.mean() == pytest.approx(expected, rel=0.01), (flops.mean(), expected)
    assert all(0 < m <= 1.0 for m in steps["mfu"]), steps["mfu"]
    # the steps' FLOPs are the ops' FLOPs
    assert flops.sum() == pytest.approx(float(prof.ops()["flops"].sum()), rel=0.01)
    # modules: the model's FLOPs (forward and backward) are its rows' FLOPs
    mods = prof.modules()
    top = mods[mods["depth"] == 0]
    assert len(top) >= 1 and top["flops"].sum() > 0.9 * prof.ops()["flops"].sum()
    finite = [m for m in mods["mfu"] if not math.isnan(m)]
    assert finite and all(0 <= m <= 1.0 for m in finite)
    # the diagnosis says the steps' MFU and names ops
    found = [f for f in prof.diagnose() if f.kind == "mfu"]
    assert found and "MFU" in found[0].title, prof.diagnose().kinds()
    assert found[0].evidence["precision"] == "bf16"
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "mfu_gpt2.txt"), "w") as f:
            f.write(f"{device}\n{text}\n\n{found[0].title}\n\n")
            f.write(str(prof.module_table(max_depth=3, min_share=0.01)))


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16_autocast"])
def test_resnet18_convolutions_count_as_flop_counter_does(amp):
    torch = autograd_torch()
    torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed")
    torch.manual_seed(0)
    model = torchvision.models.resnet18().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 3, 224, 224, device="cuda")
    step = train_step(torch, opt, lambda: model(x).float().sum(), amp=amp)
    expected = flop_counter(torch, step)
    prof = profile_steps(torch, step, 2, record_shapes=True, with_flops=True)
    ops = prof.ops()
    by_op: dict[str, int] = {}
    for name, f in zip(ops["name"], ops["flops"].tolist()):
        by_op[name] = by_op.get(name, 0) + f
    assert by_op.get("aten::convolution_backward", 0) > 0, "no backward convolution counted"
    total = sum(by_op.values()) / 2
    assert total == pytest.approx(expected, rel=0.01), (total, expected, by_op)
    assert all(s["flops"] > 0 for s in prof.steps())
    for r in prof.key_averages():
        if r.mfu is not None:
            assert r.mfu <= 1.0, (r.key, r.tflops, r.peak_tflops)


def _dynamic(torch, **kwargs):
    lin = torch.nn.Linear(256, 256).cuda()
    for n in (64, 128):
        lin(torch.randn(n, 256, device="cuda")).sum().backward()
    with gpuprof.profile(activities=CUDA, record_shapes=True, with_flops=True, **kwargs) as prof:
        for n in (64, 128, 64, 32):  # the batch changes from step to step
            lin(torch.randn(n, 256, device="cuda")).sum().backward()
            prof.step()
        torch.cuda.synchronize()
    return prof


def test_dynamic_shapes_are_never_given_to_a_step_that_ran_others():
    # reuse_shapes (the default): the sizes of step 0 (batch 64) go to step 2, which
    # launched the same; steps 1 and 3 launched other grids and keep no shapes
    torch = autograd_torch()
    prof = _dynamic(torch)
    assert prof.results.cuda["aten_ops"]["shapes"] == {
        "reuse": True, "sampled": 1, "reused": 1, "unmatched": 2
    }  # fmt: skip
    grouped = prof.key_averages(group_by_input_shape=True)
    addmm = {tuple(map(tuple, r.input_shapes)): r for r in grouped if r.key == "aten::addmm"}
    shaped = [k for k in addmm if k]
    assert len(shaped) == 1 and shaped[0][1][0] == 64, list(addmm)
    assert addmm[shaped[0]].count == 2 and addmm[()].count == 2
    assert addmm[()].flops == 0  # no shapes, no FLOPs: not the 64-row count
    assert "2 ran other launches and show no shapes" in prof.key_averages().table()


def test_dynamic_shapes_are_rows_of_their_own():
    torch = autograd_torch()
    prof = _dynamic(torch, reuse_shapes=False)
    grouped = prof.key_averages(group_by_input_shape=True)
    addmm = {r.input_shapes[1][0]: r for r in grouped if r.key == "aten::addmm"}
    assert set(addmm) == {64, 128, 32}, [r.input_shapes for r in grouped if r.key == "aten::addmm"]
    assert addmm[64].count == 2 and addmm[128].count == 1
    # each shape's FLOPs are its own: 2 * n * 256 * 256 per call
    for n, r in addmm.items():
        assert r.flops == 2 * n * 256 * 256 * r.count, (n, r.flops)


def test_no_grad_evaluation_counts_the_forward_only():
    torch = autograd_torch()
    lin = torch.nn.Linear(512, 512).cuda()
    x = torch.randn(128, 512, device="cuda")
    with gpuprof.profile(activities=CUDA, record_shapes=True, with_flops=True) as prof:
        with torch.no_grad():
            for _ in range(3):
                lin(x)
                prof.step()
        torch.cuda.synchronize()
    ops = prof.ops()
    assert int(ops["flops"].sum()) == 3 * 2 * 128 * 512 * 512
    assert not any("Backward" in str(n) for n in ops["name"])


def _mlp(torch, width=1024, depth=4):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).cuda()


def _profile_shapes(torch, step):
    for _ in range(3):  # warm: compile, graphs, cuBLAS
        step()
    torch.cuda.synchronize()
    prof = profile_steps(torch, step, STEPS, record_shapes=True, with_flops=True)
    return prof


def _write(name, prof):
    out = os.environ.get("OUT")
    if out:
        text = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12)
        with open(os.path.join(out, name), "w") as f:
            f.write(f"{text}\n")


def test_torch_compile_shows_the_ops_inductor_still_dispatches():
    torch = autograd_torch()
    model = _mlp(torch)
    fwd = torch.compile(model)
    x = torch.randn(512, 1024, device="cuda")

    def step():
        fwd(x).square().mean().backward()
        model.zero_grad(set_to_none=True)

    prof = _profile_shapes(torch, step)
    _write("compile_table.txt", prof)
    ops = prof.ops()
    names = set(ops["name"])
    # the graph runs its kernels without ATen ops, except the matmuls Inductor hands
    # to cuBLAS (extern_kernels.mm/addmm, dispatched ops): those keep shapes and FLOPs
    assert "CompiledFunctionBackward" in names, sorted(names)[:30]
    counted = {str(n) for n, f in zip(ops["name"], ops["flops"]) if f}
    assert counted and counted <= {"aten::mm", "aten::addmm", "aten::bmm"}, counted
    # forward 4 matmuls, backward 8 (input and weight gradients; the first layer's input
    # needs none, so 7): 2 * 512 * 1024 * 1024 each
    per_mm = 2 * 512 * 1024 * 1024
    total = int(ops["flops"].sum()) / STEPS
    assert total == pytest.approx(11 * per_mm, rel=0.01), total / per_mm
    assert prof.results.attributed_gpu_fraction == 1.0
    for r in prof.key_averages():
        if r.mfu is not None:
            assert r.mfu <= 1.0, (r.key, r.tflops, r.peak_tflops)


def test_cuda_graph_replays_have_no_aten_rows_and_no_flops():
    torch = autograd_torch()
    model = _mlp(torch)
    x = torch.randn(512, 1024, device="cuda")
    static_out = None
    for _ in range(3):  # warm on a side stream before capture, as the CUDA graph docs do
        model(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_out = model(x)

    def step():
        graph.replay()

    prof = _profile_shapes(torch, step)
    _write("cuda_graph_table.txt", prof)
    assert static_out is not None
    ops = prof.ops()
    # a replay launches the captured kernels without running an op: nothing to count
    assert not any(str(n).startswith("aten::") for n in ops["name"]), sorted(set(ops["name"]))
    assert int(ops["flops"].sum()) == 0
    ev = prof.gpu_events()
    kernels = ev[ev["kind"] == "kernel"]
    assert len(kernels) and (kernels["graph_id"] != 0).all()
    assert all(s["flops"] == 0 and math.isnan(s["mfu"]) for s in prof.steps())


def test_ddp_keeps_the_flops_and_its_all_reduce_has_none(tmp_path):
    """DDP on one rank (the reducer's NCCL all-reduce runs during the backward all the
    same): the matmuls' FLOPs are those of the model without DDP, and the communication
    kernels count none."""
    torch = autograd_torch()
    dist = torch.distributed
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        model = _mlp(torch)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(512, 1024, device="cuda")
        step = train_step(torch, opt, lambda: ddp(x).square().mean())
        expected = flop_counter(torch, step)
        prof = profile_steps(torch, step, STEPS, record_shapes=True, with_flops=True)
    finally:
        dist.destroy_process_group()
    total = int(prof.ops()["flops"].sum()) / STEPS
    assert total == pytest.approx(expected, rel=0.01), (total, expected)
    # NCCL on a single rank may all-reduce without a kernel of its own (on an H100 it
    # launched none); where it launches one, that op counts no FLOPs
    ev = prof.gpu_events()
    nccl = ev[np.char.find(ev["name"].astype(str), "nccl") >= 0]
    ops = prof.ops()
    assert not ops["flops"][np.unique(nccl["op"][nccl["op"] >= 0])].any()
    assert prof.results.attributed_gpu_fraction == 1.0
