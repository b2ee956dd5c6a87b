"""On-demand capture, the armed process's side (docs/on-demand.md).

Armed, a process records nothing and has no profile hook and no CUPTI: it
counts step boundaries (PyTorch optimizer steps or ``step_fn``, through
``gpuprof._steps``, or :meth:`OnDemand.step` calls) and keeps one thread
asleep in ``select()`` on a pipe. A request (files described in
``gpuprof._ondemand_proto``) wakes that thread: the signal's handler only
writes one byte to the pipe; without a signal, or when the program has replaced
the handler, the thread reads the requests every ``poll_interval_s`` anyway.

The thread answers at once. A capture it accepts starts at the next step
boundary, on the thread that reached it, records N steps (or S seconds of whole
steps) there and stops there; a process that has found no step yet records a
``duration`` capture as a time window started and stopped by this thread. A
writer thread then writes the files, so the program goes on meanwhile, and only
then is the process free for the next capture: a request that comes while one
is recording or writing is refused with a message saying so.

A capture's request, state, answers and files are ``gpuprof._ondemand_capture``'s.

Nothing here runs inside the program's own code except the step count
(``found += 1`` and one attribute test per step while idle), and nothing here
raises into it: failures go to the requester's reply and one line on stderr.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import re
import select
import signal
import sys
import threading
import time

from . import _gpuprof
from . import _ondemand_capture as capture_
from . import _ondemand_proto as proto
from ._ondemand_capture import CaptureRequest

__all__ = ["OnDemand", "CaptureRequest", "arm", "armed", "disarm", "arm_from_environment"]

DEFAULT_STEPS = capture_.DEFAULT_STEPS
_RID = re.compile(r"^[0-9a-f]+-\d+-[0-9a-f]+$")
_REFRESH_S = 3600.0  # rewrite the state file (tmp cleaners delete files untouched for days)

# The armed OnDemand of this process, or None. GIL.
_ARMED: OnDemand | None = None


class _ShareTheGil:
    """Lower the interpreter's switch interval while gpuprof's threads work.

    A CPU-bound stepping thread keeps the GIL for a whole switch interval (5 ms
    by default) each time one of gpuprof's threads gives it up for a system
    call, and handling a request or writing a capture makes hundreds of them:
    on small virtual machines that took minutes. While a request is handled or
    files are written, the interval is 0.1 ms, then the program's own value
    comes back (unless the program changed it meanwhile). The interval only
    counts while some thread waits for the GIL, so the program's threads pay
    nothing for it otherwise.
    """

    FAST_S = 1e-4

    def __init__(self):
        self._lock = threading.Lock()
        self._users = 0
        self._saved: float | None = None

    @contextlib.contextmanager
    def __call__(self):
        with self._lock:
            if self._users == 0:
                now = sys.getswitchinterval()
                self._saved = now if now > self.FAST_S else None
                if self._saved is not None:
                    sys.setswitchinterval(self.FAST_S)
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if (
                    self._users == 0
                    and self._saved is not None
                    and abs(sys.getswitchinterval() - self.FAST_S) < 1e-7
                ):
                    sys.setswitchinterval(self._saved)


_share_the_gil = _ShareTheGil()


def _say(line: str) -> None:
    """One line on the program's stderr (never raises into the program)."""
    with contextlib.suppress(Exception):
        stream = sys.__stderr__ or sys.stderr
        stream.write(f"gpuprof: {line}\n")
        stream.flush()


# -- the armed process ----------------------------------------------------------------------
class _SourceCounter:
    """What gpuprof._steps calls at each step boundary it finds."""

    __slots__ = ("step",)

    def __init__(self, step):
        self.step = step


