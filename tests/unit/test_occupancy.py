"""Theoretical occupancy against hand-worked examples, and the deep dive's pure-Python
parts (classification, aggregation, ncu CSV, CUPTI struct layouts). No GPU needed.

Every case writes its arithmetic out. Shorthand: W = warps per block,
R = registers allocated per warp (regs/thread x 32, rounded up to 256),
S = shared memory allocated per block (static + dynamic + reserve, rounded up
to the allocation unit). sm_90: 64K registers (16384 per sub-partition, 4
sub-partitions), 64 warps (2048 threads), 32 blocks, 228 KB = 233472 bytes
shared per SM, 1 KB reserved per block, 128-byte unit.
"""

import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from gpuprof import _gpuprof
from gpuprof.analysis import deepdive as dd
from gpuprof.analysis.deepdive import _cupti as ddc
from gpuprof.analysis.deepdive import _ncu as ddn
from gpuprof.api.deepdive import deep_dive
from gpuprof.results.occupancy import (
    ARCH_LIMITS,
    annotate_kernels,
    arch_limits,
    device_limits,
    estimated_achieved_occupancy,
    theoretical_occupancy,
)

# The properties an H100 SXM reports through device_props() (CUDA attribute names).
H100 = {
    "id": 0,
    "name": "NVIDIA H100",
    "computeMajor": 9,
    "computeMinor": 0,
    "maxThreadsPerBlock": 1024,
    "maxThreadsPerMultiprocessor": 2048,
    "regsPerBlock": 65536,
    "regsPerMultiprocessor": 65536,
    "warpSize": 32,
    "sharedMemPerBlock": 49152,
    "sharedMemPerBlockOptin": 232448,
    "sharedMemPerMultiprocessor": 233472,
    "maxBlocksPerMultiprocessor": 32,
    "numSms": 132,
    "totalGlobalMem": 80 << 30,
}


def occ(block, regs, smem, dev="sm_90"):
    return theoretical_occupancy(block, regs, smem, dev)


def test_sm90_table_matches_the_documented_limits():
    d = arch_limits("sm_90")
    assert d.regs_per_sm == 65536 and d.max_warps_per_sm == 64 and d.max_blocks_per_sm == 32
    assert d.shared_mem_per_sm == 228 * 1024 and d.shared_mem_per_block_optin == 227 * 1024
    assert d.reserved_shared_mem_per_block == 1024 and d.shared_mem_alloc_unit == 128
    assert d.reg_alloc_unit == 256
    # the live properties of an H100 and the table agree
    assert device_limits(H100) == device_limits(
        {**{k: 0 for k in H100}, "computeMajor": 9, "computeMinor": 0, "numSms": 132}
    )


def test_full_occupancy_is_limited_by_warps():
    # 256 threads, 32 regs, no smem. W = 8. R = 32*32 = 1024.
    # registers: 16384 / 1024 = 16 warps per sub-partition -> 64 warps -> 64 / 8 = 8 blocks
    # shared:    S = 0 + 1024 reserve = 1024 -> 233472 / 1024 = 228 blocks
    # warps:     64 / 8 = 8 blocks;   block cap: 32
    # min = 8 blocks -> 64 warps -> 64/64 = 100%, every slot used: "warps"
    o = occ(256, 32, 0, H100)
    assert (o.blocks_per_sm, o.warps_per_sm, o.occupancy, o.limiter) == (8, 64, 1.0, "warps")
    assert o.limits == {"registers": 8, "shared_mem": 228, "blocks_per_sm": 32, "warps": 8}


def test_registers_limit():
    # 256 threads, 64 regs. W = 8. R = 64*32 = 2048.
    # registers: 16384 / 2048 = 8 warps per sub-partition -> 32 warps -> 32 / 8 = 4 blocks
    # warps: 8 blocks; shared: 228; cap: 32 -> 4 blocks -> 32 warps -> 50%
    o = occ(256, 64, 0)
    assert (o.blocks_per_sm, o.occupancy, o.limiter) == (4, 0.5, "registers")


def test_registers_round_up_to_the_256_allocation_unit():
    # 256 threads, 70 regs. 70*32 = 2240 -> rounded up to 9*256 = 2304 = R.
    # registers: floor(16384 / 2304) = 7 warps per sub-partition -> 28 warps
    #            -> floor(28 / 8) = 3 blocks -> 24 warps -> 24/64 = 37.5%
    # (without the rounding: floor(16384/2240) = 7 as well, but 72 regs = 2304 exactly
    #  gives the same answer, so 70 and 72 must agree)
    o = occ(256, 70, 0)
    assert o.regs_per_warp == 2304
    assert (o.blocks_per_sm, o.warps_per_sm, o.occupancy, o.limiter) == (3, 24, 0.375, "registers")
    assert occ(256, 72, 0).occupancy == o.occupancy


def test_registers_are_split_across_four_sub_partitions():
    # 32 threads (W = 1), 80 regs. R = 2560.
    # whole SM would give floor(65536 / 2560) = 25 warps, but per sub-partition
    # floor(16384 / 2560) = 6 -> 4 * 6 = 24 warps -> 24 blocks (cap 32, warps 64)
    # -> 24 warps -> 24/64 = 37.5%
    o = occ(32, 80, 0)
    assert (o.blocks_per_sm, o.occupancy, o.limiter) == (24, 0.375, "registers")


