"""The memory sampler thread: host RSS and framework allocators, every few milliseconds.

While ``gpuprof.profile(profile_memory=True)`` runs, one background thread
reads the process's resident set size (``/proc/self/statm``) and polls the
framework allocator adapters (``_allocators.py``) every
``memory_sample_interval_s``. Timestamps are on the profiler clock
(``_gpuprof.clock_ns()``, CLOCK_MONOTONIC), so the samples line up with ops,
spans and GPU records.

Invisible to the profile: the profile hook runs on every thread, and the
C core hides every code object whose file lies in the gpuprof package
(and C calls made directly from those frames). So this module runs only its
own frames on the thread:

- the thread is started with ``_thread.start_new_thread``, not
  ``threading.Thread``, whose bootstrap frames live in threading.py and
  would be recorded as the user's ops;
- it waits on a ``_thread`` lock (``acquire(timeout=...)``, a C call), not
  ``threading.Event.wait`` (Python code in threading.py);
- adapters call only C functions of their framework (``_allocators.py``).

Memory is bounded: each series keeps its newest ``SAMPLE_CAPACITY`` rows
(about 87 minutes at 10 ms); older rows are overwritten and counted in
``dropped``.
"""

from __future__ import annotations

import _thread
import array
import os
import sys
import weakref

import numpy as np

try:
    import resource
except ImportError:  # not on Windows
    resource = None

from .. import _gpuprof

__all__ = ["HOST_DTYPE", "SAMPLE_CAPACITY", "HostSampler", "SampleSnapshot", "Series"]

SAMPLE_CAPACITY = 1 << 19
HOST_DTYPE = np.dtype([("timestamp_ns", "i8"), ("rss_bytes", "i8")])

_STOP_WAIT_S = 5.0


class Series:
    """Rows of int64 columns, the newest ``capacity`` kept (a ring once full).

    Not locked: the owner serializes ``append`` and ``array`` (HostSampler.lock).
    """

    __slots__ = ("ncols", "capacity", "data", "pos", "dropped")

    def __init__(self, ncols: int, capacity: int = SAMPLE_CAPACITY):
        self.ncols = ncols
        self.capacity = capacity
        self.data = array.array("q")
        self.pos = 0  # next row to overwrite once full
        self.dropped = 0

    def append(self, row: tuple) -> None:
        if len(self.data) < self.capacity * self.ncols:
            self.data.extend(row)
            return
        base = self.pos * self.ncols
        self.data[base : base + self.ncols] = array.array("q", row)
        self.pos = (self.pos + 1) % self.capacity
        self.dropped += 1

    def array(self, dtype: np.dtype) -> np.ndarray:
        """The rows in time order as a structured array of int64 fields."""
        flat = np.frombuffer(self.data, dtype=np.int64).reshape(-1, self.ncols)
        if self.pos:
            flat = np.concatenate([flat[self.pos :], flat[: self.pos]])
        out = np.zeros(len(flat), dtype=dtype)
        for i, name in enumerate(dtype.names[: self.ncols]):
            out[name] = flat[:, i]
        return out


