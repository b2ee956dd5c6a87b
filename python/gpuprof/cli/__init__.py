"""Command line: ``python -m gpuprof {demo,run,report,compare,merge,capture,dump,top}``.

``run`` profiles an unmodified program, like ``nsys profile`` or ``py-spy record``:

    python -m gpuprof run train.py --epochs 1
    python -m gpuprof run --wait 5 --warmup 2 --active 10 -m mypackage.train
    python -m gpuprof run --delay 30 --duration 10 train.py

Steps are found without code changes: every PyTorch optimizer step ends one
(``gpuprof.core._steps``), or ``--step-fn module:function`` names the function whose
every return ends one; ``--delay/--duration`` record a time window instead. By
default the start-up up to the end of the first step is recorded apart and left out
of the results (``gpuprof.core._steps.StartupApart``); ``--whole-run`` keeps it.

Every argument is checked before the program starts: a bad one gets one line on
stderr and exit code 2. When the program has ended, the ``--output`` files are
written first, then the tables and the diagnosis go to stdout (after the
program's own output); progress and warnings go to stderr.

Each command lives in a module of its own: ``_run`` (``run`` and ``demo``),
``_report`` (``report``, ``compare``, ``merge``), ``_capture`` (``run --on-demand``
and ``capture``), ``_dump`` (``dump``), ``_top`` (``top``); ``_common`` holds what they
share. This module wires them into the argument parser and holds ``main()``.
"""

from __future__ import annotations

import sys

from . import _top
from ._capture import _pid_arg, _signal_arg, cmd_capture
from ._common import _CliError, _natural, _Parser, _positive, _seconds, _sort_key, _step_fn
from ._dump import cmd_dump
from ._report import cmd_compare, cmd_merge, cmd_report
from ._run import cmd_demo, cmd_run

__all__ = ["main"]


def _version() -> str:
    from .._version import __version__

    return f"gpuprof {__version__}"


def _parser() -> _Parser:
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
        "run --warmup steps, record --active steps; --repeat such cycles. Without --active "
        "everything after the first step is recorded (--whole-run: everything).",
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
        help="steps to record in each cycle (default: none: record every step after the first)",
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
        "--whole-run",
        action="store_true",
        help="record from the program's start to its end as one window, start-up "
        "included (default: the start-up up to the end of the first step is recorded "
        "apart and left out of the results, which cover the steps after it; a program "
        "without steps is recorded whole)",
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
        "--trace-max-events",
        type=_natural,
        default=1_000_000,
        metavar="N",
        help="write at most about N events into the trace: the first and the last steps, "
        "half of N each; the steps between are left out, and the header and a line on "
        "stderr say which; 0 writes every event (default: 1000000, about 12 MB)",
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
    outp.add_argument(
        "--idle",
        action="store_true",
        help="also show the time threads spent waiting (sleeps, lock acquires, polls, "
        "queue gets) in the table, as key_averages(idle=True) (default: off, a footer "
        "line says how much was left out)",
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
        "files",
        nargs="+",
        metavar="FILE",
        help="saved profiles (.gpuprof), Chrome traces, or folders that `run --output` "
        "or `capture` wrote (their newest saved profile)",
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
    c.add_argument(
        "before",
        metavar="BEFORE",
        help="the saved profile (.gpuprof), or a folder holding it, to compare from",
    )
    c.add_argument(
        "after",
        metavar="AFTER",
        help="the saved profile (.gpuprof), or a folder holding it, to compare to",
    )
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

    # -- dump (docs/on-demand.md, "Dumping a hung job") --
    dp = sub.add_parser(
        "dump",
        help="print every thread's stack of a running, armed program",
        description="Print every thread of a running program armed with `run --on-demand`, "
        "gpuprof.arm() or GPUPROF_ON_DEMAND=1: its name, its Python stack (innermost frame "
        "first), the C call it is in and what the OS says it waits for; for a "
        "torch.distributed job, the collectives in flight. The stacks are read without the "
        "GIL, so a program stuck in C code that holds it is dumped too; it goes on running. "
        "Processes that are not armed are refused, and nothing is sent to them.",
        epilog="Examples: python -m gpuprof dump 4242; python -m gpuprof dump --all-ranks "
        "4242 (every rank of its torchrun job on this host)",
    )
    dp.add_argument(
        "pids",
        nargs="*",
        type=_pid_arg,
        metavar="PID",
        help="the armed process; with --all-ranks, every rank (or one rank: the other "
        "ranks of its torchrun job on this host are found)",
    )
    dp.add_argument(
        "--all-ranks",
        action="store_true",
        help="dump every PID at once, show their main threads side by side and name the "
        "ranks whose stacks differ from the others (default: off)",
    )
    dp.add_argument(
        "--timeout",
        type=_seconds(True),
        default=5.0,
        metavar="S",
        help="how long to wait for each process's answer (default: 5)",
    )
    dp.add_argument(
        "--json",
        action="store_true",
        help="print what each process answered as JSON instead of text (default: off)",
    )
    dp.set_defaults(fn=cmd_dump)
    # -- end dump --
    _top.add_parser(sub, _pid_arg, _seconds, _positive)  # docs/on-demand.md, "Watching live"
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
