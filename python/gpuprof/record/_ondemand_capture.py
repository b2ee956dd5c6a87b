"""One on-demand capture: its request, its state, where its answers go, its files.

Used by the armed process (``gpuprof.api.ondemand``): a :class:`Capture` is made from a
request when it is accepted, goes pending -> starting -> recording -> writing (or
cancelled, or failed), and its answers go to a requester's reply folder
(:class:`FolderReply`) or, for ``OnDemand.capture()``, to the caller
(:class:`InProcessReply`, seen through :class:`CaptureRequest`). :func:`write_files`
writes the trace, the saved profile, the stacks and the report (docs/on-demand.md).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from typing import Any

from ..core import _ondemand_proto as proto

__all__ = [
    "DEFAULT_STEPS",
    "Capture",
    "CaptureRequest",
    "FolderReply",
    "InProcessReply",
    "check_capture_args",
    "default_output",
    "write_files",
]

DEFAULT_STEPS = 10


def default_output(pid: int | None = None, when: float | None = None) -> str:
    """``gpuprof-<host>-<pid>-<YYYYmmdd-HHMMSS>`` in the working directory."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    return os.path.abspath(f"gpuprof-{proto.host()}-{pid or os.getpid()}-{stamp}")


def check_capture_args(steps, duration, output, memory) -> None:
    """Check ``OnDemand.capture()``'s arguments (and a request's, output aside).

    Raises:
        ValueError, TypeError: naming the argument and what it must be.
    """
    if steps is not None and duration is not None:
        raise ValueError("capture(): give steps or duration, not both")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"capture(): steps must be a positive int, got {steps!r}")
    if duration is not None and (
        isinstance(duration, bool)
        or not isinstance(duration, (int, float))
        or not math.isfinite(duration)
        or duration <= 0
    ):
        raise ValueError(f"capture(): duration must be a number of seconds > 0, got {duration!r}")
    if output is not None and not isinstance(output, (str, os.PathLike)):
        raise TypeError(f"capture(): output must be a folder path, got {output!r}")
    if not isinstance(memory, bool):
        raise TypeError(f"capture(): memory must be a bool, got {memory!r}")


# -- where answers go ------------------------------------------------------------------------
class FolderReply:
    """Answers written into a requester's reply folder (only while it exists)."""

    def __init__(self, folder: str, wait: bool, shared: bool):
        self.folder = folder
        self.wait = wait
        self.mode = 0o644 if shared else 0o600

    def _write(self, doc: dict, done: bool) -> None:
        if not os.path.isdir(self.folder):  # the requester has gone
            return
        with contextlib.suppress(OSError):
            proto.write_json(
                os.path.join(self.folder, proto.reply_name(proto.host(), os.getpid(), done)),
                doc,
                self.mode,
            )

    def reply(self, doc: dict) -> None:
        self._write(doc, False)

    def done(self, doc: dict) -> None:
        if self.wait:
            self._write(doc, True)


class InProcessReply:
    """Answers to :meth:`OnDemand.capture`, called in the armed process itself."""

    def __init__(self):
        self.replied = threading.Event()
        self.finished = threading.Event()
        self.reply_doc: dict | None = None
        self.done_doc: dict | None = None

    def reply(self, doc: dict) -> None:
        if doc.get("state") == "received":  # the decision follows
            return
        self.reply_doc = doc
        self.replied.set()

    def done(self, doc: dict) -> None:
        self.done_doc = doc
        self.finished.set()


