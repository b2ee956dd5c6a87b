"""Step schedules: which steps are skipped, warmed up, recorded and saved.

``schedule(wait=1, warmup=1, active=3)`` behaves exactly like
``torch.profiler.schedule``: after ``skip_first`` steps, each cycle waits
``wait`` steps (nothing recorded, no overhead beyond an idle hook), warms up
for ``warmup`` steps (capture armed, events discarded), then records
``active`` steps; the last active step is ``RECORD_AND_SAVE``, where the
window is closed, aggregated and handed to ``on_trace_ready``. ``repeat=0``
cycles until the profiler stops; ``repeat=N`` runs N cycles.
"""

from __future__ import annotations

import enum
import numbers
import warnings
from collections.abc import Callable
from typing import Any

from .. import _gpuprof
from ..core import _constants as _c

__all__ = ["ProfilerAction", "Schedule", "action_at", "schedule"]


class ProfilerAction(enum.IntEnum):
    """What the profiler does at a step (same values as torch.profiler's)."""

    NONE = _c.ACT_NONE
    WARMUP = _c.ACT_WARMUP
    RECORD = _c.ACT_RECORD
    RECORD_AND_SAVE = _c.ACT_RECORD_AND_SAVE

    @property
    def records(self) -> bool:
        """Whether a step with this action is kept in a window (RECORD, RECORD_AND_SAVE)."""
        return self in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)


def action_at(schedule: Callable[[int], object] | None, step: int) -> ProfilerAction:
    """What ``schedule`` does at ``step``: a :func:`gpuprof.schedule`, any callable
    step -> action (gpuprof's or torch.profiler's ProfilerAction, or its int value;
    it is called, so one that keeps state sees the call), or None, which records
    every step.

    Raises:
        TypeError: ``step`` is not an int, or the callable answered something that
            is not an action.
        ValueError: ``step`` is negative.
    """
    step = _check_int("step", step, 0)
    if schedule is None:
        return ProfilerAction.RECORD
    answer = schedule(step)
    value: Any = getattr(answer, "value", answer)  # torch.profiler.ProfilerAction
    try:
        return ProfilerAction(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"schedule: {schedule!r} answered {answer!r} for step {step}; a schedule "
            "returns a ProfilerAction (NONE, WARMUP, RECORD or RECORD_AND_SAVE)"
        ) from None


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"schedule(): {name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"schedule(): {name} must be >= {minimum}, got {value}")
    return value


class Schedule:
    """A step -> ProfilerAction callable whose state machine runs in C.

    Create it with :func:`schedule`. Calling it with a step number returns
    the action for that step.
    """

    __slots__ = ("wait", "warmup", "active", "repeat", "skip_first", "skip_first_wait")

    def __init__(
        self,
        wait: int,
        warmup: int,
        active: int,
        repeat: int = 0,
        skip_first: int = 0,
        skip_first_wait: int = 0,
    ) -> None:
        self.wait = _check_int("wait", wait, 0)
        self.warmup = _check_int("warmup", warmup, 0)
        self.active = _check_int("active", active, 1)
        self.repeat = _check_int("repeat", repeat, 0)
        self.skip_first = _check_int("skip_first", skip_first, 0)
        self.skip_first_wait = _check_int("skip_first_wait", skip_first_wait, 0)

    def as_tuple(self) -> tuple[int, int, int, int, int, int]:
        return (
            self.wait,
            self.warmup,
            self.active,
            self.repeat,
            self.skip_first,
            self.skip_first_wait,
        )

    def __call__(self, step: int) -> ProfilerAction:
        step = _check_int("step", step, 0)
        return ProfilerAction(_gpuprof.schedule_action(*self.as_tuple(), step))

    def __repr__(self) -> str:
        return (
            "schedule(wait={}, warmup={}, active={}, repeat={}, skip_first={}, "
            "skip_first_wait={})".format(*self.as_tuple())
        )


def schedule(
    *,
    wait: int,
    warmup: int,
    active: int,
    repeat: int = 0,
    skip_first: int = 0,
    skip_first_wait: int = 0,
) -> Schedule:
    """Return a schedule for :class:`gpuprof.profile` (torch.profiler.schedule semantics).

    Args:
        wait: steps per cycle with nothing recorded.
        warmup: steps per cycle with capture armed but events discarded.
        active: steps per cycle that are recorded (>= 1).
        repeat: number of cycles; 0 repeats until the profiler stops.
        skip_first: steps skipped once before the first cycle.
        skip_first_wait: if non-zero, the first cycle starts without its wait.

    Raises:
        TypeError: an argument is not an int.
        ValueError: an argument is negative, or active < 1.
    """
    s = Schedule(wait, warmup, active, repeat, skip_first, skip_first_wait)
    if s.warmup == 0:
        warnings.warn(
            "gpuprof.schedule(): warmup=0 records the first step cold; its timings "
            "include one-time costs",
            stacklevel=2,
        )
    return s
