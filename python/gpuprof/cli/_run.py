"""``run``: profile an unmodified program, with its step schedule, time window or
capture range, then write the files and print the report (``demo`` runs the bundled
loop). Steps are found by ``gpuprof.core._steps``; ``run --on-demand`` is ``_capture``'s.

With none of those flags (and no ``--whole-run``), the start-up up to the end of the
first step is a window of its own (``_steps.StartupApart``) that the results leave
out; the report's first line says how long it was."""

from __future__ import annotations

import os
import signal
import sys
import traceback
import warnings
from typing import Any

from ._capture import _run_on_demand
from ._common import (
    _check_cuda_usable,
    _check_output_dir,
    _CliError,
    _find_program,
    _flush,
    _run_program,
)


def _startup_apart(args) -> bool:
    """Whether the start-up before the first step is kept out of the results: the
    default, when no flag says what to record."""
    return not (
        args.whole_run
        or args.active is not None
        or args.delay is not None
        or args.duration is not None
        or args.capture_range
    )


def _profile_kwargs(args, startup=None) -> dict:
    import gpuprof

    kwargs: dict = {"profile_memory": args.memory, "with_stack": args.with_stack}
    if startup is not None:  # the default: start-up apart (gpuprof.core._steps.StartupApart)
        kwargs["schedule"] = startup
        kwargs["on_trace_ready"] = startup.window_ready
    if args.subprocesses:  # -- subprocesses (docs/subprocesses.md) --
        kwargs["subprocesses"] = True
    if args.cuda is not None:
        kwargs["activities"] = [gpuprof.ProfilerActivity.CPU] + (
            [gpuprof.ProfilerActivity.CUDA] if args.cuda else []
        )
    if args.active is not None:
        kwargs["schedule"] = gpuprof.schedule(
            wait=args.wait or 0,
            warmup=1 if args.warmup is None else args.warmup,
            active=args.active,
            repeat=1 if args.repeat is None else args.repeat,
        )
    if args.capture_range:  # -- capture ranges (docs/nvtx.md) --
        kwargs["capture"] = args.capture_range
    return kwargs


def _check_run(args) -> None:
    """Every check of ``run``'s arguments that needs no program: raises _CliError."""
    import gpuprof

    window = args.delay is not None or args.duration is not None
    if args.whole_run and (window or args.active is not None or args.capture_range):
        other = (
            "--active"
            if args.active is not None
            else "--capture-range"
            if args.capture_range
            else "--delay/--duration"
        )
        raise _CliError(
            f"--whole-run and {other} cannot be combined: {other} decides what is "
            "recorded; use one of them"
        )
    if args.active is None:
        for name in ("wait", "warmup", "repeat"):
            if getattr(args, name) is not None:
                raise _CliError(f"--{name} applies to the step schedule: give --active N too")
    if args.capture_range and args.active is not None:
        raise _CliError(
            "--capture-range and --active cannot be combined: the capture range "
            "decides when to record"
        )
    if window and (args.active is not None or args.capture_range):
        other = "--active" if args.active is not None else "--capture-range"
        raise _CliError(
            f"--delay/--duration record a time window and cannot be combined with "
            f"{other}; use one of them"
        )
    if args.output is not None:
        _check_output_dir(args.output)
    if args.cuda:
        _check_cuda_usable("profile")
    if args.capture_range:
        try:
            gpuprof.record._nvtx.parse_capture(args.capture_range)
        except ValueError as e:
            raise _CliError(f"--capture-range: {e}") from None
        if args.capture_range == "cudaProfilerApi":
            status = gpuprof.cuda_status()
            if args.cuda is False:
                raise _CliError(
                    "--capture-range cudaProfilerApi needs GPU capture: leave --no-cuda out"
                )
            if not status["usable"]:
                raise _CliError(
                    "--capture-range cudaProfilerApi needs GPU capture, which is "
                    f"off here: {status['reason']}"
                )


