"""Child-process profiling for ``gpuprof.profile(subprocesses=True)`` (docs/subprocesses.md).

The parent and its children share nothing but a private folder:

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
    one piece of a child's recording: the raw window dict of the child's own
    C session, one ``.npy`` per array (no pickle) and ``meta.json`` for the
    names and scalars; renamed into place complete. The parent memory-maps
    the large arrays (spans), so reading a piece costs little until it is used.

Each child runs its own C session (CPU only; it never touches the parent's
buffers) and a poll thread that reads ``state`` every ``POLL_S`` seconds:
it records while the parent records, saves a piece whenever the parent's
window ends or a flush is asked for, and answers with an ack. At a window's
end the parent waits (at most ``ack_timeout_s()``) for the acks of the live
children, then reads the pieces of that window.

Children are reached three ways: forked children through
``os.register_at_fork``; spawn and forkserver children through one extra
entry in multiprocessing's preparation data, whose unpickling in the child
starts its session before the child's ``__main__`` is imported; and exits
through multiprocessing's finalizers (workers leave with ``os._exit``) and
``atexit``.
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import fcntl
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import warnings

import numpy as np

from . import _gpuprof, _monitoring
from ._constants import ACT_RECORD as _RECORD
from ._constants import ACT_RECORD_AND_SAVE as _RECORD_AND_SAVE
from ._output import write_atomic
from .schedule import Schedule

__all__ = ["ParentSession", "load_piece", "POLL_S"]

POLL_S = 0.01  # how often a child reads the parent's state
_PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# This process's view. GIL (and, in a child, _Child.lock for the session itself).
_CTX: _Ctx | None = None  # the shared folder while a session with subprocesses runs
_CHILD: _Child | None = None  # this process's own child session, if it is a child
_FORK_HOOK = False  # os.register_at_fork done (once per process)


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


class _Ctx:
    """What every process of one session knows: the folder and the event budget."""

    __slots__ = ("dir", "state_path", "top_pid", "max_events")

    def __init__(self, folder: str, top_pid: int, max_events: int):
        self.dir = folder
        self.state_path = os.path.join(folder, "state")
        self.top_pid = top_pid
        self.max_events = max_events


# ---- small file helpers (C calls only: they may run while the hook records) --------


def _read_small(path: str) -> bytes | None:
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


def _read_state(ctx: _Ctx) -> tuple[int, int, int, int, int] | None:
    """(version, recording, window, alive, flush), or None when the parent is gone."""
    data = _read_small(ctx.state_path)
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


def _is_alive(folder: str, pid: int) -> bool:
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


def _read_ack(folder: str, pid: int) -> tuple[int, int]:
    """(version, done) of a child's last answer; (-1, 0) before any."""
    data = _read_small(os.path.join(folder, f"{pid}.ack"))
    try:
        v, done = data.split() if data else (b"-1", b"0")
        return int(v), int(done)
    except ValueError:
        return -1, 0


# ---- pieces --------------------------------------------------------------------------


def _process_name() -> str:
    mp = sys.modules.get("multiprocessing.process")
    if mp is not None:
        with contextlib.suppress(Exception):
            return str(mp.current_process().name)
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    return os.path.basename(argv0) or "python"


_MMAP_BYTES = 1 << 20  # arrays at least this large are memory-mapped when read back


