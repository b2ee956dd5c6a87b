"""The armed process: :class:`OnDemand` (arming, the state file, disarming, the step
count, in-process requests) and ``arm()``, ``armed()`` and ``disarm()``, which keep
this process's one armed object. Its captures are ``_captures``'s, its control
thread ``_requests``'s."""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any

from ...core import _ondemand_proto as proto
from ...record import _ondemand_capture as capture_
from ...record._ondemand_capture import CaptureRequest
from ...record._recording import at_fork_in_child
from ._captures import _Captures
from ._dump import Dumper
from ._requests import _Requests
from ._shared import _say

# The armed OnDemand of this process, or None. GIL.
_ARMED: OnDemand | None = None


class _SourceCounter:
    """What gpuprof.core._steps calls at each step boundary it finds."""

    __slots__ = ("step",)

    def __init__(self, step):
        self.step = step


class OnDemand(_Requests, _Captures):
    """This process, armed for on-demand capture (``gpuprof.arm()`` returns it).

    Attributes:
        pid: the process id that ``gpuprof capture`` takes.
        found: step boundaries found since arming (the program's step number).
    """

    def __init__(
        self,
        *,
        signal_=signal.SIGUSR2,
        trigger_dir=None,
        step_fn=None,
        cuda=None,
        poll_interval_s: float = 1.0,
        main_names=None,
        launcher: bool = False,
    ):
        from ...core import _steps

        self._signum = proto.parse_signal(signal_)
        if trigger_dir is not None:
            trigger_dir = os.path.abspath(os.fspath(trigger_dir))
            if not os.path.isdir(trigger_dir):
                raise ValueError(
                    f"trigger_dir: {trigger_dir!r} is not a folder; create it on a "
                    "file system every rank sees"
                )
            if not os.access(trigger_dir, os.W_OK | os.X_OK):
                raise ValueError(
                    f"trigger_dir: cannot write in {trigger_dir!r} (permission denied)"
                )
        if cuda is not None and not isinstance(cuda, bool):
            raise TypeError(f"cuda must be True, False or None, got {cuda!r}")
        if (
            isinstance(poll_interval_s, bool)
            or not isinstance(poll_interval_s, (int, float))
            or not 0 < poll_interval_s <= 60
        ):
            raise ValueError(
                f"poll_interval_s must be a number of seconds in (0, 60], got {poll_interval_s!r}"
            )
        self.pid = os.getpid()
        self.found = 0
        self._trigger_dir = trigger_dir
        self._cuda = cuda
        self._poll_s = float(poll_interval_s)
        self._work: capture_.Capture | None = None  # the capture pending, recording or writing
        self._explicit = False  # OnDemand.step() was called: only its steps count
        self._lock = threading.Lock()
        self._closing = False
        self._closed = False
        self._installed = False
        self._inbox: collections.deque = collections.deque()
        self._samples: collections.deque = collections.deque(maxlen=10)
        self._seen: set[str] = set()
        self._captures = 0
        self._runtime = ""
        self._handler = self._on_signal
        self._previous_handler: Any = None
        self._signal_lost: str | None = None
        self._wake_r = self._wake_w = -1
        self._thread: threading.Thread | None = None
        self._armed_at = time.time()
        self._refreshed = 0.0
        self._job = _job()
        self._dumper = Dumper()  # `gpuprof dump`'s native thread (_dump.py)
        # step boundaries
        counter = _SourceCounter(self._source_step)
        self._watch = _steps.ImportWatch()
        if step_fn is not None:
            try:
                self.source = _steps.StepFunction(step_fn, counter, set(main_names or {"__main__"}))
            except ValueError as e:
                raise ValueError(f"step_fn: {e}") from None
        else:
            self.source = _steps.OptimizerSteps(counter)
        self._launcher = launcher

    # -- arming -------------------------------------------------------------------------------
    def install(self) -> None:
        """Install the signal handler, the step boundaries, the state file and the thread.

        Raises:
            RuntimeError: a signal was asked for off the main thread.
            ValueError: the signal already has a handler of the program's.
            OSError: the runtime folder cannot be used.
        """
        from ...core import _steps

        if self._installed:
            return
        self._runtime = proto.runtime_dir(create=True)
        if self._signum is not None:
            if threading.current_thread() is not threading.main_thread():
                raise RuntimeError(
                    f"arming with {proto.signal_name(self._signum)} must be done on "
                    "the main thread (Python runs signal handlers there); call "
                    "arm() from the main thread, or pass signal=None"
                )
            prev = signal.getsignal(self._signum)
            ours = isinstance(getattr(prev, "__self__", None), OnDemand)  # a disarmed or forked one
            if prev not in (signal.SIG_DFL, signal.SIG_IGN) and not ours:
                held = "a handler set outside Python" if prev is None else repr(prev)
                raise ValueError(
                    f"{proto.signal_name(self._signum)} already has a handler "
                    f"({held}); arm with another signal (SIGUSR1, SIGRTMIN+N) or "
                    "with none"
                )
        if (
            isinstance(self.source, _steps.StepFunction)
            and self.source.in_main
            and not self._launcher
        ):
            main = sys.modules.get("__main__")
            self.source._wrap_in(main)
            if not self.source.wrapped:
                raise ValueError(
                    f"step_fn: {self.source.problem()}; define it before arming, or "
                    "start the program with `python -m gpuprof run --on-demand "
                    "--step-fn ...`"
                )
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        if self._signum is not None:
            self._previous_handler = signal.signal(self._signum, self._handler)
            with contextlib.suppress(AttributeError, OSError, ValueError):
                signal.siginterrupt(self._signum, False)  # SA_RESTART: native calls go on
        self.source.install(self._watch)
        self._watch.install()
        if self._trigger_dir is not None:
            with contextlib.suppress(OSError):  # requests already there are not for us
                self._seen = {
                    n[4:-5]
                    for n in os.listdir(self._trigger_dir)
                    if n.startswith("req.") and n.endswith(".json")
                }
        self._dumper.start(self._runtime, self.pid, self._wake_w)
        self._write_state()
        self._samples.append((time.monotonic(), self.found))  # the step rate's first point
        self._thread = threading.Thread(target=self._loop, name="gpuprof-on-demand", daemon=True)
        self._thread.start()
        self._installed = True
        atexit.register(self._at_exit)

    def _state_doc(self) -> dict:
        from ..._version import __version__

        return {
            "version": proto.VERSION,
            "pid": self.pid,
            "start_time": proto.own_start_time(),
            "host": proto.host(),
            "uid": os.getuid(),
            "argv": list(getattr(sys, "orig_argv", sys.argv)),
            "cwd": os.getcwd(),
            "signal": None if self._signal_lost else self._signum,
            "signal_name": proto.signal_name(self._signum),
            "signal_lost": self._signal_lost,
            "poll_interval_s": self._poll_s,
            "trigger_dir": self._trigger_dir,
            "armed_at": self._armed_at,
            "steps": self.source.describe() if not self._explicit else "OnDemand.step() calls",
            "job": self._job,
            **self._dumper.state(),
            "python": sys.version.split()[0],
            "gpuprof": __version__,
        }

    def _write_state(self) -> None:
        try:
            proto.runtime_dir(create=True)
            proto.write_json(proto.state_path(self._runtime, self.pid), self._state_doc())
        except OSError as e:
            _say(
                f"on-demand: cannot write the state file in {self._runtime!r}: {e}; "
                "`gpuprof capture` will not find this process"
            )
        self._refreshed = time.monotonic()

    def disarm(self) -> None:
        """End a capture in progress (its files are written), then remove the signal
        handler, the step boundaries, the state file and the thread."""
        global _ARMED
        if self._closed:
            return
        self.finish()
        self._closing = True
        self._poke()
        restored = False
        if (
            self._signum is not None
            and self._installed
            and os.getpid() == self.pid
            and threading.current_thread() is threading.main_thread()
        ):
            with contextlib.suppress(ValueError, TypeError, OSError):
                if signal.getsignal(self._signum) is self._handler:
                    signal.signal(self._signum, self._previous_handler or signal.SIG_DFL)
                    restored = True
        self._watch.uninstall()
        uninstall = getattr(self.source, "uninstall", None)
        if uninstall is not None:
            uninstall()
        if os.getpid() == self.pid and self._runtime:
            with contextlib.suppress(OSError):
                os.unlink(proto.state_path(self._runtime, self.pid))
        self._dumper.stop()  # before the wake pipe it writes to is closed
        self._closed = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        # The handler writes to the pipe until it is removed: keep the pipe while it is not.
        if (restored or self._signum is None) and self._wake_r >= 0:
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._wake_r = self._wake_w = -1
        with contextlib.suppress(ValueError):
            atexit.unregister(self._at_exit)
        if _ARMED is self:
            _ARMED = None

    def _at_exit(self) -> None:
        if os.getpid() != self.pid or self._closed:
            return
        self.disarm()

    def _forked(self) -> None:
        """In a forked child: the state, the thread and the requests are the parent's."""
        self._closed = self._closing = True
        self._work = None
        self._thread = None
        self._dumper.forked()

    # -- step boundaries (the program's threads) ------------------------------------------------
    def step(self) -> None:
        """Mark a step boundary from the program's own loop, as ``prof.step()`` does in a
        profile. Once called, only these calls count as steps."""
        self._explicit = True
        self.found += 1
        if self._work is not None:
            self._boundary()

    def _source_step(self) -> None:
        if self._explicit:
            return
        self.found += 1
        if self._work is not None:
            self._boundary()

    # -- in-process requests --------------------------------------------------------------------
    def capture(
        self,
        steps: int | None = None,
        duration: float | None = None,
        output=None,
        memory: bool = False,
    ) -> CaptureRequest:
        """Ask this process itself for a capture, as ``gpuprof capture PID`` does.

        Args:
            steps: record this many steps from the next step boundary (default 10).
            duration: or record this many seconds of whole steps (a time window when
                no step has been found since arming).
            output: the folder for the files (default: ``gpuprof-<host>-<pid>-<time>``
                in the working directory).
            memory: also record memory (``profile_memory=True``).

        Returns:
            A :class:`CaptureRequest`; its ``wait()`` returns when the files are written.

        Raises:
            RuntimeError: a capture is already recording or writing, or the process
                is not armed.
            ValueError, TypeError: bad arguments.
        """
        capture_.check_capture_args(steps, duration, output, memory)
        if self._closed or not self._installed:
            raise RuntimeError(
                "capture(): this process is not armed (disarmed, or a forked "
                "child of the armed one)"
            )
        reply = capture_.InProcessReply()
        self._inbox.append(
            (
                {
                    "op": "capture",
                    "id": proto.new_request_id(),
                    "steps": steps,
                    "duration": duration,
                    "memory": memory,
                    "wait": True,
                    "output": os.path.abspath(os.fspath(output))
                    if output is not None
                    else capture_.default_output(),
                    "requested_by": self.pid,
                },
                reply,
            )
        )
        self._poke()
        if not reply.replied.wait(max(10.0, 3 * self._poll_s)):
            raise RuntimeError(
                "capture(): the on-demand thread did not answer within "
                f"{max(10.0, 3 * self._poll_s):g} s"
            )
        if not reply.reply_doc["ok"]:
            raise RuntimeError(f"capture(): {reply.reply_doc['message']}")
        return CaptureRequest(reply)


