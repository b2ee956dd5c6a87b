"""A child's own session: its C profiler, driven by the parent's state file.

Each child runs its own C session (CPU only; it never touches the parent's
buffers) and a poll thread that reads ``state`` every ``POLL_S`` seconds: it
records while the parent records, saves a piece whenever the parent's window ends
or a flush is asked for, and answers with an ack (``_protocol`` has the files).
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import fcntl
import json
import os
import sys
import time

from ... import _gpuprof
from ...core._output import write_atomic
from .._recording import Recording
from . import _current, _pieces
from ._protocol import POLL_S, Ctx, read_state

__all__ = ["_Child"]


def _process_name() -> str:
    mp = sys.modules.get("multiprocessing.process")
    if mp is not None:
        with contextlib.suppress(Exception):
            return str(mp.current_process().name)
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    return os.path.basename(argv0) or "python"


class _Child:
    """This process's own session, driven by the parent's state file."""

    def __init__(self, ctx: Ctx, how: str):
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
        # CPU only, recording from start to stop: the parent's state file says when
        self.rec = Recording(max_events=ctx.max_events)

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
        st = read_state(self.ctx)
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
        # the poll thread is gpuprof's, not the program's: it stays out of the data
        self.rec.start(this_thread=not from_poll)
        self.recording = True
        self.rec_win = win

    def _stop(self) -> dict | None:
        self.recording = False
        return self.rec.stop()

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
            _pieces.save_piece(path, raw, meta)

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
        sys.setprofile(None)
        while True:
            time.sleep(POLL_S)
            st = read_state(self.ctx)
            with self.lock:
                if self.closed:
                    return
                if st is None:  # the parent's session ended and its folder is gone
                    self.closed = True
                    if self.recording:
                        with contextlib.suppress(Exception):
                            self._stop()
                    if _current.ctx is self.ctx:
                        _current.ctx = None
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
