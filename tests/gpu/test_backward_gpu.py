"""Inside the backward pass on a real GPU: each kernel autograd launches is charged to
its node (``AddmmBackward0``), through PyTorch's NVTX range per node (docs/backward.md).

Marked `gpu`: skipped where GPU capture is unusable or PyTorch sees no CUDA device.
gpuprof is imported before torch, as users should: NVTX attaches to gpuprof at torch's
first NVTX call.
"""

import gpuprof  # noqa: I001  (first: see the module docstring)

import json
import threading

import numpy as np
import pytest
from gpu_helpers import NODE, autograd_torch, train_step

pytestmark = pytest.mark.gpu
CUDA = [gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA]
STEPS = 4


def _torch():
    return autograd_torch()


def _mlp(torch):
    """The launch-bound MLP of the benchmarks: 16 x Linear(256) + ReLU, batch 64, SGD."""
    torch.manual_seed(0)
    layers = []
    for _ in range(16):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256, device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()

    for _ in range(3):  # warm: cuBLAS handles, the autograd threads, NVTX attached
        step()
    torch.cuda.synchronize()
    return step


def _profile(torch, step, **kw):
    with gpuprof.profile(activities=CUDA, **kw) as prof:
        for _ in range(STEPS):
            step()
            prof.step()
        torch.cuda.synchronize()
    assert prof.results.cuda["active"], prof.results.cuda
    return prof


def _backward_kernels(prof):
    """The GPU work (kernels, copies, sets: what ops' Self CUDA counts) launched on
    threads other than this one (autograd's), all of it, and the ops."""
    threads = prof.results.threads()
    me = [i for i, t in enumerate(threads) if int(t["ident"]) == threading.get_ident()]
    assert len(me) == 1
    ev = prof.gpu_events()
    work = ev[np.isin(ev["kind"], ["kernel", "memcpy", "memset"])]
    return work[work["thread"] != me[0]], work, prof.ops()


def test_every_backward_kernel_is_charged_to_its_node(tmp_path):
    torch = _torch()
    step = _mlp(torch)
    prof = _profile(torch, step)
    assert prof.results.cuda["autograd_nodes"] == {"on": True, "reason": "", "forward": True}
    bwd, _, ops = _backward_kernels(prof)
    assert len(bwd) >= STEPS * 16 * 2, bwd[["name", "op_name"]]  # two GEMMs a layer at least
    # 100% of their time (and every one of them) under a node row from "autograd"
    owner_file = np.array([ops["file"][o] if o >= 0 else "" for o in bwd["op"]])
    assert (owner_file == "autograd").all(), bwd[owner_file != "autograd"][["name", "op_name"]]
    assert all(NODE.search(str(n)) for n in bwd["op_name"]), set(bwd["op_name"])
    assert not bwd["blocked_thread"].any()
    # one row per node name, with its calls, Self CUDA and # of Kernels
    nodes = ops[ops["file"] == "autograd"]
    assert len(set(nodes["name"])) == len(nodes)
    add = nodes[nodes["name"] == "AddmmBackward0"]
    assert len(add) == 1 and add["calls"][0] == STEPS * 16, nodes[["name", "calls"]]
    assert add["kernels"][0] >= STEPS * 16 * 2 and add["cuda_self_ns"][0] > 0
    node_time = int(nodes["cuda_self_ns"].sum())
    assert node_time == int(np.sum(bwd["end_ns"] - bwd["start_ns"]))
    assert int(nodes["kernels"].sum()) == len(bwd)
    # key_averages(): the node rows hold them, run_backward holds none itself
    ka = {e.key: e for e in prof.key_averages()}
    assert ka["AddmmBackward0"].count == STEPS * 16
    run = [e for k, e in ka.items() if k.endswith("_EngineBase.run_backward")]
    assert len(run) == 1 and run[0].self_cuda_time_total == 0, run
    # ... while its total still has them: the step's kernel time stays under the step
    assert run[0].cuda_time_total * 1000 >= node_time * 0.999
    table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15)
    assert "AddmmBackward0" in table and "Autograd nodes: on" in table
    print(table)
    # the trace: node slices on autograd's thread, named by the node, with their seq
    path = prof.export_chrome_trace(str(tmp_path / "t.json"))
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    me = threading.get_native_id()
    named = [e for e in events if e.get("ph") == "X" and e.get("name") == "AddmmBackward0"]
    slices = [e for e in named if e["cat"] == "user_annotation"]
    assert len(slices) == STEPS * 16
    assert all(e["tid"] != me for e in slices)
    # and the node's span of GPU time on the GPU lanes, as for every range
    assert len([e for e in named if e["cat"] == "gpu_user_annotation"]) == STEPS * 16
    assert all(isinstance(e["args"].get("Sequence number"), int) for e in slices)