def _job() -> dict | None:
    """The torchrun job this process is a rank of (from its environment), or None."""
    env = os.environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    from ...analysis.distributed import rank_info

    try:
        info = rank_info()
    except ValueError:
        return None
    key = (
        f"{env.get('TORCHELASTIC_RUN_ID', '')}@{env.get('MASTER_ADDR', '')}:"
        f"{env.get('MASTER_PORT', '')}"
    )
    return {"id": key, **info}


# -- module functions -----------------------------------------------------------------------------
def arm(
    *, signal="SIGUSR2", trigger_dir=None, step_fn=None, cuda=None, poll_interval_s: float = 1.0
) -> OnDemand:
    """Arm this process for on-demand capture (docs/on-demand.md).

    Armed, the process records nothing and runs no profile hook until
    ``python -m gpuprof capture PID`` (or :meth:`OnDemand.capture`) asks for a
    capture; that one then records the next steps and writes the trace, the saved
    profile, the table and the diagnosis. Arming again with the same arguments
    returns the armed object; with other ones it re-arms (unless a capture runs).

    Args:
        signal: the signal ``gpuprof capture`` sends to wake the process:
            ``"SIGUSR2"`` (default), ``"SIGUSR1"``, a real-time signal
            (``"SIGRTMIN+2"``), or None: no signal, requests are read every
            ``poll_interval_s``. A signal needs arming on the main thread.
        trigger_dir: a folder shared by every rank of a job; a
            ``gpuprof capture --trigger-dir`` request there starts all ranks at
            the same step. Read every ``poll_interval_s``.
        step_fn: ``"module:function"``: every return of that function ends a step,
            instead of PyTorch optimizer steps (``--step-fn`` of ``gpuprof run``).
        cuda: True/False to record GPU activity or not; None: when usable.
        poll_interval_s: how often requests are looked for without a signal.

    Returns:
        The :class:`OnDemand` object: ``pid``, ``found``, ``step()`` (mark a step
        boundary yourself), ``capture()``, ``status()``, ``disarm()``.

    Raises:
        ValueError, TypeError: bad arguments, or the signal already has a handler.
        RuntimeError: a signal asked for off the main thread, or re-arming while a
            capture runs.
    """
    global _ARMED
    od = OnDemand(
        signal_=signal,
        trigger_dir=trigger_dir,
        step_fn=step_fn,
        cuda=cuda,
        poll_interval_s=poll_interval_s,
    )
    return _install(od)


