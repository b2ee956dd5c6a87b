"""Command line: ``python -m gpuprof {demo,run,report,compare,merge,capture}``.

``run`` profiles an unmodified program, like ``nsys profile`` or ``py-spy record``:

    python -m gpuprof run train.py --epochs 1
    python -m gpuprof run --wait 5 --warmup 2 --active 10 -m mypackage.train
    python -m gpuprof run --delay 30 --duration 10 train.py

Steps are found without code changes: every PyTorch optimizer step ends one
(``gpuprof._steps``), or ``--step-fn module:function`` names the function whose
every return ends one; ``--delay/--duration`` record a time window instead.

Every argument is checked before the program starts: a bad one gets one line on
stderr and exit code 2. When the program has ended, the ``--output`` files are
written first, then the tables and the diagnosis go to stdout (after the
program's own output); progress and warnings go to stderr.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
import traceback
import warnings

__all__ = ["main"]


class _CliError(Exception):
    """A bad argument: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (naming the argument), exit code 2."""

    def error(self, message):
        self.exit(2, f"gpuprof: error: {message} (see {self.prog} --help)\n")


# -- argument types: each names what it wants ---------------------------------------------
def _int_at_least(lo: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < lo:
            want = "a positive integer" if lo == 1 else f"an integer >= {lo}"
            raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


def _seconds(positive: bool):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            want = "> 0" if positive else ">= 0"
            raise argparse.ArgumentTypeError(f"must be a number of seconds {want}, got {text!r}")
        return value

    parse.__name__ = "seconds"
    return parse


def _sort_key(text: str) -> str:
    from .tables import SORT_KEYS

    if text not in SORT_KEYS:
        raise argparse.ArgumentTypeError(
            f"unknown sort key {text!r}; use one of " + ", ".join(sorted(SORT_KEYS))
        )
    return text


def _step_fn(text: str) -> str:
    from ._steps import parse

    try:
        parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


_positive = _int_at_least(1)
_natural = _int_at_least(0)


# -- run ----------------------------------------------------------------------------------
def _check_output_dir(path: str) -> None:
    """--output names a folder that exists or can be created, and can be written."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise _CliError(
                f"--output: {path!r} is a file, not a folder; name a folder (created if missing)"
            )
        parent = path
    else:
        parent = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            raise _CliError(f"--output: cannot create {path!r}: {parent!r} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _CliError(
            f"--output: cannot write in {parent!r} (permission denied); name another folder"
        )


def _profile_kwargs(args) -> dict:
    import gpuprof

    kwargs: dict = {"profile_memory": args.memory, "with_stack": args.with_stack}
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
        status = gpuprof.cuda_status()
        if not status["usable"]:
            raise _CliError(
                f"--cuda: GPU capture is not usable here: {status['reason']}; "
                "leave --cuda out to profile the CPU side"
            )
    if args.capture_range:
        try:
            gpuprof._nvtx.parse_capture(args.capture_range)
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
        self._previous = None

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

    from . import _launch, _steps

    if args.on_demand or args.signal is not None or args.trigger_dir is not None:
        return _run_on_demand(args)  # -- on-demand capture --
    _check_run(args)
    try:
        program = _launch.find(args.target, args.module)
    except _launch.LaunchError as e:
        raise _CliError(str(e)) from None
    if program.path0 not in sys.path[:1]:
        sys.path.insert(0, program.path0)
    try:
        prof = gpuprof.profile(**_profile_kwargs(args))
    except (ValueError, TypeError, RuntimeError) as e:
        raise _CliError(str(e)) from None
    counter = _steps.StepCounter(prof)
    watch = _steps.ImportWatch()
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
    return _finish_run(prof, args, counter, source, window, out, code_rc)


def _run_program(program, code, argv, init_globals) -> int:
    """Run the program; return its exit code.

    An exception escaping the program is printed as Python would print it
    (without gpuprof's frames) and gives exit code 1, or 130 for
    KeyboardInterrupt, after which the profile is still reported.
    """
    try:
        program.run(code, argv, init_globals)
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except BaseException as e:  # noqa: BLE001 - the program's own exception, reported as-is
        tb = e.__traceback__
        while tb is not None and _is_ours(tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb)
        return 130 if isinstance(e, KeyboardInterrupt) else 1
    return 0


def _is_ours(filename: str) -> bool:
    return filename.startswith(os.path.dirname(os.path.abspath(__file__)) + os.sep)