def test_block_that_does_not_fit_the_register_file_cannot_launch():
    # 800 threads (W = 25), 80 regs, R = 2560. The hardware check rounds W up to a
    # multiple of 4: 2560 * 28 = 71680 > 65536 regs per block -> 0 blocks.
    o = occ(800, 80, 0)
    assert (o.blocks_per_sm, o.occupancy, o.limiter) == (0, 0.0, "registers")


def test_shared_memory_limit():
    # 128 threads (W = 4), 32 regs, 48 KB smem.
    # S = 49152 + 1024 reserve = 50176 (= 392 * 128, no rounding)
    # shared:    floor(233472 / 50176) = 4 blocks
    # registers: 64 warps / 4 = 16 blocks; warps: 16; cap 32 -> 4 blocks -> 16 warps -> 25%
    o = occ(128, 32, 48 * 1024)
    assert (o.shared_mem_per_block, o.blocks_per_sm, o.occupancy, o.limiter) == (
        50176,
        4,
        0.25,
        "shared_mem",
    )


def test_shared_memory_rounds_up_to_128_bytes_with_the_1kb_reserve():
    # 256 threads (W = 8), 32 regs, 100000 bytes smem.
    # 100000 + 1024 = 101024 -> ceil(101024 / 128) = 790 -> S = 101120
    # shared: floor(233472 / 101120) = 2 blocks -> 16 warps -> 25%
    o = occ(256, 32, 100000)
    assert (o.shared_mem_per_block, o.blocks_per_sm, o.occupancy, o.limiter) == (
        101120,
        2,
        0.25,
        "shared_mem",
    )


def test_shared_memory_past_the_opt_in_limit_cannot_launch():
    # 227 KB opt-in + 1 byte: S = 232449 + 1024 -> 233600 > 227 KB + 1 KB = 233472
    o = occ(128, 32, 227 * 1024 + 1)
    assert (o.blocks_per_sm, o.limiter) == (0, "shared_mem")
    # exactly 227 KB fits once: S = 232448 + 1024 = 233472 -> 1 block -> 4 warps
    assert occ(128, 32, 227 * 1024).blocks_per_sm == 1


def test_blocks_per_sm_limit():
    # 32 threads (W = 1), 16 regs, no smem. R = 512.
    # registers: 16384 / 512 = 32 per sub-partition -> 128 warps -> 128 blocks
    # warps: 64 / 1 = 64 blocks; shared: 228; cap: 32 -> 32 blocks -> 32 warps -> 50%
    o = occ(32, 16, 0)
    assert (o.blocks_per_sm, o.occupancy, o.limiter) == (32, 0.5, "blocks_per_sm")


def test_block_size_leaves_warp_slots_empty():
    # sm_86: 48 warps (1536 threads), 16 blocks, 100 KB shared.
    # 1024 threads (W = 32), 32 regs: warps: floor(48 / 32) = 1 block;
    # registers: 16384/1024 = 16 per sub-partition -> 64 warps -> 2 blocks
    # -> 1 block -> 32 of 48 warps = 66.7%: the block size wastes 16 slots
    o = occ(1024, 32, 0, "sm_86")
    assert (o.blocks_per_sm, o.max_warps_per_sm, o.limiter) == (1, 48, "block_size")
    assert o.occupancy == pytest.approx(32 / 48)
    # sm_90, 768 threads (W = 24): floor(64 / 24) = 2 blocks -> 48 warps -> 75%;
    # registers also allow 2 (64 / 24 = 2), but no register saving lifts it
    o = occ(768, 32, 0)
    assert (o.blocks_per_sm, o.occupancy, o.limiter) == (2, 0.75, "block_size")


def test_block_larger_than_the_device_allows():
    # 2048 threads > maxThreadsPerBlock 1024: no block can launch
    o = occ((32, 64, 1), 16, 0)
    assert (o.blocks_per_sm, o.occupancy, o.limiter) == (0, 0.0, "block_size")


def test_turing_and_ampere():
    # sm_75: 32 warps, 16 blocks, 64 KB, no reserve, 256-byte unit.
    # 128 threads (W = 4), 40 regs: R = 1280 -> 16384/1280 = 12 per sub-partition
    # -> 48 warps -> 12 blocks; warps: 32/4 = 8 -> 8 blocks -> 32 warps -> 100%
    assert (occ(128, 40, 0, "sm_75").occupancy, occ(128, 40, 0, "sm_75").limiter) == (1.0, "warps")
    # with 10000 bytes: S = ceil(10000/256)*256 = 10240 -> floor(65536/10240) = 6 blocks
    # -> 24 warps -> 75%
    o = occ(128, 40, 10000, "7.5")
    assert (o.shared_mem_per_block, o.occupancy, o.limiter) == (10240, 0.75, "shared_mem")
    # sm_80: 164 KB = 167936. 48 KB + 1 KB = 50176 -> 3 blocks -> 12 warps of 64 = 18.75%
    o = occ(128, 32, 48 * 1024, (8, 0))
    assert (o.blocks_per_sm, o.occupancy, o.limiter) == (3, 0.1875, "shared_mem")