class _TimeWindow:
    """--delay/--duration: start and stop the profiler on the program's main thread.

    SIGALRM (``setitimer``) runs the handler on the main thread between two
    bytecodes, also when it was waiting in a system call, which is retried. No
    thread of gpuprof's runs meanwhile, so none appears in the results, and the
    window's steps belong to the main thread as they would with ``prof.step()``.
    """

    def __init__(self, prof, counter, delay: float | None, duration: float | None):
        self.prof = prof
        self.counter = counter
        self.delay = delay or 0.0
        self.duration = duration
        self.state = "waiting"  # -> recording -> done
        self.error: str | None = None
        self._previous: Any = None

    def arm(self) -> None:
        if self.delay == 0:
            self.prof.start()
            self.state = "recording"
            if self.duration is None:
                return
        self._previous = signal.signal(signal.SIGALRM, self._fire)
        signal.setitimer(signal.ITIMER_REAL, self.delay or self.duration)

    def disarm(self) -> None:
        if self._previous is None:
            return
        signal.setitimer(signal.ITIMER_REAL, 0)
        if signal.getsignal(signal.SIGALRM) == self._fire:
            signal.signal(signal.SIGALRM, self._previous)
        elif self.state != "done":
            self.error = (
                "the program replaced gpuprof's SIGALRM handler, which ends --delay/--duration"
            )
        self._previous = None

    def _fire(self, signum, frame) -> None:
        if self.counter.in_step:  # inside prof.step(): try again in a millisecond
            signal.setitimer(signal.ITIMER_REAL, 0.001)
            return
        try:
            if self.state == "waiting":
                self.state = "recording"
                self.prof.start()
                if self.duration is not None:
                    signal.setitimer(signal.ITIMER_REAL, self.duration)
            elif self.state == "recording":
                self.state = "done"
                self.prof.stop()
        except Exception as e:  # noqa: BLE001 - never into the program: reported at the end
            self.error = f"{e}"
            self.state = "done"


def cmd_run(args) -> int:
    import gpuprof

    from ..core import _steps
    from . import _launch

    if args.on_demand or args.signal is not None or args.trigger_dir is not None:
        return _run_on_demand(args)  # -- on-demand capture --
    _check_run(args)
    program = _find_program(args)
    startup = _steps.StartupApart() if _startup_apart(args) else None
    try:
        prof = gpuprof.profile(**_profile_kwargs(args, startup))
    except (ValueError, TypeError, RuntimeError) as e:
        raise _CliError(str(e)) from None
    counter = _steps.StepCounter(prof)
    watch = _steps.ImportWatch()
    source: _steps.StepFunction | _steps.OptimizerSteps
    if args.step_fn:
        main_names = {"__main__", program.module_name}
        source = _steps.StepFunction(args.step_fn, counter, main_names)
        transform = source.transform if source.in_main else None
        init_globals = source.binder() if source.in_main else None
    else:
        source = _steps.OptimizerSteps(counter)
        transform = init_globals = None
    try:
        code = program.compile(transform)
    except _launch.LaunchError as e:
        raise _CliError(f"--step-fn: {e}") from None
    except SyntaxError as e:  # the program's own error, as Python prints it
        traceback.print_exception(type(e), e, None)
        return 1

    # A first window cut short by the program's end: the step line at the end says so
    # for the command line ("recorded 2 of the 5 --active steps"). Set before recording
    # starts: the filter's own Python code must not land in the window.
    warnings.filterwarnings(
        "ignore",
        message=r"gpuprof: the loop ended at step \d+, inside "
        r"the first recording window",
    )
    out = sys.stdout  # the report goes here, even if the program replaces sys.stdout
    window = _TimeWindow(prof, counter, args.delay, args.duration)
    source.install(watch)
    watch.install()
    code_rc = 0
    try:
        try:
            if args.delay is None and args.duration is None:
                prof.start()
            else:
                window.arm()
        except RuntimeError as e:  # another profiler holds the hook: nothing has run yet
            raise _CliError(str(e)) from None
        code_rc = _run_program(program, code, args.args, init_globals)
    finally:
        window.disarm()
        if prof.running:
            prof.stop()
        watch.uninstall()
        if isinstance(source, _steps.OptimizerSteps):
            source.uninstall()
    return _finish_run(prof, args, counter, source, window, out, code_rc, startup)


