"""Framework allocator adapters: what PyTorch's or CuPy's caching allocator holds, over time.

CUPTI sees the driver's allocations (``cudaMalloc``), which for a caching
allocator is *reserved* memory; what tensors actually use (*allocated*) is
known only to the framework. An adapter asks the framework while a profile
records. Adapters are chosen at ``profile.start()`` among those whose
framework is already imported: gpuprof never imports torch or cupy itself.

Writing an adapter (JAX: ``device.memory_stats()``'s ``bytes_in_use`` /
``bytes_reserved``; others alike):

- subclass :class:`AllocatorAdapter`, set ``name``, implement ``available()``
  (look in ``sys.modules``, never import) and ``poll(ts_ns)``, which calls
  ``self.record(device, ts_ns, allocated, reserved)``;
- ``poll`` runs on the memory sampler thread, and on the profiling thread
  once at start and stop. It must call only C functions of the framework
  (pybind11/Cython/builtin methods), never a Python-level function: gpuprof
  hides its own frames from the profile, not the framework's, which would
  show up as ops of the user's program;
- append the class to ``ADAPTERS``.

An adapter that collects events at the end instead (e.g. from PyTorch's
``torch.cuda.memory._snapshot()``) does its work in ``stop()`` and records
the same rows. None does today: the snapshot's timestamps need a conversion
to the profiler clock that has not been verified on a GPU, so the PyTorch
adapter samples.
"""

from __future__ import annotations

import sys

import numpy as np

from ._host_sampler import SAMPLE_CAPACITY, Series

__all__ = [
    "ADAPTERS",
    "ALLOCATOR_DTYPE",
    "AllocatorAdapter",
    "CupyAdapter",
    "TorchAdapter",
    "active_adapters",
]

ALLOCATOR_DTYPE = np.dtype(
    [
        ("timestamp_ns", "i8"),
        ("allocated_bytes", "i8"),
        ("reserved_bytes", "i8"),
        ("peak_allocated_bytes", "i8"),
    ]
)


class AllocatorAdapter:
    """One framework's allocator, sampled (``poll``) or traced (``stop``).

    Attributes:
        name: short framework name, the ``source`` of ``prof.memory_curve``.
        error: why the adapter was disabled (set by the sampler), else None.
    """

    name = "allocator"

    def __init__(self, capacity: int = SAMPLE_CAPACITY):
        self._capacity = capacity
        self._series: dict[int, Series] = {}
        self.error: str | None = None

    @classmethod
    def available(cls) -> bool:
        """True when the framework is imported and exposes what the adapter reads."""
        return False

    def start(self) -> None:
        """Called on the profiling thread when profiling starts."""

    def thread_init(self) -> None:
        """Called first thing on the sampler thread (per-thread framework state)."""

    def poll(self, ts_ns: int) -> None:
        """Record one sample per device at ``ts_ns`` (profiler clock)."""

    def stop(self) -> None:
        """Called when profiling stops, after the last poll."""

    def record(
        self, device: int, ts_ns: int, allocated: int, reserved: int, peak_allocated: int = -1
    ) -> None:
        """Append a row; ``peak_allocated`` is the framework's running maximum, -1 unknown."""
        s = self._series.get(device)
        if s is None:
            s = self._series[device] = Series(4, self._capacity)
        s.append((ts_ns, allocated, reserved, peak_allocated))

    def samples(self) -> dict[int, np.ndarray]:
        """Device index -> ALLOCATOR_DTYPE rows, oldest first."""
        return {d: s.array(ALLOCATOR_DTYPE) for d, s in sorted(self._series.items())}

    def dropped(self) -> int:
        return sum(s.dropped for s in self._series.values())


