"""The precision finding on a convolution network: FP32/TF32 cuDNN kernels are found by
name (forward, data and weight gradients), bf16 autocast makes the finding go."""

import gpuprof
import pytest
from gpu_helpers import cuda_torch, train_step
from gpuprof.analysis import diagnose as diagnose_mod

pytestmark = pytest.mark.gpu
CUDA = [gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA]


def _profile_convnet(amp: bool):
    torch = cuda_torch()
    nn = torch.nn
    torch.manual_seed(0)
    # convolutions take most of the GPU time, as in a ResNet's 3x3 stages (no batch
    # norm: its FP32 kernels are not matrix kernels and would dilute the share)
    model = nn.Sequential(
        nn.Conv2d(3, 128, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(128, 256, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(256, 256, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(256, 256, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(256, 10),
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")

    step = train_step(torch, opt, lambda: nn.functional.cross_entropy(model(x), y), amp=amp)
    with gpuprof.profile(activities=CUDA) as prof:
        for _ in range(5):
            step()
            prof.step()
        torch.cuda.synchronize()
    return prof


def _classes(prof):
    k = prof.kernels()
    rows = [
        (diagnose_mod.matrix_kernel_class(str(r["name"])), int(r["total_ns"]), str(r["name"]))
        for r in k
    ]
    for (family, precision), ns, name in sorted(rows, key=lambda r: -r[1])[:15]:
        print(f"{ns / 1e3:10.1f} us  {family or '-':12s} {precision:8s} {name[:110]}")
    return rows


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16_autocast"])
def test_convolutions_and_their_precision(amp):
    prof = _profile_convnet(amp)
    rows = _classes(prof)
    conv_ns = sum(ns for (family, _), ns, _ in rows if family == "convolution")
    matrix = [(p, ns) for (family, p), ns, _ in rows if family is not None]
    matrix_ns = sum(ns for _, ns in matrix)
    assert conv_ns > 0.5 * matrix_ns, "cuDNN's convolution kernels were not recognized"
    known = sum(ns for p, ns in matrix if p != "unknown")
    assert known > 0.9 * matrix_ns, "most matrix time has no precision in its kernel names"
    finding = next((f for f in prof.diagnose() if f.kind == "no_mixed_precision"), None)
    print(prof.diagnose())
    if amp:
        assert finding is None
        assert sum(ns for p, ns in matrix if p in ("bf16", "fp16")) > 0.5 * matrix_ns
    else:
        assert finding is not None
        assert finding.evidence["convolution_ns"] > 0.5 * finding.evidence["matrix_ns"]
        assert finding.evidence["fp32_tf32_share"] >= 0.25
