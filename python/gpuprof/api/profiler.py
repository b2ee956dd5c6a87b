"""The ``gpuprof.profile`` context manager, ``record_function`` and activities."""

from __future__ import annotations

import enum
import functools
import json
import numbers
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from types import FrameType, TracebackType
from typing import Any, ParamSpec, TypeVar

import numpy as np

from .. import _gpuprof
from ..analysis import deepdive as _deepdive
from ..analysis import memory as _memory
from ..analysis import processes as _processes
from ..core import _progress
from ..core._paths import PACKAGE_DIR
from ..record import (  # docs/nvtx.md, docs/subprocesses.md, docs/backward.md
    _autograd,
    _cuda,
    _modules,
    _nvtx,
    _parts,
    _recording,
    _subprocess,
    _threads,
)
from ..record.schedule import Schedule
from ..results._meta import RecordingMeta
from ..results._results import Results
from ._accessors import ResultAccessors

__all__ = ["ProfilerActivity", "profile", "record_function"]

_P = TypeVar("_P", bound=_parts.Part)
_A = ParamSpec("_A")
_R = TypeVar("_R")


class ProfilerActivity(enum.Enum):
    """What to capture: Python/C calls on the host (CPU) and GPU activity (CUDA)."""

    CPU = "cpu"
    CUDA = "cuda"


def _user_stacklevel() -> int:
    """The warnings.warn stacklevel of the innermost frame outside gpuprof, for a
    warning raised from gpuprof code (the user's ``with`` line, ``prof.stop()``)."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


# Packages whose threads run the notebook kernel or the debugger itself (ipykernel's
# IOPub, control and heartbeat threads, IPython's history saver, debugpy's): their
# event loops are not the user's work, and gpuprof leaves them out of its results.
_KERNEL_PACKAGES = (
    "ipykernel",
    "IPython",
    "jupyter_client",
    "zmq",
    "tornado",
    "debugpy",
    "pydevd",
    "_pydevd",
)


def _kernel_threads() -> list[int]:
    """Idents of the running threads that belong to a notebook kernel's machinery."""
    out = []
    me = threading.get_ident()
    for t in threading.enumerate():
        if t.ident is None or t.ident == me:
            continue
        target = getattr(t, "_target", None)  # threading.Thread(target=...)
        owner = getattr(target, "__module__", None) if target is not None else None
        owner = owner or type(t).__module__
        if isinstance(owner, str) and owner.split(".")[0] in _KERNEL_PACKAGES:
            out.append(t.ident)
    return out[:16]


def _name_the_callback(error: BaseException, callback: object, step: int) -> None:
    """Add a note to an error ``on_trace_ready`` raised: which callback, at which
    step (on Python 3.10, which has no notes, the line goes to stderr)."""
    name = getattr(callback, "__qualname__", None) or repr(callback)
    module = getattr(callback, "__module__", None)
    if module and getattr(callback, "__qualname__", None):
        name = f"{module}.{name}"
    note = (
        f"gpuprof: raised by on_trace_ready={name} as the window ended at step {step}; "
        "profiling goes on if the exception is caught around prof.step()"
    )
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:  # Python 3.10
        print(note, file=sys.stderr)


def _check_torch_compat_args(**args: Any) -> None:
    """Check the torch.profiler arguments gpuprof accepts for compatibility, and warn
    once (per profile) for each set argument it cannot honour, naming it."""
    for name in ("with_flops", "with_modules", "record_shapes"):
        if not isinstance(args[name], bool):
            raise TypeError(f"profile(): {name} must be a bool, got {args[name]!r}")
    if args["use_cuda"] is not None and not isinstance(args["use_cuda"], bool):
        raise TypeError(f"profile(): use_cuda must be a bool or None, got {args['use_cuda']!r}")
    t = args["post_processing_timeout_s"]
    if t is not None and (isinstance(t, bool) or not isinstance(t, numbers.Real) or t < 0):
        raise ValueError(
            f"profile(): post_processing_timeout_s must be a number >= 0 or None, got {t!r}"
        )
    if args["custom_trace_id_callback"] is not None and not callable(
        args["custom_trace_id_callback"]
    ):
        raise TypeError(
            "profile(): custom_trace_id_callback must be callable or None, got "
            f"{args['custom_trace_id_callback']!r}"
        )
    unsupported = {
        "experimental_config": "it configures PyTorch's Kineto profiler, which gpuprof does "
        "not use; gpuprof honours its enable_cuda_sync_events (as "
        "cuda_sync_events=True) and ignores the rest",
        "execution_trace_observer": "gpuprof does not write PyTorch execution traces; "
        "it is ignored",
        "custom_trace_id_callback": "gpuprof's traces have no trace id; it is ignored",
        "post_processing_timeout_s": "gpuprof closes a window in one pass and cannot "
        "stop it part way; it is ignored",
    }
    for name, why in unsupported.items():
        value = args[name]
        if value is None or value is False:
            continue
        warnings.warn(f"gpuprof.profile({name}=...): {why}", UserWarning, stacklevel=3)


