"""The on-demand thread: it sleeps (``_gpuprof._wait_readable``) on a pipe that the
signal handler writes one byte to, reads the requests (the process's own in the runtime folder, and
those of ``trigger_dir``), answers each at once and ends a time window on time. The
descriptions of the process's state that the answers carry are here too."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ... import _gpuprof
from ...core import _ondemand_proto as proto
from ...record import _ondemand_capture as capture_
from ._shared import _say, _share_the_gil

_RID = re.compile(r"^[0-9a-f]+-\d+-[0-9a-f]+$")
_REFRESH_S = 3600.0  # rewrite the state file (tmp cleaners delete files untouched for days)


class _Requests:
    """An :class:`OnDemand`'s control thread: requests in, answers out.

    Methods of :class:`OnDemand`, which sets every attribute they use in its
    ``__init__`` (``_armed``).
    """

    if TYPE_CHECKING:  # what OnDemand sets and defines, for the type checker
        from ...core import _steps

        pid: int
        found: int
        source: _steps.StepFunction | _steps.OptimizerSteps
        _trigger_dir: str | None
        _poll_s: float
        _work: capture_.Capture | None
        _explicit: bool
        _lock: threading.Lock
        _closing: bool
        _closed: bool
        _inbox: deque[tuple[dict[str, Any], Any]]
        _samples: deque[tuple[float, int]]
        _seen: set[str]
        _captures: int
        _runtime: str
        _handler: Callable[[int, Any], None]
        _signum: int | None
        _signal_lost: str | None
        _wake_r: int
        _wake_w: int
        _armed_at: float
        _refreshed: float
        _job: dict[str, Any] | None
        _dumper: Any  # _dump.Dumper

        def _write_state(self) -> None: ...
        def _prepare(self, cap: capture_.Capture) -> None: ...
        def _start(self, cap: capture_.Capture, timed: bool = False) -> None: ...
        def _stop(self, cap: capture_.Capture, synchronous: bool = False) -> None: ...
        def _discard(self, cap: capture_.Capture) -> None: ...

    # -- requests (the control thread) ----------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:
        # The whole handler: one byte into the pipe the control thread waits on.
        if not self._closed:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"!")

    def _poke(self) -> None:
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"!")

    def _loop(self) -> None:
        _gpuprof._ignore_current_thread()  # never in a capture's results
        self._dumper.tick()  # this thread's name, for a dump made while the GIL is held
        failures = 0
        while not self._closing:
            timeout = self._poll_s
            cap = self._work
            timed = (
                cap is not None and cap.deadline is not None and cap.thread == threading.get_ident()
            )
            if timed:
                timeout = max(0.0, min(timeout, cap.deadline - time.monotonic()))
            try:
                # a time window ends on time only if this thread gets the GIL back soon
                # and only if it gets it at all: a main thread that lets the GIL go and
                # takes it back often (a stat() per step) starves a plain select()'s
                # return, so the wait hands the GIL over (csrc/record/gil.c)
                # (the wake-up bytes are read inside the wait: an os.read() after it
                # would let the GIL go once more)
                with _share_the_gil() if timed else contextlib.nullcontext():
                    _gpuprof._wait_readable(self._wake_r, timeout, True)
            except (OSError, ValueError):
                if self._closing:
                    return
                time.sleep(self._poll_s)
            if self._closing:
                return
            try:
                with _share_the_gil():
                    self._tick()
                failures = 0
            except Exception as e:  # noqa: BLE001 - the thread must not die silently
                failures += 1
                if failures == 1:
                    _say(f"on-demand: handling requests failed: {e!r}")

    def _tick(self) -> None:
        self._dumper.tick()  # first: a dump waits for it (_dump.py)
        now = time.monotonic()
        if not self._samples or now - self._samples[-1][0] >= 0.5:
            self._samples.append((now, self.found))
        self._check_signal()
        while self._inbox:
            req, reply = self._inbox.popleft()
            self._handle(req, reply)
        self._serve_local()
        if self._trigger_dir is not None:
            self._serve_shared()
        cap = self._work
        if cap is not None and cap.state == "recording" and cap.thread == threading.get_ident():
            if cap.abort:  # a time window this thread started
                self._discard(cap)
            elif cap.deadline is not None and time.monotonic() >= cap.deadline:
                self._stop(cap)
        if now - self._refreshed > _REFRESH_S:
            self._write_state()

    def _check_signal(self) -> None:
        if self._signum is None or self._signal_lost:
            return
        current = signal.getsignal(self._signum)
        if current is not self._handler:
            self._signal_lost = f"replaced by {current!r}"
            _say(
                f"on-demand: the program replaced gpuprof's {proto.signal_name(self._signum)} "
                f"handler; requests now arrive by polling, within {self._poll_s:g} s"
            )
            self._write_state()

    def _serve_local(self) -> None:
        prefix = f"{self.pid}.req."
        try:
            names = sorted(
                n for n in os.listdir(self._runtime) if n.startswith(prefix) and n.endswith(".json")
            )
        except OSError:
            return
        for name in names:
            path = os.path.join(self._runtime, name)
            req = proto.read_json(path)
            with contextlib.suppress(OSError):
                os.unlink(path)
            rid = name[len(prefix) : -5]
            if req is None or not _RID.match(rid):
                continue
            folder = os.path.join(self._runtime, f"rep.{rid}")
            self._handle(req, capture_.FolderReply(folder, bool(req.get("wait")), shared=False))

    def _serve_shared(self) -> None:
        try:
            names = os.listdir(self._trigger_dir)
        except OSError:
            return
        present = set()
        for name in sorted(names):
            if not (name.startswith("req.") and name.endswith(".json")):
                continue
            rid = name[4:-5]
            present.add(rid)
            if rid in self._seen or not _RID.match(rid):
                continue
            self._seen.add(rid)
            req = proto.read_json(os.path.join(self._trigger_dir, name))
            if req is None:
                continue
            folder = os.path.join(self._trigger_dir, f"rep.{rid}")
            self._handle(req, capture_.FolderReply(folder, bool(req.get("wait")), shared=True))
        self._seen &= present

    def _handle(self, req: dict, reply) -> None:
        op = req.get("op")
        if op == "query":
            reply.reply(
                {"ok": True, "state": "status", "message": self._describe_state(), **self.status()}
            )
        elif op == "capture":
            self._handle_capture(req, reply)
        elif op == "cancel":
            self._handle_cancel(req, reply)
        else:
            reply.reply(
                {
                    "ok": False,
                    "state": "refused",
                    "message": f"unknown request {op!r}",
                    **self._who(),
                }
            )

    def _handle_capture(self, req: dict, reply) -> None:
        try:
            cap = capture_.Capture(req, reply, self.found)
        except (ValueError, TypeError) as e:
            reply.reply(
                {"ok": False, "state": "refused", "message": f"bad request: {e}", **self._who()}
            )
            return
        if self._work is not None:  # busy: no need to make a profile for nothing
            self._refuse_busy(reply)
            return
        # making the profile can take seconds (CUPTI is loaded the first time): say that
        # the request has arrived, so that the requester waits for the decision
        reply.reply({"ok": True, "state": "received", "message": "received", **self._who()})
        try:  # before the decision below: no step boundary may pass between it and "pending"
            self._prepare(cap)
        except Exception as e:  # noqa: BLE001 - bad CUDA setup, memory sampler...
            reply.reply(
                {
                    "ok": False,
                    "state": "failed",
                    "message": f"pid {self.pid} cannot record: {e}",
                    **self._who(),
                }
            )
            return
        timed = cap.duration is not None and cap.start_step is None
        with self._lock:
            at = self.found
            if self._work is not None:
                verdict = "busy"
            elif cap.start_step is not None and at >= cap.start_step:
                verdict = "late"
            else:
                verdict = "accepted"
                timed = timed and at == 0  # no step found yet: a time window, started here
                cap.state = "starting" if timed else "pending"
                self._work = cap
        if verdict == "busy":
            self._refuse_busy(reply)
            return
        if verdict == "late":
            reply.reply(
                {
                    "ok": False,
                    "state": "late",
                    "message": (
                        f"pid {self.pid} is already at step {at}, past step {cap.start_step} where "
                        "the capture was to start"
                    ),
                    **self._who(),
                }
            )
            return
        if timed:
            self._start(cap, timed=True)
            if cap.state != "recording":
                reply.reply(
                    {
                        "ok": False,
                        "state": "failed",
                        "message": "could not start recording (see the program's stderr)",
                        **self._who(),
                    }
                )
                return
        reply.reply(
            {
                "ok": True,
                "state": cap.state,
                "message": self._accepted(cap, timed),
                "output": cap.output,
                **self.status(),
            }
        )

    def _refuse_busy(self, reply) -> None:
        cur = self._work
        message = self._busy(cur) if cur is not None else f"pid {self.pid} was busy"
        reply.reply({"ok": False, "state": "busy", "message": message, **self._who()})

    def _handle_cancel(self, req: dict, reply) -> None:
        """Cancel the capture waiting to start: ``target`` is its request id, or "*".
        With ``abort`` (``gpuprof capture`` undoing its own same-step request that
        another rank refused), one that has started is stopped too, at its next step
        boundary, and nothing of it is written."""
        target = req.get("target")
        with self._lock:
            cap = self._work
            mine = cap is not None and (target == "*" or cap.rid == target)
            ok = mine and cap.state == "pending"
            if ok:
                self._work = None
                cap.state = "cancelled"
            aborting = (
                mine
                and not ok
                and bool(req.get("abort"))
                and cap.state in ("starting", "recording")
            )
            if aborting:
                cap.abort = True
        if aborting:
            reply.reply(
                {
                    "ok": True,
                    "state": "aborting",
                    "message": f"pid {self.pid}: the "
                    "capture stops at the next step boundary and writes nothing",
                    **self._who(),
                }
            )
            return
        if ok:
            cap.reply.done({"ok": False, "error": "cancelled before it started", **self._who()})
            msg = (
                f"pid {self.pid}: cancelled the capture asked for at "
                f"{time.strftime('%H:%M:%S', time.localtime(cap.requested_at))}, "
                "which had not started"
            )
            reply.reply({"ok": True, "state": "cancelled", "message": msg, **self._who()})
        elif mine:
            reply.reply(
                {
                    "ok": False,
                    "state": cap.state,
                    "message": self._busy(cap, False) + "; it has started and ends by itself",
                    **self._who(),
                }
            )
        else:
            reply.reply(
                {
                    "ok": False,
                    "state": "idle",
                    "message": f"pid {self.pid} has no capture waiting to start",
                    **self._who(),
                }
            )

    # -- descriptions ---------------------------------------------------------------------------
    def _who(self) -> dict:
        job = self._job or {}
        return {
            "pid": self.pid,
            "host": proto.host(),
            "rank": job.get("rank"),
            "world_size": job.get("world_size"),
        }

    def _rate(self) -> float | None:
        """The fastest step rate (steps per second) over half-second stretches of the last
        few seconds: an upper bound for how far the program gets while a request travels.
        Just after arming, over the shorter stretch there is (None before 50 ms)."""
        points = list(self._samples) + [(time.monotonic(), self.found)]
        pairs = list(zip(points, points[1:]))
        for shortest in (0.5, 0.05):
            rates = [(f1 - f0) / (t1 - t0) for (t0, f0), (t1, f1) in pairs if t1 - t0 >= shortest]
            if rates:
                return max(rates)
        return None

    def status(self) -> dict:
        """State, steps found, step rate and where steps come from, as plain data."""
        cap = self._work
        return {
            **self._who(),
            "found": self.found,
            "rate": self._rate(),
            "state": "idle" if cap is None else cap.state,
            "requested_by": None if cap is None else cap.requested_by,
            "steps_from": "OnDemand.step() calls" if self._explicit else self.source.describe(),
            "poll_interval_s": self._poll_s,
            "signal": None if self._signal_lost else self._signum,
            "captures": self._captures,
            "job": self._job,
        }

    def _describe_state(self) -> str:
        cap = self._work
        if cap is None:
            return f"idle, at step {self.found}"
        return self._busy(cap, hint=False)

    def _busy(self, cap: capture_.Capture, hint: bool = True) -> str:
        by = f" by pid {cap.requested_by}" if cap.requested_by else ""
        when = time.strftime("%H:%M:%S", time.localtime(cap.requested_at))
        if cap.state in ("pending", "preparing"):
            start = (
                f"step {cap.start_step}" if cap.start_step is not None else "its next step boundary"
            )
            return (
                f"pid {self.pid} has a capture waiting to start (asked for at {when}{by}: "
                f"{cap.what()} from {start}; it is at step {self.found}, "
                f"{self.found - cap.found_at_request} step(s) since); cancel it with "
                f"`python -m gpuprof capture {self.pid} --cancel`"
            )
        again = "; try again when its files are written" if hint else ""
        if cap.state == "writing" and cap.summary:
            return f"pid {self.pid} is summing up the step it sampled for `gpuprof top`{again}"
        if cap.state == "writing":
            return (
                f"pid {self.pid} is writing the files of its capture (asked for at "
                f"{when}{by}) into {cap.output}{again}"
            )
        if cap.steps is not None:
            progress = f"{cap.recorded} of {cap.steps} steps recorded"
        else:
            progress = f"{time.monotonic() - cap.t_start:.1f} of {cap.duration:g} s recorded"
        return (
            f"pid {self.pid} is already capturing (asked for at {when}{by}): {progress}, "
            f"{cap.where()}{again}"
        )

    def _accepted(self, cap: capture_.Capture, timed: bool) -> str:
        if timed:
            return (
                f"pid {self.pid} records {cap.duration:g} s from now: a time window, as it "
                f"has found no step boundary since it was armed"
            )
        if cap.start_step is not None:
            return (
                f"pid {self.pid} records {cap.what()} from step {cap.start_step} (it is at "
                f"step {self.found})"
            )
        msg = f"pid {self.pid} records {cap.what()} from its next step boundary"
        if self.found == 0:
            why = "" if self._explicit else self.source.problem() or ""
            ago = time.time() - self._armed_at
            msg += (
                f"; it has found none in the {ago:.0f} s since it was armed (steps: "
                f"{self.status()['steps_from']}{': ' + why if why else ''}), so the capture "
                "starts at the first one; for a program without steps, ask for --duration S"
            )
        else:
            msg += f" (it is at step {self.found})"
        return msg
