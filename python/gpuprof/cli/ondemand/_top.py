"""``gpuprof top``'s side of the exchange: ask armed processes every refresh how far
they have stepped, sample one of their steps now and then, and hand each interval's
figures to the screen (``gpuprof.cli._top`` draws them).

Two kinds of request go out, through the folders ``gpuprof capture`` uses
(``_exchange``):

- a ``query`` at every refresh: the step count of each process. The step rate is
  the count's change between two answers over the time between them, so it is
  the program's own rate, over every step of the interval.
- a ``capture`` of one step with ``"summary": true``: the process records the
  step from its next step boundary, as a capture would, then answers with a
  summary of a few KB (``_summary``) instead of writing files. The ranks of a
  job (``--all-ranks``, ``--trigger-dir``) are asked for the same step number,
  as ``capture`` asks them.

The sampling rule: one sample at a time, at most one per refresh, and spaced so
that the samples take at most ``overhead`` (1%) of the job's time. Each summary
says what its sample cost the program: the profile made and started, the step
recorded under the hook (what it took beyond the job's usual step, from the step
rate), stopped and summed up. The next sample is asked for once
``cost / overhead`` seconds have passed since the last one was, and not before the
samples so far, the first included, are ``overhead`` of the time since top started
(:func:`next_sample_at`). A process's first sample comes at once, so the screen
fills within a refresh; it pays once for loading gpuprof's analysis (and CUPTI, on
a GPU), and the samples after it wait until that is paid off.

Leaving cancels a sample not yet recorded, and stops one that records at its next
step boundary with nothing kept (an ``abort`` cancel), so the processes are back to
armed and idle. Failures raise :class:`CaptureError` (``_targets``).
"""

from __future__ import annotations

import collections
import contextlib
import os
import statistics
import time

from ._client import _start_step
from ._exchange import POLL_S, PREPARE_S, _Exchange
from ._targets import CaptureError, Target

__all__ = ["OVERHEAD", "Proc", "Row", "Interval", "Top"]

OVERHEAD = 0.01  # the share of the job's time the samples may take, by default
BACKOFF_S = 30.0  # a process that could not record a sample is asked again after this
GRACE_S = 0.5  # at a refresh, how long to wait for the step counts just asked for
LATE_FACTOR_MAX = 8  # same-step samples refused as too late get more margin, up to this


class Proc:
    """One armed process as top sees it: its step counts and its latest sample."""

    def __init__(self, key: str, doc: dict, target: Target | None):
        self.key = key  # "<host>_<pid>", as its answers are named
        self.pid = int(doc.get("pid") or (target.pid if target else 0))
        self.host = str(doc.get("host") or (target.host if target else "?"))
        self.rank = doc.get("rank", target.rank if target else None)
        self.world_size = doc.get("world_size", target.world_size if target else None)
        self.target = target
        self.status: dict | None = None  # its latest answer to a query
        self.answered_at: float | None = None
        self.points: collections.deque = collections.deque(maxlen=64)  # (time, found)
        self.mark: tuple[float, int] | None = None  # the count at the last refresh
        self.rate: float | None = None  # the latest step rate shown
        self.sample: dict | None = None  # its latest summary, and when it came
        self.sample_at = 0.0
        self.sampled = 0  # summaries that came since the last refresh
        self.taken = 0  # summaries received from it
        self.error: str | None = None
        self.retry_at = 0.0
        self.gone = False

    @property
    def name(self) -> str:
        who = f"pid {self.pid}"
        if self.rank is not None:
            who = f"rank {self.rank} (pid {self.pid})"
        return who

    def step_s(self) -> float | None:
        """The job's usual step time: over the last counts, None without two of them."""
        pts = [p for p in self.points if p[0] >= self.points[-1][0] - 10.0] if self.points else []
        if len(pts) < 2 or pts[-1][1] <= pts[0][1]:
            return None
        return (pts[-1][0] - pts[0][0]) / (pts[-1][1] - pts[0][1])

    def cost_s(self, doc: dict) -> float:
        """What ``doc``'s sample took from this process, in seconds (see the module)."""
        cost = doc.get("cost") or {}
        hooked = (doc.get("step_ns") or 0) / 1e9 / max(int(doc.get("n_steps") or 1), 1)
        usual = self.step_s()
        extra = max(0.0, hooked - usual) if usual is not None else hooked
        return (
            float(cost.get("prepare_s") or 0.0)
            + float(cost.get("start_s") or 0.0)
            + float(cost.get("stop_s") or 0.0)
            + float(cost.get("summary_s") or 0.0)
            + extra
        )