def _finish_run(prof, args, counter, source, window, out, code: int, startup=None) -> int:
    """Files first, then the report on ``out``, then what went wrong with the steps."""
    try:
        results = prof.results
    except RuntimeError:
        results = None
    failed = False
    note = _startup_note(prof, startup)
    if results is not None and args.output:
        try:
            _write_outputs(prof, args.output, args.trace_min_us, args.trace_max_events or None)
        except OSError as e:
            print(f"gpuprof: error: writing --output {args.output!r} failed: {e}", file=sys.stderr)
            failed = True
        except KeyboardInterrupt:  # a second Ctrl-C: the files written so far stay
            print(
                "gpuprof: interrupted while writing --output; the files named above are "
                "complete, the others were not written",
                file=sys.stderr,
            )
            return 130
    _flush(sys.stdout)
    if results is not None:
        try:
            if note is not None:
                print(note, file=out)
            _report_run(prof, results, args, counter, source, out, note is not None)
            _flush(out)
        except BrokenPipeError:  # `| head`: the reader has gone, the files are written
            _quiet_broken_pipe()
            return code
        except Exception as e:  # noqa: BLE001 - printing failed; the files are kept
            print(f"gpuprof: error: printing the report failed: {e!r}", file=sys.stderr)
            failed = True
    for line in _problems(args, results, counter, source, window):
        print(f"gpuprof: {line}", file=sys.stderr)
    return code if code or not failed else 1


def _quiet_broken_pipe() -> None:
    # Python would print another BrokenPipeError when it flushes stdout at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _problems(args, results, counter, source, window) -> list[str]:
    """One line for each reason the recording is not what was asked for."""
    lines = []
    if window.error:
        lines.append(f"--delay/--duration: {window.error}")
    elif window.state == "waiting" and args.delay:
        lines.append(
            f"nothing recorded: the program ended before --delay {args.delay:g} s; "
            "give a shorter --delay"
        )
    if counter.error:
        lines.append(counter.error)
    why = source.problem()
    hint = (
        "name the function that ends a step with --step-fn module:function, or record a "
        "time window with --delay S --duration S"
    )
    if why is not None and counter.found == 0:
        if args.step_fn:
            lines.append(
                f"--step-fn {args.step_fn} never ran: {why}; name another function "
                "with --step-fn, or record a time window with --delay S --duration S"
            )
        elif args.active is not None:
            lines.append(
                f"nothing recorded: --active counts steps and none were found ({why}); " + hint
            )
        elif args.delay is None and args.duration is None and not args.capture_range:
            lines.append(
                f"no steps found ({why}): the table covers the whole run; to see steps, " + hint
            )
    elif results is not None and args.active is not None and len(results.steps()) < args.active:
        lines.append(
            f"recorded {len(results.steps())} of the {args.active} --active steps: the "
            f"program ended after {counter.found} step(s)"
        )
    elif results is None and args.active is not None and counter.found:
        need = (args.wait or 0) + (1 if args.warmup is None else args.warmup) + 1
        lines.append(
            f"nothing recorded: the program ended after {counter.found} step(s), and "
            f"--wait/--warmup/--active start recording at step {need}; lower "
            "--wait or --warmup"
        )
    elif results is None and args.capture_range:
        lines.append(
            f"nothing recorded: the program never entered --capture-range {args.capture_range}"
        )
    elif results is None and not lines:
        lines.append("nothing recorded")
    return lines


def _startup_note(prof, startup) -> str | None:
    """The line that says the start-up is not in the results (None when it is), and
    the same in the files' header (``gpuprof_startup``: its bounds on the profiler
    clock, the part spent in imports, and that the results leave it out)."""
    if startup is None or not startup.apart:
        return None
    import json

    from ..core._steps import startup_note

    header = startup.header()
    prof.add_metadata_json("gpuprof_startup", json.dumps(header))
    return f"gpuprof: {startup_note(header)}"