class TorchAdapter(AllocatorAdapter):
    """PyTorch's CUDA caching allocator: ``memory_allocated`` / ``memory_reserved``.

    Reads ``torch._C._cuda_memoryStats(device)`` (the C function behind
    ``torch.cuda.memory_stats``; the Python wrappers would be recorded as the
    user's ops), only once CUDA is initialized (``torch.cuda._initialized``),
    so profiling never initializes CUDA. The device current at start and
    every device whose allocator holds memory are read every poll; the others
    are re-checked every ``RESCAN`` polls (one ``memoryStats`` call builds a
    dict of ~100 entries, tens of microseconds with the GIL held).
    With a non-native allocator backend (``cudaMallocAsync``) only the device
    current at start is read, as reading another may create a context there.
    """

    name = "torch"
    RESCAN = 50

    @classmethod
    def available(cls) -> bool:
        torch = sys.modules.get("torch")
        c = getattr(torch, "_C", None)
        return (
            c is not None
            and hasattr(c, "_cuda_memoryStats")
            and hasattr(c, "_cuda_getDeviceCount")
            and hasattr(torch, "cuda")
        )

    def start(self) -> None:
        torch = sys.modules["torch"]
        self._cuda = torch.cuda
        self._stats = torch._C._cuda_memoryStats
        self._count = torch._C._cuda_getDeviceCount
        self._backend = getattr(torch._C, "_cuda_getAllocatorBackend", None)
        self._get_device = getattr(torch._C, "_cuda_getDevice", None)
        self._devices: list[int] | None = None
        self._active: set[int] = set()
        self._tick = 0
        self._start_device = None
        if getattr(self._cuda, "_initialized", False) and self._get_device is not None:
            # the profiling thread's device: read every poll from the start, even while
            # it holds nothing, so its first allocations are not missed
            self._start_device = int(self._get_device())
            self._active.add(self._start_device)

    def _device_list(self) -> list[int]:
        if self._devices is None:
            backend = self._backend() if self._backend is not None else "native"
            if backend == "native":
                self._devices = list(range(int(self._count())))
            else:
                self._devices = [self._start_device or 0]
        return self._devices

    def poll(self, ts_ns: int) -> None:
        if not getattr(self._cuda, "_initialized", False):
            return
        rescan = self._tick % self.RESCAN == 0
        self._tick += 1
        for d in self._device_list():
            if d not in self._active and not rescan:
                continue
            st = self._stats(d)
            alloc = st["allocated_bytes"]["all"]
            reserved = int(st["reserved_bytes"]["all"]["current"])
            if d not in self._active:
                if reserved == 0 and alloc["peak"] == 0:
                    continue
                self._active.add(d)
            self.record(d, ts_ns, int(alloc["current"]), reserved, int(alloc["peak"]))


class CupyAdapter(AllocatorAdapter):
    """CuPy's default memory pool: ``used_bytes()`` / ``total_bytes()``.

    The pool answers for the calling thread's current device, so the
    sampler thread selects the device that was current when profiling
    started (``cupy.cuda.runtime.setDevice``, only when it is not 0). Only
    that device is sampled. Allocations through another allocator
    (``cupy.cuda.set_allocator``) are not seen here, but CUPTI sees them.
    """

    name = "cupy"

    @classmethod
    def available(cls) -> bool:
        cupy = sys.modules.get("cupy")
        return cupy is not None and getattr(cupy, "_default_memory_pool", None) is not None

    def start(self) -> None:
        cupy = sys.modules["cupy"]
        self._pool = cupy._default_memory_pool  # what get_default_memory_pool() returns
        self._runtime = cupy.cuda.runtime
        self._device = int(self._runtime.getDevice())

    def thread_init(self) -> None:
        if self._device != 0:
            self._runtime.setDevice(self._device)

    def poll(self, ts_ns: int) -> None:
        self.record(
            self._device, ts_ns, int(self._pool.used_bytes()), int(self._pool.total_bytes())
        )


ADAPTERS: list[type[AllocatorAdapter]] = [TorchAdapter, CupyAdapter]


def active_adapters() -> list[AllocatorAdapter]:
    """New instances of every adapter whose framework is imported (none is imported here)."""
    return [cls() for cls in ADAPTERS if cls.available()]