class Row:
    """One process over one refresh interval."""

    def __init__(self, proc: Proc, steps: int | None, seconds: float | None, now: float):
        self.proc = proc
        self.steps = steps  # steps counted over the interval (None: no new count)
        self.seconds = seconds  # the time between the two counts
        self.rate = steps / seconds if steps is not None and seconds else proc.rate
        # None, or how old the latest count is when none came this interval (a busy
        # program's main thread can keep gpuprof's thread from answering for a while)
        self.count_age = None if steps is not None or not proc.points else now - proc.points[-1][0]
        if steps is not None and seconds:
            proc.rate = self.rate
        self.found = proc.status.get("found") if proc.status else None
        self.sample = proc.sample
        self.sample_age = now - proc.sample_at if proc.sample is not None else None
        self.sampled = proc.sampled
        self.state = (proc.status or {}).get("state")
        self.message = (proc.status or {}).get("message")
        self.error = proc.error
        self.gone = proc.gone
        self.silent_s = now - proc.answered_at if proc.answered_at is not None else None


class Interval:
    """What one refresh shows: a row per process, and how top samples."""

    def __init__(self, top: Top, rows: list[Row], seconds: float, now: float):
        self.time = time.time()
        self.seconds = seconds
        self.rows = rows
        self.spacing_s = top.spacing_s  # the time between samples the rule asks for
        self.cost_s = top.last_cost_s  # what the latest sample took from the job
        self.share = top.total_cost_s / max(now - top.started_at, 1e-9)  # so far
        self.overhead = top.overhead
        self.note = top.note
        self.in_flight = top.in_flight_description(now)


class _Sample:
    """One sample in flight: the request, its answers, the start step."""

    def __init__(self, ex: _Exchange, keys: set[str], start_step: int | None, now: float):
        self.ex = ex
        self.keys = keys  # the processes asked (every watcher of a trigger folder: known ones)
        self.start_step = start_step
        self.sent_at = now
        self.replies: dict[str, dict] = {}
        self.accepted: set[str] = set()
        self.received = False