def test_kernel_counts_are_the_same_with_nodes_off():
    torch = _torch()
    step = _mlp(torch)
    on = _profile(torch, step)
    off = _profile(torch, step, autograd_nodes=False)
    assert off.results.cuda["autograd_nodes"] == {
        "on": False,
        "reason": "autograd_nodes=False",
        "forward": False,
    }
    k_on, k_off = on.kernels(), off.kernels()
    assert int(k_on["calls"].sum()) == int(k_off["calls"].sum())
    assert dict(zip(k_on["name"], k_on["calls"])) == dict(zip(k_off["name"], k_off["calls"]))
    # without the ranges the backward pass is one call again (the blocked-thread rule)
    ops = off.ops()
    assert not (ops["file"] == "autograd").any()
    run = ops[np.array([str(n).endswith("_EngineBase.run_backward") for n in ops["name"]])]
    assert len(run) == 1 and run["cuda_self_ns"][0] > 0
    bwd, _, _ = _backward_kernels(off)
    assert bwd["blocked_thread"].all()


def test_ranges_are_on_only_while_a_window_records():
    torch = _torch()
    step = _mlp(torch)
    seen = []
    sched = gpuprof.schedule(wait=2, warmup=1, active=2, repeat=1)
    with gpuprof.profile(activities=CUDA, schedule=sched) as prof:
        for _ in range(7):
            seen.append(torch.autograd._profiler_enabled())
            step()
            prof.step()
        torch.cuda.synchronize()
    seen.append(torch.autograd._profiler_enabled())
    assert seen == [False, False, True, True, True, False, False, False]
    ops = prof.ops()
    add = ops[ops["name"] == "AddmmBackward0"]
    assert len(add) == 1 and add["calls"][0] == 2 * 16  # the two active steps


def test_another_torch_profiler_keeps_its_hold():
    torch = _torch()
    step = _mlp(torch)
    with torch.autograd.profiler.emit_nvtx():
        prof = _profile(torch, step)
    st = prof.results.cuda["autograd_nodes"]
    assert st["on"] is False and "another PyTorch profiler" in st["reason"]
    # emit_nvtx's own ranges are named by their op or node all the same
    ops = prof.ops()
    names = set(ops["name"][ops["kind"] == "user"])
    assert "AddmmBackward0" in names and "aten::addmm" in names
    assert not any("op_id" in str(n) or "evaluate_function" in str(n) for n in names)
    assert ops[ops["name"] == "AddmmBackward0"]["calls"][0] == STEPS * 16


def _work_ns(ev):
    return int(np.sum(ev["end_ns"] - ev["start_ns"]))


def _check_join(prof, min_share=0.99):
    """What item 2 promises, on a real run: every backward kernel in a node, at least
    99% of their time joined to a forward call, and forward + backward adding up."""
    bwd, work, ops = _backward_kernels(prof)
    summary = prof.results.backward_summary()
    assert summary["node_ns"] == _work_ns(bwd), summary  # 100% in a node
    assert summary["joined_ns"] >= min_share * summary["node_ns"], summary
    joined = bwd[bwd["fwd_op"] >= 0]
    assert _work_ns(joined) == summary["joined_ns"]
    # no backward time is charged to a backward row or to gpuprof: forward calls only
    assert not any(NODE.search(str(n).split(" (")[0]) for n in set(joined["fwd_op_name"]))
    # forward and backward together: the step's calls hold every kernel once
    ka = {e.key: e for e in prof.key_averages()}
    return summary, ka, work


