"""Achieved TFLOPS and MFU per op row and for the steps (issue 35; docs/aten.md).

The windows are built by the real C aggregation from synthetic records (no GPU
needed): an ATen op range with its input sizes as PyTorch's emit_nvtx writes it, the
kernel launch inside it, the kernel with a cuBLAS name that says its precision, and
the device properties a GPU run saves with its results."""

import gpuprof
import numpy as np
import pytest
from gpuprof import _gpuprof
from gpuprof.results import tables
from gpuprof.results._results import Results

C = _gpuprof._test_constants()
gpuprof.cuda_status()  # loads libcupti when present: API names come from it
LAUNCH = _gpuprof._test_api_key(C["API_RUNTIME"], 211)["key"]  # cudaLaunchKernel
H100 = [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]
BF16_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"
FP32_GEMM = "ampere_sgemm_128x64_nn"
M = K = N = 4096
MM_FLOPS = 2 * M * K * N  # aten::mm of [M, K] by [K, N]


def train_step():
    pass


def _mm(op_id):
    return _gpuprof._test_nvtx_name(f"aten::mm, op_id = {op_id}, sizes = [[{M}, {K}], [{K}, {N}]]")


def _mm_call(t, corr):
    """An aten::mm range at ``t`` whose kernel launch has correlation ``corr``."""
    return [
        (t, C["EV_NVTX_PUSH"], _mm(corr)["id"], 0),
        (t + 5, C["EV_API_ENTER"], corr, LAUNCH),
        (t + 8, C["EV_API_EXIT"], corr),
        (t + 20, C["EV_NVTX_POP"], 0, 0),
    ]


def _window(kernels, device_props=H100, step_ns=10_000_000):
    """One step of ``train_step`` that runs one aten::mm per entry of ``kernels``
    ((kernel name, ns) each), its kernels back to back on the GPU."""
    ops = [(C["OP_PYTHON"], train_step.__code__, 0)]
    events = [(0, C["EV_STEP_BEGIN"], 0), (10, C["EV_CALL"], 2)]
    gpu, names, t, gpu_t = [], [], 100, 1000
    for corr, (name, ns) in enumerate(kernels, start=1):
        events += _mm_call(t, corr)
        names.append(name)
        gpu.append(
            dict(
                kind=C["GPU_KERNEL"],
                correlation=corr,
                start_ns=gpu_t,
                end_ns=gpu_t + ns,
                name_id=len(names) - 1,
            )
        )
        t, gpu_t = t + 50, gpu_t + ns
    events += [(step_ns - 10, C["EV_RETURN"], 0), (step_ns, C["EV_STEP_END"], 0)]
    raw = _gpuprof._test_aggregate(ops, [(1, 101, events)], gpu, 0, step_ns + 10, names, 1)
    return Results(
        [raw],
        cuda={"active": True, "mode": "callbacks", "error": None},
        meta={"device_properties": device_props},
    )


def _key_averages(res, **kw):
    return tables.KeyAverages(res, **kw)


def _mm_row(res, **kw):
    return next(e for e in _key_averages(res, **kw) if e.key == "aten::mm")


def test_an_op_row_has_its_tflops_and_mfu_against_its_precisions_peak():
    # a BF16 GEMM of 137 GFLOP in 278 us: 494.5 TFLOPS, half of the H100's 989
    ns = round(MM_FLOPS / 494.5e3)
    res = _window([(BF16_GEMM, ns)])
    row = _mm_row(res)
    assert row.flops == MM_FLOPS
    assert row.precision == "bf16" and row.peak_tflops == 989
    assert row.tflops == pytest.approx(494.5, rel=1e-3)
    assert row.mfu == pytest.approx(0.5, rel=1e-3)
    # the table: TFLOPS and MFU columns
    text = _key_averages(res).table()
    assert "TFLOPS" in text and "MFU" in text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("aten::mm")]
    assert "494.5" in line and "50.0%" in line


def test_the_kernels_precision_picks_the_peak():
    # the same FLOPs and time in an FP32 SIMT GEMM: above the FP32 peak of 67 TFLOPS,
    # which is a counting error the table marks
    ns = round(MM_FLOPS / 494.5e3)
    row = _mm_row(_window([(FP32_GEMM, ns)]))
    assert row.precision == "fp32" and row.peak_tflops == 67
    assert row.mfu > 1
    text = _key_averages(_window([(FP32_GEMM, ns)])).table()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("aten::mm")]
    assert "%!" in line
    # at 33.5 TFLOPS it is half of the FP32 peak
    row = _mm_row(_window([(FP32_GEMM, round(MM_FLOPS / 33.5e3))]))
    assert row.mfu == pytest.approx(0.5, rel=1e-3)


