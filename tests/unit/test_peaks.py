"""gpuprof.results._peaks: the dense-peak table, the precision an op ran in, and the TFLOPS and
MFU arithmetic, on synthetic op rows. An op above its peak is a counting error: the
checks here fail on it."""

import pytest
from gpuprof.results import _peaks
from gpuprof.results._flops import flops
from gpuprof.results._peaks import (
    PEAKS,
    PRECISIONS,
    CountingError,
    achieved_tflops,
    combine,
    device_peaks,
    kernel_precision,
    mfu,
    op_precision,
    peak_tflops,
    utilization,
)

# ---------------------------------------------------------------------- the table


@pytest.mark.parametrize(
    "name, label",
    [
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 SXM5 80GB", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA B200", "B200"),
    ],
)
def test_device_names_as_torch_reports_them(name, label):
    assert device_peaks(name).label == label


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA H100",  # SXM or PCIe: the string does not say
        "NVIDIA L40",  # not an L4, not an L40S
        "NVIDIA GB200",  # not a B200
        "Tesla V100-SXM2-16GB",
        "NVIDIA GeForce RTX 4090",
        "NVIDIA H800",
        "",
    ],
)
def test_unknown_devices_have_no_peak(name):
    assert device_peaks(name) is None
    assert peak_tflops(name, "bf16") is None
    u = utilization(10**12, 10**6, device_name=name, precision="bf16")
    assert u.mfu is None and u.peak_tflops is None and "unknown device" in u.note


def test_hopper_dense_bf16_is_989_not_the_sparse_headline():
    for name in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        assert peak_tflops(name, "bf16") == 989
        assert peak_tflops(name, "fp8") == 1979
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "tf32") == 156
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "fp8") is None  # Ampere has no FP8


def test_every_row_is_dense_and_self_consistent():
    """Typos show up as broken ratios: BF16 = FP16, FP8 = 2x BF16, TF32 = BF16 / 2 on
    every tensor-core generation in the table, and nothing reaches the 2:4 figure."""
    labels = [row.label for row in PEAKS]
    assert len(labels) == len(set(labels))
    for required in ("A100", "H100 SXM", "H100 PCIe", "H100 NVL", "H200 SXM", "L4", "L40S", "B200"):
        assert required in labels
    for row in PEAKS:
        t = row.tflops
        assert set(t) <= set(PRECISIONS), row.label
        assert row.source.startswith("NVIDIA ") and "datasheet" in row.source, row.label
        assert t["bf16"] == t["fp16"], row.label
        assert t["tf32"] == pytest.approx(t["bf16"] / 2, rel=0.02), row.label
        if "fp8" in t:
            assert t["fp8"] == pytest.approx(2 * t["bf16"], rel=0.02), row.label
        if "int8" in t:
            assert t["int8"] == pytest.approx(t.get("fp8", 2 * t["bf16"]), rel=0.01), row.label
        assert t["fp32"] < t["tf32"], row.label


def test_precision_names_and_errors():
    assert peak_tflops("NVIDIA H200", "torch.bfloat16") == 989
    assert peak_tflops("NVIDIA H200", "float8_e4m3fn") == 1979
    assert peak_tflops("NVIDIA H200", "Half") == 989
    with pytest.raises(ValueError, match="unknown precision 'bf17'; use one of fp4, fp8"):
        peak_tflops("NVIDIA H200", "bf17")
    with pytest.raises(TypeError, match="device_name"):
        peak_tflops(None, "bf16")
    with pytest.raises(TypeError, match="precision"):
        peak_tflops("NVIDIA H200", 16)


# --------------------------------------------------------------- precision of an op


@pytest.mark.parametrize(
    "kernel, precision",
    [
        # H200 kernels named in docs/ and the trace reference
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "bf16"),
        ("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT", "bf16"),
        ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_TNN", "bf16"),
        ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", "tf32"),
        ("sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nchw", "tf32"),
        ("sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_tilesize64x64x8_stage3", "fp32"),
        ("void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_tn_align1>(Params)", "fp32"),
        ("ampere_sgemm_128x64_nn", "fp32"),
        ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", "fp32"),
        ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", "fp16"),
        ("turing_h1688gemm_128x128_ldg8_nn", "fp16"),
        (
            "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, "
            "false, false, cutlass::half_t, Flash_kernel_traits<64, 128, 128, 4, "
            "cutlass::half_t> >, false, false, false, false, false, true, false, false>"
            "(Flash_fwd_params)",
            "fp16",
        ),
        ("void pytorch_flash::flash_bwd_kernel<cutlass::bfloat16_t, 128>(Params)", "bf16"),
        ("sm90_xmma_gemm_e4m3e4m3_bf16f32_f32_tn_n_tilesize128x128x128", "fp8"),
        ("cutlass3x_sm90_tensorop_gemm_e4m3_e4m3_f32_bf16_bf16_128x128x128", "fp8"),
        ("sm80_xmma_gemm_i8i8_i8i32_f32_tn_n_tilesize128x128x64", "int8"),
        ("ampere_int8_i16832gemm_int8_256x128_ldg16_stages_64x3_nt", "int8"),
        ("sm80_xmma_gemm_f64f64_f64f64_f64_nt_n_tilesize64x64x16", "fp64"),
        ("cutlass3x_sm100_bstensorop_gemm_ue4m3xe2m1_ue4m3xe2m1_f32_bf16", "fp4"),
        ("triton_tem_fused_mm_0", None),
        ("triton_per_fused_native_layer_norm_0", None),
    ],
)
def test_kernel_precision(kernel, precision):
    assert kernel_precision(kernel) == precision