class Top:
    """The exchange loop of ``gpuprof top`` over local targets or a trigger folder.

    ``refresh()`` asks for the step counts and returns the :class:`Interval` since the
    last one; ``poll(until, stop)`` handles answers and samples until ``until`` (or
    ``stop()`` is true); ``close()`` cancels what is in flight.
    """

    def __init__(
        self,
        *,
        targets: list[Target] | None = None,
        trigger_dir: str | None = None,
        interval: float = 1.0,
        overhead: float = OVERHEAD,
        timeout: float = 10.0,
        memory: bool = True,
    ):
        if (targets is None) == (trigger_dir is None):
            raise ValueError("Top(): give targets or trigger_dir")
        self.targets = targets or []
        self.trigger_dir = trigger_dir
        self.interval = interval
        self.overhead = overhead
        self.timeout = timeout
        self.memory = memory
        self.procs: dict[str, Proc] = {}
        for t in self.targets:
            self.procs[t.reply_file[: -len(".reply.json")]] = Proc(
                t.reply_file[: -len(".reply.json")], {"pid": t.pid, "host": t.host}, t
            )
        self.same_step = trigger_dir is not None or len(self.targets) > 1
        self.started_at = time.monotonic()
        self.last_refresh = self.started_at
        self.refreshes = 0  # intervals returned by refresh()
        self.queries: dict[str, tuple[_Exchange, float]] = {}  # unit -> (exchange, sent at)
        self._shared_seen = False  # a first question to the trigger folder has had its answers
        self.rtts: collections.deque = collections.deque(maxlen=15)  # query round trips
        self.sample: _Sample | None = None
        self.next_sample_at = 0.0
        self.spacing_s: float | None = None
        self.last_cost_s: float | None = None
        self.total_cost_s = 0.0
        self.samples = 0  # summaries received
        self.late_factor = 1
        self.note: str | None = None  # why the latest sample did not happen
        self._cancels: list[_Cancel] = []  # samples being undone
        self.unsettled: list[str] = []  # processes not seen idle again after a cancel
        self.cancelled: list[str] = []  # processes whose sample close() undid

    # -- step counts ---------------------------------------------------------------------------
    def _units(self) -> list[str]:
        """A query goes to each local target on its own, or once to the trigger folder."""
        if self.trigger_dir is not None:
            return ["*"]
        return [k for k, p in self.procs.items() if not p.gone]

    def ask(self) -> None:
        """Ask every process for its step count (those that have not answered the last
        question yet are not asked again until it times out)."""
        now = time.monotonic()
        for unit in self._units():
            old = self.queries.get(unit)
            if old is not None:
                if now - old[1] < self.timeout:
                    continue
                old[0].close()
            if unit == "*":
                ex = _Exchange(self.trigger_dir, shared=True)
                ex.send_shared({"op": "query"})
            else:
                ex = _Exchange(self.procs[unit].target.runtime, shared=False)
                try:
                    ex.send_local(self.procs[unit].target, {"op": "query"})
                except BaseException:
                    ex.close()
                    raise
            self.queries[unit] = (ex, now)

    def _read_queries(self, now: float) -> None:
        for unit, (ex, sent) in list(self.queries.items()):
            got = ex.answers()
            for key, doc in got.items():
                if doc.get("state") == "received":
                    continue
                proc = self._proc(key, doc)
                if proc.answered_at is not None and proc.answered_at >= sent:
                    continue  # this exchange's answer, read already
                proc.status = doc
                proc.answered_at = now
                proc.points.append((now, int(doc.get("found") or 0)))
                self.rtts.append(now - sent)
            done = unit != "*" and unit in got and got[unit].get("state") != "received"
            if unit == "*":
                done = self._shared_answered(sent, now)
            if done:
                ex.close()
                del self.queries[unit]
                self._shared_seen = self._shared_seen or unit == "*"

    def _shared_answered(self, sent: float, now: float) -> bool:
        """Whether a question to the trigger folder has had its answers: from as many
        processes as the job's world size, or, without one, from every process known
        (the first time: from those that answered within two poll intervals)."""
        known = [p for p in self.procs.values() if not p.gone]
        answered = [p for p in known if p.answered_at is not None and p.answered_at >= sent]
        if now - sent > 2 * self._poll_s() + 1.0:
            return True
        worlds = {p.world_size for p in known if p.world_size}
        if worlds:
            return len(answered) >= max(worlds)
        return self._shared_seen and bool(known) and len(answered) == len(known)

    def _proc(self, key: str, doc: dict) -> Proc:
        proc = self.procs.get(key)
        if proc is None:  # a watcher of the trigger folder, seen for the first time
            proc = self.procs[key] = Proc(key, doc, None)
        if doc.get("rank") is not None:
            proc.rank, proc.world_size = doc.get("rank"), doc.get("world_size")
        return proc

    def _poll_s(self) -> float:
        polls = [float((p.status or {}).get("poll_interval_s") or 1.0) for p in self.procs.values()]
        return max(polls, default=1.0)

    def first_answers(self, stop=None) -> bool:
        """Ask and wait for every process's first step count; True when ``stop()`` said
        to leave meanwhile.

        Raises:
            CaptureError: none answered within the timeout (code 1), or, with local
                targets, one has exited.
        """
        self.ask()
        deadline = time.monotonic() + self.timeout + (self._poll_s() if self.trigger_dir else 0)
        while time.monotonic() < deadline:
            now = time.monotonic()
            self._read_queries(now)
            if self.procs and all(p.status is not None for p in self.procs.values()):
                if self.trigger_dir is None or not self.queries:
                    break
            if stop is not None and stop():
                return True
            time.sleep(POLL_S)
        silent = [p for p in self.procs.values() if p.status is None]
        if self.trigger_dir is not None and not self.procs:
            raise CaptureError(
                f"--trigger-dir: no armed process watches {self.trigger_dir!r} (none "
                f"answered within {self.timeout:g} s); arm the ranks with "
                f"--trigger-dir {self.trigger_dir} (or GPUPROF_TRIGGER_DIR)",
                code=1,
            )
        if silent:
            gone = [p for p in silent if p.target is not None and not p.target.alive()]
            if gone:
                raise CaptureError(
                    f"{', '.join(p.target.name for p in gone)} exited before answering", code=1
                )
            names = ", ".join(p.target.name if p.target else p.name for p in silent)
            raise CaptureError(
                f"no answer from {names} within {self.timeout:g} s; the program may be "
                "stuck in native code with its main thread busy; try again with a "
                "larger --timeout",
                code=1,
            )
        self.last_refresh = time.monotonic()
        for p in self.procs.values():
            if p.points:
                p.mark = p.points[-1]
        return False

    def refresh(self, stop=None) -> Interval:
        """Ask for the step counts, wait a moment for them, and return the interval
        since the last refresh (its counts, the samples that came)."""
        self.ask()
        # The first refresh waits up to the timeout for the counts, so that it shows a
        # rate: a process's on-demand thread answers nothing while it sets up the first
        # sample (imports, CUPTI), which takes seconds on a loaded machine. (Later ones
        # do not: a process that stopped answering is shown as such every interval.)
        if not self.refreshes and any(p.rate is None for p in self.procs.values()):
            grace = self.timeout
        else:
            grace = min(GRACE_S, self.interval)
        self.poll(time.monotonic() + grace, stop, counts_only=True)
        now = time.monotonic()
        rows = []
        for p in self.procs.values():
            if p.target is not None and not p.gone and not p.target.alive():
                p.gone = True
            steps = seconds = None
            last = p.points[-1] if p.points else None
            if last is not None and p.mark is not None and last[0] > p.mark[0]:
                steps, seconds = last[1] - p.mark[1], last[0] - p.mark[0]
            rows.append(Row(p, steps, seconds, now))
            if last is not None and (p.mark is None or last[0] > p.mark[0]):
                p.mark = last
            p.sampled = 0
        rows.sort(key=lambda r: (r.proc.rank is None, r.proc.rank or 0, r.proc.host, r.proc.pid))
        out = Interval(self, rows, now - self.last_refresh, now)
        self.last_refresh = now
        self.refreshes += 1
        return out

    @property
    def all_gone(self) -> bool:
        return bool(self.procs) and all(p.gone for p in self.procs.values())

    # -- the loop ------------------------------------------------------------------------------
    def poll(self, until: float, stop=None, counts_only: bool = False) -> bool:
        """Read answers and ask for samples until ``until``; True when ``stop()`` said so.
        ``counts_only``: return as soon as every process asked has answered."""
        while True:
            now = time.monotonic()
            self._read_queries(now)
            if self._cancels:
                self._read_cancels(now)
            if not counts_only:
                self._drive_sample(now)
            if stop is not None and stop():
                return True
            if counts_only and not self.queries:
                return False
            if now >= until:
                return False
            time.sleep(max(0.0, min(POLL_S, until - now)))

    # -- samples -------------------------------------------------------------------------------
    def _drive_sample(self, now: float) -> None:
        if self.sample is not None:
            self._read_sample(now)
            return
        if now < self.next_sample_at or self._cancels:  # one being undone: wait for it
            return
        live = [p for p in self.procs.values() if not p.gone and p.status is not None]
        if not live or any(now < p.retry_at for p in live):
            return
        if any(not p.status.get("found") for p in live):
            self.note = (
                "no step found yet (steps: "
                f"{next(p.status.get('steps_from') for p in live if not p.status.get('found'))}"
                "): top samples whole steps"
            )
            return
        mine = os.getpid()
        busy = [
            p
            for p in live
            if p.status.get("state") != "idle" and p.status.get("requested_by") != mine
        ]
        if busy:  # another requester's capture: asked again once the counts say idle
            self.note = busy[0].status.get("message")
            return
        self._send_sample(live, now)

    def _send_sample(self, live: list[Proc], now: float) -> None:
        start_step = None
        if self.same_step:
            statuses = [p.status for p in live]
            stale = max(now - (p.answered_at or now) for p in live)
            # as `capture` reckons it, with the usual round trip rather than the slowest:
            # the odd answer a busy main thread delays would put every sample seconds off
            rtt = statistics.median(self.rtts) if self.rtts else 0.0
            if self.trigger_dir is not None:
                latency = max(1.0, 2 * rtt) + 2 * self._poll_s()
            else:
                polled = max(
                    (p.target.poll_s for p in live if p.target.signal() is None), default=0.0
                )
                latency = max(0.5, 3 * rtt) + polled
            f = self.late_factor
            start_step = _start_step(statuses, f * latency + stale, f)
        req = {
            "op": "capture",
            "steps": 1,
            "summary": True,
            "memory": self.memory,
            "wait": True,
            "output": None,
            "start_step": start_step,
            "requested_by": os.getpid(),
        }
        if self.trigger_dir is not None:
            ex = _Exchange(self.trigger_dir, shared=True)
            ex.send_shared(req)
        else:
            ex = _Exchange(live[0].target.runtime, shared=False)
            try:
                for p in live:
                    ex.send_local(p.target, req)
            except BaseException:
                ex.close()
                raise
        self.sample = _Sample(ex, {p.key for p in live}, start_step, now)

    def _read_sample(self, now: float) -> None:
        s = self.sample
        for key, doc in s.ex.answers().items():
            if key not in s.keys:
                if self.trigger_dir is None:
                    continue
                self._proc(key, doc)  # a watcher that joined: its answer counts
                s.keys.add(key)
            if doc.get("state") == "received":
                s.received = True
            elif key not in s.replies:
                s.replies[key] = doc
                if doc.get("ok"):
                    s.accepted.add(key)
        if len(s.replies) < len(s.keys):
            limit = self.timeout + (PREPARE_S if s.received else 0.0) + self._poll_s()
            if now - s.sent_at > limit:
                silent = sorted(self.procs[k].name for k in s.keys - set(s.replies))
                self.note = f"no answer to the sample request from {', '.join(silent)}"
                self._abandon(s)
                self.next_sample_at = now + self.interval
            return
        refused = [d for d in s.replies.values() if not d.get("ok")]
        if refused:
            if all(d.get("state") == "late" for d in refused):
                self.late_factor = min(self.late_factor * 2, LATE_FACTOR_MAX)
            for d in refused:
                if d.get("state") == "failed":
                    proc = self.procs.get(self._key_of(d))
                    if proc is not None:
                        proc.error = d.get("message")
                        proc.retry_at = now + BACKOFF_S
            self.note = "; ".join(str(d.get("message")) for d in refused)
            self._abandon(s)
            self.next_sample_at = now + self.interval
            return
        done = s.ex.answers(done=True)
        if not set(s.accepted) <= set(done):
            for key in s.accepted - set(done):  # a process that exits never answers
                p = self.procs[key]
                if p.target is not None and not p.target.alive():
                    p.gone = True
                    s.accepted.discard(key)
            if not s.accepted <= set(done):
                return
        cost = paced = 0.0
        for key in s.accepted:
            doc, proc = done[key], self.procs[key]
            if doc.get("ok"):
                proc.sample, proc.sample_at, proc.error = doc, now, None
                proc.sampled += 1
                proc.taken += 1
                self.samples += 1
                cost = max(cost, proc.cost_s(doc))
                if proc.taken > 1:  # the first pays once for imports (and CUPTI): not paced
                    paced = max(paced, proc.cost_s(doc))
            else:
                proc.error = doc.get("error")
                proc.retry_at = now + BACKOFF_S
        s.ex.close()
        self.sample = None
        self.note = None
        self.late_factor = max(1, self.late_factor // 2)
        if cost:
            self.last_cost_s = cost
            self.total_cost_s += cost
        self.spacing_s = max(self.interval, paced / self.overhead)
        self.next_sample_at = next_sample_at(
            s.sent_at, self.spacing_s, self.started_at, self.total_cost_s, self.overhead
        )

    @staticmethod
    def _key_of(doc: dict) -> str:
        return f"{doc.get('host')}_{doc.get('pid')}"

    def in_flight_description(self, now: float) -> str | None:
        s = self.sample
        if s is None:
            return None
        at = f"step {s.start_step}" if s.start_step is not None else "the next step boundary"
        return f"sampling one step from {at} (asked {now - s.sent_at:.1f} s ago)"

    def _abandon(self, s: _Sample, wait_s: float = 0.0) -> list[str]:
        """Undo sample ``s`` where it was taken: cancelled where it has not started,
        stopped with nothing kept at the next step boundary where it has. With
        ``wait_s``, wait up to that long until each process is idle again; else
        :meth:`poll` reads the answers later. Returns the processes asked to undo it."""
        if self.sample is s:
            self.sample = None
        taken = {_pid_of(path) for path in s.ex.withdraw()}
        finished = set(s.ex.answers(done=True))
        refused = {k for k, d in s.replies.items() if not d.get("ok")}
        pending = [
            k
            for k in sorted(s.keys)
            if k not in finished
            and k not in refused
            # a request to one pid that is still there was never read: nothing to undo
            and (self.trigger_dir is not None or self.procs[k].pid in taken)
        ]
        if not pending:
            s.ex.close()
            return []
        cancel = {"op": "cancel", "target": s.ex.rid, "abort": True}
        if self.trigger_dir is not None:
            ex = _Exchange(self.trigger_dir, shared=True)
            ex.send_shared(cancel)
        else:
            ex = _Exchange(self.procs[pending[0]].target.runtime, shared=False)
            for key in pending:
                with contextlib.suppress(CaptureError):
                    ex.send_local(self.procs[key].target, cancel)
        self._cancels.append(_Cancel(ex, s.ex, pending, time.monotonic()))
        if wait_s:
            self._settle(wait_s)
        return pending

    def _settle(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while self._cancels and time.monotonic() < deadline:
            self._read_cancels(time.monotonic())
            if self._cancels:
                time.sleep(POLL_S)

    def _read_cancels(self, now: float) -> None:
        """Close the cancels whose processes are idle again (or gone, or silent for
        longer than the timeout)."""
        for c in list(self._cancels):
            got = c.ex.answers()
            done = c.sample_ex.answers(done=True)  # an abort ends with "aborted" here
            settled = True
            for k in c.keys:
                d = got.get(k)
                proc = self.procs[k]
                if proc.gone or (proc.target is not None and not proc.target.alive()):
                    continue
                if d is None or d.get("state") == "received":
                    settled = False
                elif d.get("state") == "aborting" and k not in done:
                    settled = False  # stops at its next step boundary
            if settled or now - c.sent > self.timeout + self._poll_s():
                if not settled:
                    self.unsettled = sorted(
                        {self.procs[k].name for k in c.keys} | set(self.unsettled)
                    )
                c.ex.close()
                c.sample_ex.close()
                self._cancels.remove(c)

    def close(self) -> None:
        """Cancel the sample in flight and wait, up to the timeout, until every process
        is idle again (``unsettled`` names those that were not); remove every request
        and answer folder of this top."""
        if self.sample is not None:
            self.cancelled = [self.procs[k].name for k in self._abandon(self.sample)]
        self._settle(self.timeout + self._poll_s())
        for ex, _ in self.queries.values():
            ex.close()
        self.queries.clear()
        for c in self._cancels:
            self.unsettled = sorted({self.procs[k].name for k in c.keys} | set(self.unsettled))
            c.ex.close()
            c.sample_ex.close()
        self._cancels = []


class _Cancel:
    """A cancel in flight: its exchange, the sample's (where an abort's end is
    answered), the processes asked, when."""

    def __init__(self, ex: _Exchange, sample_ex: _Exchange, keys: list[str], sent: float):
        self.ex = ex
        self.sample_ex = sample_ex
        self.keys = keys
        self.sent = sent


def next_sample_at(
    sent_at: float, spacing_s: float, started_at: float, total_cost_s: float, overhead: float
) -> float:
    """When the next sample may be asked for: ``spacing_s`` after the last one was
    (its own cost over ``overhead``, at least a refresh), and not before every sample
    so far is at most ``overhead`` of the time since top started. The first sample's
    one-time costs would otherwise make a watch of a few seconds cost the job twice
    its share (measured on an H100: 2.3% over 8 s watches at the 1% default)."""
    return max(sent_at + spacing_s, started_at + total_cost_s / overhead)


def _pid_of(request_path: str) -> int | None:
    head = os.path.basename(request_path).split(".")[0]
    return int(head) if head.isdigit() else None
