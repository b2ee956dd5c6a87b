"""``report``, ``compare`` and ``merge``: tables from saved profiles and traces, two
profiles compared, per-rank traces merged; ``--html`` pages of the first two."""

from __future__ import annotations

import os
import sys

from ._common import _CliError


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
    from .._format import format_time
    from .._trace_read import read_trace
    from ..views import Table

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
    from ..distributed import merge

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