def _finish_run(prof, args, counter, source, window, out, code: int) -> int:
    """Files first, then the report on ``out``, then what went wrong with the steps."""
    try:
        results = prof.results
    except RuntimeError:
        results = None
    failed = False
    if results is not None and args.output:
        try:
            for path in _write_outputs(prof, args.output, args.trace_min_us):
                print(f"gpuprof: wrote {path}", file=sys.stderr)
        except OSError as e:
            print(f"gpuprof: error: writing --output {args.output!r} failed: {e}", file=sys.stderr)
            failed = True
    _flush(sys.stdout)
    if results is not None:
        try:
            _report_run(prof, results, args, counter, source, out)
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


def _flush(stream) -> None:
    try:
        stream.flush()
    except (OSError, ValueError, AttributeError):
        pass


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


def _write_outputs(prof, out_dir: str, trace_min_us: float = 0.0) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"{os.uname().nodename}_{os.getpid()}")
    outputs = [
        (
            stem + ".pt.trace.json.gz",
            lambda p: prof.export_chrome_trace(p, min_duration_us=trace_min_us),
        ),
        (stem + ".gpuprof", prof.save),
        (stem + ".stacks.txt", prof.export_stacks),
    ]
    # -- html report (docs/report.md): beside the trace, which it links --
    outputs.append(
        (os.path.join(out_dir, "report.html"), lambda p: prof.export_html(p, trace=outputs[0][0]))
    )
    for path, write in outputs:
        write(path)
    return [path for path, _ in outputs]


def _report_run(prof, results, args, counter, source, out) -> None:
    sort = args.sort or (
        "self_cuda_time_total" if results.cuda.get("active") else "self_cpu_time_total"
    )
    print(prof.key_averages().table(sort_by=sort, row_limit=args.limit), file=out)
    if prof.subprocesses:  # -- subprocesses --
        _report_processes(prof, args, out)
    recorded = f"{len(results.steps())} recorded"
    if args.delay is not None or args.duration is not None:
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
    from ._format import format_time

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


# -- report -------------------------------------------------------------------------------
def _is_trace(path: str) -> bool:
    return path.endswith((".json", ".json.gz"))


def cmd_report(args) -> int:
    import gpuprof

    traces = [f for f in args.files if _is_trace(f)]
    for f in args.files:
        if not os.path.isfile(f):
            raise _CliError(f"cannot read {f!r}: no such file")
    if traces and (args.steps or args.memory or args.sort):
        flag = "--steps" if args.steps else "--memory" if args.memory else "--sort"
        raise _CliError(
            f"{flag} needs a saved profile (.gpuprof), and {traces[0]!r} is a "
            "Chrome trace (its report lists events by total time)"
        )
    if args.html and (len(args.files) != 1 or traces):  # -- html report --
        raise _CliError(
            "--html writes one page of one saved profile (.gpuprof); give one "
            "file (a trace opens in https://ui.perfetto.dev)"
            if len(args.files) != 1
            else "--html needs a saved profile (.gpuprof), not a trace; open the trace "
            "in https://ui.perfetto.dev"
        )
    loaded = {}
    for f in args.files:
        if _is_trace(f):
            continue
        try:
            loaded[f] = gpuprof.load(f)
        except (OSError, ValueError, KeyError) as e:
            raise _CliError(f"cannot read {f!r}: {e}") from None
        if args.memory and not loaded[f].profile_memory:
            raise _CliError(
                f"--memory: {f!r} has no memory data: it was recorded without "
                "memory (record with `python -m gpuprof run --memory` or "
                "profile(profile_memory=True))"
            )
    several = len(args.files) > 1
    for i, f in enumerate(args.files):
        if several:
            print(("\n" if i else "") + f"== {f}")
        if _is_trace(f):
            print(_trace_report(f, args.kernels, args.limit))
            continue
        prof = loaded[f]
        if args.html:  # -- html report (docs/report.md) --
            _write_html(lambda p=prof: p.export_html(args.html), args.html)
            return 0
        if args.kernels:
            print(prof.kernel_table(row_limit=args.limit))
        elif args.steps:
            print(prof.step_table())
        elif args.memory:
            print(prof.memory_summary())
        else:
            sort = args.sort or (
                "self_cuda_time_total" if prof.results.cuda.get("active") else "self_cpu_time_total"
            )
            print(prof.key_averages().table(sort_by=sort, row_limit=args.limit))
    return 0


