"""``gpuprof top PID``: a live view of an armed program, refreshed every second or so.

The exchange with the program (step counts, sampled steps, the sampling rule) is
``_ondemand._top``'s; this module checks the arguments, draws each interval (a
full screen with curses when stdout is a terminal, else one line per process per
interval) and leaves on ``q``, Ctrl-C, SIGTERM or SIGHUP with the program back to
armed and idle.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time

from ..core._format import format_bytes
from ._capture import check_targets
from ._common import _flush

LINE_OPS = 3  # ops named on each plain line


# -- arguments ---------------------------------------------------------------------------------
def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 < value <= 50:
        raise argparse.ArgumentTypeError(f"must be a percentage in (0, 50], got {text!r}")
    return value


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds from 0.1 to 3600, got {text!r}"
        )
    return value


def add_parser(sub, pid_arg, seconds, positive) -> None:
    """The ``top`` subcommand, on ``sub`` (the parser's subcommands)."""
    tp = sub.add_parser(
        "top",
        help="watch an armed program live: step rate, GPU busy, waits, hottest functions",
        description="A live view of a running program armed with `run --on-demand`, "
        "gpuprof.arm() or GPUPROF_ON_DEMAND=1, like py-spy top: its step rate and step "
        "time over each interval, and, from one step it records now and then, the "
        "shares of GPU busy, data wait, sync wait and communication, peak memory, and "
        "the functions and ops that took the most self CPU and CUDA time. Samples are "
        "spaced so that they take at most --overhead of the program's time. q or Ctrl-C "
        "leaves the program armed and idle. When stdout is not a terminal, one line per "
        "process per interval.",
        epilog="Examples: python -m gpuprof top 4242; python -m gpuprof top 4242 "
        "--iterations 10 > top.log; python -m gpuprof top --all-ranks 4242",
    )
    tp.add_argument(
        "pids",
        nargs="*",
        type=pid_arg,
        metavar="PID",
        help="the armed process; with --all-ranks, every rank (or one rank: the other "
        "ranks of its torchrun job on this host are found)",
    )
    tp.add_argument(
        "--all-ranks",
        action="store_true",
        help="watch every rank of the job, sampling the same step number on each (default: off)",
    )
    tp.add_argument(
        "--trigger-dir",
        metavar="DIR",
        help="watch every process armed with --trigger-dir DIR, on any host (default: none)",
    )
    tp.add_argument(
        "--interval",
        "-n",
        type=_interval,
        default=1.0,
        metavar="S",
        help="seconds between refreshes (default: 1)",
    )
    tp.add_argument(
        "--iterations",
        type=positive,
        metavar="N",
        help="leave after N refreshes (default: run until q or Ctrl-C)",
    )
    tp.add_argument(
        "--overhead",
        type=_percent,
        default=1.0,
        metavar="PCT",
        help="the share of the program's time the sampled steps may take, in percent; "
        "samples are spaced out to stay under it (default: 1)",
    )
    tp.add_argument(
        "--timeout",
        type=seconds(True),
        default=10.0,
        metavar="S",
        help="how long to wait for the program to answer (default: 10)",
    )
    tp.set_defaults(fn=cmd_top)


# -- figures as text -----------------------------------------------------------------------------
def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"


def _pct(part: int | None, whole: int | None) -> str:
    if part is None or not whole:
        return "-"
    return f"{100.0 * part / whole:.1f}%"


def _rate(row) -> str:
    if row.gone:
        return "exited"
    if row.rate is None:
        return "counting steps"
    if row.steps == 0:
        return f"no step in {row.seconds:.1f} s (at step {row.found})"
    old = f"; no new count for {row.count_age:.1f} s" if row.count_age is not None else ""
    return f"{row.rate:.1f} steps/s (step {_dur(1 / row.rate)}{old})"


def _shares(sample: dict) -> str:
    parts = sample.get("parts")
    if not parts:
        return "no whole step recorded"
    total = parts["step_ns"]
    waits = (
        f"data wait {_pct(parts['data_wait_ns'], total)}, "
        f"sync wait {_pct(parts['sync_wait_ns'], total)}"
    )
    if not sample.get("cuda"):
        return f"GPU not recorded, {waits}"
    return (
        f"GPU busy {_pct(parts['gpu_busy_ns'], total)}, comm "
        f"{_pct(parts['comm_ns'], total)}, {waits}"
    )


def _memory(sample: dict) -> str:
    mem = sample.get("memory")
    if not mem:
        return ""
    out = [
        f"{name} {format_bytes(d['peak_bytes'], 'binary')}"
        for name, d in sorted(mem.get("devices", {}).items())
    ]
    if mem.get("host_peak_bytes") is not None:
        out.append(f"RSS {format_bytes(mem['host_peak_bytes'], 'binary')}")
    return "peak " + ", ".join(out) if out else ""


def _ranked(ops: list | None, column: str, step_ns: int | None) -> str:
    """The first LINE_OPS ops, by name, each with its share of the sampled step."""
    if not ops:
        return "-"
    return ", ".join(f"{o['name']} {_pct(o[column], step_ns)}" for o in ops[:LINE_OPS])


def _finding(f: dict, cut: bool = False) -> str:
    """A finding of the diagnosis in one line (``cut``: its title up to the first colon)."""
    title = f["title"].split(":")[0] if cut else f["title"]
    at = f" at {f['location']}" if f.get("location") else ""
    return f"[{100 * f['severity']:.1f}% of {f['share_of']}] {title}{at}"


def _sampled(row, seconds: float) -> str:
    """How many steps were sampled of those counted, over the time they were counted
    in (the time between two step counts, close to the refresh interval)."""
    if row.steps is None:
        return f"sampled {row.sampled} steps in the last {seconds:.1f} s"
    return f"sampled {row.sampled} of {row.steps} steps in the last {row.seconds:.1f} s"


def line(iv, row) -> str:
    """One process over one interval, as the plain (not a terminal) output prints it."""
    stamp = time.strftime("%H:%M:%S", time.localtime(iv.time))
    head = f"{stamp} {row.proc.name}: {_rate(row)}"
    if row.gone:
        return head
    out = [head, _sampled(row, iv.seconds)]
    s = row.sample
    if s is not None:
        step_ns = s.get("step_ns")
        age = "" if row.sampled else f", {row.sample_age:.1f} s ago"
        took = f" took {_dur(step_ns / 1e9)} under the hook" if step_ns else ""
        out.append(f"step {s.get('first_step')}{took}{age}: {_shares(s)}")
        mem = _memory(s)
        if mem:
            out.append(mem)
        out.append("self CPU: " + _ranked(s.get("cpu_ops"), "cpu_self_ns", step_ns))
        if s.get("cuda"):
            out.append("self CUDA: " + _ranked(s.get("cuda_ops"), "cuda_self_ns", step_ns))
        if s.get("findings"):
            out.append("diagnosis: " + _finding(s["findings"][0], cut=True))
    why = row.error or (iv.note if not row.sampled else None)
    if why:
        out.append(f"not sampled: {why}")
    elif not row.sampled and iv.in_flight:
        out.append(iv.in_flight)
    return "; ".join(out)


def _rule(iv) -> str:
    """How top samples, for the screen's second line."""
    if iv.spacing_s is None:
        return f"one step at most every {iv.seconds:.1f} s"
    share = f", {100 * iv.share:.2f}% of the job's time so far" if iv.cost_s else ""
    return (
        f"one step every {iv.spacing_s:.1f} s (a sample costs the job about "
        f"{_dur(iv.cost_s)}; limit {iv.overhead * 100:g}%{share})"
    )


def screen(iv, width: int, height: int, title: str) -> list[str]:
    """The terminal view of one interval, as lines of at most ``width`` characters."""
    stamp = time.strftime("%H:%M:%S", time.localtime(iv.time))
    sampled = sum(r.sampled for r in iv.rows)
    steps = sum(r.steps or 0 for r in iv.rows)
    lines = [
        f"gpuprof top  {stamp}  refresh {iv.seconds:.1f} s  q quits  |  {title}",
        f"sampled {sampled} of {steps} steps in the last {iv.seconds:.1f} s: {_rule(iv)}",
    ]
    if iv.in_flight:
        lines.append(iv.in_flight)
    note = next((r.error for r in iv.rows if r.error), None) or iv.note
    if note and not sampled:
        lines.append(f"not sampled: {note}")
    lines.append("")
    lines.append(
        f"{'PROCESS':<20} {'STEPS/S':>8} {'STEP':>9} {'SAMPLED':>9} {'GPU BUSY':>8} "
        f"{'COMM':>6} {'DATA':>6} {'SYNC':>6}  PEAK MEMORY"
    )
    for r in iv.rows:
        s = r.sample or {}
        parts = s.get("parts") or {}
        total = parts.get("step_ns")
        gpu = bool(s.get("cuda"))
        rate = "exited" if r.gone else ("-" if r.rate is None else f"{r.rate:.1f}")
        step = _dur(1 / r.rate) if r.rate else "-"
        lines.append(
            f"{r.proc.name:<20.20} {rate:>8} {step:>9} "
            f"{_dur(s['step_ns'] / 1e9) if s.get('step_ns') else '-':>9} "
            f"{_pct(parts.get('gpu_busy_ns'), total) if gpu else 'off':>8} "
            f"{_pct(parts.get('comm_ns'), total) if gpu else '-':>6} "
            f"{_pct(parts.get('data_wait_ns'), total):>6} "
            f"{_pct(parts.get('sync_wait_ns'), total):>6}  "
            f"{_memory(s)[5:] if s else ''}"
        )
    samples = [r.sample for r in iv.rows if r.sample is not None and not r.gone]
    findings = []
    for r in iv.rows:
        if r.sample is not None and not r.gone:
            who = f"{r.proc.name}: " if len(samples) > 1 else ""
            findings += [who + _finding(f) for f in r.sample.get("findings") or []]
    if findings:
        lines += ["", "DIAGNOSIS of the sampled step" + ("s" if len(samples) > 1 else "")]
        lines += findings[: max(1, (height - len(lines)) // 3)]
    if samples:
        lines += _op_tables(iv, samples, height - len(lines) - 1)
    return [ln[:width] for ln in lines[:height]]


def _op_tables(iv, samples: list[dict], room: int) -> list[str]:
    """Self CPU (and self CUDA) tables over the latest sample of each process, summed."""
    total = sum(s.get("step_ns") or 0 for s in samples)
    steps = ", ".join(str(s.get("first_step")) for s in samples)
    where = f"step {steps}" if len(samples) == 1 else f"steps {steps} of {len(samples)} processes"
    age = min(r.sample_age for r in iv.rows if r.sample is not None and not r.gone)
    cuda = any(s.get("cuda") for s in samples)
    tables = [("cpu", "SELF CPU", "CALLS", "cpu_ops", "calls")]
    if cuda:
        tables.append(("cuda", "SELF CUDA", "KERNELS", "cuda_ops", "kernels"))
    per = max(1, (room - 3 * len(tables)) // len(tables))
    out = []
    for key, head, count, field, count_field in tables:
        merged: dict[tuple, dict] = {}
        for s in samples:
            for o in s.get(field) or []:
                m = merged.setdefault(
                    (o["name"], o["where"]), {**o, f"{key}_self_ns": 0, count_field: 0}
                )
                m[f"{key}_self_ns"] += o[f"{key}_self_ns"]
                m[count_field] += o[count_field]
        rows = sorted(merged.values(), key=lambda o: -o[f"{key}_self_ns"])[:per]
        out += [
            "",
            f"{head} TIME of {where} ({_dur(total / 1e9)} under the hook, {age:.1f} s ago)",
            f"{head:>10} {'%':>6} {count:>8}  FUNCTION OR OP",
        ]
        for o in rows:
            name = o["name"] + (f" ({o['where']})" if o["where"] else "")
            out.append(
                f"{_dur(o[f'{key}_self_ns'] / 1e9):>10} {_pct(o[f'{key}_self_ns'], total):>6} "
                f"{o[count_field]:>8}  {name}"
            )
        if not rows:
            out.append("  (none)")
    return out


# -- the command ---------------------------------------------------------------------------------
class _Leave(BaseException):
    """SIGTERM or SIGHUP: leave as Ctrl-C does."""


def _on_signal(signum, frame):
    raise _Leave()


def cmd_top(args) -> int:
    from .ondemand import _client as client
    from .ondemand._top import Top

    check_targets(args, "to watch the ranks of one job (or watch each one on its own)")
    try:
        if args.trigger_dir is not None:
            top = Top(
                trigger_dir=os.path.abspath(args.trigger_dir),
                interval=args.interval,
                overhead=args.overhead / 100,
                timeout=args.timeout,
            )
            title = f"the processes watching {args.trigger_dir}"
        else:
            targets = [client.find_target(pid) for pid in args.pids]
            if args.all_ranks and len(targets) == 1:
                targets = client.job_targets(targets[0])
            top = Top(
                targets=targets,
                interval=args.interval,
                overhead=args.overhead / 100,
                timeout=args.timeout,
            )
            title = targets[0].name if len(targets) == 1 else f"{len(targets)} ranks"
    except client.CaptureError as e:
        print(f"gpuprof: error: {e}", file=sys.stderr)
        return e.code
    tty = sys.stdout.isatty() and os.environ.get("TERM", "dumb") != "dumb"
    saved = {signal.SIGINT: signal.getsignal(signal.SIGINT)}
    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None:
            saved[sig] = signal.signal(sig, _on_signal)
    rc = 0
    try:
        try:
            if tty:
                _run_curses(top, args, title)
            else:
                top.first_answers()
                _run_lines(top, args)
        except client.CaptureError as e:
            print(f"gpuprof: error: {e}", file=sys.stderr)
            rc = e.code
        except (KeyboardInterrupt, _Leave):
            pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C: the cancels go on
        try:
            top.close()
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)
    _farewell(top)
    return rc


def _run_lines(top, args) -> int:
    shown = 0
    tick = time.monotonic() + args.interval
    while True:
        top.poll(tick)
        iv = top.refresh()
        for row in iv.rows:
            print(line(iv, row))
        _flush(sys.stdout)
        shown += 1
        if args.iterations is not None and shown >= args.iterations:
            return shown
        if top.all_gone:
            return shown
        tick = max(tick + args.interval, time.monotonic() + args.interval / 2)


def _run_curses(top, args, title: str) -> int:
    import curses

    def run(stdscr) -> int:
        try:
            curses.curs_set(0)
        except curses.error:
            pass  # a terminal that cannot hide its cursor
        stdscr.nodelay(True)
        quit_keys = {ord("q"), ord("Q")}

        def stop() -> bool:
            while True:
                ch = stdscr.getch()
                if ch == -1:
                    return False
                if ch in quit_keys:
                    return True

        stdscr.erase()
        stdscr.addstr(0, 0, f"gpuprof top: asking {title}..."[: max(1, curses.COLS - 1)])
        stdscr.refresh()
        if top.first_answers(stop):
            return 0
        shown = 0
        tick = time.monotonic() + args.interval
        while True:
            if top.poll(tick, stop):
                return shown
            iv = top.refresh(stop)
            height, width = stdscr.getmaxyx()
            stdscr.erase()
            for y, text in enumerate(screen(iv, width - 1, height, title)):
                try:
                    stdscr.addstr(y, 0, text)
                except curses.error:
                    pass  # the bottom-right corner of a small window
            stdscr.refresh()
            shown += 1
            if args.iterations is not None and shown >= args.iterations:
                return shown
            if top.all_gone:
                return shown
            tick = max(tick + args.interval, time.monotonic() + args.interval / 2)

    return curses.wrapper(run)


def _farewell(top) -> None:
    """On stderr, once the screen is gone: what was sampled, what it cost, the state."""
    elapsed = time.monotonic() - top.started_at
    gone = [p for p in top.procs.values() if p.gone]
    for p in gone:
        print(f"gpuprof: top: {p.name} has exited", file=sys.stderr)
    for name in top.cancelled:
        print(f"gpuprof: top: {name} dropped the step top had asked it to sample", file=sys.stderr)
    for name in top.unsettled:
        print(
            f"gpuprof: top: {name} did not confirm within {top.timeout:g} s that it "
            "dropped the step top asked for; it stops recording it at its next step "
            "boundary and keeps nothing",
            file=sys.stderr,
        )
    live = [p for p in top.procs.values() if not p.gone and p.name not in top.unsettled]
    share = 100 * top.total_cost_s / max(elapsed, 1e-9)
    head = f"watched for {elapsed:.1f} s"
    if live:
        head = f"left {', '.join(p.name for p in live)} armed and idle after {elapsed:.1f} s"
    print(
        f"gpuprof: top: {head}; {top.samples} step{'s' if top.samples != 1 else ''} "
        f"sampled, which cost about {share:.2f}% of the time",
        file=sys.stderr,
    )
