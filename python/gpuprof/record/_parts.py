"""The parts a profile composes, behind one small interface (:class:`Part`), and the
memory sampler part.

``gpuprof.profile`` keeps a list of parts and calls each hook of every part, with the
read-only state of its recording (``_recording.RecordingState``), at one place of its
own lifecycle, in list order, and in reverse order on the way down
(``stopping``, ``stopped``): the part started last is stopped first. A part that
has nothing to do at a hook leaves it out. The child-process session
(``_subprocess.ParentSession``) is the other part.
"""

from __future__ import annotations

import warnings

from ._allocators import active_adapters
from ._host_sampler import HostSampler
from ._recording import RecordingState

__all__ = ["MemorySampler", "Part"]


class Part:
    """One part of a recording. Every hook is a no-op here.

    The hook goes on between ``start`` and ``started`` and comes off before
    ``stopped``: hooks called while it is on run recorded, so they must not import
    anything (importlib's frames would be recorded as the program's ops) and should
    make few Python calls.
    """

    # prof.step() calls before_step/after_step around the C step; False keeps
    # prof.step the C method itself (no Python frame per step)
    steps = False

    def start(self, state: RecordingState) -> None:
        """profile.start(), before the hook goes on. May raise to refuse the start;
        the parts started before it are then told ``stopped``."""

    def started(self, state: RecordingState) -> None:
        """profile.start(), after the C session started (hook on)."""

    def before_step(self, state: RecordingState) -> None:
        """prof.step(), before the C step (hook on, when recording)."""

    def after_step(self, state: RecordingState) -> None:
        """prof.step(), after the C step; a window may have ended in it."""

    def window_ended(self, state: RecordingState, raw: dict | None) -> None:
        """A window closed (the C core's on_trace_ready): after the profile kept
        it, before the user's on_trace_ready. ``raw`` is its result dict."""

    def stopping(self, state: RecordingState) -> None:
        """profile.stop(), before the last window is closed (hook on)."""

    def stopped(self, state: RecordingState) -> None:
        """profile.stop() after the hook came off, or a start() that failed after
        this part's ``start``."""

    def contribute(self, results) -> None:
        """Add this part's data to a new :class:`gpuprof.Results` (``prof.results``)."""


class MemorySampler(Part):
    """profile_memory=True: host RSS and the framework allocators, sampled on a thread
    from start() to stop() (``gpuprof.memory`` reads the samples)."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.sampler: HostSampler | None = None  # stays readable after stop()

    def started(self, state: RecordingState) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        self.sampler = self._start(state)

    def _start(self, owner) -> HostSampler | None:
        """Start the sampler; warn and return None if it cannot run. The hook is on:
        everything here and below must be imported already."""
        try:
            adapters = active_adapters()
        except Exception as e:  # a half-imported framework must not stop the profile
            warnings.warn(f"gpuprof: allocator adapters unavailable: {e!r}", stacklevel=4)
            adapters = []
        sampler = HostSampler(self.interval_s, adapters, owner=owner)
        try:
            sampler.start()
        except Exception as e:
            warnings.warn(
                f"gpuprof: memory sampler not started ({e!r}); host and allocator "
                "memory curves will be empty",
                stacklevel=4,
            )
            return None
        return sampler

    def stopping(self, state: RecordingState) -> None:
        # first of all; its samples stay readable
        if self.sampler is not None:
            self.sampler.stop()

    def contribute(self, results) -> None:
        results.memory_samples = self.sampler
