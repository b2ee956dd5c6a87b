"""The backward pass joined to the forward, in the cases training code meets: torch.compile,
CUDA graphs, activation checkpointing, gradient accumulation, no_grad evaluation, DDP and
a second thread (docs/backward.md, "Where it applies").

Marked `gpu`: skipped where GPU capture is unusable or PyTorch sees no CUDA device.
"""

import gpuprof  # noqa: I001  (first: NVTX attaches to gpuprof at torch's first NVTX call)

import os
import threading

import numpy as np
import pytest
from gpu_helpers import autograd_torch

pytestmark = pytest.mark.gpu
CUDA = [gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA]
STEPS = 3


def _torch():
    return autograd_torch()


def _mlp(torch, depth=4, width=512):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).cuda()


def _record(torch, step, **kw):
    for _ in range(3):  # warm: compile, graphs, cuBLAS, the autograd threads
        step()
    torch.cuda.synchronize()
    with gpuprof.profile(activities=CUDA, **kw) as prof:
        for _ in range(STEPS):
            step()
            prof.step()
        torch.cuda.synchronize()
    return prof


def _work(prof):
    ev = prof.gpu_events()
    return ev[np.isin(ev["kind"], ["kernel", "memcpy", "memset"])]


def _ns(ev):
    return int(np.sum(ev["end_ns"] - ev["start_ns"]))


def _main_thread_row(prof):
    idents = prof.results.threads()["ident"]
    return int(np.flatnonzero(idents == threading.get_ident())[0])


def _backward(prof):
    """The work autograd's thread launched (not the stepping thread's)."""
    w = _work(prof)
    return w[w["thread"] != _main_thread_row(prof)]


ACC = "torch::autograd::AccumulateGrad"


def _joined(prof, min_share=0.99):
    """Every backward node's work joined to its forward call, but AccumulateGrad's (a
    leaf's gradient added into the one already there: it has no forward call), and at
    least ``min_share`` of the whole."""
    s = prof.results.backward_summary()
    assert s["node_ns"] > 0, s
    assert set(s["unjoined_ns"]) <= {ACC}, s
    assert s["joined_ns"] >= min_share * s["node_ns"], s
    return s


def _in_nodes(prof):
    """The GPU work of autograd's thread is all in node calls: per record, the node span
    above its launch (gpuprof.results._backward)."""
    w = prof.results.window()
    b = w.backward()
    ev = prof.gpu_events()
    work = np.isin(ev["kind"], ["kernel", "memcpy", "memset"])
    bwd = work & (ev["thread"] != _main_thread_row(prof))
    return bwd, b.node_span >= 0