def _save_piece(path: str, raw: dict, meta: dict) -> None:
    """Write one window dict as a folder: one ``.npy`` per array (no pickle) and
    ``meta.json`` for the rest. The folder appears at ``path`` complete or not at all."""
    tmp = f"{path}.tmp"
    scalars = {}
    try:
        os.mkdir(tmp)
        for key, value in raw.items():
            if isinstance(value, np.ndarray):
                np.save(os.path.join(tmp, f"{key}.npy"), value, allow_pickle=False)
            else:
                scalars[key] = value
        doc = dict(meta)
        doc["raw"] = scalars
        # ensure_ascii keeps lone surrogates of odd file names intact through json.loads
        with open(os.path.join(tmp, "meta.json"), "w", encoding="ascii") as f:
            json.dump(doc, f, ensure_ascii=True)
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_piece(path: str) -> tuple[dict, dict]:
    """Read a piece written by a child: (raw window dict, meta). Large arrays (the
    spans) are memory-mapped, read-only: reading costs nothing until they are used.

    Raises:
        ValueError: the folder is not a complete piece (truncated, foreign, damaged).
        OSError: it cannot be read.
    """
    name = os.path.basename(path)
    try:
        with open(os.path.join(path, "meta.json"), encoding="ascii") as f:
            doc = json.load(f)
        raw = dict(doc.pop("raw"))
        for entry in os.listdir(path):
            if not entry.endswith(".npy"):
                continue
            file = os.path.join(path, entry)
            big = os.path.getsize(file) >= _MMAP_BYTES
            arr = np.load(file, mmap_mode="r" if big else None, allow_pickle=False)
            arr.flags.writeable = False
            raw[entry[:-4]] = arr
    except FileNotFoundError as e:
        raise ValueError(f"{name}: missing {os.path.basename(e.filename or '?')}") from None
    except (ValueError, KeyError, EOFError, TypeError, AttributeError, UnicodeError) as e:
        raise ValueError(f"{name}: {type(e).__name__}: {e}") from None
    for key in (
        "ops",
        "nodes",
        "kernels",
        "gpu",
        "steps",
        "spans",
        "threads",
        "op_names",
        "op_files",
        "op_lines",
        "kernel_names",
        "window_start_ns",
        "window_end_ns",
        "dropped_events",
    ):
        if key not in raw:
            raise ValueError(f"{name}: missing {key!r}")
    return raw, doc


# ---- the child side ----------------------------------------------------------------