@pytest.mark.parametrize("cc", ["sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100"])
def test_every_architecture_has_a_table(cc):
    # a 1-warp block with no registers can only be limited by the block cap
    o = occ(32, 0, 0, cc)
    d = arch_limits(cc)
    assert o.blocks_per_sm == d.max_blocks_per_sm
    assert o.limiter == "blocks_per_sm" or d.max_blocks_per_sm >= d.max_warps_per_sm


def test_compute_capability_spellings_and_unknown_ones():
    assert arch_limits("sm_90a") is ARCH_LIMITS[(9, 0)]
    assert arch_limits(100) is ARCH_LIMITS[(10, 0)]
    assert arch_limits("8.8") is ARCH_LIMITS[(8, 7)]  # newest of the same major, not newer
    with pytest.raises(ValueError, match="not in gpuprof's occupancy table"):
        arch_limits("sm_61")
    with pytest.raises(ValueError, match="compute_capability must be"):
        arch_limits("hopper")
    # an unknown architecture works when the properties are complete
    future = {**H100, "computeMajor": 15, "computeMinor": 0}
    assert occ(256, 32, 0, future).occupancy == 1.0
    with pytest.raises(ValueError, match="lack"):
        occ(256, 32, 0, {"computeMajor": 15, "computeMinor": 0})
    with pytest.raises(ValueError, match="computeMajor"):
        occ(256, 32, 0, {"numSms": 4})


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="registers must be at most 255"):
        occ(256, 256, 0)
    with pytest.raises(ValueError, match="shared_mem"):
        occ(256, 32, -1)
    with pytest.raises(ValueError, match="block"):
        occ(0, 32, 0)
    with pytest.raises(ValueError, match="block"):
        occ("256", 32, 0)


def test_estimated_achieved_occupancy_is_capped_by_the_grid():
    # 8 blocks of 256 threads on 132 SMs: 8/132 blocks per SM (theoretical 8)
    # -> 8/132 * 256 / 2048 = 0.757...%
    assert estimated_achieved_occupancy((8, 1, 1), 256, 32, 0, H100) == pytest.approx(
        8 / 132 * 256 / 2048
    )
    # a large grid reaches the theoretical limit: min(8, 10000/132) * 256 / 2048 = 100%
    assert estimated_achieved_occupancy(10000, 256, 32, 0, H100) == 1.0
    with pytest.raises(ValueError, match="num_sms"):
        estimated_achieved_occupancy(10, 256, 32, 0, "sm_90")


def test_annotate_kernel_rows_with_and_without_properties():
    from gpuprof.results._results import KERNELS_DTYPE

    rows = np.zeros(3, dtype=KERNELS_DTYPE)
    rows["block"][0] = (256, 1, 1)
    rows["registers"][0] = 64
    rows["block"][1] = (128, 1, 1)
    rows["registers"][1] = 32
    rows["shared_mem"][1] = 48 * 1024
    rows["category"][2] = "memcpy"  # no block: no occupancy
    annotate_kernels(rows, [H100])
    assert rows["occupancy"][0] == 0.5 and rows["occupancy_limiter"][0] == "registers"
    assert rows["blocks_per_sm"][0] == 4
    assert rows["occupancy"][1] == 0.25 and rows["occupancy_limiter"][1] == "shared_mem"
    assert math.isnan(rows["occupancy"][2]) and rows["occupancy_limiter"][2] == ""
    # no device properties: unknown, and the callable is not even asked without blocks
    annotate_kernels(rows, [])
    assert np.isnan(rows["occupancy"]).all() and (rows["blocks_per_sm"] == 0).all()
    empty = np.zeros(1, dtype=KERNELS_DTYPE)
    annotate_kernels(empty, lambda: pytest.fail("device properties asked for"))
    # only computeMajor/Minor known: the rest comes from the table
    annotate_kernels(rows, [{"id": 0, "computeMajor": 9, "computeMinor": 0}])
    assert rows["occupancy"][0] == 0.5


C = _gpuprof._test_constants()


def _results(meta):
    from gpuprof.results._results import Results

    gpu = [
        dict(
            kind=C["GPU_KERNEL"],
            correlation=7,
            start_ns=200,
            end_ns=300,
            name_id=0,
            stream=7,
            device=0,
            registers=64,
            grid_x=8,
            block_x=256,
        ),
        dict(
            kind=C["GPU_KERNEL"],
            correlation=8,
            start_ns=300,
            end_ns=400,
            name_id=1,
            stream=7,
            device=0,
            registers=32,
            grid_x=8,
            block_x=128,
            static_smem=16384,
            dynamic_smem=32768,
        ),
    ]
    raw = _gpuprof._test_aggregate([], [], gpu, 0, 1000, ["_Z4gemmv", "_Z4convv"], 1)
    return Results([raw], cuda={"active": True, "mode": "callbacks", "error": None}, meta=meta)


