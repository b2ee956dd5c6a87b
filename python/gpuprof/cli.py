"""Command line: ``python -m gpuprof {demo,run,report,compare,merge}``.

``run`` profiles an unmodified program, like ``nsys profile`` or ``py-spy record``:

    python -m gpuprof run train.py --epochs 1
    python -m gpuprof run --wait 5 --warmup 2 --active 10 -m mypackage.train
    python -m gpuprof run --delay 30 --duration 10 train.py

Steps are found without code changes: every ``torch.optim.Optimizer.step``
call ends a step when PyTorch is used, or ``--step-fn module:function`` names
the function whose every return ends a step; with ``--delay/--duration`` a
time window is recorded instead.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.abc
import importlib.util
import os
import runpy
import sys
import threading
import traceback

__all__ = ["main"]


class _CliError(Exception):
    """A bad argument: printed as one line, exit code 2."""


def _profile_kwargs(args) -> dict:
    import gpuprof

    kwargs: dict = {"profile_memory": args.memory, "with_stack": args.with_stack}
    if getattr(args, "subprocesses", False):  # -- subprocesses (docs/subprocesses.md) --
        kwargs["subprocesses"] = True
    if args.cuda is not None:
        kwargs["activities"] = [gpuprof.ProfilerActivity.CPU] + (
            [gpuprof.ProfilerActivity.CUDA] if args.cuda else [])
    if args.active is not None:
        kwargs["schedule"] = gpuprof.schedule(wait=args.wait, warmup=args.warmup,
                                              active=args.active, repeat=args.repeat)
    if getattr(args, "capture_range", None):  # -- capture ranges (docs/nvtx.md) --
        if args.active is not None:
            raise _CliError("--capture-range and --active cannot be combined: the capture range "
                            "decides when to record")
        try:
            gpuprof._nvtx.parse_capture(args.capture_range)
        except ValueError as e:
            raise _CliError(f"--capture-range: {e}") from None
        kwargs["capture"] = args.capture_range
    return kwargs


class _StepHook(importlib.abc.MetaPathFinder):
    """Wraps a function when its module is imported, so that each return ends a step."""

    def __init__(self, targets: dict[str, list[str]], on_step):
        self.targets = targets  # module -> attribute paths
        self.on_step = on_step
        self.patched: list[str] = []

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.targets:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module, _orig=original, _name=fullname):
            _orig(module)
            for attr in self.targets[_name]:
                self._patch(module, attr, f"{_name}:{attr}")

        loader.exec_module = exec_module
        return spec

    def patch_loaded(self):
        for mod, attrs in self.targets.items():
            if mod in sys.modules:
                for attr in attrs:
                    self._patch(sys.modules[mod], attr, f"{mod}:{attr}")

    def _patch(self, module, attr, label):
        owner = module
        parts = attr.split(".")
        for p in parts[:-1]:
            owner = getattr(owner, p, None)
            if owner is None:
                return
        fn = getattr(owner, parts[-1], None)
        if fn is None or getattr(fn, "_gpuprof_step", False):
            return
        on_step = self.on_step

        @functools.wraps(fn)
        def wrapper(*a, **kw):
            try:
                return fn(*a, **kw)
            finally:
                on_step()

        wrapper._gpuprof_step = True
        setattr(owner, parts[-1], wrapper)
        self.patched.append(label)


def _run_target(args) -> int:
    """Run the script or module as __main__; return its exit code.

    An exception escaping the program is printed as Python would print it
    (without gpuprof's and runpy's frames) and gives exit code 1, or 130 for
    KeyboardInterrupt, after which the profile is still reported.
    """
    sys.argv = [args.target] + list(args.args)
    try:
        if args.module:
            runpy.run_module(args.target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(args.target)))
            runpy.run_path(args.target, run_name="__main__")
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
    return filename.startswith(os.path.dirname(__file__)) or "runpy" in filename


def _write_outputs(prof, out_dir: str, trace_min_us: float = 0.0) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"{os.uname().nodename}_{os.getpid()}")
    outputs = [(stem + ".pt.trace.json.gz",
                lambda p: prof.export_chrome_trace(p, min_duration_us=trace_min_us)),
               (stem + ".gpuprof", prof.save), (stem + ".stacks.txt", prof.export_stacks)]
    # -- html report (docs/report.md): beside the trace, which it links --
    outputs.append((os.path.join(out_dir, "report.html"),
                    lambda p: prof.export_html(p, trace=outputs[0][0])))
    for path, write in outputs:
        write(path)
    return [path for path, _ in outputs]


def cmd_run(args) -> int:
    import gpuprof

    if (args.delay is None) != (args.duration is None):
        raise _CliError("--delay and --duration go together")
    if not 0 <= args.trace_min_us < float("inf"):
        raise _CliError(f"--trace-min-us must be >= 0 and finite, got {args.trace_min_us}")
    if args.module:
        if importlib.util.find_spec(args.target) is None:
            raise _CliError(f"no module named {args.target!r}")
    elif not os.path.isfile(args.target):
        raise _CliError(f"no such script: {args.target!r}")
    prof = gpuprof.profile(**_profile_kwargs(args))
    steps = {"n": 0}

    def on_step():
        if prof.running:
            prof.step()
            steps["n"] += 1

    targets: dict[str, list[str]] = {"torch.optim.optimizer": ["Optimizer.step"]}
    if args.step_fn:
        if ":" not in args.step_fn:
            raise _CliError("--step-fn takes module:function, e.g. train:train_step")
        mod, attr = args.step_fn.split(":", 1)
        targets = {mod: [attr]}
    hook = _StepHook(targets, on_step)
    sys.meta_path.insert(0, hook)
    hook.patch_loaded()
    timers = []
    if args.delay is not None:
        timers = [threading.Timer(args.delay, prof.start),
                  threading.Timer(args.delay + args.duration, prof.stop)]
        for t in timers:
            t.daemon = True
            t.start()
    else:
        prof.start()
    code = 0
    try:
        code = _run_target(args)
    finally:
        for t in timers:
            t.cancel()
        if prof.running:
            prof.stop()
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)
        _report_run(prof, args, steps["n"], hook.patched)
    return code


def _report_run(prof, args, n_steps, patched):
    out = sys.stderr
    try:
        results = prof.results
    except RuntimeError as e:
        print(f"gpuprof: nothing recorded ({e})", file=out)
        return
    sort = args.sort or ("self_cuda_time_total" if results.cuda.get("active")
                         else "self_cpu_time_total")
    print(prof.key_averages().table(sort_by=sort, row_limit=args.limit), file=out)
    if getattr(prof, "subprocesses", False):  # -- subprocesses --
        _report_processes(prof, args, out)
    how = ", ".join(patched) if patched else ("time window" if args.delay is not None else "none")
    print(f"steps detected: {n_steps} (step boundaries: {how})", file=out)
    print(prof.diagnose(), file=out)
    if args.output:
        for path in _write_outputs(prof, args.output, args.trace_min_us):
            print(f"gpuprof: wrote {path}", file=out)


# -- subprocesses (docs/subprocesses.md) --
def _report_processes(prof, args, out) -> None:
    """One line per profiled process, then the workers' ops summed (when any recorded)."""
    from .tables import format_time

    procs = prof.processes()
    workers = procs[procs["role"] == "worker"]
    print(f"processes: main + {len(workers)} worker{'s' if len(workers) != 1 else ''}",
          file=out)
    width = min(40, max(len(str(n)) for n in procs["name"]))
    for p in procs:
        how = f"{p['role']}, {p['start_method']}" if p["start_method"] else str(p["role"])
        print(f"  pid {p['pid']:<8d} {str(p['name'])[:width]:<{width}s}  {how:<18s} "
              f"{p['status']:<7s} {p['events']:>11,d} events  self CPU "
              f"{format_time(p['cpu_self_ns'])}", file=out)
    if len(workers) and workers["windows"].sum() > 0:
        print(prof.key_averages(pid="workers").table(
            sort_by="self_cpu_time_total", row_limit=args.limit,
            header=f"child processes ({len(workers)}), summed"), file=out)
