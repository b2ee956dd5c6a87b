"""The ``gpuprof.profile`` context manager, ``record_function`` and activities."""

from __future__ import annotations

import enum
import functools
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable

from . import (  # docs/nvtx.md, docs/subprocesses.md
    _cuda,
    _gpuprof,
    _monitoring,
    _nvtx,
    _progress,
    _subprocess,
)
from . import memory as _memory  # imported here: start() must not import while hooked
from . import processes as _processes  # -- subprocesses --
from ._accessors import ResultAccessors
from ._results import Results
from .schedule import Schedule

__all__ = ["ProfilerActivity", "profile", "record_function"]


class ProfilerActivity(enum.Enum):
    """What to capture: Python/C calls on the host (CPU) and GPU activity (CUDA)."""

    CPU = "cpu"
    CUDA = "cuda"


def _foreign_profiler() -> str | None:
    """Name another profiler hooked into this thread, or None."""
    current = sys.getprofile()
    if current is not None and not isinstance(current, _gpuprof.Profiler):
        return f"sys.setprofile is already set to {current!r}"
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:
        tool = monitoring.get_tool(monitoring.PROFILER_ID)
        if tool is not None and tool != "gpuprof":  # ours: the C core says "already running"
            return f"sys.monitoring's profiler slot is held by {tool!r}"
    return None