def _check_flags(**flags: object) -> None:
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise TypeError(f"profile(): {name} must be a bool, got {flag!r}")


def _activities(
    activities: Iterable[ProfilerActivity] | None, use_cuda: bool | None
) -> tuple[set[ProfilerActivity], bool, str | None]:
    """profile()'s activities: the set, whether CUDA was asked for explicitly (a warning
    then says why it is off), and why CUDA is not in the set (for the table footer)."""
    cuda_off_reason = None
    if activities is None:
        acts = {ProfilerActivity.CPU}
        if use_cuda is not None:
            if use_cuda:
                acts.add(ProfilerActivity.CUDA)
            else:
                cuda_off_reason = "use_cuda=False"
            explicit = bool(use_cuda)
        else:
            if _cuda.gpu_present() and _cuda.ensure_cupti()[0]:
                acts.add(ProfilerActivity.CUDA)
            else:
                cuda_off_reason = _cuda.cuda_status()["reason"] or "not usable here"
            explicit = False
    else:
        if isinstance(activities, (str, ProfilerActivity)) or not isinstance(activities, Iterable):
            raise TypeError(
                f"profile(): activities must be a list of ProfilerActivity, got {activities!r}"
            )
        acts = set()
        for a in activities:
            if not isinstance(a, ProfilerActivity):
                if type(a).__name__ == "ProfilerActivity" and a.name in ("CPU", "CUDA"):
                    a = ProfilerActivity[a.name]  # torch.profiler.ProfilerActivity
                else:
                    raise TypeError(
                        "profile(): activities must contain ProfilerActivity.CPU"
                        f" or ProfilerActivity.CUDA, got {a!r}"
                    )
            acts.add(a)
        if use_cuda:
            acts.add(ProfilerActivity.CUDA)
        explicit = ProfilerActivity.CUDA in acts
        if not explicit:
            cuda_off_reason = "ProfilerActivity.CUDA is not in activities"
    return acts, explicit, cuda_off_reason


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
            None records everything between start and stop. A callable whose
            ``until_stop`` attribute is True means its last window to run until
            stop(): it is complete there, not cut short (docs/schedule.md).
        on_trace_ready: callable(prof) run when a window closes at RECORD_AND_SAVE.
        profile_memory: record device memory allocations and frees.
        with_stack: keep call stacks for grouping by stack and flame graphs (the
            call tree is always kept; accepted for torch.profiler compatibility).
        record_shapes: with CUDA capture and a CUDA build of PyTorch, a row per ATen
            op (``aten::addmm``, under the Python call that ran it) and its input
            shapes, from PyTorch's NVTX range per op: ``key_averages(
            group_by_input_shape=True)`` and ``KeyAverage.input_shapes``, as in
            torch.profiler (docs/aten.md; it costs what every op's range costs).
        aten_ops: the ATen op rows of ``record_shapes`` without their shapes.
        reuse_shapes: with ``record_shapes``, ask PyTorch for the input shapes on the
            first recorded step of each window only, and give them to the window's
            later steps that ran the same ops and the same launches (kernels, grids,
            blocks, shared memory, copy sizes): the shapes cost that one step, and
            the names alone the others. A step that ran other launches keeps its ATen
            rows without shapes; ``results.cuda["aten_ops"]["shapes"]`` counts both
            and the table footer says so. False asks for them on every step (shapes
            that change from step to step; docs/aten.md).
        with_flops: FLOPs of the matmul, convolution and attention ops, counted from
            their input shapes (turns ``record_shapes`` on): ``KeyAverage.flops``,
            the table's FLOPs and TFLOPS columns (docs/flops.md).
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
        cuda_sync_events: take synchronizations from CUPTI's own SYNCHRONIZATION and
            CUDA_EVENT records instead of from the CUDA API calls that wait. Both give
            every wait with its time and line; CUPTI's records add, for
            cudaStreamWaitEvent, the stream that recorded the event (HTA's critical
            path uses it). Off by default: on a launch-bound step they cost about
            1.5 us on every kernel launch (docs/benchmarks.md). torch.profiler's
            ``experimental_config=_ExperimentalConfig(enable_cuda_sync_events=True)``
            switches it on too.
        autograd_nodes: with CUDA capture and a CUDA build of PyTorch (imported before
            ``start()``), charge each backward kernel to the autograd node that launched
            it (``AddmmBackward0``, ``torch::autograd::AccumulateGrad``: rows of
            ``key_averages()``, slices on autograd's threads in the trace), through
            PyTorch's NVTX range per node, on while a window records. False leaves the
            backward pass as one ``loss.backward()`` call. Whether it was on, or why
            not, is in ``results.cuda["autograd_nodes"]`` and the table footer; see
            docs/backward.md (and its cost).
        modules: with PyTorch imported before ``start()``, note which
            ``torch.nn.Module`` instance each module call ran on, for
            ``prof.modules()`` and ``prof.module_table()`` (one row per instance, named
            as in the model: ``transformer.h.3.attn``) and the trace's module slices
            (docs/backward.md, "Modules"). False records module calls as plain calls.
        with_modules: accepted for torch.profiler compatibility: the module hierarchy
            is always recorded (each ``Module.forward`` frame is in the call tree, the
            trace and ``group_by_stack_n`` stacks).
        use_cuda: torch.profiler's older spelling: True adds ProfilerActivity.CUDA to
            the activities, False leaves it out.
        with_flops, experimental_config, execution_trace_observer,
        custom_trace_id_callback, post_processing_timeout_s: accepted for
            torch.profiler compatibility; gpuprof cannot honour them, and one warning
            naming the argument says so when one is set.
    """

    # set in __init__; ResultAccessors reads them
    profile_memory: bool
    subprocesses: bool

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
        with_flops: bool = False,
        with_modules: bool = False,
        experimental_config: object = None,
        execution_trace_observer: object = None,
        custom_trace_id_callback: Callable[[], str] | None = None,
        post_processing_timeout_s: float | None = None,
        use_cuda: bool | None = None,
        cuda_sync_events: bool = False,
        autograd_nodes: bool = True,
        modules: bool = True,
        aten_ops: bool = False,
        reuse_shapes: bool = True,
    ) -> None:
        _check_torch_compat_args(
            with_flops=with_flops,
            with_modules=with_modules,
            post_processing_timeout_s=post_processing_timeout_s,
            use_cuda=use_cuda,
            record_shapes=record_shapes,
            experimental_config=experimental_config,
            execution_trace_observer=execution_trace_observer,
            custom_trace_id_callback=custom_trace_id_callback,
        )
        if getattr(experimental_config, "enable_cuda_sync_events", False) is True:
            cuda_sync_events = True
        acts, self._explicit_cuda, cuda_off_reason = _activities(activities, use_cuda)
        if schedule is not None and not callable(schedule):
            raise TypeError(
                f"profile(): schedule must be gpuprof.schedule(...) or a callable, got {schedule!r}"
            )
        if on_trace_ready is not None and not callable(on_trace_ready):
            raise TypeError(f"profile(): on_trace_ready must be callable, got {on_trace_ready!r}")
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"profile(): max_events must be a positive int, got {max_events!r}")
        _check_flags(
            profile_memory=profile_memory,
            with_stack=with_stack,
            record_shapes=record_shapes,
            acc_events=acc_events,
            subprocesses=subprocesses,
            cuda_sync_events=cuda_sync_events,
            autograd_nodes=autograd_nodes,
            modules=modules,
            aten_ops=aten_ops,
            reuse_shapes=reuse_shapes,
        )
        self.activities = acts
        self.schedule = schedule
        self.on_trace_ready = on_trace_ready
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.record_shapes = record_shapes
        self.aten_ops = aten_ops
        self.reuse_shapes = reuse_shapes
        self.with_modules = with_modules
        self.with_flops = with_flops
        self.acc_events = acc_events
        self.max_events = max_events
        self.cuda_sync_events = cuda_sync_events
        self.autograd_nodes = autograd_nodes
        self.memory_sample_interval_s = _memory.validate_interval(memory_sample_interval_s)
        self._cuda_state: dict[str, Any] = {
            "active": False,
            "mode": "off",
            "error": cuda_off_reason,
        }
        self._metadata: dict[str, str] = {}  # add_metadata(): top-level keys of the trace
        # the cut-short window stop() dropped (docs/schedule.md): True while it closes
        self._partial: bool | dict[str, Any] | None = None
        cuda = ProfilerActivity.CUDA in acts
        if cuda:
            ok, reason = _cuda.ensure_cupti()
            if not ok:
                if self._explicit_cuda:
                    warnings.warn(f"gpuprof: GPU capture is off: {reason}", stacklevel=2)
                self._cuda_state["error"] = reason
                cuda = False
        # -- capture ranges (gpuprof.record._nvtx, docs/nvtx.md) --
        capture_mode, capture_name, capture_domain = _nvtx.parse_capture(capture)
        if capture_mode and schedule is not None:
            raise ValueError(
                "profile(): capture= and schedule= cannot be combined: the capture "
                "range decides when to record; drop one of them"
            )
        if capture_mode == _nvtx.CAPTURE_PROFILER_API and not cuda:
            raise RuntimeError(
                "profile(capture='cudaProfilerApi') needs GPU capture, which is "
                f"off: {self._cuda_state['error'] or 'CUDA not in activities'}"
            )
        self.capture = capture
        # -- end capture ranges --
        self._rec = _recording.Recording(
            max_events=max_events,
            schedule=schedule,
            cuda=cuda,
            memory=profile_memory,
            on_window=self._window_ready,
            capture=(capture_mode, capture_name, capture_domain),
            cuda_sync_events=cuda_sync_events,
            acc_events=acc_events,
        )
        self.subprocesses = subprocesses
        # The parts this profile composes (gpuprof.record._parts), called in this order, and
        # in reverse on the way down: children follow the schedule; memory is sampled.
        self._parts: list[_parts.Part] = [_threads.ThreadNames()]  # names past a thread's end
        if subprocesses:
            self._parts.append(_subprocess.ParentSession(_processes.group_children))
        if profile_memory:
            self._parts.append(_parts.MemorySampler(self.memory_sample_interval_s))
        # PyTorch's NVTX range per autograd node while recording (docs/backward.md)
        # and, asked for, per ATen op with its input sizes (docs/aten.md)
        self._parts.append(
            _autograd.AutogradNodes(
                autograd_nodes,
                cuda,
                schedule is not None,
                aten=aten_ops,
                shapes=record_shapes or with_flops,
                reuse_shapes=reuse_shapes and capture is None,
            )
        )
        self._parts.append(_modules.ModuleInstances(modules))
        self._step_parts = [p for p in self._parts if p.steps]
        # prof.step() is the C method itself unless a part follows the steps: no
        # Python frame of ours per step.
        self.step = self._step_with_parts if self._step_parts else self._rec.step

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> None:
        """Start profiling (the hook goes on every thread). Raises RuntimeError if
        another profiler is active."""
        other = _recording.hook_holder(gpuprof_too=False)
        if other:
            raise RuntimeError(
                f"gpuprof.profile.start(): another profiler is active ({other}); "
                "stop it first, gpuprof will not silently replace it"
            )
        self._partial = None
        state = self._rec.state
        # before the hook goes on (parts may import here; e.g. the children's folder,
        # state file and fork/spawn hooks)
        begun: list[_parts.Part] = []
        try:
            for part in self._parts:
                part.start(state)
                begun.append(part)
        except BaseException:
            for part in reversed(begun):
                part.stopped(state)
            raise
        for ident in _kernel_threads():  # a notebook kernel's own threads: not the user's work
            _gpuprof._ignore_thread(ident)
        try:
            self._rec.start()
        except BaseException:
            for part in reversed(self._parts):
                part.stopped(state)
            raise
        if self.capture and self.capture.startswith("nvtx:"):  # -- capture ranges --
            nvtx = _nvtx.status()
            if nvtx["reason"]:
                warnings.warn(
                    f"gpuprof: profile(capture={self.capture!r}) may never record: "
                    f"{nvtx['reason']}",
                    stacklevel=2,
                )
        cuda = self._rec.cuda
        self._cuda_state = {
            "active": cuda["active"],
            "mode": cuda["mode"],
            "parts": cuda["parts"],
            "error": cuda["error"] or self._cuda_state.get("error"),
        }
        if self._explicit_cuda and cuda["error"]:
            warnings.warn(f"gpuprof: GPU capture is off: {cuda['error']}", stacklevel=2)
        for part in self._parts:  # the hook is on: nothing may be imported now
            part.started(state)

    def stop(self) -> None:
        """Stop profiling; a window still recording is closed and aggregated."""
        state = self._rec.state
        try:
            for part in reversed(self._parts):
                part.stopping(state)
            # Only C calls until the window is closed: Python code here would be recorded.
            cut = self._cut_short()
            events = self._rec.buffer_stats()["events"]
            t0 = time.perf_counter()
            self._rec.stop()
            _progress.done("closed the recorded window", events, time.perf_counter() - t0)
            if cut is not None:
                self._warn_cut_short(*cut)
        finally:
            self._rec.unhook()
            for part in reversed(self._parts):
                part.stopped(state)

    def __enter__(self) -> profile:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.running:
            return
        try:
            self.stop()
        except Exception:
            if exc_type is None:
                raise
            # the user's exception propagates; ours would hide it

    def _cut_short(self) -> tuple[int, int] | None:
        """At stop(), before the window closes: (closed steps, complete windows) when
        the schedule is recording a cycle whose RECORD_AND_SAVE step never came, else
        None. When a complete window came before (and windows are not accumulated),
        the cut-short one is dropped (``self._partial`` marks it) and the complete one
        stays the result. A schedule whose ``until_stop`` is true records its last
        window until stop(): that window is complete, never cut short."""
        state = self._rec.state
        if self.schedule is None or not state.running:
            return None
        if getattr(self.schedule, "until_stop", False) is True:
            return None
        if not state.records:
            return None
        complete = state.windows_this_run
        if complete and not self.acc_events:
            self._partial = True  # _window_ready stores the dropped window here
        return state.step_num, complete

    def _warn_cut_short(self, step: int, complete: int) -> None:
        active = getattr(self.schedule, "active", None)
        if complete and not self.acc_events:
            kept = self.results.steps()["step"]
            span = (
                f"steps {kept[0]}-{kept[-1]}"
                if len(kept) > 1
                else f"step {kept[0]}"
                if len(kept)
                else "its steps"
            )
            msg = (
                f"gpuprof: the loop ended at step {step}, inside a recording window of the "
                f"schedule; that cut-short window was dropped and the results show the last "
                f"complete one ({span})"
            )
        else:
            msg = (
                f"gpuprof: the loop ended at step {step}, inside the first recording "
                f"window of the schedule; the results show that cut-short window"
            )
        if isinstance(self.schedule, Schedule):
            cycle = self.schedule.wait + self.schedule.warmup + active if active else 0
            hint = (
                f"run whole cycles ({cycle} step{'s' if cycle != 1 else ''} each) or set "
                f"repeat= so the last cycle ends before the loop does"
            )
        else:
            hint = "make the schedule's last recording window end before the loop does"
        warnings.warn(f"{msg}; to avoid this, {hint}", UserWarning, stacklevel=_user_stacklevel())

    def _window_ready(self) -> None:
        raw = self._rec.result
        if self._partial is True:  # stop() cut this window short: keep the complete one
            self._partial = raw
        else:
            self._collect()
        for part in self._parts:
            part.window_ended(self._rec.state, raw)
        if self.on_trace_ready is not None and self._partial is None:
            try:
                self.on_trace_ready(self)
            except Exception as e:
                # it propagates out of prof.step() as torch's does; the note says
                # whose error it is, which the traceback alone leaves to guess
                _name_the_callback(e, self.on_trace_ready, self.step_num)
                raise

    def _collect(self) -> None:
        raw = self._rec.result
        if raw is not self._partial:
            self._rec.keep(raw)

    # -- state ---------------------------------------------------------------
    @property
    def step_num(self) -> int:
        """Steps completed since start (prof.step() calls)."""
        return self._rec.state.step_num

    @property
    def running(self) -> bool:
        return self._rec.state.running

    @property
    def results(self) -> Results:
        """The recorded window(s) as a :class:`gpuprof.Results`."""
        self._collect()
        res = Results(
            list(self._rec.state.kept),
            cuda=self._cuda_state,
            meta=RecordingMeta(
                profile_memory=self.profile_memory,
                with_stack=self.with_stack,
                trace_metadata=dict(self._metadata),
            ),
        )
        for part in self._parts:
            part.contribute(res)
        return res

    def _part(self, kind: type[_P]) -> _P | None:
        """This profile's part of that kind, or None."""
        return next((p for p in self._parts if isinstance(p, kind)), None)

    @property
    def _memory_sampler(self) -> _parts.HostSampler | None:
        """The live host/allocator sampler (profile_memory=True), else None."""
        part = self._part(_parts.MemorySampler)
        return part.sampler if part is not None else None

    @property
    def _subprocs(self) -> _subprocess.ParentSession | None:
        """The child-process session (subprocesses=True), else None; its ``skipped``
        and ``late`` counts are named in docs/subprocesses.md."""
        return self._part(_subprocess.ParentSession)

    @property
    def dropped_events(self) -> int:
        """CPU events dropped because the buffer was full, in the kept windows."""
        return self.results.dropped_events

    def buffer_stats(self) -> dict[str, int]:
        """Bytes and events held by the event buffers right now."""
        return self._rec.buffer_stats()

    # -- trace metadata (torch.profiler's add_metadata) ----------------------------------
    def add_metadata(self, key: str, value: str) -> None:
        """Add a top-level ``key: "value"`` entry to exported traces and saved profiles.

        Raises:
            TypeError: key or value is not a str.
        """
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"add_metadata(): key and value must be str, got {key!r}, {value!r};"
                " use add_metadata_json(key, json_text) for other values"
            )
        self._metadata[key] = json.dumps(value)

    def add_metadata_json(self, key: str, value: str) -> None:
        """Add a top-level ``key: value`` entry to exported traces, where ``value`` is
        JSON text (``'{"lr": 0.1}'``, ``'[1, 2]'``, ``'3'``).

        Raises:
            TypeError: key or value is not a str.
            ValueError: value is not valid JSON.
        """
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"add_metadata_json(): key and value must be str, got {key!r}, {value!r}"
            )
        try:
            json.loads(value)
        except ValueError as e:
            raise ValueError(
                f"add_metadata_json(): value must be JSON text, got {value!r} "
                f"({e}); use add_metadata(key, value) for a plain string"
            ) from e
        self._metadata[key] = value

    # -- results ---------------------------------------------------------------
    # -- kernel deep dive (gpuprof.deepdive, docs/kernels.md) ------------------------------
    def deep_dive(
        self,
        top: int = 5,
        replay: Callable[[], object] | None = None,
        *,
        command: Sequence[str] | str | None = None,
        backend: str = "auto",
        max_kernels: int = 20000,
        timeout_s: float | None = 1800.0,
        ncu: str | None = None,
    ) -> _deepdive.DeepDiveReport:
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
            raise RuntimeError(
                "deep_dive(): the profiler is still running; call it after "
                "prof.stop() (after the with block), so that replaying kernels "
                "cannot perturb a recorded window"
            )
        return _deepdive.deep_dive(
            self.results,
            top,
            replay,
            command=command,
            backend=backend,
            max_kernels=max_kernels,
            timeout_s=timeout_s,
            ncu=ncu,
            kernel_sequence=kernel_sequence,
        )

    def _step_with_parts(self) -> None:
        """prof.step() when a part follows the steps (subprocesses=True: the children
        learn whether the parent records)."""
        state = self._rec.state
        for part in self._step_parts:
            part.before_step(state)
        self._rec.step()
        for part in self._step_parts:
            part.after_step(state)

    # -- subprocesses (gpuprof.processes, docs/subprocesses.md) ---------------------------

    def processes(self) -> np.ndarray:
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

    def __init__(self, name: str, args: str | None = None) -> None:
        if not isinstance(name, str):
            raise TypeError(f"record_function(): name must be a str, got {type(name).__name__}")
        if args is not None and not isinstance(args, str):
            raise TypeError(f"record_function(): args must be a str or None, got {args!r}")
        self.name = name
        self._token = 0

    def __enter__(self) -> record_function:
        self._token = _gpuprof.range_push(self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        token, self._token = self._token, 0
        _gpuprof.range_pop(token)

    def __call__(self, fn: Callable[_A, _R]) -> Callable[_A, _R]:
        name = self.name

        @functools.wraps(fn)
        def wrapper(*args: _A.args, **kwargs: _A.kwargs) -> _R:
            token = _gpuprof.range_push(name)
            try:
                return fn(*args, **kwargs)
            finally:
                _gpuprof.range_pop(token)

        return wrapper


def kernel_sequence(replay: Callable[[], object]) -> list[tuple[str, int]]:
    """Run ``replay`` under a plain gpuprof profile: (name, device) of its
    kernels in launch order (correlation id, then start for graph kernels).
    The deep dive (gpuprof.deepdive) names its CUPTI ranges with it."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        replay()
    ev = p.gpu_events()
    ev = ev[ev["kind"] == "kernel"]
    order = np.lexsort((ev["start_ns"], ev["correlation"]))
    return [(str(ev["name"][i]), int(ev["device"][i])) for i in order]