def test_an_unknown_device_or_precision_has_no_mfu():
    ns = round(MM_FLOPS / 100e3)
    unknown = _mm_row(_window([(BF16_GEMM, ns)], device_props=[{"id": 0, "name": "Mystery X"}]))
    assert unknown.tflops == pytest.approx(100, rel=1e-3) and unknown.mfu is None
    untyped = _mm_row(_window([("triton_poi_fused_mm_0", ns)]))
    assert untyped.precision is None and untyped.mfu is None
    assert "MFU" not in _key_averages(_window([("triton_poi_fused_mm_0", ns)])).table()


def test_a_row_of_several_calls_sums_their_flops_over_their_time():
    ns = round(MM_FLOPS / 247.25e3)  # each at 25% of the BF16 peak
    res = _window([(BF16_GEMM, ns)] * 3)
    row = _mm_row(res)
    assert row.count == 3 and row.flops == 3 * MM_FLOPS
    assert row.mfu == pytest.approx(0.25, rel=1e-3)
    grouped = _mm_row(res, group_by_input_shape=True)
    assert grouped.mfu == pytest.approx(0.25, rel=1e-3)
    assert grouped.input_shapes == [[M, K], [K, N]]


def test_the_steps_mfu_is_their_flops_over_their_wall_time():
    from gpuprof.results._mfu import OpPeaks, steps_mfu

    ns = round(MM_FLOPS / 494.5e3)
    res = _window([(BF16_GEMM, ns)] * 4, step_ns=10_000_000)
    ops = res.ops()
    s = steps_mfu(ops, OpPeaks([res.window()]), wall_ns=10_000_000)
    assert s.flops == 4 * MM_FLOPS and s.precision == "bf16" and s.peak_tflops == 989
    assert s.tflops == pytest.approx(4 * MM_FLOPS / 10_000_000 / 1e3)
    assert s.mfu == pytest.approx(s.tflops / 989)
    assert steps_mfu(ops[:0], OpPeaks([res.window()]), 10).note == "no FLOP count"


def test_no_flops_no_mfu_column():
    res = _window([(BF16_GEMM, 1000)])
    rows = _key_averages(res).rows
    assert np.isnan(rows["peak_tflops"][rows["flops"] == 0]).all()


def test_the_diagnosis_says_the_steps_mfu_and_the_op_furthest_below_its_peak():
    import gpuprof.diagnose as dg

    fast = round(MM_FLOPS / 791.2e3)  # 80% of the BF16 peak
    slow = round(MM_FLOPS / 98.9e3)  # 10%
    res = _window([(BF16_GEMM, fast), (BF16_GEMM, slow)], step_ns=10_000_000)
    (f,) = [f for f in dg.diagnose(res) if f.kind == "mfu"]
    wall_tflops = 2 * MM_FLOPS / 10_000_000 / 1e3
    assert f.evidence["mfu"] == pytest.approx(wall_tflops / 989)
    assert f.evidence["precision"] == "bf16" and f.evidence["device"] == H100[0]["name"]
    assert f.title.startswith(f"The steps run at {100 * wall_tflops / 989:.1f}% MFU")
    # one row (same op, same shapes): both calls at their mean, 2 * t / (t_fast + t_slow)
    (op,) = f.evidence["ops"]
    assert op["op"] == "aten::mm in train_step (test_mfu.py:25)"
    assert op["mfu"] == pytest.approx(2 * MM_FLOPS / (fast + slow) / 1e3 / 989, rel=1e-3)
    assert op["lost_ns"] == pytest.approx(fast + slow - 2 * MM_FLOPS / 989e3, rel=1e-3)
    # no device name: nothing said, rather than a guess
    unnamed = dg.diagnose(_window([(BF16_GEMM, fast)], device_props=[]))
    assert not [f for f in unnamed if f.kind == "mfu"]


def test_two_rows_of_one_op_under_one_caller_are_told_apart_by_their_shapes():
    # the input's and the weight's gradients: two aten::mm rows in one caller
    import gpuprof.diagnose as dg

    ops = [(C["OP_PYTHON"], train_step.__code__, 0)]
    events = [(0, C["EV_STEP_BEGIN"], 0), (10, C["EV_CALL"], 2)]
    gpu, t, gpu_t = [], 100, 1000
    for corr, sizes in enumerate(("[[4096, 4096], [4096, 4096]]", "[[4096, 8], [8, 4096]]"), 1):
        name = _gpuprof._test_nvtx_name(f"aten::mm, op_id = {corr}, sizes = {sizes}")["id"]
        events += [
            (t, C["EV_NVTX_PUSH"], name, 0),
            (t + 5, C["EV_API_ENTER"], corr, LAUNCH),
            (t + 8, C["EV_API_EXIT"], corr),
            (t + 20, C["EV_NVTX_POP"], 0, 0),
        ]
        ns = 10 * round(MM_FLOPS / 989e3)  # both well below the peak
        gpu.append(dict(kind=C["GPU_KERNEL"], correlation=corr, start_ns=gpu_t, end_ns=gpu_t + ns))
        t, gpu_t = t + 50, gpu_t + ns
    events += [(10_000_000 - 10, C["EV_RETURN"], 0), (10_000_000, C["EV_STEP_END"], 0)]
    raw = _gpuprof._test_aggregate(ops, [(1, 101, events)], gpu, 0, 10_000_010, [BF16_GEMM], 1)
    res = Results([raw], cuda={"active": True}, meta={"device_properties": H100})
    (f,) = [f for f in dg.diagnose(res) if f.kind == "mfu"]
    names = sorted(op["op"] for op in f.evidence["ops"])
    where = "aten::mm in train_step (test_mfu.py:25)"
    assert names == [f"{where} [[4096, 4096], [4096, 4096]]", f"{where} [[4096, 8], [8, 4096]]"]
    assert all(n in f.title for n in names)