def test_kernel_precision_agrees_with_the_diagnosis():
    """gpuprof.diagnose's mixed-precision check reads kernels the same way where both
    know the precision (it has no fp64, int8 or fp4)."""
    from gpuprof.analysis import diagnose

    names = [
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
        "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT",
        "nvjet_hsh_64x64_64x4_2x1_v_bz_NNN",
        "nvjet_sss_128x64_64x3_2x1_v_bz_TNT",
        "nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_TNT",
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n",
        "cutlass_80_tensorop_s1688tf32gemm_256x128_16x3_nn_align4",
        "ampere_sgemm_128x64_nn",
        "implicit_convolve_sgemm",
        "scudnn_128x64_relu_interior_nn_v1",
        "ampere_h16816gemm_256x128_ldg8_stages_32x3_nn",
        "cutlass::Kernel2<cutlass::half_t>",
        "fmha_cutlassB_f16_aligned_64x64_k128_sm80",
        "sm90_xmma_gemm_e4m3e4m3_bf16f32_f32_tn_n",
        "triton_tem_fused_mm_0",
    ]
    for n in names:
        theirs = diagnose.matrix_kernel_class(n)[1]
        assert kernel_precision(n) == (None if theirs == "unknown" else theirs), n


def test_op_precision_rules():
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
    helper = "void at::native::vectorized_elementwise_kernel<4, FillFunctor<float>>"
    # the lowest precision any kernel names: helpers in FP32 do not make it FP32
    assert op_precision([helper, gemm]) == "bf16"
    # kernels decide over dtypes: FP32 inputs that ran as TF32
    assert op_precision(["sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n"], ["float", "float"]) == "tf32"
    # without typed kernels, certain dtypes decide
    assert op_precision(["triton_tem_fused_mm_0"], ["c10::BFloat16", "c10::BFloat16"]) == "bf16"
    assert op_precision([], ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", "float", "float"]) == (
        "fp8"
    )
    assert op_precision([], ["torch.float16"]) == "fp16"
    # FP32 inputs alone may have run as TF32: unknown
    assert op_precision([], ["float", "float"]) is None
    assert op_precision(["triton_tem_fused_mm_0"]) is None
    with pytest.raises(TypeError, match="lists of str"):
        op_precision("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n")


# ------------------------------------------------------------------- TFLOPS and MFU


def test_achieved_tflops_and_mfu_arithmetic():
    # 989e12 FLOPs in one second is 989 TFLOPS: an H200 at its dense BF16 peak
    assert achieved_tflops(989 * 10**12, 10**9) == pytest.approx(989.0)
    assert mfu(989 * 10**12, 10**9, 989) == pytest.approx(1.0)
    assert mfu(4 * 10**12, 10**7, 989) == pytest.approx(400 / 989)
    assert achieved_tflops(None, 10**6) is None
    assert achieved_tflops(10**9, 0) is None  # no kernel time: nothing to divide by
    assert mfu(10**9, 10**6, None) is None  # unknown device
    with pytest.raises(ValueError, match="kernel_ns must be >= 0"):
        achieved_tflops(10, -1)
    with pytest.raises(TypeError, match="flops must be a number"):
        achieved_tflops("10", 1)
    with pytest.raises(ValueError, match="peak must be > 0"):
        mfu(10, 1, 0)


def test_above_peak_is_a_counting_error():
    # 2 ms for a matmul the H200 needs at least 1.1 ms for at peak: fine
    m = k = n = 8192
    count = flops("aten::mm", [[m, k], [k, n]])
    peak = peak_tflops("NVIDIA H200", "bf16")
    assert 0 < mfu(count, 2_000_000, peak, what="aten::mm") < 1
    # the same count in 0.5 ms is impossible: counted twice, or time missing
    with pytest.raises(CountingError, match=r"aten::mm ran at 2199.0 TFLOPS, above the 989"):
        mfu(count, 500_000, peak, what="aten::mm")
    u = utilization(count, 500_000, device_name="NVIDIA H200", precision="bf16", what="aten::mm")
    assert u.counting_error and u.mfu > 1 and "above the 989 TFLOPS" in u.note


