"""The folder a parent and its children share, and how each side reads it.

``state``
    written by the parent only (atomically, by rename): one line
    ``version recording window alive flush``. ``window`` is the index of
    the parent's current (or next) recorded window; ``flush`` counts flush
    requests (the parent asks before terminating a child).
``<pid>.proc``
    a child's registration (JSON). The child holds an exclusive ``flock`` on
    it for as long as it lives; the lock goes with the process (death, kill,
    or exec), so the parent tells a live child from a gone one without
    signals, /proc or waitpid, and a zombie counts as gone.
``<pid>.ack``
    ``version done``: the last state version the child has seen; done is 0
    while it is still saving its piece for it, 1 when finished. A child must
    answer within ``ack_timeout_s()``; once it has, the parent waits up to
    ``work_timeout_s()`` for it to finish (aggregating and saving millions
    of events takes seconds).
``<pid>.<window>.<seq>.piece/``
    one piece of a child's recording (``_pieces``), renamed into place complete.

The readers here make C calls only: they may run while the hook records.
"""

from __future__ import annotations

import fcntl
import os

__all__ = [
    "POLL_S",
    "Ctx",
    "ack_timeout_s",
    "is_alive",
    "read_ack",
    "read_small",
    "read_state",
    "terminate_flush_s",
    "work_timeout_s",
]

POLL_S = 0.01  # how often a child reads the parent's state


def ack_timeout_s() -> float:
    """Seconds the parent waits at a window's end for its live children to answer
    (``GPUPROF_SUBPROCESS_TIMEOUT_S``, default 2)."""
    try:
        v = float(os.environ.get("GPUPROF_SUBPROCESS_TIMEOUT_S", "2"))
    except ValueError:
        return 2.0
    return v if v > 0 else 2.0


def terminate_flush_s() -> float:
    """Seconds Process.terminate() waits for a child to answer the request for its last
    piece before the child is killed (half the ack timeout: 1 s by default)."""
    return ack_timeout_s() / 2


def work_timeout_s() -> float:
    """Seconds the parent waits for a child that has answered to finish saving."""
    return 30.0 * ack_timeout_s()


class Ctx:
    """What every process of one session knows: the folder and the event budget."""

    __slots__ = ("dir", "state_path", "top_pid", "max_events")

    def __init__(self, folder: str, top_pid: int, max_events: int):
        self.dir = folder
        self.state_path = os.path.join(folder, "state")
        self.top_pid = top_pid
        self.max_events = max_events


def read_small(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_state(ctx: Ctx) -> tuple[int, int, int, int, int] | None:
    """(version, recording, window, alive, flush), or None when the parent is gone."""
    data = read_small(ctx.state_path)
    if not data:
        return None
    parts = data.split()
    if len(parts) != 5:
        return None
    try:
        v, rec, win, alive, flush = (int(p) for p in parts)
    except ValueError:
        return None
    return v, rec, win, alive, flush


def is_alive(folder: str, pid: int) -> bool:
    """Whether the child registered as `pid` still holds its registration lock."""
    try:
        fd = os.open(os.path.join(folder, f"{pid}.proc"), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # also drops our shared lock when we got it
    return False


def read_ack(folder: str, pid: int) -> tuple[int, int]:
    """(version, done) of a child's last answer; (-1, 0) before any."""
    data = read_small(os.path.join(folder, f"{pid}.ack"))
    try:
        v, done = data.split() if data else (b"-1", b"0")
        return int(v), int(done)
    except ValueError:
        return -1, 0