def _trace_report(path: str, kernels: bool, limit: int):
    """Totals by name from an exported Chrome trace (ours or any Kineto-style trace)."""
    from ._format import format_time
    from ._trace_read import read_trace
    from .views import Table

    try:
        events = read_trace(path, "report")["traceEvents"]
    except (OSError, ValueError) as e:
        raise _CliError(f"cannot read {path!r}: not a Chrome trace ({e})") from e
    gpu_cats = {"kernel", "gpu_memcpy", "gpu_memset"}
    host_cats = {"python_function", "user_annotation", "cpu_op", "cuda_runtime", "cuda_driver"}
    cats = gpu_cats if kernels else host_cats
    totals: dict[str, list] = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in cats:
            continue
        t = totals.setdefault(e.get("name", "?"), [0, 0.0])
        t[0] += 1
        t[1] += float(e.get("dur", 0.0))
    order = sorted(totals.items(), key=lambda kv: -kv[1][1])[:limit]
    rows = [
        [
            name if len(name) <= 70 else name[:67] + "...",
            str(n),
            format_time(us * 1e3),
            format_time(us * 1e3 / n),
        ]
        for name, (n, us) in order
    ]
    title = ("GPU activity" if kernels else "Host events (inclusive time)") + f" in {path}"
    return Table(
        title,
        ["Name", "Count", "Total", "Avg"],
        rows,
        "lrrr",
        footer=f"{len(totals)} names; {sum(v[0] for v in totals.values())} events",
    )


# -- compare ------------------------------------------------------------------------------
def cmd_compare(args) -> int:
    import gpuprof

    for flag, f in (("BEFORE", args.before), ("AFTER", args.after)):
        if not os.path.isfile(f):
            raise _CliError(f"{flag}: cannot read {f!r}: no such file")
    loaded = []
    for flag, f in (("BEFORE", args.before), ("AFTER", args.after)):
        if _is_trace(f):
            raise _CliError(
                f"{flag}: {f!r} is a Chrome trace; compare reads saved profiles "
                "(.gpuprof, written by `run --output` or prof.save())"
            )
        try:
            loaded.append(gpuprof.load(f))
        except (OSError, ValueError, KeyError) as e:
            raise _CliError(f"{flag}: cannot read {f!r}: {e}") from None
    result = gpuprof.compare(*loaded, limit=args.limit)
    if args.html:  # -- html report --
        _write_html(lambda: result.export_html(args.html), args.html)
        return 0
    print(result)
    return 0


# -- html report (docs/report.md) --
def _write_html(write, path: str) -> None:
    """Run ``write()``; an unwritable ``path`` is a bad argument (one line, exit 2)."""
    try:
        write()
    except OSError as e:
        raise _CliError(f"--html: {e}") from None
    print(f"gpuprof: wrote {path}", file=sys.stderr)


# -- end html report --


# -- merge (gpuprof.distributed) --
def cmd_merge(args) -> int:
    from .distributed import merge

    ranks = None
    if args.ranks:
        try:
            ranks = [int(r) for r in args.ranks.split(",")]
        except ValueError:
            raise _CliError(
                f"--ranks takes comma-separated ints, e.g. 0,1,2,3; got {args.ranks!r}"
            ) from None
    try:
        run = merge(args.out, args.traces, align=args.align, ranks=ranks)
    except (OSError, ValueError, TypeError) as e:
        raise _CliError(str(e)) from e
    print(run.table(max_steps=args.limit))
    print(run.diagnose())
    print(f"gpuprof: wrote {args.out}", file=sys.stderr)
    return 0


# -- end merge --


# -- on-demand capture (gpuprof._ondemand, docs/on-demand.md) --
def _signal_arg(text: str) -> str:
    from ._ondemand_proto import parse_signal

    try:
        parse_signal(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("signal must be", "must be")) from None
    return text


def _pid_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a process id (a positive integer), got {text!r}")
    return value


def _check_trigger_dir(path: str) -> None:
    if not os.path.isdir(path):
        raise _CliError(
            f"--trigger-dir: {path!r} is not a folder; create it on a file system "
            "that every rank (and the capture command) sees"
        )
    if not os.access(path, os.W_OK | os.X_OK):
        raise _CliError(
            f"--trigger-dir: cannot write in {path!r} (permission denied); name a "
            "folder you can write"
        )


