"""``report``, ``compare`` and ``merge``: tables from saved profiles and traces, two
profiles compared, per-rank traces merged; ``--html`` pages of the first two."""

from __future__ import annotations

import os
import sys

from ._common import _CliError


def _is_trace(path: str) -> bool:
    return path.endswith((".json", ".json.gz"))


# -- the file to read: a folder's saved profile; a file that is not one, named ----------
_PROFILE = ".gpuprof"
_TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json")


def _saved_in(folder: str) -> list[str]:
    """The saved profiles directly in ``folder``, oldest first (by modification time)."""
    try:
        names = [n for n in os.listdir(folder) if n.endswith(_PROFILE)]
    except OSError:
        return []
    paths = [os.path.join(folder, n) for n in names]
    paths = [p for p in paths if os.path.isfile(p)]
    return sorted(paths, key=lambda p: (os.path.getmtime(p), p))


def _profile_beside(path: str) -> str | None:
    """The saved profile written with ``path`` (``run --output`` and ``capture`` write
    the trace, the stacks, the text and HTML reports beside it): the one of the same
    stem, else the newest in its folder, else None."""
    folder, name = os.path.split(path)
    for suffix in (*_TRACE_SUFFIXES, ".stacks.txt", ".txt", ".html"):
        if name.endswith(suffix):
            same = os.path.join(folder, name[: -len(suffix)] + _PROFILE)
            if os.path.isfile(same):
                return same
            break
    found = _saved_in(folder or ".")
    return found[-1] if found else None


def _instead(path: str) -> str:
    """'; pass X instead' for a file that is not a saved profile, when X is beside it."""
    beside = _profile_beside(path)
    return f"; pass the saved profile beside it instead: {beside!r}" if beside else ""


def _not_a_profile(path: str) -> str | None:
    """What ``path`` is when it is one of gpuprof's other files (the HTML report, the
    stacks, a capture's text report), else None."""
    try:
        with open(path, "rb") as f:
            head = f.read(256).lstrip().lower()
    except OSError:
        return None
    if path.endswith((".html", ".htm")) or head.startswith((b"<!doctype html", b"<html")):
        return "is the HTML report: open it in a browser"
    if path.endswith(".stacks.txt"):
        return "holds collapsed stacks for flame graphs (flamegraph.pl, speedscope)"
    if head.startswith(b"gpuprof on-demand capture"):
        return "is the text report of an on-demand capture"
    return None


def _resolve(path: str, who: str = "") -> str:
    """The file to read for ``path``: a folder that ``run --output`` or ``capture``
    wrote gives its saved profile (the newest when it holds several), said on stderr;
    a file is checked to exist and not to be one of gpuprof's other outputs.

    Raises:
        _CliError: no such file, a folder without a saved profile, or the HTML report
            (or stacks) given for a profile, each naming the file to pass instead.
    """
    if os.path.isdir(path):
        found = _saved_in(path)
        if not found:
            traces = sorted(
                n for n in os.listdir(path) if n.endswith(_TRACE_SUFFIXES[:2])
            )  # a TensorBoard log folder
            hint = (
                f"; it holds {len(traces)} trace(s): pass one, e.g. "
                f"{os.path.join(path, traces[-1])!r}"
                if traces and not who
                else ""
            )
            raise _CliError(
                f"{who}{path!r} is a folder without a saved profile ({_PROFILE}) in it"
                f"{hint}; `run --output DIR` and `capture --output DIR` write one there"
            )
        chosen = found[-1]
        more = (
            f" (the newest of the {len(found)} saved profiles in {path}; name a file "
            "to read another)"
            if len(found) > 1
            else ""
        )
        print(f"gpuprof: {who}reading {chosen}{more}", file=sys.stderr)
        return chosen
    if not os.path.isfile(path):
        raise _CliError(f"{who}cannot read {path!r}: no such file")
    what = _not_a_profile(path)
    if what is not None:
        raise _CliError(
            f"{who}{path!r} {what}; `{'compare' if who else 'report'}` reads saved "
            f"profiles ({_PROFILE}){_instead(path)}"
        )
    return path


def cmd_report(args) -> int:
    import gpuprof

    args.files = [_resolve(f) for f in args.files]
    traces = [f for f in args.files if _is_trace(f)]
    if traces and (args.steps or args.memory or args.sort):
        flag = "--steps" if args.steps else "--memory" if args.memory else "--sort"
        raise _CliError(
            f"{flag} needs a saved profile (.gpuprof), and {traces[0]!r} is a "
            f"Chrome trace (its report lists events by total time){_instead(traces[0])}"
        )
    if args.html and (len(args.files) != 1 or traces):  # -- html report --
        raise _CliError(
            "--html writes one page of one saved profile (.gpuprof); give one "
            "file (a trace opens in https://ui.perfetto.dev)"
            if len(args.files) != 1
            else "--html needs a saved profile (.gpuprof), not a trace; open the trace "
            f"in https://ui.perfetto.dev{_instead(traces[0])}"
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
            beside = _profile_beside(f)
            if beside is not None and beside not in args.files:
                print(
                    f"gpuprof: {f} is a Chrome trace: its report is totals by name; the "
                    f"saved profile beside it has the full tables: report {beside}",
                    file=sys.stderr,
                )
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
    from ..core._format import format_time
    from ..core._trace_read import read_trace
    from ..results.views import Table

    try:
        events = read_trace(path, "report")["traceEvents"]
    except (OSError, ValueError) as e:
        raise _CliError(f"cannot read {path!r}: not a Chrome trace ({e})") from e
    gpu_cats = {"kernel", "gpu_memcpy", "gpu_memset"}
    host_cats = {"python_function", "user_annotation", "cpu_op", "cuda_runtime", "cuda_driver"}
    cats = gpu_cats if kernels else host_cats
    totals: dict[str, list] = {}
    for ev in events:
        if ev.get("ph") != "X" or ev.get("cat") not in cats:
            continue
        t = totals.setdefault(ev.get("name", "?"), [0, 0.0])
        t[0] += 1
        t[1] += float(ev.get("dur", 0.0))
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

    args.before = _resolve(args.before, "BEFORE: ")
    args.after = _resolve(args.after, "AFTER: ")
    loaded = []
    for flag, f in (("BEFORE", args.before), ("AFTER", args.after)):
        if _is_trace(f):
            raise _CliError(
                f"{flag}: {f!r} is a Chrome trace; compare reads saved profiles "
                f"(.gpuprof, written by `run --output` or prof.save()){_instead(f)}"
            )
        try:
            loaded.append(gpuprof.load(f))
        except (OSError, ValueError, KeyError) as e:
            raise _CliError(f"{flag}: cannot read {f!r}: {e}") from None
    result = gpuprof.compare(loaded[0], loaded[1], limit=args.limit)  # BEFORE, AFTER
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
    from ..analysis.distributed import merge

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
