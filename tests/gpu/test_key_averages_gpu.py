"""key_averages() on a real GPU (issue 20): CUDA Mem columns with real figures,
device-time attributes of the row objects and of prof.events(), sorting by CUDA time
without a fallback, and PyTorch's CUDA functions named as written.

Marked `gpu`: skipped (with the loader's reason) where GPU capture is unusable.
"""

import gpuprof
import pytest
from gpu_helpers import cuda_torch

pytestmark = pytest.mark.gpu
CUDA = [gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA]
MiB = 1 << 20


def test_cuda_rows_columns_and_events():
    torch = cuda_torch()
    torch.cuda.empty_cache()  # the allocation below must reach cudaMalloc
    x = torch.ones(256, 256, device="cuda")
    torch.cuda.synchronize()
    with gpuprof.profile(activities=CUDA, profile_memory=True) as prof:
        for _ in range(3):
            keep = torch.empty(64 * MiB // 4, device="cuda")  # a new 64 MiB block
            torch.relu(torch.addmm(x, x, x))
            prof.step()
        torch.cuda.synchronize()
    del keep
    ka = prof.key_averages()
    header = ka.table(sort_by="cuda_memory_usage").split("\n")[1]
    assert "CUDA Mem" in header and "Self CUDA Mem" in header and "CPU Mem" not in header
    rows = {e.key: e for e in ka}
    assert rows["torch.addmm"].self_device_time_total > 0
    assert rows["torch.relu"].device_time_total > 0
    assert rows["ProfilerStep*"].device_time_total >= rows["torch.addmm"].device_time_total
    # the allocation is the empty() call's, and its callers' totals include it
    assert rows["torch.empty"].self_device_memory_usage >= 64 * MiB
    assert rows["ProfilerStep*"].device_memory_usage >= rows["torch.empty"].device_memory_usage
    text = ka.table(sort_by="self_cuda_time_total")
    assert "Sorted by self CPU time" not in text
    assert text.split("\n")[3].startswith("torch.")  # a launching C function first
    # per call: each addmm call launched GPU work
    addmm = [e for e in prof.events() if e.name == "torch.addmm"]
    assert len(addmm) == 3 and all(e.self_device_time_total > 0 for e in addmm)