def test_a_saved_profile_gives_the_same_mfu_without_a_gpu(tmp_path):
    from gpuprof.exporters import saved

    res = _window([(BF16_GEMM, round(MM_FLOPS / 494.5e3))])
    loaded = saved.read(saved.save(res, str(tmp_path / "p.gpuprof")))
    assert _mm_row(loaded).mfu == pytest.approx(0.5, rel=1e-3)
    assert _key_averages(loaded).table() == _key_averages(res).table()


def test_each_step_has_the_flops_of_the_calls_that_began_in_it():
    # step 0 runs one aten::mm, step 1 two of them
    ops = [(C["OP_PYTHON"], train_step.__code__, 0)]
    events, gpu = [], []
    for step, (begin, mms) in enumerate(((0, 1), (1000, 2))):
        events += [(begin, C["EV_STEP_BEGIN"], step), (begin + 10, C["EV_CALL"], 2)]
        for k in range(mms):
            corr, t = len(gpu) + 1, begin + 100 + 50 * k
            events += _mm_call(t, corr)
            gpu.append(dict(kind=C["GPU_KERNEL"], correlation=corr, start_ns=t + 30,
                            end_ns=t + 40, name_id=0))  # fmt: skip
        events += [(begin + 900, C["EV_RETURN"], 0), (begin + 1000, C["EV_STEP_END"], 0)]
    raw = _gpuprof._test_aggregate(ops, [(1, 101, events)], gpu, 0, 2010, [BF16_GEMM], 1)
    res = Results(
        [raw],
        cuda={"active": True, "mode": "callbacks", "error": None},
        meta={"device_properties": H100},
    )
    steps = res.steps()
    assert steps["step"].tolist() == [0, 1]
    assert steps["flops"].tolist() == [MM_FLOPS, 2 * MM_FLOPS]
    assert steps["kernels"].tolist() == [1, 2]  # C's fields pass through
    # each step's MFU: its FLOPs over its wall time at the BF16 peak
    wall = steps["end_ns"] - steps["start_ns"]
    expected = [MM_FLOPS / wall[0] / 1e3 / 989, 2 * MM_FLOPS / wall[1] / 1e3 / 989]
    assert steps["mfu"] == pytest.approx(expected)
    # no device name: no MFU, and no guess
    raw_again = _gpuprof._test_aggregate(ops, [(1, 101, events)], gpu, 0, 2010, [BF16_GEMM], 1)
    assert np.isnan(Results([raw_again], cuda={"active": True}).steps()["mfu"]).all()


def test_a_module_has_the_flops_of_its_calls_and_its_mfu():
    ns = round(MM_FLOPS / 247.25e3)  # each at 25% of the BF16 peak
    ops = [(C["OP_PYTHON"], train_step.__code__, 0)]
    events = [(0, C["EV_STEP_BEGIN"], 0), (10, C["EV_CALL"], 2), (10, C["EV_MODULE"], 0)]
    gpu = []
    for corr in (1, 2):
        t = 100 * corr
        events += _mm_call(t, corr)
        gpu.append(dict(kind=C["GPU_KERNEL"], correlation=corr, start_ns=1000 + corr * ns,
                        end_ns=1000 + (corr + 1) * ns, name_id=0))  # fmt: skip
    events += [(900, C["EV_RETURN"], 0), (1000, C["EV_STEP_END"], 0)]
    raw = _gpuprof._test_aggregate(ops, [(1, 101, events)], gpu, 0, 10**7, [BF16_GEMM], 1)
    raw["module_names"], raw["module_classes"] = ["proj"], ["Linear"]
    res = Results([raw], cuda={"active": True}, meta={"device_properties": H100})
    (m,) = res.window().modules()
    assert m["name"] == "proj" and m["flops"] == 2 * MM_FLOPS
    assert m["mfu"] == pytest.approx(0.25, rel=1e-3)
    # and the modules table's columns
    from gpuprof.results.views import module_table

    text = str(module_table(res.window().modules(), 2 * ns))
    assert "GFLOPs" in text and "MFU" in text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("proj")]
    assert f"{2 * MM_FLOPS / 1e9:.3f}" in line and "25.0%" in line
