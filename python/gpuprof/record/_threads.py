"""Thread names that outlive their threads: the part of a profile that keeps the name
of every thread it may have recorded, for the trace's lanes, the HTML report and
``Results.thread_names()``.

A thread's name is readable only while it runs (``threading.enumerate()``), and the
threads a ``with ThreadPoolExecutor()`` block or a DataLoader's queue feeder starts
have ended by the time the trace is written. So the names are taken:

- when profiling starts and stops, from the threads running then;
- when a thread ends while profiling: ``threading.Thread._delete``, which every
  thread runs last (``Thread._bootstrap_inner``'s ``finally``, Python 3.10 to 3.13),
  is replaced for the session by ``_gpuprof._ThreadEnd`` (csrc/record/threads.c), which
  stores the ending thread's name and calls the original.

Names are kept by OS thread id (``Thread.native_id``, the ``os_tid`` of a thread row
and the trace's ``tid``), not by ``threading.get_ident()``: the system gives an ended
thread's ident to the next thread at once, so the threads of pools started one after
the other share one ident, each with a row of its own.

Nothing runs per recorded call: the profile hook is unchanged, and a thread's end
costs one dict store more (docs/benchmarks.md). ``_ThreadEnd`` is C but not a builtin
function, so no profile hook sees a call of it and nothing of it shows in a profile
(csrc/record/threads.c says why a Python wrapper would not do).
"""

from __future__ import annotations

import threading

from .. import _gpuprof
from ._parts import Part
from ._recording import RecordingState

__all__ = ["ThreadNames"]

# The running session's names (OS thread id -> name), or None when no profile runs.
_session: dict[int, str] | None = None
_original_delete = None  # threading.Thread._delete before ours


def _install(names: dict[int, str]) -> None:
    global _session, _original_delete
    current = threading.Thread.__dict__.get("_delete")
    if current is not None and not isinstance(current, _gpuprof._ThreadEnd):
        _original_delete = current
    if _original_delete is not None:  # else a Python whose threads end otherwise
        # a private method of CPython's Thread, absent from its stubs
        threading.Thread._delete = _gpuprof._ThreadEnd(_original_delete, names)  # type: ignore[attr-defined]
    _session = names


def _uninstall() -> None:
    global _session
    _session = None
    current = threading.Thread.__dict__.get("_delete")
    if isinstance(current, _gpuprof._ThreadEnd):  # unless someone wrapped ours since
        threading.Thread._delete = _original_delete  # type: ignore[attr-defined]  # as above


def _running(names: dict[int, str]) -> None:
    """Add the names of the threads running now."""
    for thread in threading.enumerate():
        tid = getattr(thread, "native_id", None)
        if tid is not None:
            names[tid] = thread.name


class ThreadNames(Part):
    """The names of the threads of a session, kept past their end; ``contribute``
    puts ``{os_tid: name}`` in ``results.meta.thread_names_by_tid``, which
    ``Results.thread_row_names()`` (the trace, the report) and saved profiles read."""

    def __init__(self):
        self.names: dict[int, str] = {}

    def start(self, state: RecordingState) -> None:
        self.names = {}
        _running(self.names)
        _install(self.names)

    def stopped(self, state: RecordingState) -> None:
        _uninstall()
        _running(self.names)  # the hook is off: the threads still running, by their last name

    def contribute(self, results) -> None:
        names = dict(self.names)
        if _session is self.names:  # still recording: the threads running now too
            _running(names)
        # every thread of the session, recorded or not: readers look theirs up
        results.meta.thread_names_by_tid = names