def _run_on_demand(args) -> int:
    """``run --on-demand``: the program runs armed and unprofiled; ``capture`` asks."""
    from . import _launch, _ondemand, _steps

    if not args.on_demand:
        flag = "--signal" if args.signal is not None else "--trigger-dir"
        raise _CliError(f"{flag} applies to an armed program: add --on-demand")
    hint = {
        "--output": "; `capture --output DIR` names the folder of each capture",
        "--memory": "; ask for memory per capture: `capture --memory`",
        "--duration": "; ask for a time window per capture: `capture --duration S`",
        "--active": "; ask for N steps per capture: `capture --steps N`",
    }
    given = [
        ("--active", args.active),
        ("--wait", args.wait),
        ("--warmup", args.warmup),
        ("--repeat", args.repeat),
        ("--delay", args.delay),
        ("--duration", args.duration),
        ("--capture-range", args.capture_range),
        ("--output", args.output),
        ("--memory", args.memory or None),
        ("--subprocesses", args.subprocesses or None),
        ("--with-stack", args.with_stack or None),
        ("--sort", args.sort),
        ("--limit", None if args.limit == 20 else args.limit),
        ("--trace-min-us", args.trace_min_us or None),
    ]
    for flag, value in given:
        if value is not None:
            raise _CliError(
                f"{flag} cannot be combined with --on-demand: an armed program "
                "records nothing until `python -m gpuprof capture PID` asks for "
                "a capture" + hint.get(flag, "")
            )
    if args.trigger_dir is not None:
        _check_trigger_dir(args.trigger_dir)
    if args.cuda:
        import gpuprof

        status = gpuprof.cuda_status()
        if not status["usable"]:
            raise _CliError(
                f"--cuda: GPU capture is not usable here: {status['reason']}; "
                "leave --cuda out to capture the CPU side"
            )
    try:
        program = _launch.find(args.target, args.module)
    except _launch.LaunchError as e:
        raise _CliError(str(e)) from None
    if program.path0 not in sys.path[:1]:
        sys.path.insert(0, program.path0)
    od = _ondemand.OnDemand(
        signal_=args.signal or "SIGUSR2",
        trigger_dir=args.trigger_dir,
        step_fn=args.step_fn,
        cuda=args.cuda,
        launcher=True,
        main_names={"__main__", program.module_name},
    )
    in_main = isinstance(od.source, _steps.StepFunction) and od.source.in_main
    try:
        code = program.compile(od.source.transform if in_main else None)
    except _launch.LaunchError as e:
        raise _CliError(f"--step-fn: {e}") from None
    except SyntaxError as e:
        traceback.print_exception(type(e), e, None)
        return 1
    try:
        _ondemand._install(od)
    except (ValueError, RuntimeError, OSError) as e:
        raise _CliError(f"--on-demand: {e}") from None
    print(
        f"gpuprof: armed: `python -m gpuprof capture {od.pid}` records the next "
        f"{_ondemand.DEFAULT_STEPS} steps of this program (docs/on-demand.md)",
        file=sys.stderr,
    )
    try:
        return _run_program(program, code, args.args, od.source.binder() if in_main else None)
    finally:
        _ondemand.disarm()


