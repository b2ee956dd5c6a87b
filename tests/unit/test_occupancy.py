"""Theoretical occupancy against hand-worked examples (no GPU needed).

Every case writes its arithmetic out. Shorthand: W = warps per block,
R = registers allocated per warp (regs/thread x 32, rounded up to 256),
S = shared memory allocated per block (static + dynamic + reserve, rounded up
to the allocation unit). sm_90: 64K registers (16384 per sub-partition, 4
sub-partitions), 64 warps (2048 threads), 32 blocks, 228 KB = 233472 bytes
shared per SM, 1 KB reserved per block, 128-byte unit.
"""

import math

import numpy as np
import pytest
from gpuprof import _gpuprof
from gpuprof.occupancy import (
    ARCH_LIMITS,
    annotate_kernels,
    arch_limits,
    device_limits,
    estimated_achieved_occupancy,
    theoretical_occupancy,
)

# The properties an H100 SXM reports through device_props() (CUDA attribute names).
H100 = {"id": 0, "name": "NVIDIA H100", "computeMajor": 9, "computeMinor": 0,
        "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536,
        "regsPerMultiprocessor": 65536, "warpSize": 32, "sharedMemPerBlock": 49152,
        "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472,
        "maxBlocksPerMultiprocessor": 32, "numSms": 132, "totalGlobalMem": 80 << 30}


def occ(block, regs, smem, dev="sm_90"):
    return theoretical_occupancy(block, regs, smem, dev)


def test_sm90_table_matches_the_documented_limits():
    d = arch_limits("sm_90")
    assert d.regs_per_sm == 65536 and d.max_warps_per_sm == 64 and d.max_blocks_per_sm == 32
    assert d.shared_mem_per_sm == 228 * 1024 and d.shared_mem_per_block_optin == 227 * 1024
    assert d.reserved_shared_mem_per_block == 1024 and d.shared_mem_alloc_unit == 128
    assert d.reg_alloc_unit == 256
    # the live properties of an H100 and the table agree
    assert device_limits(H100) == device_limits({**{k: 0 for k in H100}, "computeMajor": 9,
                                                 "computeMinor": 0, "numSms": 132})


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
    assert (o.shared_mem_per_block, o.blocks_per_sm, o.occupancy, o.limiter) == \
        (50176, 4, 0.25, "shared_mem")


def test_shared_memory_rounds_up_to_128_bytes_with_the_1kb_reserve():
    # 256 threads (W = 8), 32 regs, 100000 bytes smem.
    # 100000 + 1024 = 101024 -> ceil(101024 / 128) = 790 -> S = 101120
    # shared: floor(233472 / 101120) = 2 blocks -> 16 warps -> 25%
    o = occ(256, 32, 100000)
    assert (o.shared_mem_per_block, o.blocks_per_sm, o.occupancy, o.limiter) == \
        (101120, 2, 0.25, "shared_mem")


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
    assert estimated_achieved_occupancy((8, 1, 1), 256, 32, 0, H100) == \
        pytest.approx(8 / 132 * 256 / 2048)
    # a large grid reaches the theoretical limit: min(8, 10000/132) * 256 / 2048 = 100%
    assert estimated_achieved_occupancy(10000, 256, 32, 0, H100) == 1.0
    with pytest.raises(ValueError, match="num_sms"):
        estimated_achieved_occupancy(10, 256, 32, 0, "sm_90")


def test_annotate_kernel_rows_with_and_without_properties():
    from gpuprof._results import KERNELS_DTYPE

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
    from gpuprof._results import Results

    gpu = [dict(kind=C["GPU_KERNEL"], correlation=7, start_ns=200, end_ns=300, name_id=0,
                stream=7, device=0, registers=64, grid_x=8, block_x=256),
           dict(kind=C["GPU_KERNEL"], correlation=8, start_ns=300, end_ns=400, name_id=1,
                stream=7, device=0, registers=32, grid_x=8, block_x=128, static_smem=16384,
                dynamic_smem=32768)]
    raw = _gpuprof._test_aggregate([], [], gpu, 0, 1000, ["_Z4gemmv", "_Z4convv"], 1)
    return Results([raw], cuda={"active": True, "mode": "callbacks", "error": None}, meta=meta)


def test_kernels_array_carries_occupancy_through_the_c_aggregation():
    res = _results({"device_properties": [{"id": 0, "computeMajor": 9, "computeMinor": 0}]})
    k = res.kernels()
    by = {n: r for n, r in zip(k["name"], k, strict=True)}
    gemm, conv = by["gemm()"], by["conv()"]
    assert (float(gemm["occupancy"]), gemm["occupancy_limiter"], gemm["blocks_per_sm"]) == \
        (0.5, "registers", 4)
    # shared_mem = static + dynamic = 48 KB -> 4 blocks -> 25%
    assert conv["shared_mem"] == 48 * 1024
    assert (float(conv["occupancy"]), conv["occupancy_limiter"]) == (0.25, "shared_mem")
    # accumulated windows keep the per-configuration fields instead of summing them
    from gpuprof._results import Results

    two = Results(res.windows * 2, cuda=res.cuda, meta=res.meta).kernels()
    assert sorted(two["occupancy"].tolist()) == [0.25, 0.5]
    assert sorted(two["calls"].tolist()) == [2, 2]


def test_kernel_table_shows_occupancy(capsys):
    from gpuprof.cli import _print_kernels

    _print_kernels(_results({"device_properties": [H100]}).kernels(), 10)
    out = capsys.readouterr().out
    assert "Occ" in out and "Limited by" in out
    assert " 50% registers" in out and " 25% shared_mem" in out
    _print_kernels(_results({"device_properties": []}).kernels(), 10)
    assert capsys.readouterr().out.rstrip().endswith("compute     -")