class _Child:
    """This process's own session, driven by the parent's state file."""

    def __init__(self, ctx: _Ctx, how: str):
        self.ctx = ctx
        self.how = how
        self.pid = os.getpid()
        self.lock = _thread.allocate_lock()  # session and files: poll thread vs exit
        self.closed = False  # lock
        self.recording = False  # lock: the C session runs
        self.rec_win = -1  # lock: parent window being recorded
        self.seen_v = -1  # lock: last state version acted on
        self.seen_flush = 0  # lock
        self.seq = 0  # lock: pieces written
        self.reg_fd = -1
        # the same hook backend as a profile in this process would use (sys.monitoring
        # on 3.12+ unless GPUPROF_HOOK says otherwise)
        self.monitoring = _monitoring.use_monitoring()
        self.core = _gpuprof.Profiler(
            max_events=ctx.max_events,
            cuda=False,
            memory=False,
            schedule=None,
            schedule_fn=None,
            on_trace_ready=None,
            owner=None,
            monitoring=self.monitoring,
        )

    # -- lifecycle -------------------------------------------------------------------
    def register(self) -> bool:
        path = os.path.join(self.ctx.dir, f"{self.pid}.proc")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError:
            return False  # the parent's session is over
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            info = {
                "pid": self.pid,
                "ppid": os.getppid(),
                "how": self.how,
                "created_ns": _gpuprof.clock_ns(),
            }
            os.write(fd, json.dumps(info).encode())
        except OSError:
            os.close(fd)
            return False
        self.reg_fd = fd
        return True

    def begin(self) -> None:
        """Start recording at once when the parent records, then hand over to the
        poll thread. Runs on the thread that forked (or unpickled the spawn data)."""
        st = _read_state(self.ctx)
        with self.lock:
            if st is not None:
                self._apply(st, from_poll=False)
        _thread.start_new_thread(self._poll, ())
        atexit.register(self.exit_flush)
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:
            # A multiprocessing child clears its finalizers at bootstrap and then runs
            # the after-fork callbacks: register the exit flush from there.
            mp_util.register_after_fork(self, _register_finalizer)

    def exit_flush(self) -> None:
        """Process exit: save what is being recorded; idempotent."""
        if not self.lock.acquire(timeout=5.0):
            return
        try:
            if self.closed:
                return
            self.closed = True
            self._stop_and_save()
        finally:
            self.lock.release()

    # -- recording ---------------------------------------------------------------------
    def _start(self, win: int, from_poll: bool) -> None:
        if self.monitoring:
            # interpreter-wide; the poll thread's own calls are gpuprof's frames and
            # C calls made from them, which the aggregation leaves out
            _monitoring.install()
            try:
                self.core.start()
            except BaseException:
                _monitoring.uninstall()
                raise
        else:
            if not from_poll:
                threading.setprofile(_gpuprof._thread_bootstrap)
            self.core.start()
            if from_poll:
                # The poll thread is gpuprof's, not the program's: keep it out of the data.
                sys.setprofile(None)
                threading.setprofile(_gpuprof._thread_bootstrap)
        self.recording = True
        self.rec_win = win

    def _stop(self) -> dict | None:
        self.recording = False
        try:
            self.core.stop()
        finally:
            if self.monitoring:
                _monitoring.uninstall()
            else:
                threading.setprofile(None)
        return self.core.result

    def _stop_and_save(self, restart_win: int | None = None) -> None:
        if not self.recording:
            return
        win = self.rec_win
        raw = self._stop()
        if restart_win is not None:
            self._start(restart_win, from_poll=True)
        if raw is not None:
            self._write(raw, win)

    def _write(self, raw: dict, win: int) -> None:
        self.seq += 1
        meta = {
            "pid": self.pid,
            "ppid": os.getppid(),
            "how": self.how,
            "window": win,
            "seq": self.seq,
            "process_name": _process_name(),
        }
        path = os.path.join(self.ctx.dir, f"{self.pid}.{win}.{self.seq}.piece")
        _gpuprof._complete_window(raw)  # the spans, from the events a CPU window keeps
        with contextlib.suppress(OSError):
            _save_piece(path, raw, meta)

    def _ack(self, v: int, done: int) -> None:
        with contextlib.suppress(OSError):
            write_atomic(os.path.join(self.ctx.dir, f"{self.pid}.ack"), f"{v} {done}".encode())

    def _apply(self, st, from_poll: bool) -> None:
        v, rec, win, alive, flush = st
        want = bool(rec and alive)
        if self.recording and (not want or win != self.rec_win or flush != self.seen_flush):
            if from_poll:
                self._ack(v, 0)  # answered; saving may take a while
            self._stop_and_save(restart_win=win if want else None)
        elif want and not self.recording:
            self._start(win, from_poll)
        self.seen_flush = flush
        self.seen_v = v
        if not alive:
            self.closed = True

    def _poll(self) -> None:
        global _CTX
        sys.setprofile(None)
        while True:
            time.sleep(POLL_S)
            st = _read_state(self.ctx)
            with self.lock:
                if self.closed:
                    return
                if st is None:  # the parent's session ended and its folder is gone
                    self.closed = True
                    if self.recording:
                        with contextlib.suppress(Exception):
                            self._stop()
                    if _CTX is self.ctx:
                        _CTX = None
                    return
                if st[0] == self.seen_v:
                    continue
                try:
                    self._apply(st, from_poll=True)
                except Exception:  # never take the program down; stop profiling instead
                    self.closed = True
                    if self.recording:
                        with contextlib.suppress(Exception):
                            self._stop()
                    return
                if self.closed:  # the session is over: nobody waits, the folder is going
                    return
                self._ack(st[0], 1)


def _register_finalizer(child: _Child) -> None:
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        # exitpriority < 0: after the child's own children are joined
        mp_util.Finalize(None, child.exit_flush, exitpriority=-100)


def _boot(ctx: _Ctx, how: str) -> None:
    """Start this process's child session (idempotent per process)."""
    global _CTX, _CHILD
    old = _CHILD
    if old is not None and old.pid == os.getpid():
        return
    if old is not None and old.reg_fd >= 0:
        # a grandchild: the parent's registration lock must stay the parent's
        with contextlib.suppress(OSError):
            os.close(old.reg_fd)
        old.reg_fd = -1
    _CHILD = None
    _CTX = ctx
    _install_fork_hook()
    child = _Child(ctx, how)
    if not child.register():
        _CTX = None
        return
    _CHILD = child
    child.begin()


