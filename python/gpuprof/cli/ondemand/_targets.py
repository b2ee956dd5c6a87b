"""``gpuprof capture``'s targets: the armed processes of this user on this host, checked.

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
import os
import pwd
import shutil

from ...core import _ondemand_proto as proto

__all__ = ["CaptureError", "Target", "find_target", "job_targets", "list_targets"]


class CaptureError(Exception):
    """A capture cannot be asked for, or was refused: ``code`` is the exit code."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


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
