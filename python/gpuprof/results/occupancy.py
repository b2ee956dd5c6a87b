"""Theoretical occupancy of a kernel launch, from the launch and the device alone.

Occupancy is the fraction of an SM's warp slots that a kernel can keep
resident: ``active warps per SM / max warps per SM``. A block stays on one SM
until it finishes, so the SM holds as many blocks as the scarcest of its
resources allows. Each resource gives a limit in blocks per SM:

``registers``
    Registers are allocated per warp: ``registers per thread x 32``, rounded
    up to the register allocation unit (256 registers). The register file is
    split evenly across the SM's 4 sub-partitions (SMSPs) and a warp lives in
    one of them, so the number of warps that fit is
    ``4 x floor((registers per SM / 4) / registers per warp)``; divided by the
    warps of a block (rounded down) it gives blocks. A block whose registers
    do not fit the per-block register limit cannot launch at all: the hardware
    checks ``registers per warp x (warps per block rounded up to a multiple
    of 4)`` against ``regsPerBlock``.
``shared_mem``
    Shared memory per block is static + dynamic (the ``shared_mem`` field)
    plus the 1 KB the driver reserves for each block on compute capability
    8.0 and newer (0 on 7.x), rounded up to the shared-memory allocation unit
    (128 bytes on 8.x and newer, 256 bytes on 7.x). The SM's shared memory
    (``sharedMemPerMultiprocessor``: the largest carveout, which is what the
    driver picks when a kernel needs it) divided by that gives blocks. A block
    needing more than ``sharedMemPerBlockOptin`` (+ the reserve) cannot launch.
``warps``
    ``floor(max warps per SM / warps per block)``, warps per block being
    ``ceil(threads per block / 32)``: warp slots are allocated whole.
``blocks_per_sm``
    The hardware's cap on resident blocks (``maxBlocksPerMultiprocessor``).

Active blocks per SM = the smallest of the four; active warps = active blocks
x warps per block. The limiter named is the binding limit, with two
refinements so that it says what to change:

- ``"warps"``: the warp-slot limit binds and every slot is used (100%
  occupancy; nothing limits it).
- ``"block_size"``: the warp-slot limit binds but slots stay empty because the
  block's warps do not divide the SM's slots (e.g. 1024 threads on a 48-warp
  SM: one block, 32 of 48 slots), or the block is larger than the device
  allows (``maxThreadsPerBlock``): occupancy 0.
- When several limits bind equally, the one that no saving of registers or
  shared memory can lift is named: the warp limit (``block_size``), then
  ``blocks_per_sm``, then ``registers``, then ``shared_mem``.

This follows the rules of NVIDIA's occupancy calculator (``cuda_occupancy.h``,
the CUDA Occupancy Calculator), except that partitioned global caching
(Maxwell/Pascal) and barrier and cluster limits are not modelled; gpuprof
targets compute capability 7.0 and newer.

Device properties come from ``gpuprof._gpuprof.device_props()`` (CUDA
attribute names: ``computeMajor``, ``regsPerMultiprocessor``, ...); missing or
zero entries are filled from :data:`ARCH_LIMITS`, keyed by compute capability.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field

import numpy as np

__all__ = [
    "ARCH_LIMITS",
    "LIMITERS",
    "DeviceLimits",
    "Occupancy",
    "device_limits",
    "estimated_achieved_occupancy",
    "theoretical_occupancy",
]

LIMITERS = ("registers", "shared_mem", "block_size", "blocks_per_sm", "warps")

REG_ALLOC_UNIT = 256  # registers, per warp, every architecture from 3.0 on
SUBPARTITIONS = 4  # SMSPs per SM (and the warp allocation granularity of
# the per-block register check), 7.0 and newer
MAX_REGS_PER_THREAD = 255  # what ptxas can assign; 7.0 and newer


@dataclass(frozen=True)
class DeviceLimits:
    """What one device offers a kernel, in the units of the CUDA attributes."""

    compute_capability: tuple[int, int]
    max_threads_per_sm: int  # maxThreadsPerMultiprocessor
    max_blocks_per_sm: int  # maxBlocksPerMultiprocessor
    regs_per_sm: int  # regsPerMultiprocessor
    regs_per_block: int  # regsPerBlock
    max_threads_per_block: int  # maxThreadsPerBlock
    shared_mem_per_sm: int  # sharedMemPerMultiprocessor (largest carveout)
    shared_mem_per_block: int  # sharedMemPerBlock (without opt-in)
    shared_mem_per_block_optin: int  # sharedMemPerBlockOptin
    reserved_shared_mem_per_block: int  # the driver's per-block reserve
    shared_mem_alloc_unit: int  # bytes
    warp_size: int = 32
    reg_alloc_unit: int = REG_ALLOC_UNIT
    num_sms: int = 0  # numSms; 0 when unknown

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // self.warp_size


def _arch(cc, threads_sm, blocks_sm, smem_sm, smem_optin, reserved, smem_unit):
    return DeviceLimits(
        compute_capability=cc,
        max_threads_per_sm=threads_sm,
        max_blocks_per_sm=blocks_sm,
        regs_per_sm=65536,
        regs_per_block=65536,
        max_threads_per_block=1024,
        shared_mem_per_sm=smem_sm,
        shared_mem_per_block=48 * 1024,
        shared_mem_per_block_optin=smem_optin,
        reserved_shared_mem_per_block=reserved,
        shared_mem_alloc_unit=smem_unit,
    )


KB = 1024
#: Per-architecture limits (CUDA C Programming Guide, "Technical Specifications
#: per Compute Capability", and cuda_occupancy.h), keyed by compute capability.
#: Every entry: 64K 32-bit registers per SM and per block, 255 registers per
#: thread, 1024 threads per block, 48 KB shared memory per block without opt-in.
ARCH_LIMITS: dict[tuple[int, int], DeviceLimits] = {
    #            cc      threads/SM blocks/SM smem/SM   opt-in/block reserve unit
    (7, 0): _arch((7, 0), 2048, 32, 96 * KB, 96 * KB, 0, 256),  # V100
    (7, 5): _arch((7, 5), 1024, 16, 64 * KB, 64 * KB, 0, 256),  # T4, RTX 20
    (8, 0): _arch((8, 0), 2048, 32, 164 * KB, 163 * KB, KB, 128),  # A100
    (8, 6): _arch((8, 6), 1536, 16, 100 * KB, 99 * KB, KB, 128),  # A10, RTX 30
    (8, 7): _arch((8, 7), 1536, 16, 164 * KB, 163 * KB, KB, 128),  # Jetson Orin
    (8, 9): _arch((8, 9), 1536, 24, 100 * KB, 99 * KB, KB, 128),  # L4, L40, RTX 40
    (9, 0): _arch((9, 0), 2048, 32, 228 * KB, 227 * KB, KB, 128),  # H100, H200
    (10, 0): _arch((10, 0), 2048, 32, 228 * KB, 227 * KB, KB, 128),  # B200
    (12, 0): _arch((12, 0), 1536, 24, 100 * KB, 99 * KB, KB, 128),  # RTX 50
}

# device_props() key -> DeviceLimits field
_PROP_KEYS = {
    "maxThreadsPerMultiprocessor": "max_threads_per_sm",
    "maxBlocksPerMultiprocessor": "max_blocks_per_sm",
    "regsPerMultiprocessor": "regs_per_sm",
    "regsPerBlock": "regs_per_block",
    "maxThreadsPerBlock": "max_threads_per_block",
    "sharedMemPerMultiprocessor": "shared_mem_per_sm",
    "sharedMemPerBlock": "shared_mem_per_block",
    "sharedMemPerBlockOptin": "shared_mem_per_block_optin",
    "reservedSharedMemPerBlock": "reserved_shared_mem_per_block",
    "warpSize": "warp_size",
    "numSms": "num_sms",
}


def _parse_cc(cc) -> tuple[int, int]:
    """(major, minor) from (9, 0), "9.0", "sm_90", "90" or 90."""
    if isinstance(cc, tuple) and len(cc) == 2 and all(isinstance(x, int) for x in cc):
        return cc
    if isinstance(cc, bool):
        raise TypeError(f"compute_capability must be like (9, 0), '9.0' or 'sm_90', got {cc!r}")
    if isinstance(cc, int) and cc >= 10:
        return divmod(cc, 10)  # 90 -> (9, 0), 100 -> (10, 0)
    if isinstance(cc, str):
        s = cc.strip().lower().removeprefix("sm_").removeprefix("sm").removeprefix("compute_")
        s = s.rstrip("af")  # sm_90a, sm_100f: same resources
        if "." in s:
            major, _, minor = s.partition(".")
            if major.isdigit() and minor.isdigit():
                return int(major), int(minor)
        elif s.isdigit() and len(s) >= 2:
            return int(s[:-1]), int(s[-1])
    raise ValueError(f"compute_capability must be like (9, 0), '9.0' or 'sm_90', got {cc!r}")


def arch_limits(cc) -> DeviceLimits:
    """The table entry for a compute capability: the exact one, else the newest
    entry of the same major version that is not newer (8.8 -> 8.7).

    Raises:
        ValueError: no entry for that major version (compute capability before
            7.0, or a major version newer than the table).
    """
    major, minor = _parse_cc(cc)
    if (major, minor) in ARCH_LIMITS:
        return ARCH_LIMITS[(major, minor)]
    same = sorted(k for k in ARCH_LIMITS if k[0] == major and k[1] <= minor)
    if not same:
        known = ", ".join(f"sm_{a}{b}" for a, b in ARCH_LIMITS)
        raise ValueError(
            f"compute capability {major}.{minor} is not in gpuprof's occupancy "
            f"table ({known}); pass the device's properties instead"
        )
    return ARCH_LIMITS[same[-1]]


def device_limits(device) -> DeviceLimits:
    """DeviceLimits from a device_props() dict, a compute capability or a DeviceLimits.

    A dict needs ``computeMajor``/``computeMinor``; every other entry it lacks
    (or reports as 0) comes from the architecture table.

    Raises:
        ValueError: no compute capability, or one the table does not know while
            the dict lacks entries that would be needed.
    """
    if isinstance(device, DeviceLimits):
        return device
    if not isinstance(device, dict):
        return arch_limits(device)
    if "computeMajor" not in device:
        raise ValueError(
            "device properties need 'computeMajor' and 'computeMinor' (as from "
            f"gpuprof._gpuprof.device_props()), got keys {sorted(device)}"
        )
    cc = (int(device["computeMajor"]), int(device.get("computeMinor", 0)))
    given = {f: int(device[k]) for k, f in _PROP_KEYS.items() if int(device.get(k) or 0) > 0}
    try:
        base = arch_limits(cc)
    except ValueError:
        base = None
    values = dict(base.__dict__) if base is not None else {}
    values.update(given)
    values["compute_capability"] = cc
    if "reserved_shared_mem_per_block" not in given and base is None:
        values["reserved_shared_mem_per_block"] = KB if cc[0] >= 8 else 0
    if "shared_mem_alloc_unit" not in values:
        values["shared_mem_alloc_unit"] = 128 if cc[0] >= 8 else 256
    missing = [
        f
        for f, spec in DeviceLimits.__dataclass_fields__.items()
        if f not in values and spec.default is MISSING
    ]
    if missing:
        raise ValueError(
            f"compute capability {cc[0]}.{cc[1]} is not in gpuprof's occupancy "
            f"table and the device properties lack {', '.join(missing)}"
        )
    return DeviceLimits(**values)


@dataclass(frozen=True)
class Occupancy:
    """Theoretical occupancy of one launch configuration on one device."""

    occupancy: float  # active warps / max warps per SM, 0..1
    limiter: str  # one of LIMITERS
    blocks_per_sm: int  # active (resident) blocks per SM
    warps_per_sm: int  # active warps per SM
    max_warps_per_sm: int
    warps_per_block: int
    regs_per_warp: int  # allocated (rounded up to the allocation unit)
    shared_mem_per_block: int  # allocated bytes (with the reserve, rounded up)
    limits: dict[str, int] = field(default_factory=dict)  # blocks per SM by each resource


def _check_count(name: str, value, lo: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"theoretical_occupancy(): {name} must be an int >= {lo}, got {value!r}")
    return int(value)


def _threads(block) -> int:
    if isinstance(block, (int, np.integer)) and not isinstance(block, bool):
        return _check_count("block", block, 1)
    if isinstance(block, (str, bytes, bool)):
        raise ValueError(
            f"theoretical_occupancy(): block must be a thread count or (x, y, z), got {block!r}"
        )
    try:
        dims = [int(d) for d in block]
    except TypeError:
        raise ValueError(
            f"theoretical_occupancy(): block must be a thread count or (x, y, z), got {block!r}"
        ) from None
    if not 1 <= len(dims) <= 3 or any(d < 0 for d in dims) or not any(dims):
        raise ValueError(
            f"theoretical_occupancy(): block must be a thread count or (x, y, z) "
            f"of non-negative sizes, got {block!r}"
        )
    return math.prod(d if d else 1 for d in dims)


def theoretical_occupancy(block, registers: int, shared_mem: int, device) -> Occupancy:
    """Theoretical occupancy of a kernel launch (see the module docstring for the rules).

    Args:
        block: threads per block, or the block's (x, y, z).
        registers: registers per thread (0..255).
        shared_mem: static + dynamic shared memory per block, in bytes.
        device: a dict from ``gpuprof._gpuprof.device_props()``, a compute
            capability ((9, 0), "9.0", "sm_90") or a :class:`DeviceLimits`.

    Raises:
        ValueError: a negative or non-integer argument, more than 255 registers,
            or a device gpuprof cannot describe.
    """
    dev = device_limits(device)
    threads = _threads(block)
    registers = _check_count("registers", registers)
    shared_mem = _check_count("shared_mem", shared_mem)
    if registers > MAX_REGS_PER_THREAD:
        raise ValueError(
            f"theoretical_occupancy(): registers must be at most "
            f"{MAX_REGS_PER_THREAD} per thread, got {registers}"
        )
    warp = dev.warp_size
    warps_per_block = -(-threads // warp)
    max_warps = dev.max_warps_per_sm

    # warp slots
    if threads > dev.max_threads_per_block:
        warp_limit = 0
    else:
        warp_limit = max_warps // warps_per_block

    # registers: per warp, rounded up to the allocation unit, per sub-partition
    regs_per_warp = -(-registers * warp // dev.reg_alloc_unit) * dev.reg_alloc_unit
    if regs_per_warp == 0:
        reg_limit = 1 << 30
    else:
        assumed = regs_per_warp * (-(-warps_per_block // SUBPARTITIONS) * SUBPARTITIONS)
        if assumed > dev.regs_per_block:
            reg_limit = 0
        else:
            warps_per_sub = (dev.regs_per_sm // SUBPARTITIONS) // regs_per_warp
            reg_limit = warps_per_sub * SUBPARTITIONS // warps_per_block

    # shared memory: static + dynamic + the driver's reserve, rounded up
    unit = dev.shared_mem_alloc_unit
    smem = -(-(shared_mem + dev.reserved_shared_mem_per_block) // unit) * unit
    per_block_cap = max(dev.shared_mem_per_block_optin, dev.shared_mem_per_block)
    if smem > per_block_cap + dev.reserved_shared_mem_per_block:
        smem_limit = 0
    elif smem == 0:
        smem_limit = 1 << 30
    else:
        smem_limit = dev.shared_mem_per_sm // smem

    limits = {
        "registers": reg_limit,
        "shared_mem": smem_limit,
        "blocks_per_sm": dev.max_blocks_per_sm,
        "warps": warp_limit,
    }
    blocks = min(limits.values())
    active_warps = blocks * warps_per_block
    occ = active_warps / max_warps if max_warps else 0.0
    if warp_limit == 0 and threads > dev.max_threads_per_block:
        limiter = "block_size"
    elif blocks == warp_limit and active_warps == max_warps:
        limiter = "warps"
    else:
        limiter = next(
            k for k in ("warps", "blocks_per_sm", "registers", "shared_mem") if limits[k] == blocks
        )
        if limiter == "warps":
            limiter = "block_size"  # slots left over: the block size does not divide them
    return Occupancy(
        occupancy=occ,
        limiter=limiter,
        blocks_per_sm=blocks,
        warps_per_sm=active_warps,
        max_warps_per_sm=max_warps,
        warps_per_block=warps_per_block,
        regs_per_warp=regs_per_warp,
        shared_mem_per_block=smem,
        limits={k: min(v, 1 << 30) for k, v in limits.items()},
    )


def estimated_achieved_occupancy(
    grid, block, registers: int, shared_mem: int, device, num_sms: int | None = None
) -> float:
    """Occupancy a launch can reach given its grid, as a fraction (Kineto's
    "est. achieved occupancy %" / 100): resident blocks per SM are the smaller of
    the theoretical limit and ``grid blocks / SMs`` (a small grid cannot fill the
    GPU), times threads per block, over max threads per SM.

    Args:
        grid: the grid's (x, y, z) or block count.
        num_sms: the device's SM count; default ``numSms`` of ``device``.

    Raises:
        ValueError: as :func:`theoretical_occupancy`, or no SM count known.
    """
    dev = device_limits(device)
    sms = num_sms if num_sms is not None else dev.num_sms
    if not sms or sms < 1:
        raise ValueError(
            "estimated_achieved_occupancy(): num_sms is unknown; pass num_sms= or "
            "device properties with numSms"
        )
    occ = theoretical_occupancy(block, registers, shared_mem, dev)
    blocks = _threads(grid) / sms
    resident = min(float(occ.blocks_per_sm), blocks)
    return resident * _threads(block) / dev.max_threads_per_sm


# -- kernels() rows ------------------------------------------------------------------------

_live_props: list[dict] | None = None


def live_device_props() -> list[dict]:
    """``_gpuprof.device_props()``, asked once per process (the properties are static)."""
    global _live_props
    if _live_props is None:
        from .. import _gpuprof

        _live_props = list(_gpuprof.device_props())
    return _live_props


def annotate_kernels(rows: np.ndarray, device_props) -> None:
    """Fill ``occupancy``, ``occupancy_limiter`` and ``blocks_per_sm`` of kernel rows
    in place. Rows without a block (copies, sets) or on a device without
    properties get NaN, "" and 0.

    Args:
        device_props: a list of device_props() dicts, or a callable returning one
            (called only when some row has a block, so that a run without
            kernels never initializes CUDA).
    """
    if len(rows) == 0:
        return
    rows["occupancy"] = np.nan
    rows["occupancy_limiter"] = ""
    rows["blocks_per_sm"] = 0
    if not rows["block"].any():
        return
    if callable(device_props):
        device_props = device_props()
    by_id: dict[int, DeviceLimits | None] = {}
    for i, p in enumerate(device_props or ()):
        try:
            by_id[int(p.get("id", i))] = device_limits(p)
        except (ValueError, TypeError):
            by_id[int(p.get("id", i))] = None
    cache: dict[tuple, Occupancy | None] = {}
    for i in range(len(rows)):
        dev = by_id.get(int(rows["device"][i]))
        block = tuple(int(b) for b in rows["block"][i])
        if dev is None or not any(block):
            continue
        key = (int(rows["device"][i]), block, int(rows["registers"][i]), int(rows["shared_mem"][i]))
        if key not in cache:
            try:
                cache[key] = theoretical_occupancy(block, key[2], key[3], dev)
            except ValueError:
                cache[key] = None
        occ = cache[key]
        if occ is None:
            continue
        rows["occupancy"][i] = occ.occupancy
        rows["occupancy_limiter"][i] = occ.limiter
        rows["blocks_per_sm"][i] = occ.blocks_per_sm
