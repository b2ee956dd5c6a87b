"""``gpuprof capture``: find armed processes, ask them for a capture, wait for the files.

The targets and their checks are ``_targets``'s; one request and its answers
``_exchange``'s. This module agrees on a start step, judges the answers and
waits for the files. Failures raise :class:`CaptureError` (``_targets`` says
what its exit codes mean).
"""

from __future__ import annotations

import contextlib
import math
import os
import time

from ._exchange import POLL_S, _Exchange, _wait_local, _wait_shared
from ._targets import CaptureError, Target, find_target, job_targets, list_targets

__all__ = [
    "CaptureError",
    "Target",
    "find_target",
    "job_targets",
    "list_targets",
    "Capture",
    "cancel",
]


class _Late(CaptureError):
    """Every refusal was "already past the start step": asking again with more margin helps."""


ATTEMPTS = 3  # same-step requests refused as too late are asked again, with twice the margin


def _settled(statuses: list[dict]) -> bool:
    """Every rank has found a step (a job that has just started has not) and none is
    still undoing an earlier attempt of this same request (it stops at its next step)."""
    return all(s.get("found") for s in statuses) and not any(
        s.get("state") != "idle" and s.get("requested_by") == os.getpid() for s in statuses
    )


def _start_step(statuses: list[dict], latency_s: float, factor: float) -> int:
    """The step every rank starts at: past where the furthest rank can be, at the
    fastest rate any rank has stepped at lately, once ``latency_s`` has passed (the
    time for the request to reach them all); at least 2 * ``factor`` steps ahead."""
    rate = max([float(s.get("rate") or 0.0) for s in statuses] + [0.0])
    ahead = max(math.ceil(2 * factor), math.ceil(rate * latency_s))
    return max(s["found"] for s in statuses) + ahead + 1


