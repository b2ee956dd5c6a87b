"""prof.diagnose() on synthetic profiles: each finding found where it is planted, with
the severity the timeline implies, and not reported in a near miss.

Every profile goes through the real C aggregation (`_gpuprof._test_aggregate`): four
steps of 100 us on one thread, CUDA API calls as enter/exit events, GPU activity as
records. Severities are computed here from the planted timeline, not read back.
"""

import json
import os
import sys
import time

import gpuprof
import pytest
import timelines
from gpuprof import _gpuprof
from gpuprof.analysis import diagnose as diagnose_mod
from gpuprof.analysis.diagnose import Diagnosis, data_wait_per_step, diagnose, step_breakdown
from gpuprof.api._accessors import ResultAccessors
from gpuprof.results._results import Results
from timelines import US, C

gpuprof.cuda_status()  # loads libcupti when present: API names come from it
STEP = 100 * US
N_STEPS = 4
T0 = 1 * US  # the first step's start; the window starts at 0

LAUNCH = 211  # CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000
STREAM_SYNC = 131  # CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020
MALLOC = 20  # CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020
FREE = 22  # CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020

# API classes are compiled in with the CUPTI headers; a stub build has none, and then
# sync and allocation calls cannot be told from other API calls.
HAVE_CLASSES = _gpuprof._test_api_key(C["API_RUNTIME"], STREAM_SYNC)["class"] != 0
needs_classes = pytest.mark.skipif(not HAVE_CLASSES, reason="built without CUPTI API classes")

FP32_GEMM = "ampere_sgemm_128x64_nn"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
ELEMENTWISE = "_Z6kernelv"


def api_name(cbid):
    return _gpuprof._test_api_key(C["API_RUNTIME"], cbid)["name"]


# The profiled program: these functions' code objects are the Python ops.
class Loader:
    def __next__(self):
        pass


def decode():
    pass


def train_step():
    pass


def log_loss():
    pass


def host_postprocess():
    pass


OPS = [train_step, Loader.__next__, decode, log_loss, host_postprocess]
TRAIN, NEXT, DECODE, LOG, POST = range(2, 2 + len(OPS))


def loc(func):
    """The file:line a finding names for a function (paths relative to the cwd)."""
    code = func.__code__
    return f"{os.path.relpath(code.co_filename)}:{code.co_firstlineno}"