# -- end subprocesses --


def cmd_demo(args) -> int:
    from . import demo

    return demo.main([])


def cmd_report(args) -> int:
    import gpuprof

    if not os.path.isfile(args.file):
        raise _CliError(f"cannot read {args.file!r}: no such file")
    if args.file.endswith((".json", ".json.gz")):
        if args.html:  # -- html report --
            raise _CliError("--html needs a saved profile (.gpuprof), not a trace; open the "
                            "trace in https://ui.perfetto.dev")
        print(_trace_report(args.file, args.kernels, args.limit))
        return 0
    load = getattr(gpuprof, "load", None)
    if load is None:
        raise _CliError("this build cannot read saved profiles")
    try:
        prof = load(args.file)
    except (OSError, ValueError, KeyError) as e:
        raise _CliError(f"cannot read {args.file!r}: {e}") from e
    if args.html:  # -- html report (docs/report.md) --
        _write_html(lambda: prof.export_html(args.html), args.html)
        return 0
    if args.kernels:
        _print_kernels(prof.kernels(), args.limit)
    elif args.steps:
        _print_steps(prof.steps())
    elif args.memory and hasattr(prof, "memory_summary"):
        print(prof.memory_summary())
    else:
        sort = args.sort or "self_cuda_time_total"
        print(prof.key_averages().table(sort_by=sort, row_limit=args.limit))
    return 0