def test_backward_joins_the_forward_on_the_mlp():
    torch = _torch()
    step = _mlp(torch)
    prof = _profile(torch, step)
    assert prof.results.cuda["autograd_nodes"]["forward"] is True
    summary, ka, work = _check_join(prof)
    linear = ka["torch._C._nn.linear"]
    add = ka["AddmmBackward0"]
    # every Linear's backward GEMMs and bias sums belong to its forward call
    assert linear.backward_cuda_time_total >= 0.99 * add.self_cuda_time_total
    tree = prof.call_tree()
    top = tree[[str(n).startswith("_mlp.<locals>.step") for n in tree["name"]]]
    assert len(top) == 1, tree[["name"]]
    unjoined = sum(summary["unjoined_ns"].values())
    assert int(top["cuda_total_ns"][0]) == _work_ns(work)  # rolled-up backward included
    fwd_bwd = ka[str(top["name"][0])].forward_backward_cuda_time_total * 1000
    assert abs(fwd_bwd + unjoined - _work_ns(work)) <= 0.001 * _work_ns(work)
    table = prof.key_averages().table(sort_by="forward_backward_cuda_time_total", row_limit=12)
    assert "Backward joined to the forward" in table and "Fwd+Bwd CUDA" in table
    print(table)


def test_backward_joins_the_forward_on_gpt2():
    torch = _torch()
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=4096)
    model = transformers.GPT2LMHeadModel(config).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (8, 128), device="cuda")
    step = train_step(torch, opt, lambda: model(input_ids=ids, labels=ids).loss, amp=True)
    prof = _profile(torch, step)
    off = _profile(torch, step, autograd_nodes=False)
    k_on, k_off = prof.kernels(), off.kernels()
    assert dict(zip(k_on["name"], k_on["calls"])) == dict(zip(k_off["name"], k_off["calls"]))
    summary, ka, _ = _check_join(prof)
    # the attention's and the MLP's projections (Conv1D: torch.addmm) carry their backward
    assert ka["torch.addmm"].backward_cuda_time_total > 0
    print(prof.key_averages().table(sort_by="forward_backward_cuda_time_total", row_limit=15))
    # the modules table: each block its own row, with its forward and backward GPU time
    mods = prof.modules()
    blocks = mods[mods["cls"] == "GPT2Block"]
    assert list(blocks["name"]) == [f"transformer.h.{i}" for i in range(config.n_layer)]
    assert (blocks["cuda_fwd_ns"] > 0).all() and (blocks["cuda_bwd_ns"] > 0).all()
    assert (blocks["calls"] == STEPS).all()
    top = mods[mods["parent"] < 0]
    assert list(top["name"]) == ["GPT2LMHeadModel"]
    # what no module made: the optimizer's and zero_grad's kernels, and backward work
    # not joined to a forward call; with those the figures add up to the GPU work
    ev = prof.gpu_events()
    work = ev[np.isin(ev["kind"], ["kernel", "memcpy", "memset"])]
    outside = int(prof.results.gpu_work_ns()) - int(top["cuda_fwd_ns"][0] + top["cuda_bwd_ns"][0])
    opt_ns = _work_ns(
        work[
            [
                ("AdamW" in str(n) or "_foreach" in str(n) or "zero_" in str(n))
                for n in work["op_name"]
            ]
        ]
    )
    assert outside >= sum(summary["unjoined_ns"].values())
    assert abs(outside - opt_ns - sum(summary["unjoined_ns"].values())) <= 0.02 * _work_ns(work)
    print(prof.module_table())
