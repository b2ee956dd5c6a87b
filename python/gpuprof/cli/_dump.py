"""``gpuprof dump PID``: every thread's Python stack of an armed process, the C call
each is in, what the OS says of it, and for a torch.distributed job the collectives
in flight; ``--all-ranks`` puts the ranks of a job side by side and names those
whose stacks differ (docs/on-demand.md, "Dumping a hung job")."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from typing import Any

from ._common import _CliError


def cmd_dump(args) -> int:
    from .ondemand import _dump_client as dc

    if not args.pids:
        raise _CliError(
            "give the PID of an armed process (`python -m gpuprof capture --list` shows them)"
        )
    if len(args.pids) > 1 and not args.all_ranks:
        raise _CliError(
            f"{len(args.pids)} PIDs: add --all-ranks to dump them side by side (or dump "
            "each one on its own)"
        )
    if len(set(args.pids)) != len(args.pids):
        raise _CliError("a PID is given twice")
    try:
        targets = dc.pids_for(args.pids, args.all_ranks)
    except dc.CaptureError as e:
        print(f"gpuprof: error: {e}", file=sys.stderr)
        return e.code
    dumps = dc.dump_all(targets, args.timeout)
    if args.json:
        print(json.dumps([_as_json(d) for d in dumps], indent=1, default=str))
    else:
        if args.all_ranks:
            print(format_ranks(dumps))
        for i, d in enumerate(dumps):
            if args.all_ranks or i:
                print()
            print(format_dump(d, header=args.all_ranks))
    failed = [d for d in dumps if not d.ok]
    for d in failed:
        print(f"gpuprof: error: {d.target.name}: {d.error}", file=sys.stderr)
    return 1 if failed else 0


def _as_json(d) -> dict:
    return {
        "pid": d.pid,
        "rank": d.rank,
        "error": d.error,
        "seconds": d.seconds,
        "walk": d.walk,
        "names": d.names,
        "python": d.python,
        "python_missing_ms": d.python_missing_ms,
    }


# -- one process ---------------------------------------------------------------------------
def _who(d) -> str:
    rank = f", rank {d.rank} of {d.world_size}" if d.rank is not None else ""
    return f"pid {d.pid} ({d.target.info.command}{rank})"


def _frame(f: dict, short: bool = False) -> str:
    path = f.get("file") or "?"
    if short:
        path = os.path.basename(path)
    line = f.get("line")
    where = f"{path}:{line}" if isinstance(line, int) and line >= 0 else path
    return f"{f.get('func') or '?'} ({where})"


def _tid(t) -> str:
    return f"tid {t.native_id}" if t.native_id else f"ident {t.ident}"


def _device_note(d, t) -> str | None:
    from .ondemand._dump_client import CUDA_CALLS, TENSOR_SYNCS

    callee = (t.call or {}).get("callee")
    if not callee:
        return None
    if callee in CUDA_CALLS:
        return CUDA_CALLS[callee]
    if callee in TENSOR_SYNCS and (d.python or {}).get("cuda_initialized"):
        return TENSOR_SYNCS[callee] + ": for a CUDA tensor, waits for its stream"
    return None


def format_dump(d, header: bool = False) -> str:
    lines = []
    lead = "== " if header else ""
    if not d.ok:
        lines.append(f"{lead}{_who(d)}: no stacks: {d.error}")
        return "\n".join(lines)
    walk = d.walk
    threads = d.threads()
    when = time.strftime("%H:%M:%S", time.localtime(float(walk.get("time") or 0)))
    lines.append(
        f"{lead}{_who(d)}: {len(threads)} Python thread(s) at {when}, read in "
        f"{(walk.get('elapsed_us') or 0) / 1000:.1f} ms without the GIL (Python "
        f"{walk.get('python')})"
    )
    holder = d.gil_holder()
    for t in threads:
        lines.append("")
        if t.ours:
            top = _frame(t.frames[0]) if t.frames else "no Python frame"
            lines.append(f"Thread {t.label} ({_tid(t)}): gpuprof's own, at {top}")
            continue
        facts = [_tid(t)]
        if t.holds_gil:
            facts.append("holds the GIL")
        state = t.os_state()
        head = f"Thread {t.label} ({', '.join(facts)})"
        lines.append(head + (f", {state}" if state else ""))
        call = t.call_text()
        if call:
            lines.append(f"    {call}")
            note = _device_note(d, t)
            if note:
                lines.append(f"      on the device: {note}")
        coll = t.collective()
        if coll:
            lines.append(f"    in torch.distributed collective {coll}")
        if not t.frames:
            lines.append("    (no Python frame: between calls, or not yet started)")
        for f in t.frames:
            lines.append(f"    {_frame(f)}")
        if t.frames_cut:
            lines.append("    ... (outer frames left out)")
    native = walk.get("native") or []
    own = [n for n in native if n.get("name") == "gpuprof-dump"]
    others = [n for n in native if n not in own]
    if others:
        lines.append("")
        shown = ", ".join(
            f"{n.get('tid')} {n.get('name') or '?'} {_native_state(n)}".rstrip()
            for n in others[:12]
        )
        more = f" and {len(others) - 12} more" if len(others) > 12 else ""
        lines.append(f"Native threads without Python ({len(others)}): {shown}{more}")
    dist = d.distributed()
    if dist:
        lines.append("")
        lines.extend(_format_distributed(dist))
    notes = _unknowns(d, holder)
    if notes:
        lines.append("")
        lines.extend(f"Not known: {n}" for n in notes)
    return "\n".join(lines)


def _native_state(n: dict) -> str:
    from .ondemand._dump_client import STATES

    state = STATES.get(n.get("state") or "", "")
    sc = n.get("syscall")
    return (
        f"({state} in {sc})" if state and sc and sc != "running" else f"({state})" if state else ""
    )


def _format_distributed(dist: dict) -> list[str]:
    if "error" in dist:
        return [f"torch.distributed: {dist['error']}"]
    out = [
        f"torch.distributed: rank {dist.get('rank')} of {dist.get('world_size')}, "
        f"backend {dist.get('backend')}"
    ]
    fr = dist.get("flight_recorder") or {}
    if fr.get("missing"):
        out.append(f"  collectives: {fr['missing']}")
        return out
    configs = fr.get("configs") or {}
    for pg, st in sorted((fr.get("groups") or {}).items()):
        name = _group_name(pg, configs)
        out.append(
            f"  group {name}: last collective enqueued #{st.get('last_enqueued_collective')}, "
            f"started #{st.get('last_started_collective')}, completed "
            f"#{st.get('last_completed_collective')}"
        )
    flying = fr.get("in_flight") or []
    for e in flying:
        out.append(f"  in flight: {_entry(e)}")
    if not flying:
        out.append("  in flight: none")
    return out


def _group_name(pg, configs) -> str:
    cfg = configs.get(str(pg)) or {}
    desc = cfg.get("desc")
    return f"{pg} ({desc})" if desc else str(pg)


def _entry(e: dict) -> str:
    pg = e.get("pg") or ["", ""]
    group = f"{pg[0]} ({pg[1]})" if len(pg) > 1 and pg[1] else str(pg[0])
    seq = e.get("p2p_seq") if e.get("is_p2p") else e.get("seq")
    age = f" for {e['age_s']:.1f} s" if isinstance(e.get("age_s"), (int, float)) else ""
    sizes = f" {e['input_sizes']}" if e.get("input_sizes") else ""
    state = f", {e['state']}" if e.get("state") else ""
    return f"#{seq} {e.get('op')}{sizes} in group {group}{state}{age}"


def _unknowns(d, holder) -> list[str]:
    out = []
    if d.python is None:
        if holder is not None:
            why = f"thread {holder.label} ({_tid(holder)}) holds the GIL"
        else:
            why = "it did not get the GIL, or was busy"
        waited = d.python_missing_ms
        within = f"within {waited / 1000:g} s" if waited is not None else "in time"
        names = d.names_source()
        named = (
            f"thread names are those of {names[6:]}"
            if names.startswith("as of")
            else ("thread names are not known")
        )
        out.append(
            f"gpuprof's on-demand thread did not answer {within} ({why}); {named}, and "
            "torch.distributed's collectives are not read"
        )
    for p in (d.walk or {}).get("problems") or []:
        out.append(p)
    more = (d.walk or {}).get("problems_more")
    if more:
        out.append(f"{more} more problem(s) of the same kind")
    if any(t.raw.get("state") is not None and t.raw.get("syscall") is None for t in d.threads()):
        out.append(
            "the system call some threads are in (/proc/PID/task/TID/syscall is not readable)"
        )
    return out


# -- ranks side by side ------------------------------------------------------------------------
def _rank_name(d) -> str:
    return f"rank {d.rank}" if d.rank is not None else f"pid {d.pid}"


def format_ranks(dumps) -> str:
    from .ondemand._dump_client import compare_ranks

    names = ", ".join(f"{_rank_name(d)} (pid {d.pid})" for d in dumps)
    lines = [f"== {len(dumps)} processes: {names}"]
    readable = [d for d in dumps if d.ok and d.main_thread() is not None]
    if len(readable) < 2:
        lines.append("(fewer than two main threads could be read: nothing to compare)")
        return "\n".join(lines)
    mains = {id(d): d.main_thread() for d in readable}
    outer = {id(d): list(reversed(mains[id(d)].frames)) for d in readable}
    common = 0
    while (
        all(len(v) > common for v in outer.values())
        and len({tuple(sorted(v[common].items())) for v in outer.values()}) == 1
    ):
        common += 1
    lines.append("Main threads side by side, outermost frame first:")
    first = next(iter(outer.values()))
    for i, f in enumerate(first[:common]):
        lines.append(f"  {'all' if i == 0 else '':<8}{_frame(f)}")
    width = shutil.get_terminal_size((120, 24)).columns - 2
    col = max(28, min(60, width // len(readable)))
    tails = {}
    for d in readable:
        t = mains[id(d)]
        cells = [_frame(f, short=True) for f in outer[id(d)][common:]]
        call = t.call_text()
        if call:
            cells.append(call)
        tails[id(d)] = cells or ["(the same)"]
    if len(readable) * col <= max(width, 2 * 28):
        lines.append("  " + "".join(_cell(_rank_name(d), col) for d in readable).rstrip())
        for row in range(max(len(v) for v in tails.values())):
            cells = [tails[id(d)][row] if row < len(tails[id(d)]) else "" for d in readable]
            lines.append("  " + "".join(_cell(c, col) for c in cells).rstrip())
    else:
        for d in readable:
            lines.append(f"  {_rank_name(d)}:")
            lines.extend(f"    {c}" for c in tails[id(d)])
    usual, different = compare_ranks(readable)
    if not different:
        lines.append("Every main thread is at the same place.")
    else:
        where = mains[id(usual[0])]
        coll = where.collective()
        one = len(usual) == 1
        if coll:
            usual_text = f"{'waits' if one else 'wait'} in collective {coll}{_called_from(where)}"
        else:
            usual_text = f"{'is' if one else 'are'} {_place(where)}"
        for d in different:
            t = mains[id(d)]
            call = t.call_text()
            lines.append(
                f"{_rank_name(d)} differs from the others: its main thread is {_place(t)}"
                + (f", {call}" if call else "")
                + f"; {', '.join(_rank_name(u) for u in usual)} {usual_text}."
            )
    lines.extend(_compare_collectives(readable))
    return "\n".join(lines)


def _place(t) -> str:
    """'in Queue.get, called from main (train.py:70)', or 'at main (train.py:70)'."""
    if not t.frames:
        return "in no Python frame"
    top, user = t.frames[0], t.user_frame()
    if user is None or user is top:
        return f"at {_frame(top)}"
    return f"in {top.get('func')}{_called_from(t)}"


def _called_from(t) -> str:
    user = t.user_frame()
    return f", called from {_frame(user)}" if user is not None else ""


def _cell(text: str, col: int) -> str:
    return (text if len(text) < col - 1 else text[: col - 4] + "...").ljust(col)


def _compare_collectives(dumps) -> list[str]:
    """Per group, the collective some ranks are in and others have not entered."""
    per = {}
    for d in dumps:
        fr = ((d.distributed() or {}).get("flight_recorder")) or {}
        if "groups" in fr:  # read (a rank that ran no collective yet has no groups)
            per[id(d)] = fr
    if len(per) < 2:
        return []
    out = []
    groups = sorted({pg for fr in per.values() for pg in fr["groups"]})
    for pg in groups:
        seqs = {}
        for d in dumps:
            if id(d) not in per:
                continue
            st = per[id(d)]["groups"].get(pg) or {"last_enqueued_collective": 0}
            seqs[id(d)] = st.get("last_enqueued_collective")
        known = {k: v for k, v in seqs.items() if isinstance(v, int)}
        if len(set(known.values())) <= 1:
            continue
        top = max(known.values())
        ahead = [d for d in dumps if known.get(id(d)) == top]
        behind = [d for d in dumps if id(d) in known and known[id(d)] < top]
        fr0 = per[id(ahead[0])]
        configs: dict[str, Any] = {}
        for fr in per.values():
            configs.update(fr.get("configs") or {})
        name = _group_name(pg, configs)
        op = next(
            (
                e.get("op")
                for e in fr0.get("in_flight") or []
                if str(e.get("pg_id")) == str(pg) and e.get("seq") == top
            ),
            None,
        )
        what = f"collective #{top}" + (f" ({op})" if op else "")
        out.append(
            f"Group {name}: {', '.join(_rank_name(d) for d in ahead)} entered {what}; "
            + ", ".join(f"{_rank_name(d)} is at #{known[id(d)]}" for d in behind)
            + f": {' and '.join(_rank_name(d) for d in behind)} never entered it."
        )
    return out