def test_kernels_array_carries_occupancy_through_the_c_aggregation():
    res = _results({"device_properties": [{"id": 0, "computeMajor": 9, "computeMinor": 0}]})
    k = res.kernels()
    by = {n: r for n, r in zip(k["name"], k, strict=True)}
    gemm, conv = by["gemm()"], by["conv()"]
    assert (float(gemm["occupancy"]), gemm["occupancy_limiter"], gemm["blocks_per_sm"]) == (
        0.5,
        "registers",
        4,
    )
    # shared_mem = static + dynamic = 48 KB -> 4 blocks -> 25%
    assert conv["shared_mem"] == 48 * 1024
    assert (float(conv["occupancy"]), conv["occupancy_limiter"]) == (0.25, "shared_mem")
    # accumulated windows keep the per-configuration fields instead of summing them
    from gpuprof.results._results import Results

    two = Results(res.windows * 2, cuda=res.cuda, meta=res.meta).kernels()
    assert sorted(two["occupancy"].tolist()) == [0.25, 0.5]
    assert sorted(two["calls"].tolist()) == [2, 2]


def test_kernel_table_shows_occupancy(capsys):
    # `gpuprof report --kernels` prints this table (LoadedProfile.kernel_table)
    from gpuprof.results.views import kernel_table

    print(kernel_table(_results({"device_properties": [H100]}).kernels(), row_limit=10))
    out = capsys.readouterr().out
    assert "Occ" in out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith(("gemm", "conv"))}
    assert "50%" in lines["gemm()"] and "25%" in lines["conv()"]


# ---------------------------------------------------------------------------------------------
# Kernel deep dive (gpuprof.deepdive): classification, aggregation, ncu parsing, and the
# CUPTI parameter structs against the real headers. No GPU needed.
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sm, dram, kw, bound",
    [
        # DRAM at 88% of peak, SM at 25%: a streaming copy
        (25.0, 88.0, {}, "memory-bound"),
        # SM at 85%, DRAM 20%: arithmetic-heavy
        (85.0, 20.0, {}, "compute-bound"),
        # a tensor-core GEMM: the SM figure alone is modest, the tensor pipes are busy
        (45.0, 30.0, {"tensor_pct": 92.0}, "compute-bound"),
        # both busy: the busier one decides (70 > 65)
        (65.0, 70.0, {}, "memory-bound"),
        (70.0, 65.0, {}, "compute-bound"),
        # a tie at/above 60% goes to compute
        (60.0, 60.0, {}, "compute-bound"),
        # just under the 60% threshold on both: nothing is saturated
        (59.9, 59.9, {}, "latency-bound"),
        # DRAM idle but L2/L1 at 75%: bandwidth-bound on chip
        (30.0, 20.0, {"memory_pct": 75.0}, "memory-bound"),
        # nothing busy
        (12.0, 8.0, {"memory_pct": 15.0, "achieved_occupancy_pct": 9.0}, "latency-bound"),
        # not measured
        (None, 50.0, {}, "unknown"),
        (float("nan"), 50.0, {}, "unknown"),
    ],
)
def test_classify_from_throughput_percentages(sm, dram, kw, bound):
    got, why = dd.classify(sm, dram, **kw)
    assert got == bound
    assert why


def test_classify_explains_with_the_figures():
    _, why = dd.classify(12.0, 8.0, achieved_occupancy_pct=9.0)
    assert "SM 12%" in why and "DRAM 8%" in why and "occupancy is only 9%" in why
    _, why = dd.classify(25.0, 88.0)
    assert "DRAM at 88%" in why
    _, why = dd.classify(30.0, 20.0, memory_pct=75.0)
    assert "on-chip" in why and "75%" in why


def test_aggregate_launches_weights_percentages_by_duration_and_sums_counts():
    launches = [
        {"duration_ns": 100.0, "sm_pct": 80.0, "dram_pct": 10.0, "dram_bytes": 1000.0},
        {"duration_ns": 300.0, "sm_pct": 40.0, "dram_pct": 50.0, "dram_bytes": 3000.0},
        {"duration_ns": 0.0, "sm_pct": 99.0},  # a zero-length launch weighs nothing
    ]
    m = dd.aggregate_launches(launches)
    # sm: (80*100 + 40*300 + 99*0) / 400 = 50; dram: (10*100 + 50*300) / 400 = 40
    assert m["sm_pct"] == pytest.approx(50.0) and m["dram_pct"] == pytest.approx(40.0)
    assert m["duration_ns"] == 400.0 and m["dram_bytes"] == 4000.0
    assert "l2_hit_pct" not in m
    assert dd.aggregate_launches([]) == {}


def test_derived_flops_and_bandwidth():
    # 1 ms; 1e9 FMA + 2e8 add + 1e8 mul FP32 = 2.3e9 FLOP -> 2.3e12 FLOP/s
    m = {"duration_ns": 1e6, "fp32_fma": 1e9, "fp32_add": 2e8, "fp32_mul": 1e8, "dram_bytes": 1e9}
    d = dd.derived(m)
    assert d["fp32_flops_per_s"] == pytest.approx(2.3e12)
    assert d["dram_bytes_per_s"] == pytest.approx(1e12)  # 1 GB in 1 ms
    assert d["flop_per_dram_byte"] == pytest.approx(2.3)
    assert "fp64_flops_per_s" not in d
    assert dd.derived({"fp32_fma": 1.0}) == {}  # no duration: nothing