class CaptureRequest:
    """A capture asked for with :meth:`OnDemand.capture`: ``message`` says what it
    records; :meth:`wait` blocks until its files are written."""

    def __init__(self, reply: InProcessReply):
        self._reply = reply
        self.message: str = reply.reply_doc["message"]
        self.output: str = reply.reply_doc["output"]

    @property
    def done(self) -> bool:
        """Whether the files are written (or the capture failed): ``wait()`` returns at once."""
        return self._reply.finished.is_set()

    def wait(self, timeout: float | None = None) -> dict:
        """The result once the files are written: ``ok``, ``files``, ``report``,
        ``steps`` (first and last step of the program recorded), ``diagnosis``
        (text) and ``error``. Call it from a thread other than the one whose
        steps are recorded (that thread must go on stepping).

        Raises:
            TimeoutError: not written within ``timeout`` seconds.
        """
        if not self._reply.finished.wait(timeout):
            raise TimeoutError(f"capture not written within {timeout} s: {self.message}")
        return self._reply.done_doc


# -- one capture ----------------------------------------------------------------------------
class Capture:
    """A capture from acceptance to written files. Fields written by the thread that
    owns the current state (control thread while pending, stepping thread while
    recording, writer while writing); ``state`` changes under OnDemand._lock."""

    def __init__(self, req: dict, reply, found: int):
        steps, duration = req.get("steps"), req.get("duration")
        if steps is None and duration is None:
            steps = DEFAULT_STEPS
        check_capture_args(steps, duration, None, bool(req.get("memory", False)))
        # a summary (``gpuprof top``'s sample) comes back in the done answer: no files
        summary = req.get("summary", False)
        if not isinstance(summary, bool):
            raise ValueError(f"the request's summary must be true or false, got {summary!r}")
        output = req.get("output")
        if not (summary and output is None) and (
            not isinstance(output, str) or not os.path.isabs(output)
        ):
            raise ValueError(
                f"the request's output folder must be an absolute path, got {output!r}"
            )
        start = req.get("start_step")
        if start is not None and (
            isinstance(start, bool) or not isinstance(start, int) or start < 0
        ):
            raise ValueError(f"the request's start_step must be an int >= 0, got {start!r}")
        self.rid = str(req.get("id"))
        self.steps: int | None = steps
        self.duration: float | None = float(duration) if duration is not None else None
        self.output = output
        self.summary = summary
        self.memory = bool(req.get("memory", False))
        self.start_step: int | None = start
        self.requested_by = req.get("requested_by")
        self.requested_at = time.time()
        self.found_at_request = found
        self.reply = reply
        self.state = "pending"  # -> starting -> recording -> writing, or cancelled
        self.prof: Any = None  # a gpuprof.profile once prepared (api layer: not imported)
        self.thread: int | None = None  # ident of the thread that started and steps it
        self.first_step: int | None = None
        self.recorded = 0  # steps closed so far
        self.t_start = 0.0
        self.t_stop = 0.0
        self.deadline: float | None = None
        self.cut_short: str | None = None
        self.abort = False  # set by an "abort" cancel: stop at the next boundary, keep nothing
        # what this capture cost the program, in seconds (a summary reports it): the
        # profile made (control thread's CPU), started and stopped (the stepping thread)
        self.prepare_s = self.start_s = self.stop_s = 0.0
        self.writer: threading.Thread | None = None

    def what(self) -> str:
        if self.summary:
            return f"{self._span()} for `gpuprof top`"
        return self._span()

    def where(self) -> str:
        """Where the results go: the output folder, or back to the requester."""
        return f"into {self.output}" if self.output is not None else "for `gpuprof top`"

    def _span(self) -> str:
        if self.steps is not None:
            return f"the next {self.steps} step{'s' if self.steps != 1 else ''}"
        return f"{self.duration:g} s"


# -- the files ---------------------------------------------------------------------------------
def _stem(pid: int, cap: Capture) -> str:
    base = f"{proto.host()}_{pid}_" + (
        f"step{cap.first_step}" if cap.first_step is not None else time.strftime("%H%M%S")
    )
    stem, n = os.path.join(cap.output, base), 1
    while any(os.path.exists(stem + ext) for ext in (".gpuprof", ".txt")):
        n += 1
        stem = os.path.join(cap.output, f"{base}-{n}")
    return stem