def _after_fork_in_child() -> None:
    ctx = _CTX
    if ctx is None:
        return
    caller = sys._getframe(1)
    if (
        caller.f_code.co_name == "_execute_child"
        and caller.f_globals.get("__name__") == "subprocess"
    ):
        return  # subprocess.Popen(preexec_fn=...): this child is about to exec another program
    try:
        _boot(ctx, "fork")
    except Exception as e:  # a child must run even if it cannot be profiled
        with contextlib.suppress(Exception):
            sys.stderr.write(f"gpuprof: child process {os.getpid()} is not profiled: {e}\n")


def _install_fork_hook() -> None:
    # Registered after gpuprof's own after-fork handler (at import), so in a child
    # the parent's session is dropped before this one starts.
    global _FORK_HOOK
    if not _FORK_HOOK:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _FORK_HOOK = True


def _boot_spawned(folder: str, top_pid: int, max_events: int, how: str = "spawn") -> None:
    """Entry point run in a spawn/forkserver child while multiprocessing unpickles
    its preparation data (before the child's __main__ is imported)."""
    if not os.path.isdir(folder):
        return
    _boot(_Ctx(folder, top_pid, max_events), how)


class _SpawnBoot:
    """Unpickles in the child as a call of _boot_spawned (through exec, so the child
    needs nothing importable before gpuprof's folder is on its path)."""

    def __init__(self, ctx: _Ctx, how: str):
        self.ctx = ctx
        self.how = how

    def __reduce__(self):
        src = (
            "try:\n"
            "    import sys as _s\n"
            f"    _s.path.insert(0, {_PKG_PARENT!r})\n"
            "    try:\n"
            "        import gpuprof._subprocess as _g\n"
            "    finally:\n"
            f"        if _s.path and _s.path[0] == {_PKG_PARENT!r}:\n"
            "            del _s.path[0]\n"
            f"    _g._boot_spawned({self.ctx.dir!r}, {self.ctx.top_pid}, {self.ctx.max_events}, "
            f"{self.how!r})\n"
            "except Exception as _e:\n"
            "    import sys as _s\n"
            "    _s.stderr.write('gpuprof: spawned child is not profiled: %r\\n' % (_e,))\n"
        )
        return (exec, (src, {}))


# ---- multiprocessing patches (installed while a parent session runs) ---------------

_PATCHES: list[tuple[object, str, object]] = []  # (owner, attribute, original)


def _wrap_preparation_data(orig):
    def get_preparation_data(name, *args, **kwargs):
        d = orig(name, *args, **kwargs)
        ctx = _CTX
        if ctx is not None and isinstance(d, dict):
            # the caller is Popen._launch of popen_spawn_posix or popen_forkserver,
            # whose class says which start method it is
            caller = sys._getframe(1).f_locals.get("self")
            method = getattr(caller, "method", None)
            d["gpuprof_subprocess"] = _SpawnBoot(
                ctx, method if method in ("spawn", "forkserver") else "spawn"
            )
        return d

    get_preparation_data._gpuprof_orig = orig
    return get_preparation_data


def _wrap_terminate(orig):
    def terminate(self, *args, **kwargs):
        parent = _PARENT
        if parent is not None and getattr(self, "returncode", 0) is None:
            with contextlib.suppress(Exception):
                parent.flush_before_terminate(int(self.pid))
        return orig(self, *args, **kwargs)

    terminate._gpuprof_orig = orig
    return terminate


def _patch() -> None:
    import multiprocessing.popen_fork as popen_fork
    import multiprocessing.spawn as spawn

    for owner, attr, wrap in (
        (spawn, "get_preparation_data", _wrap_preparation_data),
        (popen_fork.Popen, "terminate", _wrap_terminate),
    ):
        cur = getattr(owner, attr)
        if getattr(cur, "_gpuprof_orig", None) is not None:
            continue  # already ours (a second session in a child)
        setattr(owner, attr, wrap(cur))
        _PATCHES.append((owner, attr, cur))


def _unpatch() -> None:
    while _PATCHES:
        owner, attr, orig = _PATCHES.pop()
        cur = getattr(owner, attr, None)
        if getattr(cur, "_gpuprof_orig", None) is orig:
            setattr(owner, attr, orig)


