"""On-demand capture from the command line: ``run --on-demand`` (the program runs
armed) and ``capture`` (ask an armed program for its next steps, list or cancel)."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

from ._common import (
    _check_cuda_usable,
    _check_output_dir,
    _CliError,
    _find_program,
    _flush,
    _run_program,
)


# -- on-demand capture (gpuprof.api.ondemand, docs/on-demand.md) --
def _signal_arg(text: str) -> str:
    from ..core._ondemand_proto import parse_signal

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


def check_targets(args: argparse.Namespace, several: str) -> None:
    """The PIDs or --trigger-dir of `capture` and `top`: one of the two, each PID once,
    several PIDs only with --all-ranks (``several``: what --all-ranks does for them, and
    the other way, for the message)."""
    if args.trigger_dir is None and not args.pids:
        raise _CliError(
            "give the PID of an armed process (`python -m gpuprof capture --list` "
            "shows them), or --trigger-dir DIR"
        )
    if args.trigger_dir is not None and args.pids:
        raise _CliError("give PIDs or --trigger-dir DIR, not both")
    if len(args.pids) > 1 and not args.all_ranks:
        raise _CliError(f"{len(args.pids)} PIDs: add --all-ranks {several}")
    if len(set(args.pids)) != len(args.pids):
        raise _CliError("a PID is given twice")
    if args.trigger_dir is not None:
        _check_trigger_dir(args.trigger_dir)


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
    from ..api import ondemand as _ondemand
    from ..core import _steps
    from . import _launch

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
        ("--whole-run", args.whole_run or None),
        ("--output", args.output),
        ("--memory", args.memory or None),
        ("--subprocesses", args.subprocesses or None),
        ("--with-stack", args.with_stack or None),
        ("--sort", args.sort),
        ("--limit", None if args.limit == 20 else args.limit),
        ("--idle", args.idle or None),
        ("--trace-min-us", args.trace_min_us or None),
        ("--trace-max-events", None if args.trace_max_events == 1_000_000 else 1),
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
        _check_cuda_usable("capture")
    program = _find_program(args)
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
        code = program.compile(od.source.transform if in_main else None)  # type: ignore[union-attr]  # in_main: a StepFunction
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
        binder = od.source.binder() if in_main else None  # type: ignore[union-attr]  # as above
        return _run_program(program, code, args.args, binder)
    finally:
        _ondemand.disarm()


def cmd_capture(args) -> int:
    from ..record._ondemand_capture import default_output
    from .ondemand import _client as client

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
    check_targets(args, "to start them at the same step (or capture each one on its own)")
    if args.trigger_dir is not None:
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