def _csv(*rows):
    """ncu's CSV: every field quoted, one row per line."""
    return "".join(",".join(f'"{c}"' for c in r) + "\n" for r in rows)


SOL_SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
SOL_DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
HEAD = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream"]
NCU_WIDE = "==PROF== Connected to process 4242 (/usr/bin/python3)\n" + _csv(
    HEAD
    + ["Block Size", "Grid Size", SOL_DRAM, "gpu__time_duration.sum", SOL_SM, "dram__bytes.sum"],
    [""] * 9 + ["%", "usecond", "%", "Mbyte"],
    [
        "0",
        "4242",
        "python3",
        "127.0.0.1",
        "void copy_kernel<float>(float *, const float *, int)",
        "1",
        "7",
        "(256, 1, 1)",
        "(4096, 1, 1)",
        "88.5",
        "1,250.5",
        "21.25",
        "2,000",
    ],
    [
        "1",
        "4242",
        "python3",
        "127.0.0.1",
        "gemm_bf16_kernel",
        "1",
        "7",
        "(128, 1, 1)",
        "(528, 1, 1)",
        "12.0",
        "300",
        "n/a",
        "40",
    ],
)


def test_parse_ncu_raw_csv_with_units_and_separators():
    rows = dd.parse_ncu_csv(NCU_WIDE)
    assert [r["id"] for r in rows] == [0, 1]
    a, b = rows
    assert a["kernel"] == "void copy_kernel<float>(float *, const float *, int)"
    m = a["metrics"]
    assert m[SOL_DRAM] == 88.5
    assert m["gpu__time_duration.sum"] == pytest.approx(1250.5e3)  # usecond -> ns
    assert m["dram__bytes.sum"] == pytest.approx(2e9)  # Mbyte (SI) -> bytes
    assert b["metrics"][SOL_SM] is None
    with pytest.raises(ValueError, match="no ncu CSV header"):
        dd.parse_ncu_csv("==ERROR== no kernels were profiled\n")


def test_parse_ncu_long_csv():
    text = _csv(
        HEAD + ["Section Name", "Metric Name", "Metric Unit", "Metric Value"],
        ["0", "1", "p", "h", "k1", "1", "7", "Raw", "gpu__time_duration.sum", "msecond", "2.5"],
        ["0", "1", "p", "h", "k1", "1", "7", "Raw", SOL_SM, "%", "91.0"],
    )
    (row,) = dd.parse_ncu_csv(text)
    assert row["kernel"] == "k1"
    assert row["metrics"]["gpu__time_duration.sum"] == pytest.approx(2.5e6)
    assert row["metrics"][SOL_SM] == 91.0


def test_kernel_base_names_match_across_demanglers():
    assert (
        ddn.base_name(
            "void at::native::vectorized_elementwise_kernel<4, "
            "at::native::FillFunctor<float>, at::detail::Array<char*, 1> >"
            "(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)"
        )
        == "vectorized_elementwise_kernel"
    )
    assert (
        ddn.base_name("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64")
        == "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
    )
    assert ddn.base_name("copy(float*)") == "copy"
    k = [
        dd.KernelDeepDive(
            "copy_kernel<float>(float*, float const*, int)", 0, 10, 1, 1.0, float("nan"), ""
        )
    ]
    got = dd.match_ncu_rows(k, dd.parse_ncu_csv(NCU_WIDE))
    assert [r["id"] for r in got[k[0].name]] == [0]


def _synthetic_results(meta=None):
    return _results(meta if meta is not None else {"device_properties": [H100]})


def test_top_kernels_are_ordered_by_gpu_time():
    from gpuprof.results._results import Results

    gpu = [
        dict(
            kind=C["GPU_KERNEL"],
            correlation=c,
            start_ns=s,
            end_ns=e,
            name_id=n,
            stream=7,
            device=0,
            registers=32,
            grid_x=8,
            block_x=256,
        )
        for c, s, e, n in ((1, 0, 100, 0), (2, 100, 400, 1), (3, 400, 450, 0), (4, 450, 460, 2))
    ]
    raw = _gpuprof._test_aggregate([], [], gpu, 0, 1000, ["_Z1av", "_Z1bv", "_Z1cv"], 1)
    res = Results([raw], cuda={"active": True}, meta={"device_properties": [H100]})
    top = dd._top_kernels(res, 2)
    assert [k.name for k in top] == ["b()", "a()"]
    assert top[0].gpu_time_ns == 300 and top[1].calls == 2
    assert top[0].share == pytest.approx(300 / 460) and top[0].occupancy == 1.0


