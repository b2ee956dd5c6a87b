"""ATen op rows, input shapes and FLOPs on a real GPU (``record_shapes=True``,
``with_flops=True``; docs/aten.md, docs/flops.md): PyTorch's NVTX range per ATen op,
its input sizes kept, the counts checked against torch.utils.flop_counter.

Marked `gpu`: skipped where GPU capture is unusable or PyTorch sees no CUDA device.
gpuprof is imported before torch: NVTX attaches to gpuprof at torch's first NVTX call.
"""

import gpuprof  # noqa: I001, F401  (first: see the module docstring)

import os

import numpy as np
import pytest
from gpu_helpers import autograd_torch, flop_counter, profile_steps

from gpuprof.results._peaks import peak_tflops

pytestmark = pytest.mark.gpu
STEPS = 3


def _mlp(torch, dtype):
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).cuda().to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(512, 1024, device="cuda", dtype=dtype)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x).float().square().mean()
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    return step


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_aten_rows_shapes_and_flops_matchflop_counter(dtype):
    torch = autograd_torch()
    step = _mlp(torch, getattr(torch, dtype))
    expected = flop_counter(torch, step)
    prof = profile_steps(torch, step, STEPS, record_shapes=True, with_flops=True)
    aten = prof.results.cuda["aten_ops"]
    assert (aten["wanted"], aten["on"], aten["reason"]) == ("shapes", True, ""), aten
    # the sizes come on the first step and are given to the steps that ran the same
    assert aten["shapes"] == {"reuse": True, "sampled": 1, "reused": STEPS - 1, "unmatched": 0}
    ops = prof.ops()
    names = set(ops["name"])
    # ATen rows as torch names them, forward and backward, with their shapes
    assert {"aten::linear", "aten::addmm", "aten::mm"} <= names, sorted(names)[:40]
    addmm = ops[ops["name"] == "aten::addmm"]
    assert (addmm["input_shapes"] != "").all() and "[512, 1024]" in addmm["input_shapes"][0]
    # nested under the Python call that ran them
    tree = prof.call_tree()
    op_names = ops["name"]
    linear_nodes = [i for i in range(len(tree)) if op_names[tree["op"][i]] == "aten::linear"]
    parents = {op_names[tree["op"][tree["parent"][i]]] for i in linear_nodes}
    assert parents == {"torch._C._nn.linear"}, parents
    # FLOPs: the same count as FlopCounterMode's, forward and backward, within 1%
    total = int(ops["flops"].sum())
    assert abs(total - STEPS * expected) <= 0.01 * STEPS * expected, (total, expected)
    # and no op runs above the dense peak of its precision
    ka = prof.key_averages()
    peak = peak_tflops(torch.cuda.get_device_name(), "bf16" if dtype == "bfloat16" else "tf32")
    for r in ka:
        if r.flops and r.device_time_total:
            tflops = r.flops / (r.device_time_total * 1e-6) / 1e12
            assert peak is None or tflops <= peak * 1.05, (r.key, tflops, peak)
    # kernel time stays fully attributed; the table shows shapes and FLOPs
    assert prof.results.attributed_gpu_fraction == 1.0
    grouped = prof.key_averages(group_by_input_shape=True)
    text = grouped.table(sort_by="self_cuda_time_total", row_limit=12)
    assert "Input Shapes" in text and "FLOPs" in text and "TFLOPS" in text
    assert any(r.key == "aten::mm" and r.input_shapes for r in grouped)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"aten_table_{dtype}.txt"), "w") as f:
            f.write(f"{text}\n\nFlopCounterMode per step: {expected}\n")


def _shaped_rows(prof):
    ops = prof.ops()
    rows = zip(ops["name"], ops["input_shapes"], ops["calls"], ops["flops"], strict=True)
    return sorted(
        (str(n), str(s), int(c), int(f)) for n, s, c, f in rows if str(n).startswith("aten::")
    )


def test_reused_shapes_are_the_shapes_every_step_records():
    # reuse_shapes=False asks PyTorch for the sizes on every step: the same rows,
    # calls and FLOPs as the sizes of the first step given to the others
    torch = autograd_torch()
    step = _mlp(torch, torch.bfloat16)
    every = profile_steps(
        torch, step, STEPS, record_shapes=True, with_flops=True, reuse_shapes=False
    )
    assert every.results.cuda["aten_ops"]["shapes"] == {
        "reuse": False, "sampled": STEPS, "reused": 0, "unmatched": 0
    }  # fmt: skip
    reused = profile_steps(torch, step, STEPS, record_shapes=True, with_flops=True)
    assert reused.results.cuda["aten_ops"]["shapes"]["reused"] == STEPS - 1
    assert _shaped_rows(reused) == _shaped_rows(every)


def test_aten_ops_without_shapes_are_one_row_per_op():
    torch = autograd_torch()
    step = _mlp(torch, torch.float32)
    prof = profile_steps(torch, step, STEPS, aten_ops=True)
    ops = prof.ops()
    addmm = ops[ops["name"] == "aten::addmm"]
    assert len(addmm) == 1 and addmm["calls"][0] == 4 * STEPS
    assert (ops["input_shapes"] == "").all() and not ops["flops"].any()
    assert prof.results.cuda["aten_ops"]["on"]
    kernels = np.int64(prof.kernels()["calls"].sum())
    assert kernels > 0 and prof.results.attributed_gpu_fraction == 1.0