class Timeline(timelines.Timeline):
    """One thread's events and the GPU's records, in steps of STEP ns."""

    def kernel(self, corr, start, end, name=ELEMENTWISE, stream=7, graph_id=0):
        super().kernel(corr, start, end, name, stream, graph_id)

    def launch(self, t, start, end, name=ELEMENTWISE, stream=7, dur=US // 2):
        """cudaLaunchKernel at t on the host; the kernel runs [start, end) on the GPU."""
        self.kernel(self.api(LAUNCH, t, dur), start, end, name, stream)

    def steps(self, body, n=N_STEPS):
        """n steps of STEP ns; body(k, t0) writes step k's events from its start t0."""
        for k in range(n):
            t0 = T0 + k * STEP
            self.events.append((t0, C["EV_STEP_BEGIN"], k))
            body(k, t0)
            self.events.append((t0 + STEP, C["EV_STEP_END"], k))
        return self

    def results(self):
        return self.aggregate([(C["OP_PYTHON"], f.__code__, 0) for f in OPS])


def found(res, kind):
    """The one finding of `kind`, or None."""
    hits = [f for f in diagnose(res) if f.kind == kind]
    assert len(hits) <= 1, hits
    return hits[0] if hits else None


# ---- data_stall -------------------------------------------------------------------------

LOADER_WAIT = 40 * US


def loader_profile(cover_us):
    """Each step waits LOADER_WAIT in Loader.__next__ (decode inside), then trains: one
    kernel that keeps the GPU busy cover_us into the next step's wait (the backlog)."""
    tl = Timeline()
    if cover_us:  # queued before the first recorded step: covers its wait as well
        tl.kernel(0, T0, T0 + cover_us * US)

    def body(k, t0):
        tl.call(NEXT, t0)
        tl.call(DECODE, t0 + 5 * US)
        tl.ret(t0 + 35 * US)
        tl.ret(t0 + LOADER_WAIT)
        tl.call(TRAIN, t0 + LOADER_WAIT)
        tl.launch(t0 + 41 * US, t0 + 42 * US, t0 + STEP + cover_us * US)
        tl.ret(t0 + 95 * US)

    return tl.steps(body).results()


def test_data_stall_found_with_the_loader_line_and_the_hottest_function_inside():
    res = loader_profile(cover_us=0)
    f = found(res, "data_stall")
    assert f is not None
    # the GPU is idle through every wait: the whole wait is lost
    assert f.severity == pytest.approx(LOADER_WAIT / STEP)
    assert f.evidence["wait_ns"] == N_STEPS * LOADER_WAIT
    assert f.evidence["wait_per_step_ns"] == LOADER_WAIT
    assert f.evidence["gpu_busy_during_wait_share"] == 0.0
    assert f.evidence["hottest_inside"] == f"decode ({loc(decode)})"
    assert f.location == loc(Loader.__next__)
    # CPython 3.10 code objects have no qualname: the op is plain __next__ there
    assert ("Loader.__next__" if sys.version_info >= (3, 11) else "__next__") in f.title
    assert "num_workers" in f.fix


def test_data_stall_counts_only_the_wait_the_gpu_backlog_does_not_cover():
    res = loader_profile(cover_us=30)
    f = found(res, "data_stall")
    assert f is not None
    assert f.severity == pytest.approx((LOADER_WAIT - 30 * US) / STEP)
    assert f.evidence["wait_ns"] == N_STEPS * LOADER_WAIT
    assert f.evidence["gpu_busy_during_wait_share"] == pytest.approx(30 / 40)


@pytest.mark.parametrize("cover_us", [40, 37])
def test_no_data_stall_when_the_gpu_backlog_covers_the_wait(cover_us):
    res = loader_profile(cover_us)
    # the loop does wait 40% of the step in the loader...
    ops = res.ops()
    name = "Loader.__next__" if sys.version_info >= (3, 11) else "__next__"
    assert ops[ops["name"] == name]["cpu_total_ns"][0] == N_STEPS * LOADER_WAIT
    # ...but the GPU has queued work for all of it (or for all but 3%, under the 5% bar)
    assert found(res, "data_stall") is None


# ---- the data wait per step, on real profiles ---------------------------------------------

FETCH_S = 0.005


class SlowBatches:
    """An iterator whose every batch takes FETCH_S (sleeping, as a loader waits on I/O)."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return self

    def __next__(self):
        if self.n == 0:
            raise StopIteration
        self.n -= 1
        time.sleep(FETCH_S)
        return self.n


def busy(seconds=0.001):
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        pass


def test_data_wait_per_step_is_the_loops_own_fetch():
    with gpuprof.profile() as prof:
        for _ in SlowBatches(4):
            busy()
            prof.step()
    steps = prof.steps()
    wait = data_wait_per_step(prof.results)
    assert len(wait) == len(steps) == 4
    # each step fetched its batch (the for loop's __next__, directly under the step)
    assert all(FETCH_S * 1e9 <= w < s for w, s in zip(wait, steps["cpu_ns"]))


def test_data_fetch_names_the_op_a_framework_fetches_in():
    batches = SlowBatches(4)
    with gpuprof.profile() as prof:
        for _ in range(4):
            with gpuprof.record_function("fetch"):
                next(batches)  # not directly under the step: next() calls __next__
            busy()
            prof.step()
    assert list(data_wait_per_step(prof.results)) == [0, 0, 0, 0]
    wait = data_wait_per_step(prof.results, data_fetch=("fetch",))
    # the range counts once (the __next__ inside it is not counted again)
    assert all(FETCH_S * 1e9 <= w < s for w, s in zip(wait, prof.steps()["cpu_ns"]))
    assert "data_stall" not in diagnose(prof.results).kinds()
    f = [f for f in diagnose(prof.results, data_fetch=("fetch",)) if f.kind == "data_stall"][0]
    assert f.evidence["wait_ns"] == int(wait.sum())
    # the hottest function inside is the one with the most self time, not the outermost
    assert f.evidence["hottest_inside"] == "time.sleep"
    with pytest.raises(TypeError, match="data_fetch must be a list of op names"):
        diagnose(prof.results, data_fetch="fetch")


# ---- sync_point -------------------------------------------------------------------------


def sync_profile(wait_us, sync_steps):
    """log_loss blocks in cudaStreamSynchronize for wait_us in the steps in sync_steps."""
    tl = Timeline()

    def body(k, t0):
        tl.call(TRAIN, t0 + 1 * US)
        tl.launch(t0 + 2 * US, t0 + 3 * US, t0 + 60 * US)
        tl.call(LOG, t0 + 4 * US)
        if k in sync_steps:
            tl.api(STREAM_SYNC, t0 + 5 * US, wait_us * US)
        tl.ret(t0 + 62 * US)
        tl.ret(t0 + 95 * US)

    return tl.steps(body).results()


@needs_classes
def test_sync_point_names_the_python_line_that_blocked():
    res = sync_profile(56, range(N_STEPS))
    f = found(res, "sync_point")
    assert f is not None
    # the sync ends at t0+61; the GPU's next op starts at the next step's t0+103, and
    # after the last step's sync the GPU idles to the window's end (t0+100): each sync
    # costs that bubble, shorter than its 56-us wait (the host had work left to overlap)
    cost = (N_STEPS - 1) * 42 * US + 39 * US
    assert f.severity == pytest.approx(cost / (N_STEPS * STEP))
    assert f.evidence == {
        "wait_ns": N_STEPS * 56 * US,
        "cost_ns": cost,
        "calls": N_STEPS,
        "wait_per_step_ns": 56 * US,
        "api": api_name(STREAM_SYNC),
    }
    assert f.location == loc(log_loss)
    assert f"({N_STEPS} times)" in f.title
    assert ".item()" in f.fix  # a sync, not a host-to-device copy


@needs_classes
def test_a_cheap_sync_in_every_step_is_still_reported():
    f = found(sync_profile(1, range(N_STEPS)), "sync_point")
    assert f is not None
    assert f.severity == pytest.approx(1 * US / STEP)  # under 2%, but it serializes each step


@needs_classes
def test_a_cheap_sync_in_all_steps_but_the_last_stub_is_reported():
    # the last step (last step() to stop()) is often a stub without the loop's work
    assert found(sync_profile(1, range(N_STEPS - 1)), "sync_point") is not None
    assert found(sync_profile(1, range(N_STEPS - 2)), "sync_point") is None


@needs_classes
def test_no_sync_point_for_one_cheap_sync():
    assert found(sync_profile(1, {0}), "sync_point") is None


@needs_classes
def test_no_sync_point_for_a_long_wait_the_gpu_was_busy_through():
    # given a GPU-bound loop that reads a value once: the host waits 80 us for queued
    # work, then launches the next kernel at once, so the GPU idles only 3 us
    tl = Timeline()

    def body(k, t0):
        tl.call(TRAIN, t0 + 1 * US)
        if k == 0:
            tl.launch(t0 + 2 * US, t0 + 3 * US, t0 + 85 * US)
            tl.call(LOG, t0 + 4 * US)
            tl.api(STREAM_SYNC, t0 + 5 * US, 80 * US)
            tl.ret(t0 + 86 * US)
            tl.launch(t0 + 86 * US, t0 + 88 * US, t0 + 99 * US)
        else:
            tl.launch(t0 + 2 * US, t0 + 3 * US, t0 + 99 * US)
        tl.ret(t0 + 95 * US)

    res = tl.steps(body).results()
    # then the wait (20% of the window) is not a finding: the sync cost 3 us
    assert found(res, "sync_point") is None


# ---- launch_bound -----------------------------------------------------------------------

LAUNCH_NS = 4 * US
SHORT_KERNELS = 20


def launch_profile(big_kernel_first):
    """SHORT_KERNELS 1-us kernels per step, each launched by a 4-us cudaLaunchKernel;
    with big_kernel_first a 70-us kernel goes first and the short ones queue behind it."""
    tl = Timeline()

    def body(k, t0):
        tl.call(TRAIN, t0 + 1 * US)
        t, gpu_free = t0 + 2 * US, t0
        durations = [1 * US] * SHORT_KERNELS
        if big_kernel_first:
            durations.insert(0, 70 * US)
        for d in durations:
            start = max(t + LAUNCH_NS, gpu_free)  # after the launch returns, behind the queue
            tl.launch(t, start, start + d, dur=LAUNCH_NS)
            gpu_free = start + d
            t += LAUNCH_NS + US // 2
        tl.ret(t0 + 97 * US)

    return tl.steps(body).results()


def test_launch_bound_found_for_short_kernels_on_an_idle_gpu():
    res = launch_profile(big_kernel_first=False)
    f = found(res, "launch_bound")
    assert f is not None
    busy = SHORT_KERNELS * US / STEP  # 20%
    # every kernel is shorter than a launch: (1 - busy) * min(1, 1.0 + 0.25)
    assert f.severity == pytest.approx(1 - busy)
    # without API classes the launch cost is the checker's 5-us default
    launch_ns = LAUNCH_NS if HAVE_CLASSES else 5000
    assert f.evidence == {
        "kernels_per_step": SHORT_KERNELS,
        "short_kernel_share": 1.0,
        "median_kernel_ns": 1 * US,
        "median_launch_ns": launch_ns,
        "gpu_busy_share": pytest.approx(busy),
    }
    assert f"{SHORT_KERNELS} kernels per step" in f.title
    assert "CUDA graphs" in f.fix


def test_no_launch_bound_when_a_backlog_keeps_the_gpu_busy():
    res = launch_profile(big_kernel_first=True)
    busy = res.steps()["gpu_busy_ns"].sum() / (N_STEPS * STEP)
    assert busy == pytest.approx(0.9)  # the same short kernels, queued behind a long one
    assert found(res, "launch_bound") is None


def test_no_launch_bound_when_the_idle_gpu_waits_on_data_instead():
    """60 us of each step waiting in Loader.__next__ with an idle GPU, then 3.5-us kernels
    behind 4-us launches: the GPU is busy most of the time the loop launches."""
    tl = Timeline()

    def body(k, t0):
        tl.call(NEXT, t0)
        tl.ret(t0 + 60 * US)
        tl.call(TRAIN, t0 + 60 * US)
        t = t0 + 61 * US
        for _ in range(8):
            tl.launch(t, t + LAUNCH_NS, t + LAUNCH_NS + 3500, dur=LAUNCH_NS)
            t += LAUNCH_NS + US // 2
        tl.ret(t0 + 99 * US)

    res = tl.steps(body).results()
    assert res.steps()["gpu_busy_ns"].sum() / (N_STEPS * STEP) < 0.4  # idle, over the step
    assert found(res, "data_stall") is not None
    assert found(res, "launch_bound") is None


def test_no_launch_bound_for_short_kernels_replayed_from_a_cuda_graph():
    # given the same 1-us kernels and the same idle GPU, all from one graph launch
    tl = Timeline()

    def body(k, t0):
        tl.call(TRAIN, t0 + 1 * US)
        corr = tl.api(LAUNCH, t0 + 2 * US, LAUNCH_NS)
        start = t0 + 2 * US + LAUNCH_NS
        for i in range(SHORT_KERNELS):
            tl.kernel(corr, start + i * US, start + (i + 1) * US, graph_id=1)
        tl.ret(t0 + 97 * US)

    res = tl.steps(body).results()
    # then no kernel paid a launch of its own: the idle GPU is gpu_idle's finding
    assert found(res, "launch_bound") is None
    assert found(res, "gpu_idle") is not None


# ---- gpu_idle ---------------------------------------------------------------------------


def idle_profile(kernel_us):
    """One kernel of kernel_us per step; the host then runs host_postprocess."""
    tl = Timeline()

    def body(k, t0):
        tl.call(TRAIN, t0 + 1 * US)
        tl.launch(t0 + 2 * US, t0 + 3 * US, t0 + (3 + kernel_us) * US)
        tl.call(POST, t0 + 35 * US)
        tl.ret(t0 + 95 * US)
        tl.ret(t0 + 97 * US)

    return tl.steps(body).results()


def test_gpu_idle_names_what_the_host_runs_in_the_largest_gap():
    f = found(idle_profile(30), "gpu_idle")
    assert f is not None
    # idle per step: [t0, t0+3us) before the kernel and [t0+33us, t0+100us) after it
    idle = 3 * US + 67 * US
    assert f.severity == pytest.approx(0.5 * idle / STEP)
    assert f.evidence == {"idle_ns": N_STEPS * idle, "gaps": 2 * N_STEPS, "largest_gap_ns": 67 * US}
    assert f"67.000us during host_postprocess ({loc(host_postprocess)})" in f.title
    assert f.location == loc(host_postprocess)  # what runs in the largest gap
    assert f.fix


def test_no_gpu_idle_under_20_percent():
    assert found(idle_profile(85), "gpu_idle") is None  # idle 3 + 12 us of 100


# ---- no_mixed_precision -----------------------------------------------------------------


def matmul_profile(gemm_name):
    """A 60-us matrix kernel and a 20-us elementwise kernel per step."""
    tl = Timeline()

    def body(k, t0):
        tl.call(TRAIN, t0 + 1 * US)
        tl.launch(t0 + 2 * US, t0 + 3 * US, t0 + 63 * US, name=gemm_name)
        tl.launch(t0 + 3 * US, t0 + 63 * US, t0 + 83 * US)
        tl.ret(t0 + 97 * US)

    return tl.steps(body).results()


@pytest.mark.parametrize(
    "gemm_name, family, precision",
    [
        (FP32_GEMM, "gemm", "fp32"),
        ("volta_sgemm_128x64_tn", "gemm", "fp32"),
        ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128", "gemm", "fp32"),
        ("void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_tn_align1>", "gemm", "fp32"),
        ("cutlass_80_tensorop_s1688tf32gemm_256x128_16x3_nn_align4", "gemm", "tf32"),
        ("nvjet_sm90_sss_128x64_64x8_2x1_v_bz_coopA_NTN", "gemm", "fp32"),
        # cuDNN convolutions of a ResNet in FP32 / TF32: forward, data and weight gradients
        (
            "sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32",
            "convolution",
            "tf32",
        ),
        ("sm80_xmma_dgrad_implicit_gemm_f32f32_f32f32_f32_nhwckrsc_nchw", "convolution", "fp32"),
        ("sm80_xmma_wgrad_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc", "convolution", "tf32"),
        (
            "void cudnn::detail::implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3>",
            "convolution",
            "fp32",
        ),
        ("ampere_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", "convolution", "fp32"),
        (
            "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(params)",
            "convolution",
            "fp32",
        ),
        # attention: PyTorch's memory-efficient kernel in FP32
        ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", "attention", "fp32"),
    ],
)
def test_no_mixed_precision_found_for_fp32_and_tf32_matrix_kernels(gemm_name, family, precision):
    assert diagnose_mod.matrix_kernel_class(gemm_name) == (family, precision)
    f = found(matmul_profile(gemm_name), "no_mixed_precision")
    assert f is not None
    share, busy = 60 / 80, 80 * US / STEP
    saves = {"fp32": 0.75, "tf32": 0.5}[precision]
    assert f.severity == pytest.approx(share * saves * busy)
    ev = f.evidence
    assert ev[f"{precision}_ns"] == N_STEPS * 60 * US and ev[f"{family}_ns"] == N_STEPS * 60 * US
    assert ev["matrix_ns"] == N_STEPS * 60 * US and ev["gpu_time_ns"] == N_STEPS * 80 * US
    assert ev["fp32_tf32_share"] == pytest.approx(share)
    assert ev["amp_saving_share"] == pytest.approx(share * saves)
    assert sum(ev[f"{p}_ns"] for p in diagnose_mod.PRECISIONS) == ev["matrix_ns"]
    assert gemm_name[:60] in f.title
    assert f"{precision.upper()} 75%" in f.title and f"{family} 75%" in f.title
    assert "autocast" in f.fix
    assert ("set_float32_matmul_precision" in f.fix) == (precision == "fp32")


@pytest.mark.parametrize(
    "gemm_name, family, precision",
    [
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn", "gemm", "bf16"),
        ("ampere_fp16_s16816gemm_fp16_256x128_ldg8_f2f_stages_32x3_nn", "gemm", "fp16"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm", "bf16"),
        ("volta_h884gemm_64x128_ldg8_nn", "gemm", "fp16"),
        ("nvjet_hsh_256x128_64x4_2x1_v_bz_coopB_TNN", "gemm", "fp16"),
        # what bf16 autocast ran on the H200 in examples/fast_training.py (docs/diagnosis.md)
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT", "gemm", "bf16"),
        ("sm90_xmma_gemm_e4m3e4m3_bf16f32_f32_tn_n_tilesize128x128x128", "gemm", "fp8"),
        ("sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", "convolution", "bf16"),
        (
            "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, "
            "false, cutlass::bfloat16_t>, false, true>(pytorch_flash::Flash_fwd_params)",
            "attention",
            "bf16",
        ),
        ("fmha_cutlassB_f16_aligned_64x64_k64_sm80", "attention", "fp16"),
        ("triton_tem_fused_mm_0", "gemm", "unknown"),  # a Triton matmul: its name says no type
        ("_Z13vectorized_addv", None, "unknown"),  # not a matrix kernel
        ("void cudnn::bn_fw_tr_1C11_singleread<float, 512, true, 1, 2, 0>(params)", None, "fp32"),
        ("void at::native::elementwise_kernel<128, 2, float>(int, float)", None, "fp32"),
    ],
)
def test_no_mixed_precision_not_reported_for_tensor_core_or_other_kernels(
    gemm_name, family, precision
):
    assert diagnose_mod.matrix_kernel_class(gemm_name) == (family, precision)
    assert found(matmul_profile(gemm_name), "no_mixed_precision") is None


def test_no_mixed_precision_shares_are_of_kernel_time_not_of_copies_or_communication():
    """15 us of FP32 GEMM and 15 us of other kernels per step, beside a 50-us all-reduce
    and a host sync: the GEMM is under a quarter of GPU time but half of the kernels'
    time; the sync's wait is host time, in neither."""
    tl = Timeline()

    def body(k, t0):
        tl.call(TRAIN, t0 + 1 * US)
        tl.launch(t0 + 2 * US, t0 + 3 * US, t0 + 18 * US, name=FP32_GEMM)
        tl.launch(t0 + 3 * US, t0 + 18 * US, t0 + 33 * US)
        tl.launch(t0 + 4 * US, t0 + 35 * US, t0 + 85 * US, name=NCCL, stream=9)
        sync = tl.api(STREAM_SYNC, t0 + 5 * US, 80 * US)
        tl.gpu.append(
            dict(kind=C["GPU_SYNC"], correlation=sync, start_ns=t0 + 5 * US, end_ns=t0 + 85 * US)
        )
        tl.ret(t0 + 97 * US)

    res = tl.steps(body).results()
    assert "sync" in set(res.kernels()["category"])
    f = found(res, "no_mixed_precision")
    assert f is not None
    ev = f.evidence
    assert ev["kernel_time_ns"] == N_STEPS * 30 * US and ev["gpu_time_ns"] == N_STEPS * 80 * US
    assert ev["fp32_tf32_share"] == pytest.approx(0.5)
    assert "50% of kernel time" in f.title and "FP32 50%" in f.title
    # what autocast could save is still a share of all GPU time, then of the step
    assert ev["amp_saving_share"] == pytest.approx(0.75 * 15 / 80)


# ---- communication_wait -----------------------------------------------------------------


def comm_profile(nccl_us):
    """A compute kernel [5, 45) us into each step on stream 7 and an all-reduce at
    nccl_us (start, end) on stream 9."""
    tl = Timeline()

    def body(k, t0):
        tl.call(TRAIN, t0 + 1 * US)
        tl.launch(t0 + 2 * US, t0 + 5 * US, t0 + 45 * US)
        a, b = nccl_us
        tl.launch(t0 + 3 * US, t0 + a * US, t0 + b * US, name=NCCL, stream=9)
        tl.ret(t0 + 97 * US)

    return tl.steps(body).results()


@pytest.mark.parametrize("nccl_us, exposed_us", [((50, 90), 40), ((30, 60), 15)])
def test_communication_wait_counts_what_compute_does_not_overlap(nccl_us, exposed_us):
    f = found(comm_profile(nccl_us), "communication_wait")
    assert f is not None
    assert f.severity == pytest.approx(exposed_us * US / STEP)
    comm = (nccl_us[1] - nccl_us[0]) * US
    assert f.evidence == {"comm_ns": N_STEPS * comm, "exposed_comm_ns": N_STEPS * exposed_us * US}
    assert f"{exposed_us}.000us per step" in f.title
    assert "all-reduce" in f.fix


def test_no_communication_wait_when_compute_overlaps_the_all_reduce():
    res = comm_profile((10, 40))
    assert res.steps()["comm_ns"].tolist() == [30 * US] * N_STEPS
    assert found(res, "communication_wait") is None


# ---- memory_churn -----------------------------------------------------------------------


def alloc_profile(alloc_steps, alloc_us=5):
    """cudaMalloc and cudaFree of alloc_us each around a kernel in alloc_steps."""
    tl = Timeline()

    def body(k, t0):
        tl.call(TRAIN, t0 + 1 * US)
        if k in alloc_steps:
            tl.api(MALLOC, t0 + 2 * US, alloc_us * US)
        tl.launch(t0 + 30 * US, t0 + 31 * US, t0 + 90 * US)
        if k in alloc_steps:
            tl.api(FREE, t0 + 40 * US, alloc_us * US)
        tl.ret(t0 + 97 * US)

    return tl.steps(body).results()


@needs_classes
def test_memory_churn_found_for_allocations_in_every_step():
    f = found(alloc_profile(range(N_STEPS)), "memory_churn")
    assert f is not None
    assert f.severity == pytest.approx(2 * 5 * US / STEP)
    assert f.evidence == {"calls": 2 * N_STEPS, "time_ns": N_STEPS * 2 * 5 * US}
    assert "2.0 calls per step" in f.title
    assert "caching allocator" in f.fix


@needs_classes
def test_no_memory_churn_once_allocation_reaches_a_steady_state():
    # the first step allocates (slowly); later steps reuse the memory
    assert found(alloc_profile({0}, alloc_us=20), "memory_churn") is None


# ---- the report -------------------------------------------------------------------------


def ranked_profile():
    """A 30-us loader wait, a compute kernel, then a 25-us all-reduce nothing overlaps:
    data_stall 0.30 > communication_wait 0.25 > gpu_idle 0.175 (checked in another order)."""
    tl = Timeline()

    def body(k, t0):
        tl.call(NEXT, t0)
        tl.ret(t0 + 30 * US)
        tl.call(TRAIN, t0 + 30 * US)
        tl.launch(t0 + 31 * US, t0 + 32 * US, t0 + 72 * US)
        tl.launch(t0 + 32 * US, t0 + 72 * US, t0 + 97 * US, name=NCCL, stream=9)
        tl.ret(t0 + 98 * US)

    return tl.steps(body).results()


def test_findings_are_ranked_by_severity():
    d = diagnose(ranked_profile())
    assert d.kinds() == ["data_stall", "communication_wait", "gpu_idle"]
    # idle per step: [0, 32) and [97, 100) us
    assert [f.severity for f in d] == pytest.approx([0.30, 0.25, 0.5 * 35 / 100])
    assert d.summary == {
        "steps": N_STEPS,
        "step_ns_mean": STEP,
        "window_ns": T0 + N_STEPS * STEP + T0,  # the window closes 1 us after the last step
        "gpu_busy_share": pytest.approx(65 / 100),
        "gpu": True,
    }


def test_to_dict_round_trips_through_json():
    d = diagnose(ranked_profile())
    data = d.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert [f["kind"] for f in data["findings"]] == d.kinds()
    assert set(data["findings"][0]) == {
        "kind",
        "severity",
        "title",
        "evidence",
        "location",
        "fix",
        "share_of",
    }
    assert data["headline"] == d.headline()
    for f in data["findings"]:
        assert type(f["severity"]) is float
        assert all(type(v) in (int, float, str) for v in f["evidence"].values()), f


def test_str_names_each_finding_with_its_share_location_and_fix():
    d = diagnose(ranked_profile())
    text = str(d)
    assert text.startswith("gpuprof diagnosis\n")
    assert f"{N_STEPS} recorded steps, 100.000us per step; GPU busy 65.0% of step time" in text
    for i, f in enumerate(d, 1):
        assert f"{i}. [{100 * f.severity:4.1f}% of step time] {f.title}" in text
        assert f"   fix: {f.fix}" in text
    assert f"   at {loc(Loader.__next__)}" in text
    assert "wait_per_step_ns=30.000us" in text


def test_a_clean_profile_has_no_findings():
    res = idle_profile(85)
    d = diagnose(res)
    assert isinstance(d, Diagnosis) and list(d) == []
    assert "No bottleneck found" in str(d)
    assert json.loads(json.dumps(d.to_dict()))["findings"] == []


def test_prof_diagnose_reads_the_results():
    class Loaded(ResultAccessors):
        def __init__(self, results):
            self.results = results

    res = loader_profile(cover_us=0)
    assert Loaded(res).diagnose().to_dict() == diagnose(res).to_dict()


# ---- step_breakdown: the parts of each step's wall time ----------------------------------

PARTS = ("gpu_busy_ns", "comm_ns", "data_wait_ns", "sync_wait_ns", "idle_ns")


def breakdown(res):
    b = step_breakdown(res)
    # every nanosecond counts once: the parts add up to the step, and GPU busy plus
    # communication is the step's GPU activity as prof.steps() counts it
    assert (sum(b[p] for p in PARTS) == b["step_ns"]).all()
    assert (b["gpu_busy_ns"] + b["comm_ns"] == res.steps()["gpu_busy_ns"]).all()
    assert all((b[p] >= 0).all() for p in PARTS)
    assert b["step"].tolist() == res.steps()["step"].tolist()
    return {p: b[p].tolist() for p in PARTS}


def test_step_breakdown_counts_the_loader_wait_the_gpu_does_not_cover():
    # each step waits 40 us in the loader; its kernel runs [42, 100) us
    assert breakdown(loader_profile(cover_us=0)) == {
        "gpu_busy_ns": [58 * US] * N_STEPS,
        "comm_ns": [0] * N_STEPS,
        "data_wait_ns": [40 * US] * N_STEPS,
        "sync_wait_ns": [0] * N_STEPS,
        "idle_ns": [2 * US] * N_STEPS,
    }
    # the previous step's kernel keeps the GPU busy for the first 30 us of the wait
    parts = breakdown(loader_profile(cover_us=30))
    assert parts["data_wait_ns"] == [10 * US] * N_STEPS
    assert parts["gpu_busy_ns"] == [88 * US] * N_STEPS


@needs_classes
def test_step_breakdown_counts_the_bubble_after_a_sync_as_sync_wait():
    # kernel [3, 60) us, sync [5, 61): the GPU then idles until the next step's kernel at
    # 103 us (39 us in this step, 3 in the next); the last step's bubble ends with the step
    parts = breakdown(sync_profile(56, range(N_STEPS)))
    assert parts["sync_wait_ns"] == [39 * US] + [42 * US] * (N_STEPS - 1)
    assert parts["gpu_busy_ns"] == [57 * US] * N_STEPS
    assert parts["idle_ns"] == [4 * US] + [1 * US] * (N_STEPS - 1)
    # the same total as the sync_point finding's cost
    f = found(sync_profile(56, range(N_STEPS)), "sync_point")
    assert sum(parts["sync_wait_ns"]) == f.evidence["cost_ns"]


@pytest.mark.parametrize("nccl_us, exposed_us", [((50, 90), 40), ((30, 60), 15)])
def test_step_breakdown_counts_only_communication_that_compute_does_not_hide(nccl_us, exposed_us):
    parts = breakdown(comm_profile(nccl_us))
    assert parts["comm_ns"] == [exposed_us * US] * N_STEPS
    assert parts["gpu_busy_ns"] == [40 * US] * N_STEPS  # the compute kernel [5, 45)
    assert parts["data_wait_ns"] == parts["sync_wait_ns"] == [0] * N_STEPS


def test_step_breakdown_numbers_the_window_of_each_step():
    a, b = loader_profile(cover_us=0), sync_profile(1, {0})
    both = Results(a.windows + b.windows, cuda=a.cuda, meta={"device_properties": []})
    rows = step_breakdown(both)
    assert rows["window"].tolist() == [0] * N_STEPS + [1] * N_STEPS
    assert rows["data_wait_ns"][:N_STEPS].tolist() == [40 * US] * N_STEPS


# ---- findings that fit the program: no steps, no GPU ------------------------------------
#
# Programs that are not GPU training loops, profiled as `python -m gpuprof run` profiles
# them: no prof.step(), no GPU. A generator or an iterator there is just code, never a
# data stall, and the diagnosis says where the CPU time goes instead.

import collections  # noqa: E402
import hashlib  # noqa: E402
import random  # noqa: E402
import threading  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

from gpuprof.core._paths import source_location  # noqa: E402

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


def line_of(func, text):
    """file:line (as a finding names it) of the line of func's source holding text."""
    import inspect

    lines, first = inspect.getsourcelines(func)
    (k,) = [i for i, s in enumerate(lines) if text in s]
    return source_location(func.__code__.co_filename, first + k)


def make_corpus(n_lines, rng):
    return [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(n_lines)]  # corpus


def count_words(corpus):
    counts = collections.Counter()
    for line in corpus:
        counts.update(w.lower() for w in line.split())  # count
    return counts


def digest(i):
    h = hashlib.sha256()
    # enough work (about half a second over the 600 tasks) that a scheduler stall
    # of the main thread on a loaded CI machine does not outweigh it
    for k in range(1000):
        h.update(f"{i}:{k}".encode())  # hash
    return h.hexdigest()


def hot_paths(d):
    return [f for f in d if f.kind == "cpu_hot_path"]


def assert_no_step_figures(d):
    """No data stall, and no "0 recorded steps, N per step" anywhere: the shares are of
    the recorded time (or the CPU time), and the header says there were no steps."""
    text = str(d)
    assert "data_stall" not in d.kinds(), text
    assert d.summary["steps"] == 0 and d.summary["step_ns_mean"] == 0
    assert "recorded steps" not in text and "per step" not in text, text
    assert "of step time" not in text, text
    assert d.headline()[0].startswith("No steps recorded: "), text
    assert all(f.share_of in ("recorded time", "CPU time") for f in d)


def test_a_word_count_gets_its_hot_line_not_a_data_stall():
    # given a word count: generator expressions inside list comprehensions over a corpus
    with gpuprof.profile() as prof:
        counts = count_words(make_corpus(4000, random.Random(0)))
    assert sum(counts.values()) == 4000 * 12
    d = diagnose(prof.results)
    # then the generator expressions are no input pipeline, and no step figures appear
    assert_no_step_figures(d)
    # and the findings say where the CPU time goes, by the user's line
    assert not d.summary["gpu"]
    assert any("GPU training loops" in line for line in d.headline())
    assert "No bottleneck found" not in str(d)
    hot = hot_paths(d)
    assert hot and hot[0] is d[0]
    # the user's line; "(in LIBRARY:LINE)" after it names the hottest library frame below
    assert hot[0].location.split(" (in ")[0] == line_of(make_corpus, "# corpus"), str(d)
    assert hot[0].share_of == "CPU time" and 0.05 <= hot[0].severity <= 1
    assert line_of(count_words, "# count") in [f.location.split(" (in ")[0] for f in hot]
    # every figure can be checked against the arrays: the hot line's time is self CPU time
    total = int(prof.call_tree()["self_ns"].sum())
    assert hot[0].evidence["self_ns"] == pytest.approx(hot[0].severity * total)
    ops = prof.ops()
    choice = ops[ops["name"] == "Random.choice"]
    assert hot[0].evidence["self_ns"] >= int(choice["cpu_self_ns"].sum())


def test_a_thread_pool_map_gets_no_data_stall():
    # given a hashing job through ThreadPoolExecutor.map, consumed by list(). The
    # workers start once every task is submitted: a thread that waits for the GIL
    # counts the wait in its frame's self time (docs/tables.md), and the main thread's
    # submitting, racing three hashing workers for the GIL, is not what this checks
    go = threading.Event()

    def gated(i):
        go.wait()
        return digest(i)

    with gpuprof.profile() as prof:
        with ThreadPoolExecutor(max_workers=3) as pool:
            results = pool.map(gated, range(600))
            go.set()
            out = list(results)
    assert len(out) == 600
    d = diagnose(prof.results)
    # then Executor.map's result iterator is no data loader
    assert_no_step_figures(d)
    # the hottest line is the workers' hashing, not their waiting for work (a queue
    # get) or the main thread's waiting for results (a lock): waiting is not CPU time
    hot = hot_paths(d)
    assert hot, str(d)
    assert hot[0].location in (line_of(digest, "def digest"), line_of(digest, "# hash")), str(d)
    for f in hot:
        assert not any(w in f.title for w in ("SimpleQueue.get", "lock.acquire")), str(d)


CELL = """\
words = [w for line in corpus for w in line.split()]
lengths = sum(len(w) for w in words if w.isalpha())  # cell line 2
longest = max((len(w), w) for w in words)
"""


def test_a_notebook_cell_generator_expression_is_no_data_stall():
    # given a notebook-style cell: code compiled under a kernel's cell file name and run
    # by exec, with generator expressions over a corpus at its top level
    cell_file = "/tmp/ipykernel_4242/2718281828.py"
    code = compile(CELL, cell_file, "exec")
    ns = {"corpus": make_corpus(3000, random.Random(1))}
    with gpuprof.profile() as prof:
        exec(code, ns)
    assert ns["lengths"] > 0
    d = diagnose(prof.results)
    assert_no_step_figures(d)
    # the hot paths name the cell's lines
    hot = hot_paths(d)
    assert hot, str(d)
    cell_lines = {source_location(cell_file, n) for n in (1, 2, 3)}
    assert hot[0].location.split(" (in ")[0] in cell_lines, str(d)


def test_a_cpu_bound_window_names_the_call_that_takes_its_time():
    def crunch():
        total = 0
        for _ in range(20):
            total += sum(range(100_000))  # sum line
        return total

    with gpuprof.profile() as prof:
        crunch()
    d = diagnose(prof.results)
    assert "No bottleneck found" not in str(d)
    f = d[0]
    assert f.kind == "cpu_hot_path"
    assert f.location == line_of(crunch, "# sum line")
    assert f.evidence["hottest"] == "sum"
    ops = prof.ops()
    assert f.evidence["hottest_self_ns"] == int(ops[ops["name"] == "sum"]["cpu_self_ns"][0])
    assert f"[{100 * f.severity:4.1f}% of CPU time] {f.title}" in str(d)


def test_no_data_stall_without_steps_in_a_gpu_profile():
    # given the loader profile's events without any step: __next__ under train code
    tl = Timeline()
    for k in range(N_STEPS):
        t0 = T0 + k * STEP
        tl.call(TRAIN, t0)
        tl.call(NEXT, t0 + 1 * US)
        tl.ret(t0 + LOADER_WAIT)
        tl.launch(t0 + 41 * US, t0 + 42 * US, t0 + 60 * US)
        if HAVE_CLASSES:  # and a host sync, which needs no steps to be found
            tl.api(STREAM_SYNC, t0 + 43 * US, 20 * US)
        tl.ret(t0 + 95 * US)
    d = diagnose(tl.results())
    # then there is no loop that waits for its input, and no step figure
    assert_no_step_figures(d)
    assert d.summary["gpu"] and d.headline()[0].endswith("of it")
    assert not hot_paths(d)  # with GPU activity the GPU checks judge the window
    if HAVE_CLASSES:
        assert d.kinds() == ["sync_point"]
        assert "% of recorded time] Host blocked" in str(d)
    else:
        assert "nothing costs more than 5% of recorded time" in str(d)


def test_a_loop_that_waits_for_its_batches_inside_steps_still_stalls():
    # the same iterator: a data stall when the steps wait for it, none without steps
    with gpuprof.profile() as prof:
        for _ in SlowBatches(4):
            busy()
            prof.step()
    d = diagnose(prof.results)
    assert d.kinds()[0] == "data_stall", str(d)
    # the hot paths of its CPU time come after the problems, whatever their shares
    assert d[0].share_of == "step time"
    kinds = d.kinds()
    assert kinds == sorted(kinds, key=lambda k: k == "cpu_hot_path")
    with gpuprof.profile() as prof:
        for _ in SlowBatches(4):
            busy()
    assert "data_stall" not in diagnose(prof.results).kinds()


def test_a_named_fetch_after_the_last_step_is_not_a_wait():
    batches = SlowBatches(3)
    with gpuprof.profile() as prof:
        for _ in range(2):
            busy()
            prof.step()
        with gpuprof.record_function("fetch"):  # after the last step: in no step
            next(batches)
    spans = prof.results.spans()
    raw = prof.results.windows[-1]
    assert not len(data_wait_per_step(prof.results, data_fetch=("fetch",)).nonzero()[0])
    assert not len(
        diagnose_mod.data_wait_spans(spans, prof.ops(), raw["ops"], data_fetch=("fetch",))
    )
