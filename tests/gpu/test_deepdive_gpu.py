"""Occupancy and the kernel deep dive on a real GPU.

- Theoretical occupancy equals the driver's (cuOccupancyMaxActiveBlocksPerMultiprocessor)
  for hand-written PTX kernels of known register and shared-memory use.
- kernels() carries occupancy for the kernels of a PyTorch workload.
- deep_dive classifies a large elementwise op as memory-bound and a large bf16 GEMM as
  compute-bound (CUPTI range profiler), and its metrics agree with Nsight Compute's for
  the same kernels within 10% (or 5 points) when ncu is on PATH.

Marked `gpu`: skipped (with the loader's reason) where GPU capture is unusable. A GPU
whose counters are closed to this user (CUPTI_ERROR_INSUFFICIENT_PRIVILEGES, vGPU)
skips the counter tests with deep_dive's own explanation.
"""

import ctypes
import shutil
import sys
import textwrap

import gpuprof
import numpy as np
import pytest
from gpu_helpers import cuda_torch
from gpuprof import _gpuprof
from gpuprof.results.occupancy import LIMITERS, theoretical_occupancy

pytestmark = pytest.mark.gpu
CUDA = [gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA]


# -- occupancy against the driver -----------------------------------------------------------


def _ptx(loads: int, static_smem: int) -> str:
    """A kernel that keeps `loads` floats live (volatile loads summed in reverse order:
    ptxas gives it about loads + 5 registers) and uses `static_smem` bytes of static
    shared memory."""
    b = [".version 7.0\n.target sm_70\n.address_size 64\n"]
    if static_smem:
        b.append(f".shared .align 4 .b8 sbuf[{static_smem}];\n")
    b.append(".visible .entry k(.param .u64 p)\n{\n")
    b.append(f"  .reg .f32 %f<{loads + 2}>;\n  .reg .b64 %rd<5>;\n  .reg .b32 %r<4>;\n")
    b.append("  ld.param.u64 %rd1, [p];\n  cvta.to.global.u64 %rd1, %rd1;\n")
    b.append("  mov.u32 %r1, %tid.x;\n  mul.wide.u32 %rd2, %r1, 4;\n  add.s64 %rd3, %rd1, %rd2;\n")
    for i in range(loads):
        b.append(f"  ld.volatile.global.f32 %f{i}, [%rd3+{4 * i}];\n")
    b.append(f"  mov.f32 %f{loads}, 0f00000000;\n")
    for i in reversed(range(loads)):
        b.append(f"  add.f32 %f{loads}, %f{loads}, %f{i};\n")
    if static_smem:
        b.append("  mov.u32 %r2, sbuf;\n  shl.b32 %r3, %r1, 2;\n  add.u32 %r2, %r2, %r3;\n")
        b.append(f"  st.volatile.shared.f32 [%r2], %f{loads};\n")
        b.append(f"  ld.volatile.shared.f32 %f{loads}, [%r2];\n")
    b.append(f"  st.global.f32 [%rd3], %f{loads};\n  ret;\n}}\n")
    return "".join(b)


class _Driver:
    CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
    CU_FUNC_ATTRIBUTE_NUM_REGS = 4

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            pytest.skip(f"libcuda.so.1 cannot be opened: {e}")
        self.check("cuInit", 0)
        dev = ctypes.c_int()
        self.check("cuDeviceGet", ctypes.byref(dev), 0)
        self.dev = dev.value
        self.ctx = ctypes.c_void_p()
        self.check("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), self.dev)
        self.check("cuCtxPushCurrent_v2", self.ctx)

    def check(self, name, *args):
        rc = getattr(self.lib, name)(*args)
        assert rc == 0, f"{name} failed with CUresult {rc}"

    def function(self, ptx: str):
        """(module, function k) of the PTX, JIT-compiled for this GPU."""
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self.check("cuModuleLoadData", ctypes.byref(mod), ctypes.c_char_p(ptx.encode()))
        self.check("cuModuleGetFunction", ctypes.byref(fn), mod, b"k")
        return mod, fn

    def attribute(self, fn, attr) -> int:
        v = ctypes.c_int()
        self.check("cuFuncGetAttribute", ctypes.byref(v), attr, fn)
        return v.value

    def max_active_blocks(self, fn, block: int, dynamic_smem: int) -> int:
        n = ctypes.c_int()
        self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_size_t,
        ]
        self.check(
            "cuOccupancyMaxActiveBlocksPerMultiprocessor", ctypes.byref(n), fn, block, dynamic_smem
        )
        return n.value

    def close(self):
        out = ctypes.c_void_p()
        self.lib.cuCtxPopCurrent_v2(ctypes.byref(out))
        self.lib.cuDevicePrimaryCtxRelease_v2(self.dev)