def test_deep_dive_argument_errors_name_the_argument():
    res = _synthetic_results()
    with pytest.raises(ValueError, match="top must be"):
        deep_dive(res, 0, replay=lambda: None)
    with pytest.raises(TypeError, match="replay must be a callable"):
        deep_dive(res, 1, replay=3)
    with pytest.raises(ValueError, match="pass replay="):
        deep_dive(res, 1)
    with pytest.raises(ValueError, match="backend must be"):
        deep_dive(res, 1, replay=lambda: None, backend="nsight")
    with pytest.raises(ValueError, match="backend='cupti'"):
        deep_dive(res, 1, command=["python", "x.py"], backend="cupti")
    with pytest.raises(ValueError, match="backend='ncu'"):
        deep_dive(res, 1, replay=lambda: None, backend="ncu")
    with pytest.raises(TypeError, match="command must be"):
        deep_dive(res, 1, command=[1, 2])
    with pytest.raises(ValueError, match="max_kernels"):
        deep_dive(res, 1, replay=lambda: None, max_kernels=0)


def test_deep_dive_without_counters_says_why_and_keeps_the_rest(monkeypatch):
    res = _synthetic_results()
    monkeypatch.setenv("PATH", "/nonexistent")
    calls = []
    rep = deep_dive(res, 5, replay=lambda: calls.append(1), command=["python", "x.py"])
    assert not rep.available and rep.backend == "none"
    assert "CUPTI:" in rep.reason and "ncu (Nsight Compute) is not on PATH" in rep.reason
    assert sorted(k.name for k in rep.kernels) == ["conv()", "gemm()"]
    assert all(k.bound == "unknown" for k in rep.kernels)
    text = str(rep)
    assert "no hardware metrics" in text and "gemm()" in text
    assert rep.to_dict()["kernels"][0]["occupancy"] is not None
    # the theoretical occupancy is there even without counters
    assert {k.occupancy_limiter for k in rep.kernels} == {"registers", "shared_mem"}
    # no kernels at all
    from gpuprof.results._results import Results

    raw = _gpuprof._test_aggregate([], [], [], 0, 1000, [], 1)
    empty = deep_dive(Results([raw]), 3, replay=lambda: None)
    assert not empty.available and "no GPU kernels" in empty.reason


def test_privileges_error_is_explained():
    e = ddc._CuptiFailure("cuptiRangeProfilerStart", 35, "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES")
    text = e.explain()
    assert "INSUFFICIENT_PRIVILEGES" in text and "NVreg_RestrictProfilingToAdminUsers=0" in text
    assert "SYS_ADMIN" in text
    assert "virtual GPU" in ddc._CuptiFailure("x", 40, "t").explain()
    assert "another profiler" in ddc._CuptiFailure("x", 26, "t").explain()


FAKE_NCU = r"""#!{python}
import os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_NCU_LOG"], "a") as f:
    f.write(" ".join(args) + "\n")
if "--query-metrics" in args:
    print("Device NVIDIA H100 (GH100)")
    print("Metric Name                     Metric Description")
    for m in ("dram__bytes", "dram__throughput", "gpu__time_duration", "sm__throughput",
              "sm__pipe_tensor_op_hmma_cycles_active", "sm__pipe_tensor_cycles_active"):
        print(m + "   some description")
    sys.exit(0)
if "--import" in args:
    sys.stdout.write(open(os.environ["FAKE_NCU_CSV"]).read())
    sys.exit(0)
if os.environ.get("FAKE_NCU_DENY"):
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA "
          "GPU Performance Counters on the target device 0.")
    sys.exit(1)
rep = args[args.index("--export") + 1]
open(rep + ".ncu-rep", "w").write("fake")
"""


def _fake_ncu(tmp_path, monkeypatch, csv_text):
    exe = tmp_path / "ncu"
    exe.write_text(FAKE_NCU.replace("{python}", sys.executable))
    exe.chmod(0o755)
    (tmp_path / "out.csv").write_text(csv_text)
    monkeypatch.setenv("FAKE_NCU_LOG", str(tmp_path / "log"))
    monkeypatch.setenv("FAKE_NCU_CSV", str(tmp_path / "out.csv"))
    return str(exe)


def test_ncu_backend_end_to_end_with_a_stand_in_ncu(tmp_path, monkeypatch):
    hmma = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
    gmma = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
    csv_text = _csv(
        HEAD + ["gpu__time_duration.sum", SOL_SM, SOL_DRAM, hmma, gmma],
        [""] * 7 + ["nsecond", "%", "%", "%", "%"],
        ["0", "1", "p", "h", "gemm", "1", "7", "1000", "50", "20", "10", "90"],
        ["1", "1", "p", "h", "gemm", "1", "7", "3000", "50", "20", "10", "90"],
        ["2", "1", "p", "h", "conv", "1", "7", "500", "15", "85", "0", "0"],
    )
    exe = _fake_ncu(tmp_path, monkeypatch, csv_text)
    rep = deep_dive(_synthetic_results(), 5, command=["python", "train.py"], ncu=exe)
    assert rep.available and rep.backend == "ncu", rep.reason
    by = {k.name: k for k in rep.kernels}
    gemm, conv = by["gemm()"], by["conv()"]
    assert gemm.launches_profiled == 2 and gemm.metrics["duration_ns"] == 4000
    assert gemm.metrics["tensor_pct"] == 90.0  # the larger of the two tensor metrics
    assert gemm.bound == "compute-bound"
    assert conv.bound == "memory-bound" and conv.metrics["dram_pct"] == 85.0
    log = (tmp_path / "log").read_text().splitlines()
    assert log[0] == "--query-metrics"
    profile_args = log[1].split()
    assert profile_args[profile_args.index("--clock-control") + 1] == "none"
    assert profile_args[-2:] == ["python", "train.py"]
    assert "regex:conv|gemm" in log[1]
    # only metrics this GPU knows are asked for (an unknown one fails the whole ncu run)
    asked = profile_args[profile_args.index("--metrics") + 1].split(",")
    assert "dram__throughput.avg.pct_of_peak_sustained_elapsed" in asked
    assert not any(m.startswith(("gpu__dram_throughput", "lts__")) for m in asked)
    assert "--import" in log[2] and "--page raw" in log[2]
    assert "compute-bound" in str(rep)