class Capture:
    """A capture asked of one process, of the ranks of a job, or through a trigger folder.

    :meth:`start` sends the request and returns once every target has answered
    (accepted, or CaptureError); :meth:`wait` then blocks until the files are
    written. ``accepted`` holds the answers (``message``, ``output``, ``pid``,
    ``rank``...), ``done`` the results.
    """

    def __init__(
        self,
        *,
        steps: int | None,
        duration: float | None,
        output: str,
        memory: bool,
        wait: bool,
        timeout: float,
    ):
        self.req = {
            "op": "capture",
            "steps": steps,
            "duration": duration,
            "output": os.path.abspath(output),
            "memory": memory,
            "wait": wait,
            "requested_by": os.getpid(),
        }
        self.timeout = timeout
        self.targets: list[Target] = []
        self.accepted: list[dict] = []
        self.done: list[dict] = []
        self.notes: list[str] = []
        self._ex: _Exchange | None = None
        self._shared = False

    # -- local processes ----------------------------------------------------------------------
    def start(self, targets: list[Target], same_step: bool) -> None:
        self.targets = targets
        base = targets[0].runtime
        for attempt in range(ATTEMPTS):
            start_step = None
            if same_step:
                start_step = self._agree_local(targets, base, 2**attempt)
            ex = self._ex = _Exchange(base, shared=False)
            for t in targets:
                ex.send_local(t, {**self.req, "start_step": start_step})
                if attempt == 0 and t.state.get("signal") is not None and t.signal() is None:
                    self.notes.append(
                        f"{t.name} no longer catches "
                        f"{t.state.get('signal_name')} (the program reset it), "
                        "so it was not signalled; it reads the request within "
                        f"{t.poll_s:g} s"
                    )
            try:
                replies = _wait_local(ex, targets, self.timeout)
            except BaseException:
                ex.close()
                raise
            try:
                self._judge(list(replies.values()), cancel=self._cancel_local)
                return
            except _Late:
                if attempt == ATTEMPTS - 1:
                    raise

    def _agree_local(self, targets: list[Target], base: str, factor: float) -> int:
        deadline = time.monotonic() + self.timeout
        while True:
            ex = _Exchange(base, shared=False)
            try:
                t0 = time.monotonic()
                for t in targets:
                    ex.send_local(t, {"op": "query"})
                replies = _wait_local(ex, targets, self.timeout)
                rtt = time.monotonic() - t0
            finally:
                ex.close()
            statuses = [replies[t.pid] for t in targets]
            if _settled(statuses) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        polled = max((t.poll_s for t in targets if t.signal() is None), default=0.0)
        return self._agree(statuses, factor * (max(1.0, 3 * rtt) + polled), factor)

    def _cancel_local(self, docs: list[dict], abort: bool = True) -> None:
        """Undo this request where it was accepted: cancelled, or, with ``abort``, where
        it has started already, stopped at the next step boundary with nothing written."""
        by_pid = {t.pid: t for t in self.targets}
        ex = _Exchange(self.targets[0].runtime, shared=False)
        try:
            targets = [by_pid[d["pid"]] for d in docs if d.get("pid") in by_pid]
            for t in targets:
                ex.send_local(t, {"op": "cancel", "target": self._ex.rid, "abort": abort})
            with contextlib.suppress(CaptureError):
                _wait_local(ex, targets, self.timeout)
        finally:
            ex.close()

    # -- a trigger folder -------------------------------------------------------------------------
    def start_shared(self, trigger_dir: str) -> None:
        self._shared = True
        for attempt in range(ATTEMPTS):
            try:
                self._start_shared(trigger_dir, 2**attempt)
                return
            except _Late:
                if attempt == ATTEMPTS - 1:
                    raise

    def _start_shared(self, trigger_dir: str, factor: float) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            ex = _Exchange(trigger_dir, shared=True)
            try:
                t0 = time.monotonic()
                ex.send_shared({"op": "query"})
                got = _wait_shared(ex, self.timeout, None)
                rtt = time.monotonic() - t0
            finally:
                ex.close()
            if not got or _settled(list(got.values())) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if not got:
            raise CaptureError(
                f"--trigger-dir: no armed process watches {trigger_dir!r} (none "
                f"answered within {self.timeout:g} s); arm the ranks with "
                f"--trigger-dir {trigger_dir} (or GPUPROF_TRIGGER_DIR)",
                code=1,
            )
        statuses = list(got.values())
        worlds = {s.get("world_size") for s in statuses}
        if len(worlds) == 1 and None not in worlds and len(statuses) < worlds.copy().pop():
            self.notes.append(
                f"only {len(statuses)} of the {worlds.pop()} ranks answered; "
                "the others are not armed with this --trigger-dir, or did not "
                f"answer within {self.timeout:g} s"
            )
        poll = max(float(s.get("poll_interval_s") or 1.0) for s in statuses)
        start_step = self._agree(statuses, factor * (max(1.0, 2 * rtt) + 2 * poll), factor)
        ex = self._ex = _Exchange(trigger_dir, shared=True)
        ex.send_shared({**self.req, "start_step": start_step})
        try:
            replies = _wait_shared(ex, self.timeout + 2 * poll, set(got))
        except BaseException:
            ex.close()
            raise
        missing = set(got) - set(replies)
        if missing:
            self.notes.append(f"no answer from {', '.join(sorted(missing))} to the capture request")
        self._judge(
            list(replies.values()), cancel=lambda docs: self._cancel_shared(trigger_dir, docs)
        )

    def _cancel_shared(self, trigger_dir: str, docs: list[dict], abort: bool = True) -> None:
        ex = _Exchange(trigger_dir, shared=True)
        try:
            ex.send_shared({"op": "cancel", "target": self._ex.rid, "abort": abort})
            _wait_shared(ex, self.timeout, {f"{d['host']}_{d['pid']}" for d in docs})
        finally:
            ex.close()

    # -- common -----------------------------------------------------------------------------------
    def _agree(self, statuses: list[dict], latency_s: float, factor: float) -> int:
        for s in statuses:
            if s.get("state") != "idle":
                raise CaptureError(f"{s['message']} (on {s['host']})", code=1)
            if not s.get("found"):
                raise CaptureError(
                    f"pid {s['pid']} on {s['host']} has found no step since it "
                    f"was armed (step boundaries: {s.get('steps_from')}); "
                    "--all-ranks and --trigger-dir start the ranks at one step "
                    "number, so they need steps",
                    code=1,
                )
        found = [s["found"] for s in statuses]
        rate = max([float(s.get("rate") or 0.0) for s in statuses] + [0.0])
        if max(found) - min(found) > 2 + rate * latency_s:
            self.notes.append(
                f"the ranks are at steps {min(found)} to {max(found)}: steps are "
                "counted from arming, so ranks armed at different times start "
                "at one step number that is not one step of training"
            )
        return _start_step(statuses, latency_s, factor)

    def _judge(self, replies: list[dict], cancel) -> None:
        refused = [r for r in replies if not r.get("ok")]
        if refused:
            accepted = [r for r in replies if r.get("ok")]
            if accepted:
                cancel(accepted)
            self._ex.close()
            lines = [r.get("message", "refused") for r in refused]
            if all(r.get("state") == "late" for r in refused):
                raise _Late(
                    "; ".join(lines) + f" (asked {ATTEMPTS} times, each with more "
                    "margin; the steps are faster than the requests reach the ranks)",
                    code=1,
                )
            hint = ""
            if accepted:
                hint = f" (the request to the other {len(accepted)} was cancelled)"
            raise CaptureError("; ".join(lines) + hint, code=1)
        self.accepted = sorted(
            replies,
            key=lambda r: (r.get("rank") is None, r.get("rank"), r.get("host"), r.get("pid")),
        )

    def wait(self, progress=None) -> list[dict]:
        """Block until every accepted capture is written (or its process has gone)."""
        ex = self._ex
        by_pid = {t.pid: t for t in self.targets}
        want = {f"{r['host']}_{r['pid']}": r for r in self.accepted}
        gone: dict[str, dict] = {}
        last_check = 0.0
        try:
            while True:
                got = ex.answers(done=True)
                if set(want) <= set(got) | set(gone):
                    break
                now = time.monotonic()
                if now - last_check > 0.5 and not self._shared:
                    last_check = now
                    for key, r in want.items():
                        t = by_pid.get(r["pid"])
                        if key not in got and t is not None and not t.alive():
                            gone[key] = {
                                **r,
                                "ok": False,
                                "error": "the process exited before writing the files",
                            }
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            self._cancel_unstarted(want, ex.answers(done=True))
            raise
        got = ex.answers(done=True)
        self.done = [got.get(k) or gone[k] for k in want]
        ex.close()
        return self.done

    def _cancel_unstarted(self, want: dict, got: dict) -> None:
        pending = [r for k, r in want.items() if k not in got]
        if not pending:
            return
        with contextlib.suppress(CaptureError, OSError):  # one that has started goes on
            if self._shared:
                self._cancel_shared(self._ex.base, pending, abort=False)
            else:
                self._cancel_local(pending, abort=False)

    def close(self) -> None:
        if self._ex is not None:
            self._ex.close()


def cancel(targets: list[Target], timeout: float) -> list[dict]:
    """Cancel the capture waiting to start in each target; their answers."""
    ex = _Exchange(targets[0].runtime, shared=False)
    try:
        for t in targets:
            ex.send_local(t, {"op": "cancel", "target": "*"})
        replies = _wait_local(ex, targets, timeout)
    finally:
        ex.close()
    return [replies[t.pid] for t in targets]