def test_torch_compile_backward_is_compiled_function_backward():
    torch = _torch()
    model = _mlp(torch)
    fwd = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(256, 512, device="cuda")

    def step():
        fwd(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    prof = _record(torch, step)
    ops = prof.ops()
    names = set(ops["name"][ops["file"] == "autograd"])
    assert "CompiledFunctionBackward" in names, names
    # the compiled backward's launches (Triton launchers, extern mm calls: Python
    # frames inside the node) are all the node's, joined to the compiled forward call
    bwd, in_node = _in_nodes(prof)
    assert in_node[bwd].all()
    s = _joined(prof)
    assert _ns(_backward(prof)) == s["node_ns"]


def test_cuda_graph_replays_are_charged_to_their_node():
    torch = _torch()
    model = _mlp(torch)
    x = torch.randn(64, 512, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (x,))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        graphed(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    prof = _record(torch, step)
    off = _record(torch, step, autograd_nodes=False)
    k_on, k_off = prof.kernels(), off.kernels()
    assert dict(zip(k_on["name"], k_on["calls"])) == dict(zip(k_off["name"], k_off["calls"]))
    bwd, in_node = _in_nodes(prof)
    ev = prof.gpu_events()
    replayed = bwd & (ev["graph_id"] != 0)
    assert replayed.any()
    # the backward graph's replay (CUDAGraph.replay, inside the Graphed node) is the node's
    assert in_node[replayed].all(), set(ev["op_name"][replayed & ~in_node])
    _joined(prof, min_share=0.9)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_forward_is_forward_not_backward(reentrant):
    torch = _torch()
    from torch.utils.checkpoint import checkpoint

    blocks = torch.nn.ModuleList([_mlp(torch, depth=2) for _ in range(2)])
    opt = torch.optim.SGD(blocks.parameters(), lr=1e-3)
    x = torch.randn(128, 512, device="cuda", requires_grad=True)

    def step():
        h = x
        for b in blocks:
            h = checkpoint(b, h, use_reentrant=reentrant)
        h.square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    prof = _record(torch, step)
    bwd, in_node = _in_nodes(prof)
    ev = prof.gpu_events()
    # the recomputed forward, launched on autograd's thread, is the Linear's forward,
    # in no node and joined to nothing...
    again = bwd & np.array([str(n) == "torch._C._nn.linear" for n in ev["op_name"]])
    assert again.sum() >= STEPS * 4, set(ev["op_name"][bwd])
    assert not in_node[again].any() and (ev["fwd_op"][again] == -1).all()
    # ... and the backward proper is in nodes, joined but for AccumulateGrad (x.grad
    # grows step by step)
    s = _joined(prof, min_share=0.95)
    assert _ns(ev[bwd & in_node]) == s["node_ns"]
    assert _ns(ev[bwd & ~in_node]) > 0


def test_gradient_accumulation_joins_each_micro_batch():
    torch = _torch()
    model = _mlp(torch)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    xs = [torch.randn(64, 512, device="cuda") for _ in range(4)]

    def step():
        for x in xs:
            (model(x).square().mean() / len(xs)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    prof = _record(torch, step)
    _joined(prof, min_share=0.8)  # the rest: the micro-batches' gradients added up
    # each micro-batch's Linear calls made their own nodes: one arrow per node
    b = prof.results.window().backward()
    spans = prof.results.window().raw["spans"]
    linear_row = int(np.flatnonzero(prof.ops()["name"] == "torch._C._nn.linear")[0])
    fwd = b.span_fwd[b.span_fwd >= 0]
    calls = int((spans["op_row"][fwd] == linear_row).sum())
    assert calls == STEPS * len(xs) * 4 * 2  # AddmmBackward0 and TBackward0 per Linear call


def test_no_grad_evaluation_makes_no_nodes():
    torch = _torch()
    model = _mlp(torch)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 512, device="cuda")

    def evaluate():
        with torch.no_grad():
            return model(x).sum()

    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        evaluate()

    prof = _record(torch, step)
    _joined(prof)
    rows = {e.key.split(" (")[0]: e for e in prof.key_averages()}
    ev = rows["test_no_grad_evaluation_makes_no_nodes.<locals>.evaluate"]
    assert ev.backward_cuda_time_total == 0 and ev.cuda_time_total > 0


def test_ddp_all_reduce_is_in_a_node():
    torch = _torch()
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if not dist.is_nccl_available():
        pytest.skip("NCCL is not available")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        model = DDP(_mlp(torch), device_ids=[0], bucket_cap_mb=1)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(64, 512, device="cuda")

        def step():
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        prof = _record(torch, step)
    finally:
        dist.destroy_process_group()
    # the reducer's work (bucket copies, the all-reduce: one rank's is a copy), launched
    # from a gradient's hook after its node, is that node's: all of autograd's thread's
    # work is in a node
    bwd, in_node = _in_nodes(prof)
    ev = prof.gpu_events()
    assert (bwd & (ev["kind"] == "memcpy")).any(), set(ev["name"][bwd])
    # ... but for the reducer's end of the backward pass (finalize_backward, run as the
    # graph task's final callback after the last node): in no node, it stays under
    # run_backward, the call the step waits in
    outside = bwd & ~in_node
    assert set(ev["op_name"][outside]) <= {"torch._C._EngineBase.run_backward"}
    # (the all-reduce is AccumulateGrad's, which no forward call made: not joined)
    _joined(prof, min_share=0.0)


def test_a_second_forward_thread_does_not_take_the_main_threads_nodes():
    """Another thread training its own model at the same time numbers its nodes with
    its own counter, so the same numbers come up on both threads: the main thread's
    nodes must still join to the main thread's forward calls."""
    torch = _torch()
    model, other = _mlp(torch), _mlp(torch)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 512, device="cuda")
    stop = threading.Event()

    def side():  # its own forward and backward passes, its own node numbers
        while not stop.is_set():
            other(x).square().mean().backward()
            torch.cuda.synchronize()

    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t = threading.Thread(target=side, name="side")
    t.start()
    try:
        prof = _record(torch, step)
    finally:
        stop.set()
        t.join()
    # (the side thread's backward has no node ranges and shares autograd's thread: its
    # launches right after one of the main thread's nodes are charged to that node,
    # docs/backward.md says so; only the join is checked here)
    w = prof.results.window()
    b = w.backward()
    assert (b.fwd_node >= 0).any()
    tree = w.raw["nodes"]
    fwd_threads = set(tree["thread"][b.fwd_node[b.fwd_node >= 0]].tolist())
    assert fwd_threads == {_main_thread_row(prof)}