def _install(od: OnDemand) -> OnDemand:
    global _ARMED
    cur = _ARMED
    if cur is not None and not cur._closed and cur.pid == os.getpid():
        same = (
            cur._signum,
            cur._trigger_dir,
            cur._cuda,
            cur._poll_s,
            type(cur.source),
            getattr(cur.source, "spec", None),
        ) == (
            od._signum,
            od._trigger_dir,
            od._cuda,
            od._poll_s,
            type(od.source),
            getattr(od.source, "spec", None),
        )
        if same:
            return cur
        if cur._work is not None:
            raise RuntimeError(
                "arm(): this process is capturing; arm again with other "
                "arguments once the capture's files are written"
            )
        cur.disarm()
    od.install()
    _ARMED = od
    return od


def armed() -> OnDemand | None:
    """This process's :class:`OnDemand` when it is armed, else None."""
    cur = _ARMED
    return cur if cur is not None and not cur._closed and cur.pid == os.getpid() else None


def disarm() -> None:
    """Disarm this process (a capture in progress is ended and written first)."""
    cur = _ARMED
    if cur is not None:
        cur.disarm()


def _after_fork_in_child() -> None:
    global _ARMED
    if _ARMED is not None:
        _ARMED._forked()
        _ARMED = None


at_fork_in_child(_after_fork_in_child)