class OnDemand:
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
        from . import _steps

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
        self._previous_handler = None
        self._signal_lost: str | None = None
        self._wake_r = self._wake_w = -1
        self._thread: threading.Thread | None = None
        self._armed_at = time.time()
        self._refreshed = 0.0
        self._job = _job()
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
        from . import _steps

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
        self._write_state()
        self._samples.append((time.monotonic(), self.found))  # the step rate's first point
        self._thread = threading.Thread(target=self._loop, name="gpuprof-on-demand", daemon=True)
        self._thread.start()
        self._installed = True
        atexit.register(self._at_exit)

    def _state_doc(self) -> dict:
        from ._version import __version__

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

    def _boundary(self) -> None:
        cap = self._work
        if cap is None or self._closed:
            return
        try:
            if cap.state == "pending":
                if cap.start_step is not None and self.found < cap.start_step:
                    return
                with self._lock:
                    if self._work is not cap or cap.state != "pending":
                        return
                    cap.state = "starting"
                self._start(cap)
            elif cap.state == "recording" and cap.thread == threading.get_ident():
                if cap.abort:
                    self._discard(cap)
                    return
                cap.recorded += 1
                cap.prof.step()
                if (cap.steps is not None and cap.recorded >= cap.steps) or (
                    cap.deadline is not None and time.monotonic() >= cap.deadline
                ):
                    self._stop(cap)
        except Exception as e:  # noqa: BLE001 - never into the program: the requester hears it
            self._failed(cap, f"recording failed: {e}")

    # -- recording ------------------------------------------------------------------------------
    def _prepare(self, cap: capture_.Capture) -> None:
        """Make ``cap``'s profile (loading CUPTI the first time) off the stepping thread.

        Raises:
            Exception: whatever ``gpuprof.profile()`` raises.
        """
        from .profiler import ProfilerActivity, profile

        kwargs: dict = {"profile_memory": cap.memory}
        if self._cuda is not None:
            kwargs["activities"] = [ProfilerActivity.CPU] + (
                [ProfilerActivity.CUDA] if self._cuda else []
            )
        cap.prof = profile(**kwargs)

    def _start(self, cap: capture_.Capture, timed: bool = False) -> None:
        """Start ``cap``'s prepared profile on the calling thread (state "starting"):
        at a step boundary, or, ``timed``, on the control thread for a time window."""
        cap.first_step = None if timed else self.found
        try:
            cap.prof.add_metadata_json(
                "gpuprof_on_demand",
                json.dumps(
                    {
                        "pid": self.pid,
                        "host": proto.host(),
                        "request": cap.rid,
                        "first_step": cap.first_step,
                        "steps": cap.steps,
                        "duration_s": cap.duration,
                        "requested_by": cap.requested_by,
                    }
                ),
            )
            cap.thread = threading.get_ident()
            cap.t_start = time.monotonic()
            if cap.duration is not None:
                cap.deadline = cap.t_start + cap.duration
            held = _hook_held()
            if held:  # checked first: a failing start() would unhook the program's profiler
                raise RuntimeError(
                    f"another profiler is active in this process ({held}), "
                    "such as the program's own gpuprof.profile or cProfile; a "
                    "capture needs Python's profile hook free"
                )
            if self._thread is not None and self._thread.ident is not None:
                # each session forgets the threads left out of the last one: this one's
                # frames would otherwise be taken from the window's start-up snapshot
                _gpuprof._ignore_thread(self._thread.ident)
            cap.state = "recording"
            cap.prof.start()
        except Exception as e:  # noqa: BLE001 - e.g. another profiler holds the hook
            self._failed(cap, f"could not start recording: {e}")
            return
        if timed:
            self._poke()  # the control thread sleeps until the deadline

    def _stop(self, cap: capture_.Capture, synchronous: bool = False) -> None:
        """Stop ``cap``'s profile, then write its files (on a writer thread, or here)."""
        cap.t_stop = time.monotonic()
        try:
            cap.prof.stop()
        except Exception as e:  # noqa: BLE001
            self._failed(cap, f"stopping the recording failed: {e}")
            return
        with self._lock:
            cap.state = "writing"
        if synchronous:
            self._write(cap)
            return
        cap.writer = threading.Thread(
            target=self._write, args=(cap,), name="gpuprof-on-demand-writer"
        )
        cap.writer.start()

    def _discard(self, cap: capture_.Capture) -> None:
        """Stop an aborted capture and keep nothing of it."""
        prof, cap.prof = cap.prof, None
        with contextlib.suppress(Exception):
            prof.stop()
        with self._lock:
            if self._work is cap:
                self._work = None
            cap.state = "cancelled"
        cap.reply.done({"ok": False, "error": "aborted by its requester", **self._who()})

    def _failed(self, cap: capture_.Capture, error: str) -> None:
        prof, cap.prof = cap.prof, None
        if prof is not None and prof.running:
            with contextlib.suppress(Exception):
                prof.stop()
        with self._lock:
            if self._work is cap:
                self._work = None
            cap.state = "failed"
        _say(f"on-demand capture {cap.rid} of pid {self.pid}: {error}")
        cap.reply.done({"ok": False, "error": error, **self._who()})

    def _write(self, cap: capture_.Capture) -> None:
        if threading.current_thread() is cap.writer:
            _gpuprof._ignore_current_thread()
        try:
            with _share_the_gil():
                doc = capture_.write_files(cap, self.pid, self.status()["steps_from"])
        except Exception as e:  # noqa: BLE001 - disk full, permissions: the requester hears it
            doc = {"ok": False, "error": f"writing the files into {cap.output!r} failed: {e}"}
        doc.update(self._who())
        with self._lock:
            if self._work is cap:
                self._work = None  # free for the next capture before anyone hears of this one
            cap.state = "done"
            self._captures += 1
        if doc["ok"]:
            cut = f"; cut short: {cap.cut_short}" if cap.cut_short else ""
            _say(
                f"on-demand capture of pid {self.pid} ({doc['summary']}{cut}) written to "
                f"{cap.output}"
            )
        else:
            _say(f"on-demand capture of pid {self.pid} failed: {doc['error']}")
        cap.reply.done(doc)

    def finish(self) -> None:
        """End the capture in progress now (the program ends): one still recording is
        stopped and written here, one being written is waited for, one that has not
        started is cancelled, each with a message to its requester."""
        cap = self._work
        if cap is None or os.getpid() != self.pid:
            return
        with self._lock:  # the stepping thread acts on "pending" and "recording" only
            state = cap.state
            if state in ("pending", "preparing"):
                cap.state = "cancelled"
                if self._work is cap:
                    self._work = None
            elif state == "recording":
                cap.state = "stopping"
        if state in ("pending", "preparing"):
            cap.reply.done(
                {
                    "ok": False,
                    "error": "the program ended before the capture started (no step boundary came)",
                    **self._who(),
                }
            )
        elif state == "recording":
            if cap.steps is not None:
                cap.cut_short = f"the program ended after {cap.recorded} of the {cap.steps} steps"
            else:
                cap.cut_short = (
                    f"the program ended {time.monotonic() - cap.t_start:.1f} s "
                    f"into the {cap.duration:g} s"
                )
            self._stop(cap, synchronous=True)
        elif (
            cap.state == "writing"
            and cap.writer is not None
            and cap.writer is not threading.current_thread()
        ):
            cap.writer.join()

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
                with _share_the_gil() if timed else contextlib.nullcontext():
                    ready, _, _ = select.select([self._wake_r], [], [], timeout)
                if ready:
                    with contextlib.suppress(OSError):
                        while os.read(self._wake_r, 4096):
                            pass
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
            f"into {cap.output}{again}"
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


