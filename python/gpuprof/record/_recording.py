"""One recording: the C profiler, the hook backend that feeds it, the windows it keeps.

Every driver of a recording goes through a :class:`Recording`: ``gpuprof.profile``
(and, through it, ``gpuprof run``, on-demand captures and the integrations) and a
child process's own session (``_subprocess._child``). Nothing else creates the C
profiler or installs the hook.

The parts a profile composes (``gpuprof.record._parts``) read the recording through its
read-only :class:`RecordingState`: the step number, the schedule's action, how many
windows closed, which are kept, whether a step records.

This module also owns the process's one ``os.register_at_fork`` handler: in a forked
child it drops the parent's recording first, then runs the callbacks other modules
gave :func:`at_fork_in_child`, in the order they gave them.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from .. import _gpuprof
from ..core._constants import ACT_EXIT, ACTS_HOOKED
from . import _monitoring
from .schedule import ProfilerAction, Schedule, action_at

__all__ = ["Recording", "RecordingState", "at_fork_in_child", "hook_holder"]

Raw = dict[str, Any]  # one closed window, as the C core returns it


def hook_holder(*, gpuprof_too: bool) -> str | None:
    """What holds Python's profile hook on this thread (sys.setprofile) or in the
    interpreter (sys.monitoring's profiler slot), or None. ``gpuprof_too=False``
    leaves gpuprof's own hook out (the C core refuses a second start itself)."""
    current = sys.getprofile()
    if current is not None and (gpuprof_too or not isinstance(current, _gpuprof.Profiler)):
        return f"sys.setprofile is set to {current!r}"
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:
        tool = monitoring.get_tool(monitoring.PROFILER_ID)
        if tool is not None and (gpuprof_too or tool != "gpuprof"):
            return f"sys.monitoring's profiler slot is held by {tool!r}"
    return None


class Recording:
    """The C profiler of one recording, its hook, and the windows kept from it.

    Args:
        max_events: CPU event budget of one window.
        schedule: a :func:`gpuprof.schedule`, a callable step -> action, or None.
        cuda, memory: CUDA capture and device memory records.
        on_window: called (with no argument) each time the C core closes a window at
            RECORD_AND_SAVE, with the hook still on.
        capture: a parsed capture range, (mode, name, domain) from
            ``_nvtx.parse_capture``.
        cuda_sync_events: CUPTI's synchronization records (profile's argument).
        acc_events: keep every window rather than the last.
    """

    def __init__(
        self,
        *,
        max_events: int,
        schedule: Callable[[int], object] | None = None,
        cuda: bool = False,
        memory: bool = False,
        on_window: Callable[[], object] | None = None,
        capture: tuple[int, str | None, str | None] = (0, None, None),
        cuda_sync_events: bool = False,
        acc_events: bool = False,
    ) -> None:
        self.monitoring = _monitoring.use_monitoring()
        self.schedule = schedule
        self.max_events = max_events
        self.capture_mode = capture[0]
        self.acc_events = acc_events
        self._on_window = on_window
        self._kept: list[Raw] = []
        self._windows_before = 0
        self._core = _gpuprof.Profiler(
            monitoring=self.monitoring,
            max_events=max_events,
            cuda=cuda,
            memory=memory,
            schedule=schedule.as_tuple() if isinstance(schedule, Schedule) else None,
            schedule_fn=None if isinstance(schedule, Schedule) else schedule,
            on_trace_ready=None if on_window is None else self._window_closed,
            owner=None,
            capture=capture[0],
            capture_name=capture[1],
            capture_domain=capture[2],
            cuda_sync_records=cuda_sync_events,
        )
        self.state = RecordingState(self)
        # prof.step(): the C method itself, no Python frame of ours per step
        self.step = self._core.step

    # -- the hook and the C session ---------------------------------------------------------
    def start(self, *, this_thread: bool = True) -> None:
        """Install the hook and start the C session. ``this_thread=False`` leaves the
        calling thread out (a thread of gpuprof's own, such as a child's poll thread)."""
        self._kept = []
        self._windows_before = self._core.windows
        if self.monitoring:
            # interpreter-wide; a thread of gpuprof's own only runs gpuprof's frames and
            # C calls made from them, which the aggregation leaves out
            _monitoring.install()
        else:
            threading.setprofile(_gpuprof._thread_bootstrap)
        try:
            self._core.start()
        except BaseException:
            self.unhook()
            raise
        if not this_thread and not self.monitoring:
            sys.setprofile(None)

    def stop(self) -> Raw | None:
        """Close the window still recording and stop; the hook comes off (also when
        closing fails). Returns the last window's result."""
        try:
            self._core.stop()
        finally:
            self.unhook()
        return self._core.result

    def unhook(self) -> None:
        """Take the hook off (idempotent): no thread calls into the C core after it."""
        if self.monitoring:
            _monitoring.uninstall()
        else:
            threading.setprofile(None)

    # -- windows ----------------------------------------------------------------------------
    def _window_closed(self, _core: object) -> None:
        assert self._on_window is not None
        self._on_window()

    def keep(self, raw: Raw | None) -> None:
        """Keep a closed window (all of them with acc_events, else the last one)."""
        if raw is None or (self._kept and self._kept[-1] is raw):
            return
        if self.acc_events:
            self._kept.append(raw)
        else:
            self._kept = [raw]

    @property
    def result(self) -> Raw | None:
        """The last window the C core closed (kept or not)."""
        return self._core.result

    @property
    def cuda(self) -> dict[str, Any]:
        """The C session's CUDA capture: active, mode, parts, error."""
        return self._core.cuda

    def buffer_stats(self) -> dict[str, int]:
        """Bytes and events held by the event buffers right now."""
        return self._core.buffer_stats()


class RecordingState:
    """What the parts of a profile read about its recording; read-only."""

    __slots__ = ("__weakref__", "_rec")  # weakly held by the memory sampler

    def __init__(self, rec: Recording) -> None:
        self._rec = rec

    @property
    def running(self) -> bool:
        return bool(self._rec._core.running)

    @property
    def step_num(self) -> int:
        """Steps completed since start (prof.step() calls)."""
        return int(self._rec._core.step_num)

    @property
    def action(self) -> ProfilerAction:
        """The schedule's action at the current step (NONE once stopped)."""
        act = self._rec._core.action
        return ProfilerAction.NONE if act == ACT_EXIT else ProfilerAction(act)

    @property
    def records(self) -> bool:
        """Whether the current step is kept in a window."""
        return self.action.records

    @property
    def hooked(self) -> bool:
        """Whether the hook records at the current step (warm-up too)."""
        return int(self.action) in ACTS_HOOKED

    @property
    def windows(self) -> int:
        """Windows the C core closed since it was made (over every start())."""
        return int(self._rec._core.windows)

    @property
    def windows_this_run(self) -> int:
        """Windows closed since the last start()."""
        return self.windows - self._rec._windows_before

    @property
    def kept(self) -> tuple[Raw, ...]:
        """The kept windows, oldest first."""
        return tuple(self._rec._kept)

    @property
    def last_closed(self) -> Raw | None:
        """The last window the C core closed."""
        return self._rec.result

    @property
    def max_events(self) -> int:
        return self._rec.max_events

    @property
    def schedule(self) -> Callable[[int], object] | None:
        return self._rec.schedule

    def records_at(self, step: int) -> bool | None:
        """Whether the schedule records ``step``; None where only the schedule knows:
        a callable (the C core calls it once per step and it may keep state) or a
        capture range (its windows open without steps)."""
        sched = self._rec.schedule
        if self._rec.capture_mode:
            return None
        if sched is not None and not isinstance(sched, Schedule):
            return None
        return action_at(sched, step).records


# -- the one fork handler ----------------------------------------------------------------
_fork_callbacks: list[Callable[[], None]] = []


def at_fork_in_child(callback: Callable[[], None]) -> None:
    """Run ``callback`` in each forked child, after the parent's recording is dropped
    (callbacks run in the order given; one given twice runs once)."""
    if callback not in _fork_callbacks:
        _fork_callbacks.append(callback)


def _after_fork_in_child() -> None:
    # A forked child (DataLoader workers, multiprocessing) must not keep recording into
    # the parent's session, nor touch the parent's CUDA capture.
    _gpuprof._after_fork_child()
    threading.setprofile(None)
    if _monitoring.available():
        _monitoring.uninstall()  # the parent's sys.monitoring tool slot is not the child's
    for callback in list(_fork_callbacks):
        callback()


os.register_at_fork(after_in_child=_after_fork_in_child)
