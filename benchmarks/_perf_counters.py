"""User-mode instructions and cycles of the calling thread, read from the kernel's
performance counters (perf_event_open), for benchmarks that want to tell added work
(instructions) from slower work (cycles per instruction) on a noisy machine.

    counters = ThreadCounters.open()   # None where the machine exposes no counters
    before = counters.read()           # (instructions, cycles)

Only this thread is counted, only in user mode (what perf_event_paranoid=2 allows),
so CUPTI's and the driver's own threads are not in the figures.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

_SYSCALL = {"x86_64": 298, "aarch64": 241}
_PERF_TYPE_HARDWARE = 0
_CPU_CYCLES = 0
_INSTRUCTIONS = 1
_EXCLUDE_KERNEL = 1 << 5
_EXCLUDE_HV = 1 << 6
_ATTR_SIZE = 128  # PERF_ATTR_SIZE_VER7


def _open_counter(config: int) -> int:
    nr = _SYSCALL.get(platform.machine())
    if nr is None:
        return -1
    # type, size, config, sample_period, sample_type, read_format, flag bits; rest zero
    head = struct.pack(
        "=IIQQQQQ",
        _PERF_TYPE_HARDWARE,
        _ATTR_SIZE,
        config,
        0,
        0,
        0,
        _EXCLUDE_KERNEL | _EXCLUDE_HV,
    )
    attr = ctypes.create_string_buffer(head + bytes(_ATTR_SIZE - len(head)), _ATTR_SIZE)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    # pid 0, cpu -1: this thread on any CPU; no group; no flags
    return int(libc.syscall(nr, attr, 0, -1, -1, 0))


class ThreadCounters:
    def __init__(self, fds: list[int]):
        self._fds = fds

    @classmethod
    def open(cls) -> ThreadCounters | None:
        fds = [_open_counter(c) for c in (_INSTRUCTIONS, _CPU_CYCLES)]
        if min(fds) < 0:
            for fd in fds:
                if fd >= 0:
                    os.close(fd)
            return None
        return cls(fds)

    def read(self) -> tuple[int, int]:
        """(instructions, cycles) counted so far on this thread in user mode."""
        ins, cyc = (struct.unpack("=Q", os.read(fd, 8))[0] for fd in self._fds)
        return ins, cyc

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []
