"""What an armed process and ``gpuprof capture`` share: folders, files, process checks.

Nothing but files passes between them (docs/on-demand.md, "How it works"). Every
file is JSON, written whole under a temporary name and renamed into place, so a
reader never sees half of one.

The runtime folder, ``/tmp/gpuprof-<uid>`` (``GPUPROF_RUNTIME_DIR`` replaces it, on
both sides), private to its user (mode 0700, checked before use):

``<pid>.json``
    the armed process's state: its pid and start time (so that a reused pid is
    never taken for it), its command line, the signal that wakes it (or none:
    it reads its requests every ``poll_interval_s``), its rank. Written when the
    process is armed, removed when it is disarmed or exits.
``<pid>.req.<rid>.json``
    a request to that process: ``capture``, ``query`` or ``cancel``.
``rep.<rid>/``
    the requester's reply folder. The armed process writes
    ``<host>_<pid>.reply.json`` when it has decided on the request and, for a
    capture whose requester waits, ``<host>_<pid>.done.json`` once the files are
    written; only while the folder exists, so a requester that has gone gets none.

A trigger folder shared by the ranks of a job (``--trigger-dir``) holds the same
requests as ``req.<rid>.json``, read by every armed process that watches it, and
the reply folders beside them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import stat
import time

from ._output import write_atomic

__all__ = [
    "VERSION",
    "runtime_dir",
    "state_path",
    "request_path",
    "reply_name",
    "new_request_id",
    "write_json",
    "read_json",
    "host",
    "ProcInfo",
    "parse_signal",
    "signal_name",
]

VERSION = 1


# -- folders and names ----------------------------------------------------------------------
def runtime_dir(create: bool = False) -> str:
    """The runtime folder of this user (``GPUPROF_RUNTIME_DIR`` or ``/tmp/gpuprof-<uid>``).

    Raises:
        OSError: it cannot be created, or it is not a private folder of this user
            (a symbolic link, another owner, or open to others), which gpuprof
            refuses to use.
    """
    path = os.environ.get("GPUPROF_RUNTIME_DIR") or f"/tmp/gpuprof-{os.getuid()}"
    if create:
        with contextlib.suppress(FileExistsError):
            os.makedirs(path, mode=0o700)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if create:
            raise
        return path
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"gpuprof's runtime folder {path!r} is not a folder; remove it")
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise OSError(
            f"gpuprof's runtime folder {path!r} is not private to this user (owner "
            f"uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); remove it or set "
            "GPUPROF_RUNTIME_DIR to a folder only you can write"
        )
    return path


def state_path(folder: str, pid: int) -> str:
    return os.path.join(folder, f"{pid}.json")


def request_path(folder: str, rid: str, pid: int | None = None) -> str:
    """A request to one pid (runtime folder), or to every watcher (trigger folder)."""
    name = f"{pid}.req.{rid}.json" if pid is not None else f"req.{rid}.json"
    return os.path.join(folder, name)


def reply_name(host_name: str, pid: int, done: bool = False) -> str:
    return f"{host_name}_{pid}.{'done' if done else 'reply'}.json"


def new_request_id() -> str:
    """Unique and ordered by time: ``<ns since epoch, hex>-<requester pid>-<random>``."""
    return f"{time.time_ns():x}-{os.getpid()}-{os.urandom(3).hex()}"


def host() -> str:
    return os.uname().nodename


# -- files ---------------------------------------------------------------------------------
def write_json(path: str, doc: dict, mode: int = 0o600) -> None:
    """Write ``doc`` to ``path`` whole: a temporary file renamed into place."""
    write_atomic(path, json.dumps(doc, indent=1).encode(), mode)


def read_json(path: str) -> dict | None:
    """The JSON object in ``path``; None if it is missing or not a JSON object."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


# -- processes -----------------------------------------------------------------------------
class ProcInfo:
    """What /proc says about a pid, read once. ``exists`` is False for a pid with
    no process (or a zombie: ``zombie`` then)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.exists = False
        self.zombie = False
        self.start_time: int | None = None  # clock ticks after boot (/proc/PID/stat field 22)
        self.uid: int | None = None
        self.argv: list[str] = []
        self.exe = ""
        self.caught = 0  # SigCgt: signals with a handler
        base = f"/proc/{pid}"
        try:
            with open(f"{base}/stat", "rb") as f:
                text = f.read().decode(errors="replace")
            self.uid = os.stat(base).st_uid
        except (FileNotFoundError, ProcessLookupError):
            return
        except OSError:
            return
        # the command name is in parentheses and may hold spaces or parentheses
        fields = text[text.rindex(")") + 2 :].split()
        self.zombie = fields[0] in ("Z", "X")
        self.exists = not self.zombie
        self.start_time = int(fields[19])
        with contextlib.suppress(OSError):
            with open(f"{base}/cmdline", "rb") as f:
                self.argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        with contextlib.suppress(OSError):
            self.exe = os.readlink(f"{base}/exe")
        with contextlib.suppress(OSError, ValueError):
            with open(f"{base}/status") as f:
                for line in f:
                    if line.startswith("SigCgt:"):
                        self.caught = int(line.split()[1], 16)

    @property
    def command(self) -> str:
        """The command line, shortened for a message."""
        text = shlex.join(self.argv) if self.argv else "?"
        return text if len(text) <= 80 else text[:77] + "..."

    @property
    def looks_like_python(self) -> bool:
        names = [os.path.basename(self.exe)] + [os.path.basename(a) for a in self.argv[:1]]
        return any(n.startswith(("python", "pypy")) for n in names)

    def catches(self, signum: int) -> bool:
        return bool(self.caught >> (signum - 1) & 1)


def own_start_time() -> int | None:
    return ProcInfo(os.getpid()).start_time


# -- signals -------------------------------------------------------------------------------
def _allowed_signals() -> dict[int, str]:
    out = {int(signal.SIGUSR1): "SIGUSR1", int(signal.SIGUSR2): "SIGUSR2"}
    rtmin, rtmax = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if rtmin is not None and rtmax is not None:
        for n in range(int(rtmin), int(rtmax) + 1):
            out[n] = "SIGRTMIN" if n == rtmin else f"SIGRTMIN+{n - rtmin}"
    return out


def signal_name(signum: int | None) -> str:
    return "none" if signum is None else _allowed_signals().get(signum, f"signal {signum}")


def parse_signal(value) -> int | None:
    """``"SIGUSR2"``, ``"USR1"``, ``"SIGRTMIN+3"``, a number, a ``signal.Signals``, or
    None/``"none"`` (no signal: requests are read every ``poll_interval_s``).

    Raises:
        ValueError: not one of SIGUSR1, SIGUSR2 or a real-time signal: any other
            signal has a meaning of its own that a trigger must not take over.
    """
    allowed = _allowed_signals()
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    if isinstance(value, bool):
        num = None
    elif isinstance(value, int):
        num = int(value)
    elif isinstance(value, str):
        text = value.strip().upper().replace(" ", "")
        if text.isdigit():
            num = int(text)
        else:
            text = text if text.startswith("SIG") else "SIG" + text
            num = next((n for n, name in allowed.items() if name == text), None)
    else:
        num = None
    if num is None or num not in allowed:
        raise ValueError(
            f"signal must be SIGUSR1, SIGUSR2, a real-time signal (SIGRTMIN+N) or "
            f"none, got {value!r}"
        )
    return num