def _row(name, shapes, kernel_names, kernel_ns, device="NVIDIA H200"):
    """One synthetic op row as the ATen rows will give it: op, shapes, its kernels."""
    return utilization(
        flops(name, shapes),
        kernel_ns,
        device_name=device,
        precision=op_precision(kernel_names),
        what=name,
    )


BF16 = ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"]
TF32 = ["sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32"]


def _assert_no_counting_error(rows):
    bad = [u.note for u in rows if u.counting_error]
    assert not bad, bad


def test_module_and_step_figures_from_synthetic_rows():
    qkv = _row("aten::addmm", [[3072], [4096, 1024], [1024, 3072], [], []], BF16, 80_000)
    attn = _row(
        "aten::_scaled_dot_product_flash_attention",
        [[4, 16, 1024, 64], [4, 16, 1024, 64], [4, 16, 1024, 64], [], [], [], []],
        ["void pytorch_flash::flash_fwd_kernel<cutlass::bfloat16_t, 64>(Params)"],
        60_000,
    )
    norm = _row("aten::native_layer_norm", [[4, 1024, 1024], [], [1024], [1024], []], [], 15_000)
    head = _row("aten::mm", [[4096, 1024], [1024, 32000]], TF32, 2_400_000)
    rows = [qkv, attn, norm, head]
    _assert_no_counting_error(rows)

    assert qkv.precision == "bf16" and qkv.peak_tflops == 989
    assert qkv.tflops == pytest.approx(2 * 4096 * 1024 * 3072 / 80_000 / 1e3)
    assert head.precision == "tf32" and head.peak_tflops == 494
    assert norm.flops is None and norm.mfu is None and norm.note == "no FLOP count"

    block = combine([qkv, attn, norm], what="block")
    assert block.flops == qkv.flops + attn.flops
    assert block.kernel_ns == 155_000
    # the layer norm's time counts, charged at the BF16 peak the block's FLOPs ran in
    assert block.mfu == pytest.approx(block.flops / (155_000 * 989 * 1e3))
    assert block.precision == "bf16"

    step = combine(rows, what="step")
    # most of the step's FLOPs are the TF32 head's: the layer norm is charged at TF32
    assert step.precision == "tf32"
    capacity = (80_000 + 60_000) * 989e3 + (15_000 + 2_400_000) * 494e3
    assert step.mfu == pytest.approx(step.flops / capacity)
    assert step.tflops == pytest.approx(step.flops / step.kernel_ns / 1e3)
    assert not step.counting_error


def test_double_counting_shows_up_as_above_peak():
    """Counting a linear at aten::linear and at its aten::addmm doubles the figure; a
    fast enough kernel then reads above the peak, which the check catches."""
    shapes = [[3072], [8192, 4096], [4096, 3072], [], []]
    once = flops("aten::addmm", shapes)
    kernel_ns = 1_000_000  # 206 TFLOPS counted once... at 989 TFLOPS peak, 21% MFU
    fine = utilization(once, kernel_ns, device_name="NVIDIA H200", precision="bf16")
    assert not fine.counting_error
    fast = 120_000  # a kernel this fast ran at 859 TFLOPS: fine once, impossible twice
    twice = utilization(2 * once, fast, device_name="NVIDIA H200", precision="bf16")
    assert twice.counting_error
    with pytest.raises(AssertionError, match="above the 989 TFLOPS"):
        _assert_no_counting_error([fine, twice])
    assert combine([fine, twice]).counting_error


def test_missing_figures_say_why():
    u = utilization(10**12, 10**6, device_name="NVIDIA A100-SXM4-80GB", precision="fp8")
    assert u.mfu is None and "publishes no fp8 peak" in u.note
    u = utilization(10**12, 10**6, device_name="NVIDIA H200", precision=None)
    assert u.mfu is None and "unknown precision" in u.note and u.tflops == pytest.approx(1000)
    u = utilization(10**12, 0, device_name="NVIDIA H200", precision="bf16")
    assert u.tflops is None and u.note == "no kernel time"
    assert combine([]).flops is None
    unknown = utilization(10**9, 10**6, device_name="x", precision="bf16")
    nothing_known = combine([unknown, unknown])
    assert nothing_known.mfu is None and nothing_known.note == "no row has a known peak"
    with pytest.raises(TypeError, match="Utilization"):
        combine([(1, 2)])
    assert set(_peaks.__all__) >= {"peak_tflops", "mfu", "achieved_tflops", "op_precision"}