def _write_outputs(
    prof, out_dir: str, trace_min_us: float = 0.0, trace_max_events: int | None = None
) -> list[str]:
    """Write the trace, the saved profile, the stacks and report.html into ``out_dir``,
    each file named on stderr once it is complete; the trace keeps at most about
    ``trace_max_events`` events, and a line says what it left out."""
    from ..exporters.chrome import trace_budget

    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"{os.uname().nodename}_{os.getpid()}")
    trace = stem + ".pt.trace.json.gz"
    outputs = [
        (
            trace,
            lambda p: prof.export_chrome_trace(
                p, min_duration_us=trace_min_us, max_events=trace_max_events
            ),
        ),
        (stem + ".gpuprof", prof.save),
        (stem + ".stacks.txt", prof.export_stacks),
        # -- html report (docs/report.md): beside the trace, which it links --
        (os.path.join(out_dir, "report.html"), lambda p: prof.export_html(p, trace=trace)),
    ]
    cut = trace_budget(prof.results, trace_max_events, min_duration_us=trace_min_us)
    if cut is not None:
        print(f"gpuprof: {_budget_line(cut, trace_max_events)}", file=sys.stderr)
    for path, write in outputs:
        write(path)
        print(f"gpuprof: wrote {path}", file=sys.stderr, flush=True)
    return [path for path, _ in outputs]


def _budget_line(cut: dict, max_events: int) -> str:
    """What the trace left out to stay within --trace-max-events."""
    if cut["steps"] is not None:
        first, last = cut["steps"]
        what = (
            f"steps {first}-{last} ({cut['n_steps']:,} of {cut['total_steps']:,})"
            if last != first
            else f"step {first} (of {cut['total_steps']:,})"
        )
    else:
        what = "a stretch in the middle of the run"
    return (
        f"the trace keeps {cut['events'] - cut['omitted_events']:,} of "
        f"{cut['events']:,} events (--trace-max-events {max_events:,}): it leaves out "
        f"{what}, {cut['omitted_events']:,} events, and keeps the steps before and "
        "after; the tables, the saved profile and the report count every step; "
        "--trace-max-events 0 writes every event"
    )


def _report_run(prof, results, args, counter, source, out, startup_apart=False) -> None:
    sort = args.sort or (
        "self_cuda_time_total" if results.cuda.get("active") else "self_cpu_time_total"
    )
    table = prof.key_averages(idle=args.idle).table(sort_by=sort, row_limit=args.limit)
    print(table, file=out)
    if prof.subprocesses:  # -- subprocesses --
        _report_processes(prof, args, out)
    recorded = f"{len(results.steps())} recorded"
    if startup_apart:
        recorded += " after the start-up"
    elif args.delay is not None or args.duration is not None:
        recorded += " in the --delay/--duration window"
    elif args.capture_range:
        recorded += f" in --capture-range {args.capture_range}"
    print(
        f"steps: {recorded}, {counter.found} found (step boundaries: {source.describe()})", file=out
    )
    if args.memory:
        print(prof.memory_summary(), file=out)
    print(prof.diagnose(), file=out)


# -- subprocesses (docs/subprocesses.md) --
def _report_processes(prof, args, out) -> None:
    """One line per profiled process, then the workers' ops summed (when any recorded)."""
    from ..core._format import format_time

    procs = prof.processes()
    workers = procs[procs["role"] == "worker"]
    print(f"processes: main + {len(workers)} worker{'s' if len(workers) != 1 else ''}", file=out)
    width = min(40, max(len(str(n)) for n in procs["name"]))
    for p in procs:
        how = f"{p['role']}, {p['start_method']}" if p["start_method"] else str(p["role"])
        print(
            f"  pid {p['pid']:<8d} {str(p['name'])[:width]:<{width}s}  {how:<18s} "
            f"{p['status']:<7s} {p['events']:>11,d} events  self CPU "
            f"{format_time(p['cpu_self_ns'])}",
            file=out,
        )
    if len(workers) and workers["windows"].sum() > 0:
        print(
            prof.key_averages(pid="workers").table(
                sort_by="self_cpu_time_total",
                row_limit=args.limit,
                header=f"child processes ({len(workers)}), summed",
            ),
            file=out,
        )


# -- end subprocesses --


def cmd_demo(args) -> int:
    from . import demo

    return demo.main([])
