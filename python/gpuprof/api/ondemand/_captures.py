"""A capture on the program's side: at a step boundary a pending capture starts and a
recording one counts the step and stops when it is done (on the thread that reached
the boundary); then a writer thread writes the files (``_capture.write_files``)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from ... import _gpuprof
from ...core import _ondemand_proto as proto
from ...record import _ondemand_capture as capture_
from ...record._recording import hook_holder
from . import _summary
from ._shared import _say, _share_the_gil


class _Captures:
    """An :class:`OnDemand`'s captures, from the step boundary that starts one to its
    files.

    Methods of :class:`OnDemand`, which sets every attribute they use in its
    ``__init__`` (``_armed``).
    """

    if TYPE_CHECKING:  # what OnDemand sets and defines, for the type checker
        pid: int
        found: int
        _cuda: bool | None
        _closed: bool
        _work: capture_.Capture | None
        _lock: threading.Lock
        _captures: int
        _thread: threading.Thread | None

        def _poke(self) -> None: ...
        def _who(self) -> dict[str, Any]: ...
        def status(self) -> dict[str, Any]: ...

    def _boundary(self) -> None:
        cap = self._work
        if cap is None or self._closed:
            return
        try:
            if cap.state == "pending":
                if cap.start_step is not None and self.found < cap.start_step:
                    return
                with self._lock:
                    if self._work is not cap or cap.state != "pending":
                        return
                    cap.state = "starting"
                self._start(cap)
            elif cap.state == "recording" and cap.thread == threading.get_ident():
                if cap.abort:
                    self._discard(cap)
                    return
                cap.recorded += 1
                cap.prof.step()
                if (cap.steps is not None and cap.recorded >= cap.steps) or (
                    cap.deadline is not None and time.monotonic() >= cap.deadline
                ):
                    self._stop(cap)
        except Exception as e:  # noqa: BLE001 - never into the program: the requester hears it
            self._failed(cap, f"recording failed: {e}")

    # -- recording ------------------------------------------------------------------------------
    def _prepare(self, cap: capture_.Capture) -> None:
        """Make ``cap``'s profile (loading CUPTI the first time) off the stepping thread.

        Raises:
            Exception: whatever ``gpuprof.profile()`` raises.
        """
        from ..profiler import ProfilerActivity, profile

        t0 = time.thread_time()
        kwargs: dict = {"profile_memory": cap.memory}
        if self._cuda is not None:
            kwargs["activities"] = [ProfilerActivity.CPU] + (
                [ProfilerActivity.CUDA] if self._cuda else []
            )
        cap.prof = profile(**kwargs)
        cap.prepare_s = time.thread_time() - t0

    def _start(self, cap: capture_.Capture, timed: bool = False) -> None:
        """Start ``cap``'s prepared profile on the calling thread (state "starting"):
        at a step boundary, or, ``timed``, on the control thread for a time window."""
        cap.first_step = None if timed else self.found
        try:
            cap.prof.add_metadata_json(
                "gpuprof_on_demand",
                json.dumps(
                    {
                        "pid": self.pid,
                        "host": proto.host(),
                        "request": cap.rid,
                        "first_step": cap.first_step,
                        "steps": cap.steps,
                        "duration_s": cap.duration,
                        "requested_by": cap.requested_by,
                    }
                ),
            )
            cap.thread = threading.get_ident()
            cap.t_start = time.monotonic()
            if cap.duration is not None:
                cap.deadline = cap.t_start + cap.duration
            held = hook_holder(gpuprof_too=True)
            if held:  # checked first: a failing start() would unhook the program's profiler
                raise RuntimeError(
                    f"another profiler is active in this process ({held}), "
                    "such as the program's own gpuprof.profile or cProfile; a "
                    "capture needs Python's profile hook free"
                )
            if self._thread is not None and self._thread.ident is not None:
                # each session forgets the threads left out of the last one: this one's
                # frames would otherwise be taken from the window's start-up snapshot
                _gpuprof._ignore_thread(self._thread.ident)
            cap.state = "recording"
            cap.prof.start()
            cap.start_s = time.monotonic() - cap.t_start
        except Exception as e:  # noqa: BLE001 - e.g. another profiler holds the hook
            self._failed(cap, f"could not start recording: {e}")
            return
        if timed:
            self._poke()  # the control thread sleeps until the deadline

    def _stop(self, cap: capture_.Capture, synchronous: bool = False) -> None:
        """Stop ``cap``'s profile, then write its files (on a writer thread, or here)."""
        cap.t_stop = time.monotonic()
        try:
            cap.prof.stop()
        except Exception as e:  # noqa: BLE001
            self._failed(cap, f"stopping the recording failed: {e}")
            return
        cap.stop_s = time.monotonic() - cap.t_stop
        with self._lock:
            cap.state = "writing"
        if synchronous:
            self._write(cap)
            return
        cap.writer = threading.Thread(
            target=self._write, args=(cap,), name="gpuprof-on-demand-writer"
        )
        cap.writer.start()

    def _discard(self, cap: capture_.Capture) -> None:
        """Stop an aborted capture and keep nothing of it."""
        prof, cap.prof = cap.prof, None
        with contextlib.suppress(Exception):
            prof.stop()
        with self._lock:
            if self._work is cap:
                self._work = None
            cap.state = "cancelled"
        cap.reply.done({"ok": False, "error": "aborted by its requester", **self._who()})

    def _failed(self, cap: capture_.Capture, error: str) -> None:
        prof, cap.prof = cap.prof, None
        if prof is not None and prof.running:
            with contextlib.suppress(Exception):
                prof.stop()
        with self._lock:
            if self._work is cap:
                self._work = None
            cap.state = "failed"
        if not cap.summary:  # a sample's failure goes to gpuprof top only
            _say(f"on-demand capture {cap.rid} of pid {self.pid}: {error}")
        cap.reply.done({"ok": False, "error": error, **self._who()})

    def _write(self, cap: capture_.Capture) -> None:
        if threading.current_thread() is cap.writer:
            _gpuprof._ignore_current_thread()
        try:
            with _share_the_gil():
                if cap.summary:  # gpuprof top's sample: a small answer, no files
                    doc = _summary.summarize(cap)
                else:
                    doc = capture_.write_files(cap, self.pid, self.status()["steps_from"])
        except Exception as e:  # noqa: BLE001 - disk full, permissions: the requester hears it
            if cap.summary:
                doc = {"ok": False, "error": f"summing up the sampled step failed: {e!r}"}
            else:
                doc = {"ok": False, "error": f"writing the files into {cap.output!r} failed: {e}"}
        doc.update(self._who())
        with self._lock:
            if self._work is cap:
                self._work = None  # free for the next capture before anyone hears of this one
            cap.state = "done"
            self._captures += not cap.summary
        # top samples a step every second or so: its requester hears of each, the
        # program's stderr of none
        if doc["ok"] and not cap.summary:
            cut = f"; cut short: {cap.cut_short}" if cap.cut_short else ""
            _say(
                f"on-demand capture of pid {self.pid} ({doc['summary']}{cut}) written to "
                f"{cap.output}"
            )
        elif not cap.summary:
            _say(f"on-demand capture of pid {self.pid} failed: {doc['error']}")
        cap.reply.done(doc)

    def finish(self) -> None:
        """End the capture in progress now (the program ends): one still recording is
        stopped and written here, one being written is waited for, one that has not
        started is cancelled, each with a message to its requester."""
        cap = self._work
        if cap is None or os.getpid() != self.pid:
            return
        with self._lock:  # the stepping thread acts on "pending" and "recording" only
            state = cap.state
            if state in ("pending", "preparing"):
                cap.state = "cancelled"
                if self._work is cap:
                    self._work = None
            elif state == "recording":
                cap.state = "stopping"
        if state in ("pending", "preparing"):
            cap.reply.done(
                {
                    "ok": False,
                    "error": "the program ended before the capture started (no step boundary came)",
                    **self._who(),
                }
            )
        elif state == "recording":
            if cap.steps is not None:
                cap.cut_short = f"the program ended after {cap.recorded} of the {cap.steps} steps"
            else:
                cap.cut_short = (
                    f"the program ended {time.monotonic() - cap.t_start:.1f} s "
                    f"into the {cap.duration:g} s"
                )
            self._stop(cap, synchronous=True)
        elif (
            cap.state == "writing"
            and cap.writer is not None
            and cap.writer is not threading.current_thread()
        ):
            cap.writer.join()