class _RssReader:
    """Current RSS in bytes: /proc/self/statm, else getrusage's high-water mark."""

    def __init__(self):
        self.fd = -1
        self.page = 4096
        self.source = "getrusage"
        try:
            self.page = os.sysconf("SC_PAGE_SIZE")
            self.fd = os.open("/proc/self/statm", os.O_RDONLY)
            self.source = "statm"
        except (OSError, ValueError, AttributeError):
            self.fd = -1
        # ru_maxrss is in KiB on Linux and bytes on macOS.
        self.maxrss_unit = 1 if sys.platform == "darwin" else 1024

    def read(self) -> int:
        if self.fd >= 0:
            # statm: size resident shared text lib data dt, in pages
            return int(os.pread(self.fd, 128, 0).split()[1]) * self.page
        if resource is None:
            raise OSError("no /proc/self/statm and no resource module to read RSS")
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * self.maxrss_unit

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class HostSampler:
    """Samples host RSS and allocator adapters on a background thread.

    ``start()`` takes one sample on the calling thread and starts the thread;
    ``stop()`` stops and waits for it, then takes a last sample. The thread
    also ends by itself when ``owner`` (weakly referenced) is collected.
    """

    def __init__(self, interval_s: float, adapters=(), owner=None, capacity: int = SAMPLE_CAPACITY):
        self.interval_s = float(interval_s)
        self.adapters = list(adapters)
        self.lock = _thread.allocate_lock()
        self.host = Series(2, capacity)
        self.dropped_adapters: list = []  # disabled after an error; their samples stay
        self.errors: list[str] = []
        self._owner = weakref.ref(owner) if owner is not None else None
        self._rss: _RssReader | None = None
        self._stop = _thread.allocate_lock()  # held while the thread should run
        self._done = _thread.allocate_lock()  # held while the thread runs
        self._running = False
        self._thread_id: int | None = None

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        if self._running:
            return
        self._rss = _RssReader()
        for ad in list(self.adapters):
            try:
                ad.start()
            except Exception as e:  # a framework's oddity must not stop the profile
                self._drop_adapter(ad, "start", e)
        self.sample()
        self._stop.acquire()
        self._done.acquire()
        try:
            self._thread_id = _thread.start_new_thread(self._run, ())
        except BaseException:
            self._stop.release()
            self._done.release()
            raise
        self._running = True

    def stop(self) -> None:
        """Stop the thread and wait for it (idempotent)."""
        if not self._running:
            return
        self._running = False
        self._stop.release()
        if self._done.acquire(timeout=_STOP_WAIT_S):
            self._done.release()
        else:
            self.errors.append(f"memory sampler thread did not stop within {_STOP_WAIT_S:.0f} s")
        self.sample()
        for ad in list(self.adapters):
            try:
                ad.stop()
            except Exception as e:
                self._drop_adapter(ad, "stop", e)
        self._rss.close()

    @property
    def alive(self) -> bool:
        """True while the sampler thread runs."""
        return self._done.locked()

    @property
    def rss_source(self) -> str:
        return self._rss.source if self._rss is not None else "statm"

    # -- sampling ----------------------------------------------------------------
    def sample(self) -> None:
        """Take one host sample and poll every adapter (any thread)."""
        with self.lock:
            ts = _gpuprof.clock_ns()
            try:
                self.host.append((ts, self._rss.read()))
            except (OSError, ValueError, IndexError) as e:
                self.errors.append(f"reading RSS failed: {e!r}")
                self._rss.close()
            for ad in list(self.adapters):
                try:
                    ad.poll(ts)
                except Exception as e:
                    self._drop_adapter(ad, "poll", e)

    def _run(self) -> None:
        _gpuprof._ignore_current_thread()  # sys.monitoring sees every thread: not this one
        try:
            for ad in list(self.adapters):
                try:
                    ad.thread_init()
                except Exception as e:
                    self._drop_adapter(ad, "thread_init", e)
            owner = self._owner
            while not self._stop.acquire(True, self.interval_s):
                if owner is not None and owner() is None:
                    break
                self.sample()
            else:
                self._stop.release()
        except BaseException as e:  # never let the thread print into the user's output
            self.errors.append(f"memory sampler thread failed: {e!r}")
        finally:
            self._done.release()

    def _drop_adapter(self, ad, what: str, exc: BaseException) -> None:
        if ad in self.adapters:
            self.adapters.remove(ad)
            self.dropped_adapters.append(ad)
        msg = f"{ad.name} allocator adapter disabled: {what}() raised {exc!r}"
        ad.error = msg
        self.errors.append(msg)

    # -- results -------------------------------------------------------------------
    def host_samples(self) -> np.ndarray:
        """Every kept host sample as HOST_DTYPE rows, oldest first."""
        with self.lock:
            return self.host.array(HOST_DTYPE)

    @property
    def dropped(self) -> int:
        """Host samples overwritten because the series was full."""
        return self.host.dropped


class _KeptAdapter:
    """An allocator adapter's samples, kept: what ``memory.py`` reads of an adapter."""

    def __init__(self, name: str, samples: dict[int, np.ndarray], error: str | None = None):
        self.name = name
        self._samples = samples
        self.error = error

    def samples(self) -> dict[int, np.ndarray]:
        return dict(self._samples)


class SampleSnapshot:
    """What a :class:`HostSampler` recorded, frozen: the samples of a saved profile.

    It answers what ``memory.py`` asks of a live sampler (``lock``, ``adapters``,
    ``dropped_adapters``, ``host_samples()``, ``rss_source``, ``interval_s``,
    ``dropped``, ``errors``), so a loaded profile's memory curves and summary are
    computed by the same code as a live one's.

    Args:
        host: HOST_DTYPE rows.
        allocators: adapter name -> {device index -> allocator rows}.
    """

    def __init__(
        self,
        host: np.ndarray,
        allocators: dict[str, dict[int, np.ndarray]],
        *,
        rss_source: str = "statm",
        interval_s: float = 0.0,
        dropped: int = 0,
        errors: list[str] | None = None,
    ):
        self.lock = _thread.allocate_lock()
        self._host = host
        self.adapters = [_KeptAdapter(name, s) for name, s in allocators.items()]
        self.dropped_adapters: list = []
        self.rss_source = rss_source
        self.interval_s = float(interval_s)
        self.dropped = int(dropped)
        self.errors = list(errors or [])

    @classmethod
    def of(cls, sampler, keep) -> SampleSnapshot:
        """The samples of ``sampler`` (a HostSampler or a snapshot) whose timestamp
        ``keep(timestamps)`` (a boolean mask) keeps."""
        host = sampler.host_samples()
        with sampler.lock:
            adapters = list(sampler.adapters) + list(sampler.dropped_adapters)
            per = {ad.name: ad.samples() for ad in adapters}
        allocators = {
            name: {d: rows[keep(rows["timestamp_ns"])] for d, rows in s.items()}
            for name, s in per.items()
        }
        return cls(
            host[keep(host["timestamp_ns"])],
            allocators,
            rss_source=sampler.rss_source,
            interval_s=sampler.interval_s,
            dropped=sampler.dropped,
            errors=sampler.errors,
        )

    def host_samples(self) -> np.ndarray:
        return self._host

    def allocators(self) -> dict[str, dict[int, np.ndarray]]:
        """Adapter name -> {device index -> allocator rows}."""
        return {ad.name: ad.samples() for ad in self.adapters}
