"""The parent's half of a session with subprocesses: the state file, waiting for
the children at a window's end, reading their pieces.

At a window's end the parent waits (at most ``ack_timeout_s()``) for the acks of
the live children, then reads the pieces of that window (``_protocol`` has the
files); each child's data for the window is one ``ChildWindow``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
import warnings

from ...core._output import write_atomic
from .._parts import Part
from .._recording import RecordingState
from . import _current, _hooks, _pieces
from ._protocol import (
    Ctx,
    ack_timeout_s,
    is_alive,
    read_ack,
    read_small,
    terminate_flush_s,
    work_timeout_s,
)

__all__ = ["ChildWindow", "ParentSession"]


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


class ParentSession(Part):
    """The parent's half: state file, waiting for children, reading their pieces.

    A part of ``profile`` (subprocesses=True; ``gpuprof.record._parts``); every hook is a
    no-op in a forked copy of the parent (a child sees the parent's ``profile``
    object too). ``to_processes`` turns the ChildWindow entries of the kept windows
    into what ``results.subprocesses`` holds (``gpuprof.processes.group_children``).
    """

    steps = True  # children start recording before a parent step that records

    def __init__(self, to_processes):
        self.state: RecordingState | None = None  # the profile's, from start()
        self.to_processes = to_processes
        self.pid = os.getpid()
        self.ctx: Ctx | None = None
        self.v = 0
        self.rec = 0
        self.win = 0  # index of the parent's current/next recorded window
        self.flush = 0
        self.flush_v = -1  # state version of the last flush request
        self.handled = 0  # parent windows whose children were collected
        self.by_raw: dict[int, tuple[dict, list[ChildWindow]]] = {}
        self.skipped = 0  # child pieces that could not be read, over the session
        self.late = 0  # pieces that arrived after their window was collected
        self.closing = False  # profile.stop() is closing the last window

    def _mine(self) -> bool:
        return self.ctx is not None and os.getpid() == self.pid

    # -- lifecycle (profile.start / stop) -------------------------------------------------
    def start(self, state: RecordingState) -> None:
        """Before the C session starts: folder, state, hooks."""
        running = _current.parent
        if running is not None and running is not self and running._mine():
            raise RuntimeError(
                "profile(subprocesses=True): another profile with subprocesses "
                "is running in this process; stop it first"
            )
        self.pid = os.getpid()
        self.state = state
        folder = tempfile.mkdtemp(prefix="gpuprof-children-")
        self.ctx = Ctx(folder, self.pid, state.max_events)
        self.v = self.rec = self.win = self.flush = 0
        self.flush_v = -1
        self.handled = state.windows
        self.by_raw = {}
        self.skipped = self.late = 0
        self.closing = False
        # children forked at once must know whether step 0 records
        self._write_state(rec=int(bool(state.records_at(0))))
        _hooks.install_fork_hook()
        _hooks.patch()
        _current.ctx = self.ctx
        _current.parent = self

    def started(self, state: RecordingState) -> None:
        """After the C session started: tell children whether it records."""
        if self._mine():
            self.after_step(state)

    def stopping(self, state: RecordingState) -> None:
        """The last window closes: no window follows it."""
        self.closing = True

    def stopped(self, state: RecordingState) -> None:
        """After the C session stopped (its last window collected)."""
        if not self._mine():
            return
        self._catch_up(state)
        with contextlib.suppress(OSError):
            self._write_state(rec=0, alive=0)
        _hooks.unpatch()
        if _current.ctx is self.ctx:
            _current.ctx = None
        if _current.parent is self:
            _current.parent = None
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

    def before_step(self, state: RecordingState) -> None:
        """Before a parent step that starts recording: children start first, so their
        recording covers the parent's window (the wait is outside it)."""
        if not self._mine() or self.rec:
            return
        if state.records_at(state.step_num + 1):
            self._forget_gone_children()
            try:
                v = self._write_state(rec=1)
            except OSError as e:
                self._lost_folder(e)
                return
            self._wait_for_children(v, ack_timeout_s())

    def after_step(self, state: RecordingState) -> None:
        """After a parent step: the window may have ended without on_trace_ready
        (a schedule going from RECORD straight to NONE), and recording may have
        started or stopped."""
        if not self._mine():
            return
        self._catch_up(state)
        rec = int(state.records)
        if rec != self.rec:
            if rec:
                self._forget_gone_children()
            try:
                self._write_state(rec=rec)
            except OSError as e:
                self._lost_folder(e)

    def _catch_up(self, state: RecordingState) -> None:
        if state.windows > self.handled:
            self.window_ended(state, state.last_closed)

    # -- the parent's window ended (profile._window_ready) -------------------------------
    def window_ended(self, state: RecordingState, raw: dict | None) -> None:
        if not self._mine():
            return
        self.handled = state.windows
        ended = self.win
        self.win += 1
        # a window that follows at once: children save this one and go on recording
        rec_next = int(not self.closing and bool(state.records_at(state.step_num)))
        try:
            v = self._write_state(rec=rec_next)
        except OSError as e:
            self._lost_folder(e)
            children = []
        else:
            timed_out = self._wait_for_children(v, ack_timeout_s())
            children = self._collect(ended, timed_out)
        if raw is not None:
            keep = {id(w) for w in state.kept}
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
        out: list[int] = []
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
        deadline = {pid: t0 + timeout for pid in self._registered() if is_alive(folder, pid)}
        work_deadline = t0 + max(timeout, work_timeout_s())
        late = set()
        while deadline:
            now = time.monotonic()
            for pid in list(deadline):
                seen, done = read_ack(folder, pid)
                if (seen >= v and done) or not is_alive(folder, pid):
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
        if self.flush_v == self.v and read_ack(folder, pid) >= (self.v, 1):
            return  # this child already answered the current flush request
        self.flush += 1
        v = self._write_state(rec=1)
        self.flush_v = v
        self._wait_for_children(v, terminate_flush_s())

    def _forget_gone_children(self) -> None:
        """Before a window starts: children that ended since are not this window's."""
        folder = self.ctx.dir
        for pid in self._registered():
            if not is_alive(folder, pid):
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
            raws: list[dict] = []
            meta: dict = {}
            for _, n in sorted(pieces.get(pid, [])):
                path = os.path.join(folder, n)
                try:
                    raw, meta = _pieces.load_piece(path)
                    raws.append(raw)
                except (OSError, ValueError) as e:
                    bad.append(f"pid {pid}: {e}")
                finally:  # memory-mapped arrays stay readable after the unlink
                    shutil.rmtree(path, ignore_errors=True)
            alive = is_alive(folder, pid)
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
        data = read_small(os.path.join(self.ctx.dir, f"{pid}.proc"))
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

    def contribute(self, results) -> None:
        """``results.subprocesses``: the children's data of the kept windows."""
        kept = list(self.state.kept) if self.state is not None else []
        results.subprocesses = self.to_processes(self.children_of(kept))
