"""Memory curves on a real GPU: PyTorch allocations in the CUPTI and allocator curves, the
peak against torch.cuda.max_memory_allocated(), a CuPy allocation in the device curve.

Marked `gpu`: skipped (with the loader's reason) where GPU capture is unusable.
"""

import sys
import time

import gpuprof
import numpy as np
import pytest
from gpu_helpers import cuda_torch

pytestmark = pytest.mark.gpu
CUDA = [gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA]
MiB = 1 << 20
BLOCK = 2 * MiB  # the caching allocator rounds large blocks to 2 MiB
SIZE = 256 * MiB


def _increments(curve, size):
    """How many consecutive rows of `curve` rise by exactly `size` bytes."""
    return int(np.sum(np.diff(curve["allocated_bytes"]) == size))


def _allocate_three(torch):
    keep = []
    for _ in range(3):
        keep.append(torch.empty(SIZE // 4, dtype=torch.float32, device="cuda:0"))  # ALLOC LINE
        time.sleep(0.05)  # several sampler periods between allocations
    return keep


ALLOC_LINE = _allocate_three.__code__.co_firstlineno + 3


def _cupy_held():
    """(used, reserved) bytes of CuPy's device pool once its free blocks went back to the
    driver: what arrays of earlier tests of this process still hold, which the default
    curve rightly adds to torch's. (0, 0) where CuPy is not loaded."""
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return 0, 0
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    return int(pool.used_bytes()), int(pool.total_bytes())


def test_torch_allocations_make_three_steps_and_the_right_peak():
    torch = cuda_torch()
    # given: CUDA and the allocator up, nothing cached, peak counter at the current value
    cupy_used, cupy_reserved = _cupy_held()
    torch.cuda.set_device(0)
    torch.ones(1, device="cuda:0").sum().item()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(0)
    before = torch.cuda.memory_allocated(0)

    # when: three 256 MiB tensors are allocated inside the window, then freed
    with gpuprof.profile(
        activities=CUDA, profile_memory=True, memory_sample_interval_s=0.005
    ) as prof:
        keep = _allocate_three(torch)
        torch.cuda.synchronize()
        torch_peak = torch.cuda.max_memory_allocated(0)
        del keep
        time.sleep(0.03)

    # then: the torch adapter sampled the device, and/or CUPTI saw the three cudaMallocs
    assert "torch" in {a.name for a in prof._memory_sampler.adapters}, prof._memory_sampler.errors
    sampled = prof.memory_curve("cuda:0", source="torch")
    cupti = prof.memory_curve("cuda:0", source="cupti")
    torch_steps = _increments(sampled, SIZE)
    cupti_steps = _increments(cupti, SIZE)
    assert torch_steps >= 3 or cupti_steps >= 3, (torch_steps, cupti_steps, prof.results.cuda)
    assert np.all(np.diff(sampled["timestamp_ns"]) > 0)
    assert sampled["allocated_bytes"][0] == before
    assert sampled["allocated_bytes"][-1] == before  # freed before the window closed
    assert sampled["reserved_bytes"].max() >= before + 3 * SIZE

    s = prof.memory_summary()
    d = s.devices["cuda:0"]
    assert d.peak_source == ("torch + cupy" if cupy_reserved else "torch")
    assert abs(d.peak_bytes - torch_peak - cupy_used) <= BLOCK, (d.peak_bytes, torch_peak)
    assert torch_peak - before == 3 * SIZE

    if prof.results.cuda["active"]:
        # the caching allocator cudaMalloc'ed each 256 MiB block: CUPTI's curve (relative to
        # the window start) peaks at 768 MiB, reached by the third torch.empty
        assert cupti_steps >= 3, cupti
        r = d.driver
        assert r is not None and r["peak_bytes"] >= 3 * SIZE
        if prof.results.cuda["mode"] == "callbacks":
            assert r["peak_location"].endswith(f"test_memory_gpu.py:{ALLOC_LINE}"), r
            assert "empty" in r["peak_op"], r
        assert r["largest"][0]["bytes"] == SIZE
    assert "cuda:0" in str(s)


def test_allocator_reserved_and_allocated():
    torch = cuda_torch()
    torch.cuda.set_device(0)
    torch.ones(1, device="cuda:0").sum().item()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(0)
    with gpuprof.profile(
        activities=CUDA, profile_memory=True, memory_sample_interval_s=0.005
    ) as prof:
        # many small-ish blocks of different sizes, freed: the cache keeps them reserved
        blocks = [
            torch.empty((i + 1) * 3 * MiB, dtype=torch.uint8, device="cuda:0") for i in range(20)
        ]
        del blocks
        held = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        time.sleep(0.03)
    a = prof.memory_summary().devices["cuda:0"].allocator
    assert a is not None
    assert a["end_reserved_bytes"] >= a["end_allocated_bytes"]
    assert a["peak_reserved_bytes"] >= a["peak_allocated_bytes"]
    del held
    torch.cuda.empty_cache()


def test_cupy_allocation_appears_in_the_device_curve():
    cp = pytest.importorskip("cupy")
    try:
        cp.cuda.Device(0).use()
        cp.zeros(1).sum().item()
    except Exception as e:  # noqa: BLE001 (CuPy without a usable device)
        pytest.skip(f"CuPy cannot use device 0: {e}")
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    with gpuprof.profile(
        activities=CUDA, profile_memory=True, memory_sample_interval_s=0.005
    ) as prof:
        base = pool.used_bytes()
        x = cp.empty(SIZE, dtype=cp.uint8)
        time.sleep(0.05)
        cp.cuda.runtime.deviceSynchronize()
        del x
        time.sleep(0.02)
    assert "cupy" in {a.name for a in prof._memory_sampler.adapters}, prof._memory_sampler.errors
    sampled = prof.memory_curve("cuda:0", source="cupy")
    assert sampled["allocated_bytes"].max() - base >= SIZE
    if prof.results.cuda["active"]:
        cupti = prof.memory_curve("cuda:0", source="cupti")
        # the pool had no free block: it cudaMalloc'ed at least the array's size
        assert np.diff(cupti["allocated_bytes"]).max() >= SIZE, cupti
        # the peak is located at this test's line, with CuPy's own line beside it
        where = prof.memory_summary().devices["cuda:0"].driver["peak_location"]
        assert where.startswith("test_memory_gpu.py:") or "/test_memory_gpu.py:" in where, where
        assert "(in cupy/" in where, where
    pool.free_all_blocks()