def cmd_capture(args) -> int:
    from . import _ondemand_client as client
    from ._ondemand_capture import default_output

    if args.list:
        if args.pids or args.trigger_dir or args.all_ranks or args.cancel:
            raise _CliError("--list lists the armed processes: give it alone")
        return _list_armed(client.list_targets())
    if args.cancel:
        if not args.pids or args.trigger_dir:
            raise _CliError("--cancel takes the PIDs whose waiting capture to cancel")
        try:
            answers = client.cancel([client.find_target(pid) for pid in args.pids], args.timeout)
        except client.CaptureError as e:
            print(f"gpuprof: error: {e}", file=sys.stderr)
            return e.code
        for a in answers:
            print(f"gpuprof: {a['message']}", file=sys.stdout if a["ok"] else sys.stderr)
        return 0 if all(a["ok"] for a in answers) else 1
    if args.trigger_dir is None and not args.pids:
        raise _CliError(
            "give the PID of an armed process (`python -m gpuprof capture --list` "
            "shows them), or --trigger-dir DIR"
        )
    if args.trigger_dir is not None and args.pids:
        raise _CliError("give PIDs or --trigger-dir DIR, not both")
    if len(args.pids) > 1 and not args.all_ranks:
        raise _CliError(
            f"{len(args.pids)} PIDs: add --all-ranks to start them at the same step "
            "(or capture each one on its own)"
        )
    if len(set(args.pids)) != len(args.pids):
        raise _CliError("a PID is given twice")
    if args.trigger_dir is not None:
        _check_trigger_dir(args.trigger_dir)
        output = args.output or os.path.join(
            os.path.abspath(args.trigger_dir), time.strftime("capture-%Y%m%d-%H%M%S")
        )
    else:
        output = args.output or default_output(args.pids[0])
    _check_output_dir(output)
    cap = client.Capture(
        steps=args.steps,
        duration=args.duration,
        output=output,
        memory=args.memory,
        wait=args.wait,
        timeout=args.timeout,
    )
    try:
        if args.trigger_dir is not None:
            cap.start_shared(args.trigger_dir)
        else:
            targets = [client.find_target(pid) for pid in args.pids]
            if args.all_ranks and len(targets) == 1:
                targets = client.job_targets(targets[0])
            cap.start(targets, same_step=args.all_ranks)
    except client.CaptureError as e:
        print(f"gpuprof: error: {e}", file=sys.stderr)
        return e.code
    for note in cap.notes:
        print(f"gpuprof: note: {note}", file=sys.stderr)
    for r in cap.accepted:
        print(f"gpuprof: {r['message']}; files go to {r['output']}")
    _flush(sys.stdout)
    if not args.wait:
        cap.close()
        return 0
    try:
        done = cap.wait()
    except KeyboardInterrupt:
        cap.close()
        print(
            f"gpuprof: interrupted; a capture that had started still writes its files into "
            f"{os.path.abspath(output)}",
            file=sys.stderr,
        )
        return 130
    return _report_captures(done, os.path.abspath(output))


def _report_captures(done: list[dict], output: str) -> int:
    """Files on stderr, then each capture's summary and diagnosis on stdout."""
    rc = 0
    several = len(done) > 1
    for i, d in enumerate(done):
        who = f"pid {d.get('pid')}" + (f", rank {d['rank']}" if d.get("rank") is not None else "")
        if several:
            print(("\n" if i else "") + f"== {who} on {d.get('host')}")
        if not d.get("ok"):
            print(f"gpuprof: error: {who}: {d.get('error')}", file=sys.stderr)
            rc = 1
            continue
        for f in d["files"]:
            print(f"gpuprof: wrote {f}", file=sys.stderr)
        line = f"{who}: recorded {d['summary']}"
        if d.get("cut_short"):
            line += f" ({d['cut_short']})"
        print(line)
        print(d["diagnosis"])
    firsts = {d.get("first_step") for d in done if d.get("ok")}
    if several and len(firsts) > 1:
        print(
            "gpuprof: note: the processes did not all start at the same step ("
            + ", ".join(f"pid {d['pid']}: step {d.get('first_step')}" for d in done if d.get("ok"))
            + ")",
            file=sys.stderr,
        )
    if several and rc == 0:
        print(
            f"gpuprof: merge the ranks into one timeline: python -m gpuprof merge "
            f"{output}-merged.json.gz {output}",
            file=sys.stderr,
        )
    return rc


def _list_armed(targets) -> int:
    if not targets:
        print("no armed process of this user on this host")
        return 0
    print(f"{'PID':>8}  {'RANK':<9} {'ARMED SINCE':<19}  {'WAKES BY':<11} COMMAND")
    for t in targets:
        rank = f"{t.rank}/{t.world_size}" if t.rank is not None else "-"
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t.state.get("armed_at", 0)))
        wake = t.state.get("signal_name") if t.signal() is not None else f"poll {t.poll_s:g} s"
        print(f"{t.pid:>8}  {rank:<9} {since:<19}  {wake:<11} {t.info.command}")
    return 0


# -- end on-demand capture --