def _hook_held() -> str | None:
    """What holds Python's profile hook on this thread (or interpreter-wide), or None."""
    current = sys.getprofile()
    if current is not None:
        return f"sys.setprofile is set to {current!r}"
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is not None:
        tool = monitoring.get_tool(monitoring.PROFILER_ID)
        if tool is not None:
            return f"sys.monitoring's profiler slot is held by {tool!r}"
    return None


def _job() -> dict | None:
    """The torchrun job this process is a rank of (from its environment), or None."""
    env = os.environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    from .distributed import rank_info

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


def _not_for_environment() -> bool:
    """Whether this process is gpuprof's command line (``python -m gpuprof ...``), or a
    helper process of multiprocessing (its children's parent is the one to arm)."""
    argv = list(getattr(sys, "orig_argv", []))
    for i, a in enumerate(argv[1:], 1):
        module = (
            argv[i + 1]
            if a == "-m" and i + 1 < len(argv)
            else a[2:]
            if a.startswith("-m") and len(a) > 2
            else None
        )
        if module is not None:
            return module == "gpuprof" or module.startswith("gpuprof.")
        if a == "-c":  # multiprocessing's spawn, forkserver and resource tracker start so
            return "from multiprocessing" in (argv[i + 1] if i + 1 < len(argv) else "")
        if not a.startswith("-") or a == "-":
            break
    return os.path.basename(sys.argv[0] if sys.argv else "") == "gpuprof"


def arm_from_environment() -> None:
    """``GPUPROF_ON_DEMAND=1``: arm at ``import gpuprof`` (gpuprof's own command line,
    which arms only for ``run --on-demand``, and multiprocessing children excepted).

    Options come from ``GPUPROF_ON_DEMAND_SIGNAL``, ``GPUPROF_TRIGGER_DIR``,
    ``GPUPROF_STEP_FN`` and ``GPUPROF_ON_DEMAND_POLL_S``. A failure is one line on
    stderr, never an exception: the program runs unarmed.
    """
    value = os.environ.get("GPUPROF_ON_DEMAND", "").strip()
    if value in ("", "0") or armed() is not None or _not_for_environment():
        return
    mp = sys.modules.get("multiprocessing")
    if mp is not None and mp.parent_process() is not None:
        return  # a DataLoader worker or pool process: its parent is the one armed
    if value != "1":
        _say(f"GPUPROF_ON_DEMAND={value!r}: set it to 1 to arm, 0 or nothing not to; not armed")
        return
    env = os.environ
    kwargs = {
        "signal": env.get("GPUPROF_ON_DEMAND_SIGNAL", "SIGUSR2"),
        "trigger_dir": env.get("GPUPROF_TRIGGER_DIR") or None,
        "step_fn": env.get("GPUPROF_STEP_FN") or None,
    }
    try:
        kwargs["poll_interval_s"] = float(env.get("GPUPROF_ON_DEMAND_POLL_S", "1"))
    except ValueError:
        _say("GPUPROF_ON_DEMAND_POLL_S must be a number of seconds; not armed")
        return
    try:
        if (
            kwargs["signal"] not in (None, "none")
            and threading.current_thread() is not threading.main_thread()
        ):
            _say(
                "GPUPROF_ON_DEMAND=1: gpuprof was first imported off the main thread, where no "
                "signal handler can be installed; requests are read every "
                f"{kwargs['poll_interval_s']:g} s instead"
            )
            kwargs["signal"] = None
        arm(**kwargs)
    except (ValueError, TypeError, RuntimeError, OSError) as e:
        _say(f"GPUPROF_ON_DEMAND=1: not armed: {e}")


def _after_fork_in_child() -> None:
    global _ARMED
    if _ARMED is not None:
        _ARMED._forked()
        _ARMED = None


os.register_at_fork(after_in_child=_after_fork_in_child)