def test_ncu_without_permission_says_how_to_fix(tmp_path, monkeypatch):
    exe = _fake_ncu(tmp_path, monkeypatch, "")
    monkeypatch.setenv("FAKE_NCU_DENY", "1")
    rep = deep_dive(_synthetic_results(), 2, command="python train.py", ncu=exe)
    assert not rep.available
    assert "NVreg_RestrictProfilingToAdminUsers=0" in rep.reason


def test_profile_deep_dive_refuses_while_recording():
    import gpuprof

    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        with pytest.raises(RuntimeError, match="still running"):
            prof.deep_dive(1, replay=lambda: None)


def _cupti_include():
    for d in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        inc = os.path.join(d, "include") if d else ""
        if inc and os.path.isfile(os.path.join(inc, "cupti_range_profiler.h")):
            return inc
    return None


@pytest.mark.skipif(
    _cupti_include() is None or shutil.which("g++") is None,
    reason="needs g++ and the CUPTI 12.6+ headers (cupti_profiler_host.h is C++)",
)
def test_ctypes_parameter_structs_match_the_cupti_headers(tmp_path):
    # Every struct deep_dive hands to CUPTI, field by field, against offsetof() and the
    # headers' *_STRUCT_SIZE macros; and the enum values it uses.
    lines = [
        "#include <cstdio>",
        "#include <cstddef>",
        "#include <cuda.h>",
        "#include <cupti_target.h>",
        "#include <cupti_profiler_target.h>",
        "#include <cupti_profiler_host.h>",
        "#include <cupti_range_profiler.h>",
        "int main() {",
    ]
    for key, cls in ddc.CUPTI_PARAMS.items():
        c = cls.__name__
        lines.append(f'printf("{key} size %zu\\n", (size_t){c}_STRUCT_SIZE);')
        for f, _ in cls._fields_:
            lines.append(f'printf("{key} {f} %zu\\n", offsetof({c}, {f}));')
    lines.append('printf("enum AutoRange %d\\n", (int)CUPTI_AutoRange);')
    lines.append('printf("enum KernelReplay %d\\n", (int)CUPTI_KernelReplay);')
    lines.append('printf("enum RangeProfiler %d\\n", (int)CUPTI_PROFILER_TYPE_RANGE_PROFILER);')
    lines.append('printf("enum RangeProfiling %d\\n", (int)CUPTI_PROFILER_RANGE_PROFILING);')
    lines.append('printf("enum Supported %d\\n", (int)CUPTI_PROFILER_CONFIGURATION_SUPPORTED);')
    lines.append("return 0; }")
    src = tmp_path / "probe.cpp"
    src.write_text("\n".join(lines))
    exe = tmp_path / "probe"
    subprocess.run(["g++", "-I", _cupti_include(), str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    enums = {
        "AutoRange": ddc.CUPTI_AUTO_RANGE,
        "KernelReplay": ddc.CUPTI_KERNEL_REPLAY,
        "RangeProfiler": ddc.CUPTI_PROFILER_TYPE_RANGE_PROFILER,
        "RangeProfiling": ddc.CUPTI_PROFILER_RANGE_PROFILING,
        "Supported": ddc.SUPPORT_SUPPORTED,
    }
    checked = 0
    for line in out.splitlines():
        key, f, value = line.split()
        if key == "enum":
            assert enums[f] == int(value), f
            continue
        cls = ddc.CUPTI_PARAMS[key]
        mine = cls.size if f == "size" else getattr(cls, f).offset
        assert mine == int(value), (key, f)
        checked += 1
    assert checked > 100


def _loaded_cupti():
    import gpuprof

    st = gpuprof.cuda_status()
    if not st["loaded"] or not st["library"]:
        return None
    try:
        return ddc._Cupti(st["library"], driver=False)
    except (OSError, RuntimeError):
        return None  # a libcupti older than CUDA 12.6: no range profiler


@pytest.mark.skipif(_loaded_cupti() is None, reason="needs libcupti 12.6+ (no GPU needed)")
@pytest.mark.parametrize("chip", ["GV100", "TU102", "GA100", "GA102", "AD102", "GH100", "GB100"])
def test_every_metric_exists_on_every_chip_and_schedules(chip):
    # CUPTI's host API works without a GPU: the metric names deep_dive asks for are
    # checked against each chip, and a config image (what the GPU would run) is built.
    api = _loaded_cupti()
    host = api.call(
        "cuptiProfilerHostInitialize",
        profilerType=ddc.CUPTI_PROFILER_TYPE_RANGE_PROFILER,
        pChipName=chip.encode(),
    ).pHostObject
    try:
        names, chosen = ddc._supported_metrics(api, host)
        assert set(chosen) == {s.field for s in dd.METRICS}, chip
        size, config = ddc._config_image(api, host, names)
        passes = api.call(
            "cuptiProfilerHostGetNumOfPasses", configImageSize=size, pConfigImage=config
        ).numOfPasses
        assert size > 0 and 1 <= passes <= 40
    finally:
        api.call("cuptiProfilerHostDeinitialize", pHostObject=host)


_OCC_PROBE = r"""
#include <cstdio>
#include <cuda_occupancy.h>
int main() {
    int major, minor, tpsm, tpb, regsm, regb, block, regs;
    long smb, smsm, optin, reserved, smem;
    while (scanf("%d %d %d %d %d %d %ld %ld %ld %ld %d %d %ld", &major, &minor, &tpsm, &tpb,
                 &regsm, &regb, &smb, &smsm, &optin, &reserved, &block, &regs, &smem) == 13) {
        cudaOccDeviceProp p;
        p.computeMajor = major; p.computeMinor = minor; p.maxThreadsPerMultiprocessor = tpsm;
        p.maxThreadsPerBlock = tpb; p.regsPerMultiprocessor = regsm; p.regsPerBlock = regb;
        p.warpSize = 32; p.sharedMemPerBlock = smb; p.sharedMemPerMultiprocessor = smsm;
        p.sharedMemPerBlockOptin = optin; p.reservedSharedMemPerBlock = reserved; p.numSms = 1;
        cudaOccFuncAttributes a;
        a.maxThreadsPerBlock = 1 << 30; a.numRegs = regs; a.sharedSizeBytes = smem;
        a.partitionedGCConfig = PARTITIONED_GC_OFF; a.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN;
        a.maxDynamicSharedSizeBytes = 0; a.numBlockBarriers = 0; a.virtualResourceCount = 0;
        cudaOccDeviceState s;
        cudaOccResult r;
        int e = (int)cudaOccMaxActiveBlocksPerMultiprocessor(&r, &p, &a, &s, block, 0);
        printf("%d %d\n", e, e ? 0 : r.activeBlocksPerMultiprocessor);
    }
    return 0;
}
"""


def _occupancy_header():
    inc = _cupti_include()
    return inc if inc and os.path.isfile(os.path.join(inc, "cuda_occupancy.h")) else None


@pytest.mark.skipif(
    _occupancy_header() is None or shutil.which("g++") is None,
    reason="needs g++ and the CUDA toolkit's cuda_occupancy.h",
)
def test_blocks_per_sm_agree_with_nvidias_occupancy_calculator(tmp_path):
    # NVIDIA's header-only calculator (what cudaOccupancyMaxActiveBlocksPerMultiprocessor
    # computes), fed each table entry and a sweep of launch shapes: every answer must match.
    src = tmp_path / "occ.cpp"
    src.write_text(_OCC_PROBE)
    exe = tmp_path / "occ"
    subprocess.run(["g++", "-I", _occupancy_header(), str(src), "-o", str(exe)], check=True)
    cases, lines = [], []
    for cc, d in ARCH_LIMITS.items():
        for block in (1, 32, 33, 96, 128, 192, 256, 288, 384, 512, 640, 768, 800, 1024):
            for regs in (0, 16, 32, 40, 56, 64, 70, 80, 96, 128, 168, 232, 255):
                for smem in (
                    0,
                    1000,
                    10000,
                    32768,
                    48 * 1024,
                    65536,
                    100000,
                    101376,
                    166912,
                    200000,
                    232448,
                    232449,
                ):
                    cases.append((cc, block, regs, smem))
                    lines.append(
                        f"{cc[0]} {cc[1]} {d.max_threads_per_sm} "
                        f"{d.max_threads_per_block} {d.regs_per_sm} {d.regs_per_block} "
                        f"{d.shared_mem_per_block} {d.shared_mem_per_sm} "
                        f"{d.shared_mem_per_block_optin} "
                        f"{d.reserved_shared_mem_per_block} {block} {regs} {smem}"
                    )
    out = subprocess.run(
        [str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True
    ).stdout.split()
    theirs = [int(b) for b in out[1::2]]
    assert len(theirs) == len(cases)
    bad = [
        (c, t, theoretical_occupancy(c[1], c[2], c[3], c[0]).blocks_per_sm)
        for c, t in zip(cases, theirs, strict=True)
        if theoretical_occupancy(c[1], c[2], c[3], c[0]).blocks_per_sm != t
    ]
    assert not bad, bad[:10]