class profile(ResultAccessors):
    """Profile the Python calls and GPU work of a block of code.

    ``with gpuprof.profile(schedule=gpuprof.schedule(wait=1, warmup=1, active=3)) as prof:``
    then call ``prof.step()`` once per training step. Results of the last
    recorded window are read with ``prof.key_averages().table()``,
    ``prof.ops()``, ``prof.kernels()``, ``prof.steps()`` and friends.

    Args:
        activities: ProfilerActivity values; default CPU, plus CUDA when GPU
            capture is usable here (see ``gpuprof.cuda_status()``).
        schedule: a :func:`gpuprof.schedule` or any callable step -> ProfilerAction;
            None records everything between start and stop.
        on_trace_ready: callable(prof) run when a window closes at RECORD_AND_SAVE.
        profile_memory: record device memory allocations and frees.
        with_stack: keep call stacks for grouping by stack and flame graphs (the
            call tree is always kept; accepted for torch.profiler compatibility).
        record_shapes: accepted for torch.profiler compatibility (no effect).
        acc_events: accumulate the results of every window instead of keeping the last.
        max_events: CPU event budget of one window (16 bytes each); past it events
            are dropped and counted. The memory stays with the process for the next
            windows and sessions (docs/schedule.md, "Memory stays bounded").
        memory_sample_interval_s: with profile_memory, how often host RSS and the
            framework allocators (PyTorch, CuPy) are sampled, in seconds.
        subprocesses: also profile child processes started while profiling (forked,
            spawned or forkserver: DataLoader workers, multiprocessing pools); see
            ``prof.processes()``, ``prof.ops(pid=...)`` and docs/subprocesses.md.
        capture: record only inside a capture range, as Nsight Systems' --capture-range:
            "cudaProfilerApi" between cudaProfilerStart() and cudaProfilerStop()
            (``torch.cuda.profiler.start()/stop()``), or "nvtx:NAME" ("nvtx:NAME@DOMAIN")
            inside NVTX ranges named NAME. Each range is one window; not combined with
            ``schedule``. See docs/nvtx.md.
    """

    def __init__(
        self,
        *,
        activities: Iterable[ProfilerActivity] | None = None,
        schedule: Callable[[int], object] | None = None,
        on_trace_ready: Callable[[profile], object] | None = None,
        profile_memory: bool = False,
        with_stack: bool = False,
        record_shapes: bool = False,
        acc_events: bool = False,
        max_events: int = 8_000_000,
        memory_sample_interval_s: float = 0.01,
        subprocesses: bool = False,
        capture: str | None = None,
    ):
        if activities is None:
            acts = {ProfilerActivity.CPU}
            if _cuda.gpu_present() and _cuda.ensure_cupti()[0]:
                acts.add(ProfilerActivity.CUDA)
            self._explicit_cuda = False
        else:
            if isinstance(activities, (str, ProfilerActivity)) or not isinstance(activities,
                                                                                 Iterable):
                raise TypeError("profile(): activities must be a list of ProfilerActivity, "
                                f"got {activities!r}")
            acts = set()
            for a in activities:
                if not isinstance(a, ProfilerActivity):
                    if type(a).__name__ == "ProfilerActivity" and a.name in ("CPU", "CUDA"):
                        a = ProfilerActivity[a.name]  # torch.profiler.ProfilerActivity
                    else:
                        raise TypeError("profile(): activities must contain ProfilerActivity.CPU"
                                        f" or ProfilerActivity.CUDA, got {a!r}")
                acts.add(a)
            self._explicit_cuda = ProfilerActivity.CUDA in acts
        if schedule is not None and not callable(schedule):
            raise TypeError(f"profile(): schedule must be gpuprof.schedule(...) or a callable, "
                            f"got {schedule!r}")
        if on_trace_ready is not None and not callable(on_trace_ready):
            raise TypeError(f"profile(): on_trace_ready must be callable, got {on_trace_ready!r}")
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"profile(): max_events must be a positive int, got {max_events!r}")
        for name, flag in (("profile_memory", profile_memory), ("with_stack", with_stack),
                           ("record_shapes", record_shapes), ("acc_events", acc_events),
                           ("subprocesses", subprocesses)):
            if not isinstance(flag, bool):
                raise TypeError(f"profile(): {name} must be a bool, got {flag!r}")
        self.activities = acts
        self.schedule = schedule
        self.on_trace_ready = on_trace_ready
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.record_shapes = record_shapes
        self.acc_events = acc_events
        self.max_events = max_events
        # -- memory curves (gpuprof.memory) --
        self.memory_sample_interval_s = _memory.validate_interval(memory_sample_interval_s)
        self._memory_sampler = None
        # -- end memory curves --
        self._windows: list[dict] = []
        self._cuda_state: dict = {"active": False, "mode": "off", "error": None}
        cuda = ProfilerActivity.CUDA in acts
        if cuda:
            ok, reason = _cuda.ensure_cupti()
            if not ok:
                if self._explicit_cuda:
                    warnings.warn(f"gpuprof: GPU capture is off: {reason}", stacklevel=2)
                self._cuda_state["error"] = reason
                cuda = False
        # -- capture ranges (gpuprof._nvtx, docs/nvtx.md) --
        capture_mode, capture_name, capture_domain = _nvtx.parse_capture(capture)
        if capture_mode and schedule is not None:
            raise ValueError("profile(): capture= and schedule= cannot be combined: the capture "
                             "range decides when to record; drop one of them")
        if capture_mode == _nvtx.CAPTURE_PROFILER_API and not cuda:
            raise RuntimeError("profile(capture='cudaProfilerApi') needs GPU capture, which is "
                               f"off: {self._cuda_state['error'] or 'CUDA not in activities'}")
        self.capture = capture
        # -- end capture ranges --
        self._monitoring = _monitoring.use_monitoring()
        self._core = _gpuprof.Profiler(
            monitoring=self._monitoring,
            max_events=max_events,
            cuda=cuda,
            memory=profile_memory,
            schedule=schedule.as_tuple() if isinstance(schedule, Schedule) else None,
            schedule_fn=None if isinstance(schedule, Schedule) else schedule,
            on_trace_ready=self._window_ready,
            owner=None,
            capture=capture_mode,
            capture_name=capture_name,
            capture_domain=capture_domain,
        )
        # prof.step() is the C method itself: no Python frame of ours per step.
        self.step = self._core.step
        # -- subprocesses (gpuprof._subprocess): children follow the schedule --
        self.subprocesses = subprocesses
        self._subprocs = _subprocess.ParentSession(self) if subprocesses else None
        if subprocesses:
            self.step = self._step_and_tell_children
        # -- end subprocesses --

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> None:
        """Start profiling (the hook goes on every thread). Raises RuntimeError if
        another profiler is active."""
        other = _foreign_profiler()
        if other:
            raise RuntimeError(f"gpuprof.profile.start(): another profiler is active ({other}); "
                               "stop it first, gpuprof will not silently replace it")
        self._windows = []
        # -- subprocesses: folder, state file and fork/spawn hooks before the hook goes on --
        if self._subprocs is not None:
            self._subprocs.begin()
        # -- end subprocesses --
        if self._monitoring:
            _monitoring.install()  # interpreter-wide: threads need nothing more
        else:
            threading.setprofile(_gpuprof._thread_bootstrap)
        try:
            self._core.start()
        except BaseException:
            self._unhook()
            if self._subprocs is not None:  # -- subprocesses --
                self._subprocs.end()
            raise
        if self._subprocs is not None:  # -- subprocesses: children record when we do --
            self._subprocs.started()
        if self.capture and self.capture.startswith("nvtx:"):  # -- capture ranges --
            nvtx = _nvtx.status()
            if nvtx["reason"]:
                warnings.warn(f"gpuprof: profile(capture={self.capture!r}) may never record: "
                              f"{nvtx['reason']}", stacklevel=2)
        cuda = self._core.cuda
        self._cuda_state = {"active": cuda["active"], "mode": cuda["mode"],
                            "error": cuda["error"] or self._cuda_state.get("error")}
        if self._explicit_cuda and cuda["error"]:
            warnings.warn(f"gpuprof: GPU capture is off: {cuda['error']}", stacklevel=2)
        # -- memory curves (gpuprof.memory): host RSS and allocator sampler --
        if self.profile_memory:
            if self._memory_sampler is not None:
                self._memory_sampler.stop()
            self._memory_sampler = _memory.start_sampler(self.memory_sample_interval_s,
                                                         owner=self)
        # -- end memory curves --

    def stop(self) -> None:
        """Stop profiling; a window still recording is closed and aggregated."""
        try:
            # -- memory curves: the sampler stops first, its samples stay readable --
            if self._memory_sampler is not None:
                self._memory_sampler.stop()
            # -- end memory curves --
            if self._subprocs is not None:  # -- subprocesses: the last window, no next one --
                self._subprocs.stopping = True
            # Only C calls until the window is closed: Python code here would be recorded.
            events = self._core.buffer_stats()["events"]
            t0 = time.perf_counter()
            self._core.stop()
            _progress.done("closed the recorded window", events, time.perf_counter() - t0)
        finally:
            self._unhook()
            if self._subprocs is not None:  # -- subprocesses: children stop, folder removed --
                self._subprocs.end()

    def _unhook(self) -> None:
        if self._monitoring:
            _monitoring.uninstall()
        else:
            threading.setprofile(None)

    def __enter__(self) -> profile:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._core.running:
            return
        try:
            self.stop()
        except Exception:
            if exc_type is None:
                raise
            # the user's exception propagates; ours would hide it

    def _window_ready(self, _core) -> None:
        self._collect()
        if self._subprocs is not None:  # -- subprocesses: collect the children's window --
            self._subprocs.window_ended(self._core.result)
        if self.on_trace_ready is not None:
            self.on_trace_ready(self)

    def _collect(self) -> None:
        raw = self._core.result
        if raw is None or (self._windows and self._windows[-1] is raw):
            return
        if self.acc_events:
            self._windows.append(raw)
        else:
            self._windows = [raw]

    # -- state ---------------------------------------------------------------
    @property
    def step_num(self) -> int:
        """Steps completed since start (prof.step() calls)."""
        return self._core.step_num

    @property
    def running(self) -> bool:
        return self._core.running

    @property
    def results(self) -> Results:
        """The recorded window(s) as a :class:`gpuprof.Results`."""
        self._collect()
        res = Results(self._windows, cuda=self._cuda_state,
                      meta={"profile_memory": self.profile_memory, "with_stack": self.with_stack})
        # -- subprocesses: res.subprocesses, one gpuprof.processes.ProcessData per child --
        if self._subprocs is not None:
            res.subprocesses = _processes.group_children(
                self._subprocs.children_of(self._windows))
        # -- end subprocesses --
        return res

    @property
    def dropped_events(self) -> int:
        """CPU events dropped because the buffer was full, in the kept windows."""
        return self.results.dropped_events

    def buffer_stats(self) -> dict:
        """Bytes and events held by the event buffers right now."""
        return self._core.buffer_stats()

    # -- results ---------------------------------------------------------------
    # -- memory (gpuprof.memory, docs/memory.md) ------------------------------------------
    def _memory_check(self, what: str) -> None:
        if not self.profile_memory:
            raise RuntimeError(f"{what}: memory was not recorded; use "
                               "gpuprof.profile(profile_memory=True)")

    def memory_curve(self, device: str = "cuda:0", source: str = "auto"):
        """Memory over time of one device, as a NumPy structured array.

        Args:
            device: "cuda:N" (or "cuda" for "cuda:0") for device memory: fields
                timestamp_ns, allocated_bytes, reserved_bytes; "cpu" for the host:
                timestamp_ns, rss_bytes. Timestamps are on the profiler clock.
            source: for a CUDA device, "auto" (the framework allocator when one was
                sampled, else CUPTI), "cupti" (device allocations CUPTI recorded,
                relative to the window start), "torch" or "cupy" (sampled allocator).

        Raises:
            ValueError: a device or source not of the forms above.
            RuntimeError: the profile was made without profile_memory=True.
        """
        _memory.parse_device(device)
        _memory.parse_source(source)
        self._memory_check("memory_curve()")
        return _memory.memory_curve(self.results, device, sampler=self._memory_sampler,
                                   source=source)

    def memory_summary(self):
        """Peak memory per device and on the host, the op and line that reached it, the
        largest allocations, and allocator overhead (a :class:`gpuprof.memory.MemorySummary`:
        ``print()`` it, ``.to_dict()``)."""
        self._memory_check("memory_summary()")
        return _memory.memory_summary(self.results, sampler=self._memory_sampler)

    def plot_memory(self, path_or_ax=None):
        """Plot the memory curves with matplotlib (``pip install matplotlib``).

        Args:
            path_or_ax: None returns a new matplotlib Figure; a file path saves the
                figure there (format from the extension) and returns it; a matplotlib
                Axes is drawn into and returned.
        """
        self._memory_check("plot_memory()")
        return _memory.plot_memory(self.results, path_or_ax, sampler=self._memory_sampler)

    # -- kernel deep dive (gpuprof.deepdive, docs/kernels.md) ------------------------------
    def deep_dive(self, top: int = 5, replay=None, *, command=None, backend: str = "auto",
                  max_kernels: int = 20000, timeout_s: float | None = 1800.0, ncu=None):
        """Hardware metrics (SM and DRAM throughput as % of peak, achieved occupancy,
        L1/L2 hit rates, tensor-pipe use, FLOP/s) and a compute-, memory- or
        latency-bound verdict for the ``top`` kernels with the most GPU time.

        The kernels are measured on a replay of the work after recording:
        ``replay`` is a callable that runs the same work again (one step); it runs
        twice, outside any recorded window, so recorded timings are never
        perturbed. Or ``command`` runs a program under Nsight Compute. See
        :func:`gpuprof.deepdive.deep_dive` for every argument and docs/kernels.md.

        Returns:
            A :class:`gpuprof.deepdive.DeepDiveReport` (``print()`` it). When the
            counters cannot be read, its ``reason`` says why and how to fix it.

        Raises:
            RuntimeError: the profiler is still running (call it after the with block).
            ValueError, TypeError: bad arguments.
        """
        if self.running:
            raise RuntimeError("deep_dive(): the profiler is still running; call it after "
                               "prof.stop() (after the with block), so that replaying kernels "
                               "cannot perturb a recorded window")
        from .deepdive import deep_dive

        return deep_dive(self.results, top, replay, command=command, backend=backend,
                         max_kernels=max_kernels, timeout_s=timeout_s, ncu=ncu)

    # -- subprocesses (gpuprof.processes, docs/subprocesses.md) ---------------------------
    def _step_and_tell_children(self) -> None:
        """prof.step() with subprocesses=True: the C step, then the children learn
        whether the parent records."""
        self._subprocs.before_step()
        self._core.step()
        self._subprocs.sync()

    def processes(self):
        """One row per profiled process of the kept window(s), the main process first:
        pid, ppid, role ("main"/"worker"), name, start_method, status ("ok", "exited",
        "lost", "timeout"), windows, events, dropped, recorded_ns, cpu_self_ns
        (see :data:`gpuprof.processes.PROCESSES_DTYPE` and docs/subprocesses.md)."""
        return _processes.processes_array(self.results)
    # -- end subprocesses --


class record_function:
    """Label a region: ``with record_function("forward"):`` or ``@record_function("load")``.

    The label appears as its own op in tables and as a user annotation in traces.
    Costs nothing measurable when no profiler is recording.
    """

    __slots__ = ("name", "_token")

    def __init__(self, name: str, args: str | None = None):
        if not isinstance(name, str):
            raise TypeError(f"record_function(): name must be a str, got {type(name).__name__}")
        if args is not None and not isinstance(args, str):
            raise TypeError(f"record_function(): args must be a str or None, got {args!r}")
        self.name = name
        self._token = 0

    def __enter__(self) -> record_function:
        self._token = _gpuprof.range_push(self.name)
        return self

    def __exit__(self, *exc) -> None:
        token, self._token = self._token, 0
        _gpuprof.range_pop(token)

    def __call__(self, fn: Callable) -> Callable:
        name = self.name

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            token = _gpuprof.range_push(name)
            try:
                return fn(*args, **kwargs)
            finally:
                _gpuprof.range_pop(token)

        return wrapper