@pytest.mark.parametrize("loads, static_smem", [(1, 0), (60, 0), (120, 0), (1, 12288), (60, 12288)])
def test_theoretical_occupancy_matches_the_driver(loads, static_smem):
    props = _gpuprof.device_props()
    assert props, "device_props() is empty on a GPU machine"
    drv = _Driver()
    try:
        dev_props = props[drv.dev]
        mod, fn = drv.function(_ptx(loads, static_smem))
        regs = drv.attribute(fn, drv.CU_FUNC_ATTRIBUTE_NUM_REGS)
        smem = drv.attribute(fn, drv.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
        assert smem == static_smem
        checked = []
        for block in (32, 64, 96, 128, 192, 256, 384, 512, 640, 768, 1024):
            for dyn in (0, 1000, 8192, 30000):
                if smem + dyn > 48 * 1024:  # more needs the opt-in attribute
                    continue
                want = drv.max_active_blocks(fn, block, dyn)
                got = theoretical_occupancy(block, regs, smem + dyn, dev_props)
                checked.append((block, dyn, want, got.blocks_per_sm, got.limiter))
                assert got.blocks_per_sm == want, (regs, smem, block, dyn, want, got)
        print(
            f"regs={regs} static smem={smem}: {len(checked)} launch shapes agree; e.g. "
            f"{checked[len(checked) // 2]}"
        )
        drv.check("cuModuleUnload", mod)
    finally:
        drv.close()


# -- PyTorch workloads ----------------------------------------------------------------------


def _elementwise(torch):
    """A large elementwise op: 2 x 1 GiB of float32 read/written, ~no arithmetic."""
    x = torch.randn(256 * 1024 * 1024, device="cuda")
    y = torch.empty_like(x)

    def step():
        torch.mul(x, 2.0, out=y)

    return step


def _gemm(torch):
    """A large bf16 GEMM: 8192^3, ~1.1 TFLOP per call on tensor cores."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def step():
        torch.matmul(a, b, out=c)

    return step


def _record(torch, step, n=3):
    for _ in range(2):  # warm up: cuBLAS heuristics, allocator
        step()
    torch.cuda.synchronize()
    with gpuprof.profile(activities=CUDA) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    assert prof.results.cuda["active"], prof.results.cuda
    return prof


def _counters_or_skip(rep):
    """Counters closed to this user are the machine's limit, not a bug: skip with
    deep_dive's explanation. Anything else unavailable is a failure."""
    if rep.available:
        return
    closed = (
        "INSUFFICIENT_PRIVILEGES",
        "NVreg_RestrictProfilingToAdminUsers",
        "virtual GPU",
        "another profiler holds",
    )
    if any(c in rep.reason for c in closed):
        pytest.skip(f"GPU counters unavailable here: {rep.reason}")
    pytest.fail(f"deep_dive collected nothing: {rep.reason}")


def test_kernels_carry_theoretical_occupancy():
    torch = cuda_torch()
    prof = _record(torch, _gemm(torch), n=1)
    k = prof.kernels()
    comp = k[k["category"] == "compute"]
    assert len(comp) >= 1
    assert np.isfinite(comp["occupancy"]).all(), comp[["name", "occupancy"]]
    assert ((comp["occupancy"] > 0) & (comp["occupancy"] <= 1)).all()
    assert set(comp["occupancy_limiter"]) <= set(LIMITERS)
    assert (comp["blocks_per_sm"] >= 1).all()
    # the figure is the theoretical occupancy of the row's own launch configuration
    props = _gpuprof.device_props()[int(comp["device"][0])]
    r = comp[0]
    want = theoretical_occupancy(
        tuple(int(b) for b in r["block"]), int(r["registers"]), int(r["shared_mem"]), props
    )
    assert float(r["occupancy"]) == pytest.approx(want.occupancy)


def _top(rep):
    assert rep.kernels, rep
    return rep.kernels[0]


def test_elementwise_is_memory_bound_and_gemm_is_compute_bound():
    torch = cuda_torch()
    step = _elementwise(torch)
    prof = _record(torch, step)
    before = prof.kernels().copy()
    rep = prof.deep_dive(top=1, replay=step)
    print(rep)
    _counters_or_skip(rep)
    assert rep.backend == "cupti" and rep.replays == 2 and rep.elapsed_s > 0
    k = _top(rep)
    assert k.launches_profiled == 1
    assert k.bound == "memory-bound", (k.metrics, k.why)
    assert k.metrics["dram_pct"] > 60 and k.metrics["dram_pct"] > k.metrics["sm_pct"]
    # the recorded window is untouched by the replay
    after = prof.kernels()
    assert (after["total_ns"] == before["total_ns"]).all()

    step = _gemm(torch)
    prof = _record(torch, step)
    rep = prof.deep_dive(top=1, replay=step)
    print(rep)
    _counters_or_skip(rep)
    k = _top(rep)
    assert k.bound == "compute-bound", (k.name, k.metrics, k.why)
    assert max(k.metrics["sm_pct"], k.metrics.get("tensor_pct", 0.0)) > 60
    assert k.metrics.get("tensor_pct", 0.0) > 30  # bf16 on tensor cores


def test_deep_dive_explains_a_replay_that_launches_other_kernels():
    torch = cuda_torch()
    prof = _record(torch, _gemm(torch), n=1)
    other = _elementwise(torch)
    rep = prof.deep_dive(top=1, replay=other)
    assert not rep.available
    assert "did not launch any of the top kernels" in rep.reason, rep.reason


_NCU_SCRIPT = textwrap.dedent("""\
    import sys
    import torch
    which = sys.argv[1]
    if which == "elementwise":
        x = torch.randn(256 * 1024 * 1024, device="cuda")
        y = torch.empty_like(x)
        step = lambda: torch.mul(x, 2.0, out=y)
    else:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)
        step = lambda: torch.matmul(a, b, out=c)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    """)


@pytest.mark.skipif(shutil.which("ncu") is None, reason="ncu (Nsight Compute) is not on PATH")
@pytest.mark.parametrize("which", ["elementwise", "gemm"])
def test_metrics_agree_with_nsight_compute(tmp_path, which):
    torch = cuda_torch()
    step = _elementwise(torch) if which == "elementwise" else _gemm(torch)
    prof = _record(torch, step)
    mine = prof.deep_dive(top=1, replay=step)
    _counters_or_skip(mine)
    script = tmp_path / "work.py"
    script.write_text(_NCU_SCRIPT)
    theirs = prof.deep_dive(
        top=1, command=[sys.executable, str(script), which], backend="ncu", timeout_s=600
    )
    print(mine, theirs, sep="\n")
    _counters_or_skip(theirs)
    a, b = _top(mine), _top(theirs)
    assert b.launches_profiled >= 1, theirs
    assert a.bound == b.bound
    for f in ("sm_pct", "dram_pct", "achieved_occupancy_pct"):
        x, y = a.metrics[f], b.metrics[f]
        assert abs(x - y) <= max(0.10 * y, 5.0), (f, x, y)
    x, y = (
        a.metrics["duration_ns"] / a.launches_profiled,
        b.metrics["duration_ns"] / b.launches_profiled,
    )
    assert abs(x - y) <= 0.10 * y, ("duration_ns per launch", x, y)


def test_capture_still_works_after_a_deep_dive():
    # the range profiler is torn down: a later profile records kernels as before
    torch = cuda_torch()
    step = _elementwise(torch)
    prof = _record(torch, step, n=1)
    prof.deep_dive(top=1, replay=step)
    again = _record(torch, step, n=2)
    ev = again.gpu_events()
    assert (ev["kind"] == "kernel").sum() >= 2
    assert again.results.cuda["active"]


@pytest.mark.skipif(shutil.which("ncu") is not None, reason="ncu is on PATH")
def test_without_ncu_the_report_says_how_to_get_it():
    torch = cuda_torch()
    prof = _record(torch, _elementwise(torch), n=1)
    rep = prof.deep_dive(top=1, command=[sys.executable, "-c", "pass"], backend="ncu")
    assert not rep.available and "ncu (Nsight Compute) is not on PATH" in rep.reason
    assert rep.kernels[0].bound == "unknown" and np.isfinite(rep.kernels[0].occupancy)