def _trace_report(path: str, kernels: bool, limit: int):
    """Totals by name from an exported Chrome trace (ours or any Kineto-style trace)."""
    import gzip
    import json

    from .tables import format_time
    from .views import Table

    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            trace = json.load(f)
        events = trace["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
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
    rows = [[name if len(name) <= 70 else name[:67] + "...", str(n), format_time(us * 1e3),
             format_time(us * 1e3 / n)] for name, (n, us) in order]
    title = ("GPU activity" if kernels else "Host events (inclusive time)") + f" in {path}"
    return Table(title, ["Name", "Count", "Total", "Avg"], rows, "lrrr",
                 footer=f"{len(totals)} names; {sum(v[0] for v in totals.values())} events")


def _print_kernels(k, limit):
    from .views import kernel_table

    print(kernel_table(k, row_limit=limit))


def _print_steps(s):
    from .views import step_table

    print(step_table(s))


def cmd_compare(args) -> int:
    import gpuprof

    compare = getattr(gpuprof, "compare", None)
    if compare is None:
        raise _CliError("compare is not available in this build")
    for f in (args.before, args.after):
        if not os.path.isfile(f):
            raise _CliError(f"cannot read {f!r}: no such file")
    result = compare(args.before, args.after)
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
            raise _CliError(f"--ranks takes comma-separated ints, e.g. 0,1,2,3; got "
                            f"{args.ranks!r}") from None
    try:
        run = merge(args.out, args.traces, align=args.align, ranks=ranks)
    except (OSError, ValueError, TypeError) as e:
        raise _CliError(str(e)) from e
    print(run.table(max_steps=args.limit))
    print(run.diagnose())
    print(f"gpuprof: wrote {args.out}", file=sys.stderr)
    return 0
# -- end merge --


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpuprof",
                                description="Profile Python programs that drive GPUs.")
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("demo", help="profile a bundled training loop and print the results")
    d.set_defaults(fn=cmd_demo)

    r = sub.add_parser("run", help="profile an unmodified script or module")
    r.add_argument("-m", dest="module", action="store_true", help="run a module (like python -m)")
    r.add_argument("--wait", type=int, default=0)
    r.add_argument("--warmup", type=int, default=1)
    r.add_argument("--active", type=int, default=None,
                   help="record this many steps per cycle (default: the whole run)")
    r.add_argument("--repeat", type=int, default=1)
    r.add_argument("--cuda", dest="cuda", action="store_true", default=None)
    r.add_argument("--no-cuda", dest="cuda", action="store_false")
    r.add_argument("--memory", action="store_true", help="record device memory")
    r.add_argument("--with-stack", action="store_true")
    r.add_argument("--step-fn", help="module:function whose every return ends a step")
    r.add_argument("--subprocesses", action="store_true",
                   help="also profile child processes started by the program (DataLoader "
                        "workers, multiprocessing); they are shown per process")
    r.add_argument("--capture-range", metavar="cudaProfilerApi|nvtx:NAME[@DOMAIN]",
                   help="record only between cudaProfilerStart() and cudaProfilerStop() "
                        "(torch.cuda.profiler.start/stop), or inside NVTX ranges named NAME")
    r.add_argument("--delay", type=float, help="seconds before recording starts")
    r.add_argument("--duration", type=float, help="seconds to record")
    r.add_argument("--output", "-o", help="directory for the trace, saved profile, stacks and "
                   "report.html")
    r.add_argument("--trace-min-us", type=float, default=0.0, metavar="US",
                   help="leave Python and C calls shorter than US microseconds that launched "
                        "no CUDA work out of the trace (counted in its header; default 0: "
                        "every call)")
    r.add_argument("--sort", help="table sort key (default: self CUDA or self CPU time)")
    r.add_argument("--limit", type=int, default=20, help="table rows")
    r.add_argument("target", help="script path, or module name with -m")
    r.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the program")
    r.set_defaults(fn=cmd_run)

    rep = sub.add_parser("report", help="print tables from a saved profile")
    rep.add_argument("file")
    rep.add_argument("--sort")
    rep.add_argument("--limit", type=int, default=20)
    g = rep.add_mutually_exclusive_group()
    g.add_argument("--kernels", action="store_true")
    g.add_argument("--steps", action="store_true")
    g.add_argument("--memory", action="store_true")
    g.add_argument("--html", metavar="OUT", help="write the report as one HTML page to OUT "
                   "(docs/report.md) instead of printing tables")
    rep.set_defaults(fn=cmd_report)

    c = sub.add_parser("compare", help="compare two saved profiles")
    c.add_argument("before")
    c.add_argument("after")
    c.add_argument("--html", metavar="OUT", help="write the comparison as one HTML page to OUT "
                   "(docs/report.md) instead of printing it")
    c.set_defaults(fn=cmd_compare)

    # -- merge (gpuprof.distributed) --
    mg = sub.add_parser("merge", help="merge per-rank traces into one timeline; compare ranks",
                        description="Write one trace with a process per rank (open it in "
                        "Perfetto) and print per-rank step, compute, communication and idle "
                        "time with the slowest rank of each step.")
    mg.add_argument("out", help="the merged trace to write (.json or .json.gz)")
    mg.add_argument("traces", nargs="+", help="per-rank traces (or one folder of them)")
    mg.add_argument("--align", choices=("auto", "clock", "step"), default="auto",
                    help="auto: the traces' clocks unless ranks disagree by far more than a "
                    "step, then their first common ProfilerStep (default: auto)")
    mg.add_argument("--ranks", help="rank of each trace, comma-separated, when the traces "
                    "carry none")
    mg.add_argument("--limit", type=int, default=20, help="steps shown in the per-step table")
    mg.set_defaults(fn=cmd_merge)
    # -- end merge --
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except _CliError as e:
        print(f"gpuprof: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