# ---- the parent side ---------------------------------------------------------------

_PARENT: ParentSession | None = None  # GIL: the running parent session of this process


class ChildWindow:
    """One child's data for one of the parent's windows."""

    __slots__ = ("pid", "ppid", "how", "name", "status", "pieces")

    def __init__(self, pid: int, ppid: int, how: str, name: str, status: str, pieces: list):
        self.pid = pid
        self.ppid = ppid
        self.how = how
        self.name = name
        self.status = status  # "ok", "exited", "lost", "timeout"
        self.pieces = pieces  # raw window dicts, in recording order


class ParentSession:
    """The parent's half: state file, waiting for children, reading their pieces.

    Created by ``profile`` (subprocesses=True); every method is a no-op in a
    forked copy of the parent (a child sees the parent's ``profile`` object too).
    """

    def __init__(self, prof):
        self.prof = prof
        self.pid = os.getpid()
        self.ctx: _Ctx | None = None
        self.v = 0
        self.rec = 0
        self.win = 0  # index of the parent's current/next recorded window
        self.flush = 0
        self.flush_v = -1  # state version of the last flush request
        self.handled = 0  # parent windows whose children were collected
        self.by_raw: dict[int, tuple[dict, list[ChildWindow]]] = {}
        self.skipped = 0  # child pieces that could not be read, over the session
        self.late = 0  # pieces that arrived after their window was collected
        self.stopping = False  # profile.stop() is closing the last window

    def _mine(self) -> bool:
        return self.ctx is not None and os.getpid() == self.pid

    # -- lifecycle (profile.start / stop) -------------------------------------------------
    def begin(self) -> None:
        """Before the C session starts: folder, state, hooks."""
        global _CTX, _PARENT
        if _PARENT is not None and _PARENT is not self and _PARENT._mine():
            raise RuntimeError(
                "profile(subprocesses=True): another profile with subprocesses "
                "is running in this process; stop it first"
            )
        self.pid = os.getpid()
        folder = tempfile.mkdtemp(prefix="gpuprof-children-")
        self.ctx = _Ctx(folder, self.pid, self.prof.max_events)
        self.v = self.rec = self.win = self.flush = 0
        self.flush_v = -1
        self.handled = self.prof._core.windows
        self.by_raw = {}
        self.skipped = self.late = 0
        self.stopping = False
        # children forked at once must know whether step 0 records
        self._write_state(rec=int(bool(self._records_at(0))))
        _install_fork_hook()
        _patch()
        _CTX = self.ctx
        _PARENT = self

    def started(self) -> None:
        """After the C session started: tell children whether it records."""
        if self._mine():
            self.sync()

    def end(self) -> None:
        """After the C session stopped (its last window collected)."""
        global _CTX, _PARENT
        if not self._mine():
            return
        self.after_step()
        with contextlib.suppress(OSError):
            self._write_state(rec=0, alive=0)
        _unpatch()
        if _CTX is self.ctx:
            _CTX = None
        if _PARENT is self:
            _PARENT = None
        # a child may still be answering or saving as the folder goes: try again
        for _ in range(50):
            shutil.rmtree(self.ctx.dir, ignore_errors=True)
            if not os.path.exists(self.ctx.dir):
                break
            time.sleep(0.01)
        self.ctx = None

    # -- state -----------------------------------------------------------------------------
    def _write_state(self, rec: int, alive: int = 1) -> int:
        self.v += 1
        self.rec = rec
        write_atomic(
            self.ctx.state_path, f"{self.v} {rec} {self.win} {alive} {self.flush}\n".encode()
        )
        return self.v

    def _records_at(self, step: int) -> bool | None:
        """Whether the parent's schedule records `step`; None when only the schedule
        callable knows (it is called once per step, by the C core, and may keep state)."""
        if getattr(self.prof, "capture", None):
            return None  # capture ranges (docs/nvtx.md) open windows without steps
        sched = self.prof.schedule
        if sched is None:
            return True
        if isinstance(sched, Schedule):
            return int(sched(step)) in (_RECORD, _RECORD_AND_SAVE)
        return None

    def before_step(self) -> None:
        """Before a parent step that starts recording: children start first, so their
        recording covers the parent's window (the wait is outside it)."""
        if not self._mine() or self.rec:
            return
        if self._records_at(self.prof._core.step_num + 1):
            self._forget_gone_children()
            try:
                v = self._write_state(rec=1)
            except OSError as e:
                self._lost_folder(e)
                return
            self._wait_for_children(v, ack_timeout_s())

    def sync(self) -> None:
        """After a parent step: the window may have ended without on_trace_ready
        (a schedule going from RECORD straight to NONE), and recording may have
        started or stopped."""
        if not self._mine():
            return
        self.after_step()
        rec = int(self.prof._core.action in (_RECORD, _RECORD_AND_SAVE))
        if rec != self.rec:
            if rec:
                self._forget_gone_children()
            try:
                self._write_state(rec=rec)
            except OSError as e:
                self._lost_folder(e)

    def after_step(self) -> None:
        core = self.prof._core
        if core.windows > self.handled:
            self.window_ended(core.result)

    # -- the parent's window ended (profile._window_ready) -------------------------------
    def window_ended(self, raw: dict | None) -> None:
        if not self._mine():
            return
        self.handled = self.prof._core.windows
        ended = self.win
        self.win += 1
        # a window that follows at once: children save this one and go on recording
        rec_next = int(not self.stopping and bool(self._records_at(self.prof._core.step_num)))
        try:
            v = self._write_state(rec=rec_next)
        except OSError as e:
            self._lost_folder(e)
            children = []
        else:
            timed_out = self._wait_for_children(v, ack_timeout_s())
            children = self._collect(ended, timed_out)
        if raw is not None:
            keep = {id(w) for w in self.prof._windows}
            keep.add(id(raw))
            self.by_raw = {k: e for k, e in self.by_raw.items() if k in keep}
            self.by_raw[id(raw)] = (raw, children)

    def _lost_folder(self, e: OSError) -> None:
        # Someone removed our temporary folder: the children stop on their own
        # (no state file); the main process keeps profiling.
        warnings.warn(
            f"gpuprof: child processes are no longer profiled: cannot write "
            f"{self.ctx.state_path!r} ({e.strerror or e})",
            RuntimeWarning,
            stacklevel=3,
        )

    def _registered(self) -> list[int]:
        out = []
        try:
            names = os.listdir(self.ctx.dir)
        except OSError:
            return out
        for n in names:
            stem, dot, ext = n.partition(".")
            if ext == "proc" and stem.isdigit():
                out.append(int(stem))
        return sorted(out)

    def _wait_for_children(self, v: int, timeout: float) -> set[int]:
        """Wait until every live child has finished acting on state version `v`: at
        most `timeout` for its answer, then at most work_timeout_s() for the rest.
        Returns the children that did not finish in time."""
        folder = self.ctx.dir
        t0 = time.monotonic()
        deadline = {pid: t0 + timeout for pid in self._registered() if _is_alive(folder, pid)}
        work_deadline = t0 + max(timeout, work_timeout_s())
        late = set()
        while deadline:
            now = time.monotonic()
            for pid in list(deadline):
                seen, done = _read_ack(folder, pid)
                if (seen >= v and done) or not _is_alive(folder, pid):
                    del deadline[pid]
                    continue
                if seen >= v:
                    deadline[pid] = work_deadline  # answered: it is saving
                if now >= deadline[pid]:
                    late.add(pid)
                    del deadline[pid]
            if deadline:
                time.sleep(0.002)
        return late

    def flush_before_terminate(self, pid: int) -> None:
        """Process.terminate(pid) is about to kill a child: ask every recording child
        for its piece first (once per burst of terminate calls), so a pool closed
        inside the profiled block keeps its workers' data."""
        if not self._mine() or not self.rec:
            return
        folder = self.ctx.dir
        if not os.path.exists(os.path.join(folder, f"{pid}.proc")):
            return
        if self.flush_v == self.v and _read_ack(folder, pid) >= (self.v, 1):
            return  # this child already answered the current flush request
        self.flush += 1
        v = self._write_state(rec=1)
        self.flush_v = v
        self._wait_for_children(v, terminate_flush_s())

    def _forget_gone_children(self) -> None:
        """Before a window starts: children that ended since are not this window's."""
        folder = self.ctx.dir
        for pid in self._registered():
            if not _is_alive(folder, pid):
                for suffix in ("proc", "ack"):
                    with contextlib.suppress(OSError):
                        os.remove(os.path.join(folder, f"{pid}.{suffix}"))

    def _collect(self, win: int, timed_out: set[int]) -> list[ChildWindow]:
        folder = self.ctx.dir
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return []
        pieces: dict[int, list[tuple[int, str]]] = {}
        for n in names:
            if not n.endswith(".piece"):
                continue
            parts = n[:-6].split(".")
            if len(parts) != 3 or not all(p.isdigit() for p in parts):
                continue
            pid, w, seq = (int(p) for p in parts)
            if w == win:
                pieces.setdefault(pid, []).append((seq, n))
            elif w < win:  # its window was collected already
                self.late += 1
                shutil.rmtree(os.path.join(folder, n), ignore_errors=True)
        bad: list[str] = []
        out: list[ChildWindow] = []
        registered = self._registered()
        for pid in sorted(set(pieces) | set(registered)):
            raws, meta = [], {}
            for _, n in sorted(pieces.get(pid, [])):
                path = os.path.join(folder, n)
                try:
                    raw, meta = load_piece(path)
                    raws.append(raw)
                except (OSError, ValueError) as e:
                    bad.append(f"pid {pid}: {e}")
                finally:  # memory-mapped arrays stay readable after the unlink
                    shutil.rmtree(path, ignore_errors=True)
            alive = _is_alive(folder, pid)
            info = self._proc_info(pid)
            if not raws and alive and pid not in timed_out:
                continue  # alive, answered, recorded nothing in this window
            if pid in timed_out:
                status = "timeout"
            elif not raws:
                status = "lost"
            else:
                status = "ok" if alive else "exited"
            out.append(
                ChildWindow(
                    pid,
                    int(meta.get("ppid", info.get("ppid", -1))),
                    str(meta.get("how", info.get("how", "?"))),
                    str(meta.get("process_name", "")),
                    status,
                    raws,
                )
            )
            if not alive:  # reported once, in the window it ended in
                for suffix in ("proc", "ack"):
                    with contextlib.suppress(OSError):
                        os.remove(os.path.join(folder, f"{pid}.{suffix}"))
        self.skipped += len(bad)
        lost = [c.pid for c in out if c.status == "lost"]
        slow = [c.pid for c in out if c.status == "timeout"]
        msgs = []
        if bad:
            msgs.append(
                f"{len(bad)} child profile piece(s) could not be read and were left "
                f"out ({'; '.join(bad[:3])})"
            )
        if lost:
            msgs.append(
                f"{len(lost)} child process(es) ended without saving their data for "
                f"this window (killed or crashed?): pid {', '.join(map(str, lost))}"
            )
        if slow:
            msgs.append(
                f"{len(slow)} child process(es) did not answer within "
                f"{ack_timeout_s():g}s or finish saving within {work_timeout_s():g}s "
                f"(GPUPROF_SUBPROCESS_TIMEOUT_S sets the first): pid "
                f"{', '.join(map(str, slow))}; their rows may be incomplete"
            )
        if msgs:
            warnings.warn("gpuprof: " + "; ".join(msgs), RuntimeWarning, stacklevel=2)
        return out

    def _proc_info(self, pid: int) -> dict:
        data = _read_small(os.path.join(self.ctx.dir, f"{pid}.proc"))
        try:
            return json.loads(data) if data else {}
        except ValueError:
            return {}

    # -- results ------------------------------------------------------------------------------
    def children_of(self, windows: list[dict]) -> list[ChildWindow]:
        """Child data of the given parent windows (raw dicts), one entry per window and child."""
        out = []
        for raw in windows:
            entry = self.by_raw.get(id(raw))
            if entry is not None and entry[0] is raw:
                out += entry[1]
        return out