def _version() -> str:
    from ._version import __version__

    return f"gpuprof {__version__}"


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m gpuprof",
        description="Profile Python programs that drive GPUs: Python and C calls, "
        "CUDA kernels, memory, and which line launched what.",
        epilog="`python -m gpuprof COMMAND --help` describes a command.",
    )
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)

    d = sub.add_parser(
        "demo",
        help="profile a bundled training loop and print the results",
        description="Profile a bundled CPU training loop and print its table and diagnosis.",
    )
    d.set_defaults(fn=cmd_demo)

    r = sub.add_parser(
        "run",
        help="profile an unmodified script or module",
        allow_abbrev=False,
        description="Run a Python script (or a module with -m) under the profiler, then print "
        "its op table, steps and diagnosis on stdout, after the program's own output. Steps "
        "are the program's PyTorch optimizer steps, or the returns of --step-fn; the "
        "program's exit code is kept.",
        epilog="Example: python -m gpuprof run --active 5 --output prof/ train.py --epochs 1",
    )
    r.add_argument(
        "-m",
        dest="module",
        action="store_true",
        help="TARGET is a module name, run as `python -m TARGET` would (default: "
        "TARGET is a script)",
    )
    sched = r.add_argument_group(
        "step schedule",
        "Record only some steps, as torch.profiler.schedule: skip --wait steps, "
        "run --warmup steps, record --active steps; --repeat such cycles. Without --active the "
        "whole run is recorded.",
    )
    sched.add_argument(
        "--wait", type=_natural, metavar="N", help="steps to skip before each cycle (default: 0)"
    )
    sched.add_argument(
        "--warmup",
        type=_natural,
        metavar="N",
        help="steps run but not recorded before the active ones (default: 1)",
    )
    sched.add_argument(
        "--active",
        type=_positive,
        metavar="N",
        help="steps to record in each cycle (default: none: record the whole run)",
    )
    sched.add_argument(
        "--repeat",
        type=_natural,
        metavar="N",
        help="cycles to record; 0 repeats until the program ends; the last "
        "cycle is reported (default: 1)",
    )
    steps = r.add_argument_group("steps and windows")
    steps.add_argument(
        "--step-fn",
        type=_step_fn,
        metavar="MODULE:FUNCTION",
        help="end a step at every return of this function instead of at "
        "PyTorch optimizer steps; MODULE is a module the program imports, or "
        "__main__ (or the script's name) for a function of the script, and "
        "FUNCTION may be Class.method (default: PyTorch optimizer steps)",
    )
    steps.add_argument(
        "--delay",
        type=_seconds(False),
        metavar="S",
        help="start recording S seconds after the program starts (default: at once)",
    )
    steps.add_argument(
        "--duration",
        type=_seconds(True),
        metavar="S",
        help="record for S seconds (default: until the program ends)",
    )
    steps.add_argument(
        "--capture-range",
        metavar="cudaProfilerApi|nvtx:NAME[@DOMAIN]",
        help="record only between cudaProfilerStart() and cudaProfilerStop() "
        "(torch.cuda.profiler.start/stop), or inside NVTX ranges named NAME "
        "(default: off)",
    )
    what = r.add_argument_group("what to record")
    cuda = what.add_mutually_exclusive_group()
    cuda.add_argument(
        "--cuda",
        dest="cuda",
        action="store_true",
        default=None,
        help="record CUDA kernels, copies and allocations; an error if GPU "
        "capture is not usable here (default: on when usable)",
    )
    cuda.add_argument(
        "--no-cuda",
        dest="cuda",
        action="store_false",
        help="record the CPU side only (default: off)",
    )
    what.add_argument(
        "--memory",
        action="store_true",
        help="record device allocations, allocator and host memory, and print "
        "the memory summary (default: off)",
    )
    what.add_argument(
        "--with-stack",
        action="store_true",
        help="accepted for torch.profiler compatibility: the call tree is always "
        "kept (default: off)",
    )
    what.add_argument(
        "--subprocesses",
        action="store_true",
        help="also profile child processes started by the program (DataLoader "
        "workers, multiprocessing); they are shown per process (default: off)",
    )
    outp = r.add_argument_group("output")
    outp.add_argument(
        "--output",
        "-o",
        metavar="DIR",
        help="write the Chrome trace (.pt.trace.json.gz), the saved profile "
        "(.gpuprof), the stacks (.stacks.txt) and the HTML report (report.html) "
        "into DIR, created if missing (default: no files)",
    )
    outp.add_argument(
        "--trace-min-us",
        type=_seconds(False),
        default=0.0,
        metavar="US",
        help="leave Python and C calls shorter than US microseconds that launched "
        "no CUDA work out of the trace (counted in its header; default: 0, every "
        "call)",
    )
    outp.add_argument(
        "--sort",
        type=_sort_key,
        metavar="KEY",
        help="sort the table by KEY, a torch.profiler sort key such as "
        "self_cpu_time_total, cuda_time_total or count (default: "
        "self_cuda_time_total with GPU capture, else self_cpu_time_total)",
    )
    outp.add_argument(
        "--limit", type=_positive, default=20, metavar="N", help="rows of the table (default: 20)"
    )
    # -- on-demand capture (docs/on-demand.md) --
    ond = r.add_argument_group(
        "on-demand capture",
        "Run the program armed instead: nothing is recorded, and no hook "
        "runs, until `python -m gpuprof capture PID` asks for the next steps (docs/on-demand.md).",
    )
    ond.add_argument(
        "--on-demand",
        action="store_true",
        help="arm the program; --step-fn, -m and --cuda/--no-cuda apply to its "
        "captures (default: off: profile the whole run)",
    )
    ond.add_argument(
        "--signal",
        type=_signal_arg,
        metavar="NAME",
        help="the signal `capture` wakes the program with: SIGUSR1, SIGUSR2, "
        "SIGRTMIN+N, or none (requests are then read every second) (default: "
        "SIGUSR2)",
    )
    ond.add_argument(
        "--trigger-dir",
        metavar="DIR",
        help="also take requests from `capture --trigger-dir DIR`, a folder shared "
        "by every rank of a job, read every second (default: none)",
    )
    # -- end on-demand capture --
    r.add_argument("target", metavar="TARGET", help="the script to run, or a module with -m")
    # (filled by _split_run: everything after TARGET, `--` included, is the program's)
    r.add_argument("args", nargs="*", default=[], metavar="ARGS", help="arguments for the program")
    r.set_defaults(fn=cmd_run)
    p.run_parser = r

    rep = sub.add_parser(
        "report",
        help="print tables from saved profiles or traces",
        description="Print tables from saved profiles (.gpuprof) or Chrome traces "
        "(.json, .json.gz), one after the other.",
    )
    rep.add_argument(
        "files", nargs="+", metavar="FILE", help="saved profiles (.gpuprof) or Chrome traces"
    )
    rep.add_argument(
        "--sort",
        type=_sort_key,
        metavar="KEY",
        help="sort the op table by KEY (default: self_cuda_time_total when the "
        "profile has GPU data, else self_cpu_time_total)",
    )
    rep.add_argument(
        "--limit", type=_positive, default=20, metavar="N", help="rows of each table (default: 20)"
    )
    g = rep.add_mutually_exclusive_group()
    g.add_argument(
        "--kernels",
        action="store_true",
        help="GPU kernels, copies and memsets instead of ops (default: ops)",
    )
    g.add_argument(
        "--steps",
        action="store_true",
        help="one line per recorded step instead of ops (default: ops)",
    )
    g.add_argument(
        "--memory",
        action="store_true",
        help="the memory summary (profiles recorded with --memory) instead of ops (default: ops)",
    )
    g.add_argument(
        "--html",
        metavar="OUT",
        help="write the report of one saved profile as one "
        "HTML page to OUT (docs/report.md) instead of printing tables (default: off)",
    )
    rep.set_defaults(fn=cmd_report)

    c = sub.add_parser(
        "compare",
        help="compare two saved profiles",
        description="Per-step differences of ops and kernels between two saved "
        "profiles, and the findings gone or new.",
    )
    c.add_argument("before", metavar="BEFORE", help="the saved profile (.gpuprof) to compare from")
    c.add_argument("after", metavar="AFTER", help="the saved profile (.gpuprof) to compare to")
    c.add_argument(
        "--limit",
        type=_positive,
        default=15,
        metavar="N",
        help="rows of each list of changes (default: 15)",
    )
    c.add_argument(
        "--html",
        metavar="OUT",
        help="write the comparison as one HTML page to OUT "
        "(docs/report.md) instead of printing it (default: off)",
    )
    c.set_defaults(fn=cmd_compare)

    # -- merge (gpuprof.distributed) --
    mg = sub.add_parser(
        "merge",
        help="merge per-rank traces into one timeline; compare ranks",
        description="Write one trace with a process per rank (open it in "
        "Perfetto) and print per-rank step, compute, communication and idle "
        "time with the slowest rank of each step.",
    )
    mg.add_argument("out", metavar="OUT", help="the merged trace to write (.json or .json.gz)")
    mg.add_argument(
        "traces", nargs="+", metavar="TRACE", help="per-rank traces (or one folder of them)"
    )
    mg.add_argument(
        "--align",
        choices=("auto", "clock", "step"),
        default="auto",
        help="auto: the traces' clocks unless ranks disagree by far more than a "
        "step, then their first common ProfilerStep (default: auto)",
    )
    mg.add_argument(
        "--ranks",
        metavar="R,R,...",
        help="rank of each trace, comma-separated, when the traces carry none "
        "(default: from the traces)",
    )
    mg.add_argument(
        "--limit",
        type=_positive,
        default=20,
        metavar="N",
        help="steps shown in the per-step table (default: 20)",
    )
    mg.set_defaults(fn=cmd_merge)
    # -- end merge --

    # -- on-demand capture (docs/on-demand.md) --
    cp = sub.add_parser(
        "capture",
        help="record the next steps of a running, armed program",
        description="Ask a running program, armed with `run --on-demand`, gpuprof.arm() or "
        "GPUPROF_ON_DEMAND=1, to record its next steps; it writes the trace, the saved profile, "
        "the stacks and a report (table and diagnosis) into --output, and goes on running. "
        "Processes that are not armed are refused, and nothing is sent to them.",
        epilog="Examples: python -m gpuprof capture 4242 --steps 20 --wait; "
        "python -m gpuprof capture --all-ranks 4242 4243 --wait; python -m gpuprof capture --list",
    )
    cp.add_argument(
        "pids",
        nargs="*",
        type=_pid_arg,
        metavar="PID",
        help="the armed process; with --all-ranks, every rank (or one rank: the "
        "other ranks of its torchrun job on this host are found)",
    )
    span = cp.add_mutually_exclusive_group()
    span.add_argument(
        "--steps", type=_positive, metavar="N", help="record the next N steps (default: 10)"
    )
    span.add_argument(
        "--duration",
        type=_seconds(True),
        metavar="S",
        help="record S seconds of whole steps instead; a program that has found "
        "no step records a time window (default: steps)",
    )
    cp.add_argument(
        "--output",
        "-o",
        metavar="DIR",
        help="the folder for the files, created if missing (default: "
        "gpuprof-HOST-PID-TIME in the working directory, or capture-TIME in "
        "--trigger-dir)",
    )
    cp.add_argument(
        "--memory", action="store_true", help="also record memory, as run --memory (default: off)"
    )
    cp.add_argument(
        "--wait",
        action="store_true",
        help="wait until the files are written, then print the diagnosis "
        "(default: return once the program has accepted)",
    )
    cp.add_argument(
        "--all-ranks",
        action="store_true",
        help="start every PID at the same step number (the ranks of one job); "
        "merge their files with `gpuprof merge` (default: off)",
    )
    cp.add_argument(
        "--trigger-dir",
        metavar="DIR",
        help="ask every process armed with --trigger-dir DIR, on any host, to "
        "start at the same step (default: none)",
    )
    cp.add_argument(
        "--timeout",
        type=_seconds(True),
        default=10.0,
        metavar="S",
        help="how long to wait for the program to answer (default: 10)",
    )
    cp.add_argument(
        "--list",
        action="store_true",
        help="list the armed processes of this user on this host (default: off)",
    )
    cp.add_argument(
        "--cancel",
        action="store_true",
        help="cancel the capture each PID has waiting to start; one that is "
        "recording ends by itself (default: off)",
    )
    cp.set_defaults(fn=cmd_capture)
    # -- end on-demand capture --
    return p


def _split_run(run_parser, argv: list[str]) -> tuple[list[str], list[str]]:
    """``run``'s own arguments up to TARGET, and the program's after it (as given)."""
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return argv[:i] + argv[i + 1 : i + 2], argv[i + 2 :]
        if not token.startswith("-") or token == "-":
            return argv[: i + 1], argv[i + 1 :]
        action = run_parser._option_string_actions.get(token)
        i += 2 if action is not None and action.nargs != 0 else 1
    return argv, []


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        parser.print_help()
        return 2
    program_args = None
    if argv[0] == "run":
        own, program_args = _split_run(parser.run_parser, argv[1:])
        argv = ["run"] + own
    args = parser.parse_args(argv)
    if program_args is not None:
        args.args = program_args
    if args.cmd is None:  # only options that do nothing alone
        parser.print_help()
        return 2
    try:
        return args.fn(args)
    except _CliError as e:
        print(f"gpuprof: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
