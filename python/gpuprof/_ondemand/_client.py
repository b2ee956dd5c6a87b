"""``gpuprof capture``: find armed processes, ask them for a capture, wait for the files.

Every check that can be made without the target is made before anything is
sent: the pid exists, belongs to this user, has a state file written by the
process that now has that pid (same start time), and still catches the signal
it was armed with. Only then is a request written and the signal sent; a
process armed without a signal (or whose handler the program replaced) gets no
signal and reads the request within its poll interval.

Functions raise :class:`CaptureError` with a message for the user and the exit
code: 2 for a target that cannot be asked (wrong pid, not armed, another
user's), 1 for one that answered no (busy, too late) or did not answer.
"""

from __future__ import annotations

import contextlib
import math
import os
import pwd
import shutil
import time

from . import _proto as proto

__all__ = [
    "CaptureError",
    "Target",
    "find_target",
    "job_targets",
    "list_targets",
    "Capture",
    "cancel",
]

POLL_S = 0.02  # how often the requester looks for answers
PREPARE_S = 60.0  # how long a process that has received a capture request may take to decide


class CaptureError(Exception):
    """A capture cannot be asked for, or was refused: ``code`` is the exit code."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


class _Late(CaptureError):
    """Every refusal was "already past the start step": asking again with more margin helps."""


ATTEMPTS = 3  # same-step requests refused as too late are asked again, with twice the margin


class Target:
    """An armed process of this user on this host, checked (see :func:`find_target`)."""

    def __init__(self, info: proto.ProcInfo, state: dict, runtime: str):
        self.pid = info.pid
        self.info = info
        self.state = state
        self.runtime = runtime
        self.host = str(state.get("host") or proto.host())
        job = state.get("job") or {}
        self.rank = job.get("rank")
        self.world_size = job.get("world_size")
        self.job_id = job.get("id")
        self.poll_s = float(state.get("poll_interval_s") or 1.0)

    @property
    def name(self) -> str:
        rank = f", rank {self.rank} of {self.world_size}" if self.rank is not None else ""
        return f"pid {self.pid} ({self.info.command}{rank})"

    @property
    def reply_file(self) -> str:
        return proto.reply_name(self.host, self.pid)

    def signal(self) -> int | None:
        """The signal to send, or None: armed without one, or the process no longer
        catches it (the program reset it, and the signal would end it). Without a
        signal the process still reads the request within its poll interval."""
        signum = self.state.get("signal")
        if signum is None:
            return None
        info = proto.ProcInfo(self.pid)
        if not info.catches(int(signum)):
            return None  # default action (often: end the process): never sent
        return int(signum)

    def alive(self) -> bool:
        info = proto.ProcInfo(self.pid)
        return info.exists and info.start_time == self.info.start_time


def _user(uid: int | None) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name!r} (uid {uid})"
    except (KeyError, TypeError):
        return f"uid {uid}"


def _how_to_arm() -> str:
    return (
        "start it with `python -m gpuprof run --on-demand SCRIPT ...` (docs/on-demand.md "
        "shows torchrun, other launchers and notebooks)"
    )


def find_target(pid: int) -> Target:
    """The armed process ``pid``, checked without sending it anything.

    Raises:
        CaptureError: no such process, a zombie, another user's, not armed (the
            message says whether it looks like Python at all).
    """
    info = proto.ProcInfo(pid)
    if info.zombie:
        raise CaptureError(
            f"pid {pid} has exited (a zombie waiting for its parent); nothing to capture"
        )
    if not info.exists:
        raise CaptureError(
            f"no process with pid {pid}; `python -m gpuprof capture --list` shows "
            "the armed processes"
        )
    if info.uid != os.getuid():
        raise CaptureError(
            f"pid {pid} ({info.command}) belongs to {_user(info.uid)}, not to you; "
            "nothing was sent to it. Run the capture as that user: gpuprof "
            "reaches only processes of its own user"
        )
    try:
        runtime = proto.runtime_dir()
    except OSError as e:
        raise CaptureError(str(e)) from None
    path = proto.state_path(runtime, pid)
    state = proto.read_json(path)
    stale = ""
    if state is not None and (
        state.get("pid") != pid or state.get("start_time") != info.start_time
    ):
        with contextlib.suppress(OSError):
            os.unlink(path)
        state, stale = (
            None,
            (
                " (the state file of an earlier process with the same pid was "
                "left behind; it is removed)"
            ),
        )
    if state is None:
        if not info.looks_like_python:
            raise CaptureError(
                f"pid {pid} ({info.command}) is not a Python program armed for "
                f"on-demand capture{stale}; nothing was sent to it. gpuprof "
                "captures Python programs armed with `python -m gpuprof run "
                "--on-demand`, gpuprof.arm() or GPUPROF_ON_DEMAND=1 "
                "(docs/on-demand.md)"
            )
        raise CaptureError(
            f"pid {pid} ({info.command}) is not armed for on-demand capture"
            f"{stale}; nothing was sent to it. To capture it later, " + _how_to_arm()
        )
    return Target(info, state, runtime)


def list_targets() -> list[Target]:
    """Every armed process of this user on this host, by pid; state files of processes
    that have gone are removed on the way."""
    try:
        runtime = proto.runtime_dir()
        names = os.listdir(runtime)
    except OSError:
        return []
    out = []
    for name in names:
        stem = name[:-5] if name.endswith(".json") else ""
        if not stem.isdigit():
            continue
        try:
            out.append(find_target(int(stem)))
        except CaptureError:
            continue
    _clean(runtime)
    return sorted(out, key=lambda t: t.pid)


def job_targets(target: Target) -> list[Target]:
    """The armed ranks on this host of the torchrun job ``target`` belongs to.

    Raises:
        CaptureError: ``target`` is not a rank of a job.
    """
    if target.job_id is None:
        raise CaptureError(
            f"--all-ranks: {target.name} is not a rank of a torchrun job (no RANK "
            "and WORLD_SIZE in its environment); name the pid of every rank"
        )
    return [t for t in list_targets() if t.job_id == target.job_id]


def _clean(runtime: str) -> None:
    """Remove what processes that have gone left behind: state files, requests to them,
    reply folders of requesters that have gone."""
    with contextlib.suppress(OSError):
        for name in os.listdir(runtime):
            pid = None
            if name.endswith(".json") and name.split(".")[0].isdigit():
                pid = int(name.split(".")[0])
            elif name.startswith("rep.") and name.count("-") >= 2:
                part = name.split("-")[1]
                pid = int(part) if part.isdigit() else None
            if pid is None or proto.ProcInfo(pid).exists:
                continue
            path = os.path.join(runtime, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)


# -- one exchange: a request, its replies, its results -------------------------------------------
class _Exchange:
    """A request to some targets (or to a trigger folder) and the folder for their answers."""

    def __init__(self, base: str, shared: bool):
        self.rid = proto.new_request_id()
        self.shared = shared
        self.base = base
        self.folder = os.path.join(base, f"rep.{self.rid}")
        os.mkdir(self.folder, 0o755 if shared else 0o700)
        self.sent: list[str] = []  # request files written

    def send_local(self, target: Target, doc: dict) -> None:
        path = proto.request_path(target.runtime, self.rid, target.pid)
        proto.write_json(path, {**doc, "id": self.rid})
        self.sent.append(path)
        signum = target.signal()
        if signum is not None:
            try:
                os.kill(target.pid, signum)
            except ProcessLookupError:
                pass  # gone meanwhile: no answer comes, the wait says so
            except PermissionError as e:
                raise CaptureError(f"cannot signal {target.name}: {e}") from None

    def send_shared(self, doc: dict) -> None:
        path = proto.request_path(self.base, self.rid)
        proto.write_json(path, {**doc, "id": self.rid}, 0o644)
        self.sent.append(path)

    def withdraw(self) -> list[str]:
        """Remove the request files still there; return those another process took."""
        taken = []
        for path in self.sent:
            try:
                os.unlink(path)
            except FileNotFoundError:
                taken.append(path)
            except OSError:
                pass
        self.sent = []
        return taken

    def answers(self, done: bool = False) -> dict[str, dict]:
        out = {}
        suffix = ".done.json" if done else ".reply.json"
        with contextlib.suppress(OSError):
            for name in os.listdir(self.folder):
                if name.endswith(suffix):
                    doc = proto.read_json(os.path.join(self.folder, name))
                    if doc is not None:
                        out[name[: -len(suffix)]] = doc
        return out

    def close(self) -> None:
        self.withdraw()
        shutil.rmtree(self.folder, ignore_errors=True)


def _wait_local(ex: _Exchange, targets: list[Target], timeout: float) -> dict[int, dict]:
    """The answers of ``targets``, by pid; CaptureError(1) naming those that gave none.

    A process answers "received" at once and decides after (a capture's first profile
    loads CUPTI, seconds on a busy machine): one that has received the request gets
    PREPARE_S more to decide. At the deadline the requests nobody has read are
    withdrawn, so that those processes never see them.
    """
    limit = timeout + max((t.poll_s for t in targets if t.signal() is None), default=0.0)
    deadline = time.monotonic() + limit
    want = {t.reply_file[: -len(".reply.json")]: t for t in targets}
    taken: list[str] = []
    withdrawn = False
    while True:
        got = ex.answers()
        final = {k: d for k, d in got.items() if k in want and d.get("state") != "received"}
        if len(final) == len(want):
            return {want[k].pid: final[k] for k in want}
        now = time.monotonic()
        if now > deadline:
            if withdrawn:
                break
            withdrawn = True
            taken = ex.withdraw()  # read meanwhile: those answer "received" right after
            waiting = any(k in got for k in want if k not in final)
            deadline = now + (PREPARE_S if waiting else 2.0 if taken else 0.0)
            continue
        time.sleep(POLL_S)
    got = ex.answers()
    silent = [t for k, t in want.items() if k not in final]
    gone = [t for t in silent if not t.alive()]
    if gone:
        raise CaptureError(f"{', '.join(t.name for t in gone)} exited before answering", code=1)
    names = ", ".join(t.name for t in silent)
    if any(k in got or want[k].pid in {_pid_of(p) for p in taken} for k in want if k not in final):
        raise CaptureError(
            f"{names} received the request but did not decide within "
            f"{limit + PREPARE_S:g} s; it may still start the capture, which "
            f"`python -m gpuprof capture PID --cancel` cancels until it starts",
            code=1,
        )
    raise CaptureError(
        f"no answer from {names} within {limit:g} s; the request was withdrawn and "
        "nothing will be captured. The program may be stuck in native code with "
        "its main thread (which runs signal handlers) busy; try again with a "
        "larger --timeout",
        code=1,
    )


def _pid_of(request_path: str) -> int | None:
    head = os.path.basename(request_path).split(".")[0]
    return int(head) if head.isdigit() else None


def _wait_shared(ex: _Exchange, timeout: float, expect: set[str] | None) -> dict[str, dict]:
    """Decisions from the trigger folder: those of ``expect``, or, when None, of every
    watcher that answers (all ranks of the job once the world size is known, else those
    that answer within two poll intervals of the first). A watcher that has answered
    "received" gets PREPARE_S more to decide."""
    deadline = time.monotonic() + timeout
    first_at = None
    extended = False
    while True:
        answers = ex.answers()
        got = {k: d for k, d in answers.items() if d.get("state") != "received"}
        pending = set(answers) - set(got)
        now = time.monotonic()
        if expect is not None:
            if expect <= set(got):
                break
        elif got and not pending:
            if first_at is None:
                first_at = now
            worlds = {d.get("world_size") for d in got.values()}
            world = worlds.pop() if len(worlds) == 1 else None
            if world is not None and len(got) >= world:
                break
            poll = max(float(d.get("poll_interval_s") or 1.0) for d in got.values())
            if world is None and now > first_at + 2 * poll + 1.0:
                break
        if now > deadline:
            if pending and not extended:
                extended = True
                deadline = now + PREPARE_S
            else:
                break
        time.sleep(POLL_S)
    ex.withdraw()
    return {k: d for k, d in ex.answers().items() if d.get("state") != "received"}


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