def _page(folder: str) -> str:
    """``report.html`` in ``folder``, as ``run --output`` names it; a later capture into
    the same folder gets ``report-2.html``, ``report-3.html``...: nothing is overwritten."""
    n = 1
    while True:  # reserved by creating it: the ranks of a job capture into one folder at once
        path = os.path.join(folder, "report.html" if n == 1 else f"report-{n}.html")
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return path
        except FileExistsError:
            n += 1


def write_files(cap: Capture, pid: int, steps_from: str) -> dict:
    """Trace, saved profile, stacks, report (table, steps, diagnosis) and HTML report
    (``report.html``, see :func:`_page`) into cap.output,
    for process ``pid`` whose steps come from ``steps_from``.

    Returns:
        The result a requester gets: ``ok``, ``files``, ``report``, ``html``, ``summary``,
        ``n_steps``, ``steps``, ``first_step``, ``seconds``, ``diagnosis``, ``cut_short``;
        ``ok`` False with ``error`` when nothing was recorded.

    Raises:
        OSError: a file could not be written.
    """
    prof = cap.prof
    try:
        results = prof.results
        n_steps = len(results.steps())
    except RuntimeError as e:
        return {"ok": False, "error": f"nothing was recorded ({e})"}
    os.makedirs(cap.output, exist_ok=True)
    stem = _stem(pid, cap)
    files = [stem + ".pt.trace.json.gz", stem + ".gpuprof", stem + ".stacks.txt"]
    prof.export_chrome_trace(files[0])
    prof.save(files[1])
    prof.export_stacks(files[2])
    seconds = cap.t_stop - cap.t_start
    if cap.first_step is not None:
        span = (
            f"steps {cap.first_step}-{cap.first_step + n_steps - 1} of the program"
            if n_steps
            else f"no whole step from step {cap.first_step} of the program"
        )
        summary = f"{n_steps} step{'s' if n_steps != 1 else ''}, {span}"
    else:
        summary = f"a {seconds:.1f} s time window"
    dropped = results.dropped_events
    if dropped:  # the table's footer says it too; the requester hears it here
        summary += f"; {dropped:,} events dropped: the event buffer was full, ask for fewer steps"
    diagnosis = str(prof.diagnose())
    sort = "self_cuda_time_total" if results.cuda.get("active") else "self_cpu_time_total"
    command = " ".join(getattr(sys, "orig_argv", sys.argv))
    lines = [
        f"gpuprof on-demand capture of pid {pid} on {proto.host()}: {command}",
        f"asked for at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(cap.requested_at))}"
        + (f" by pid {cap.requested_by}" if cap.requested_by else "")
        + f"; recorded {summary} ({seconds:.2f} s; steps are counted from arming, step "
        f"boundaries: {steps_from})",
    ]
    if cap.cut_short:
        lines.append(f"cut short: {cap.cut_short}")
    lines += ["", str(prof.key_averages().table(sort_by=sort, row_limit=20)), ""]
    if cap.memory:
        lines += [str(prof.memory_summary()), ""]
    lines.append(diagnosis)
    report = stem + ".txt"
    with open(report, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    # the page `run --output` writes too, beside the trace it links
    html = _page(cap.output)
    prof.export_html(
        html, trace=files[0], title=f"gpuprof capture of pid {pid} on {proto.host()}: {summary}"
    )
    first = cap.first_step
    return {
        "ok": True,
        "files": files + [report, html],
        "report": report,
        "html": html,
        "output": cap.output,
        "summary": summary,
        "n_steps": n_steps,
        "cut_short": cap.cut_short,
        "steps": [first, first + n_steps - 1] if first is not None and n_steps else None,
        "first_step": first,
        "seconds": seconds,
        "diagnosis": diagnosis,
        "dropped_events": dropped,
        "cuda": bool(results.cuda.get("active")),
    }
