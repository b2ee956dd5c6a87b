"""A sampled step summed up for ``gpuprof top``: what a capture asked for with
``"summary": true`` answers instead of writing files.

The answer goes back whole in the requester's ``done`` file, so it is kept small
(a few KB of JSON): the step's time and where it went (``diagnose.step_breakdown``),
the ops that took the most self CPU and self CUDA time, the kernels that took the
most GPU time, the memory peaks, the diagnosis's first findings, and what the
sample cost the program.
"""

from __future__ import annotations

import os
import time

from ...analysis import diagnose as diagnose_
from ...results._findings import Diagnosis

__all__ = ["FINDINGS", "ROWS", "summarize"]

FINDINGS = 3  # the diagnosis's most severe findings kept
ROWS = 15  # ops (and kernels) kept per ranking: what a terminal shows, with room
_NAME_CHARS = 160  # kernel names run to hundreds of characters: cut


def _name(text: str) -> str:
    text = str(text)
    return text if len(text) <= _NAME_CHARS else text[: _NAME_CHARS - 3] + "..."


def _top_ops(ops, column: str) -> list[dict]:
    """The ROWS ops with the most ``column`` (> 0), largest first; steps and waits
    (``ops()["idle"]``: sleeps, lock acquires, queue gets) left out, as the tables
    leave waits out: waiting is not CPU time."""
    keep = (ops["kind"] != "step") & ~ops["idle"] & (ops[column] > 0)
    rows = [int(i) for i in keep.nonzero()[0]]
    rows.sort(key=lambda i: -int(ops[column][i]))
    out = []
    for i in rows[:ROWS]:
        r = ops[i]
        where = (
            f"{os.path.basename(str(r['file']))}:{int(r['line'])}" if r["kind"] == "python" else ""
        )
        out.append(
            {
                "name": _name(r["name"]),
                "where": where,
                "kind": str(r["kind"]),
                "calls": int(r["calls"]),
                "cpu_self_ns": int(r["cpu_self_ns"]),
                "cpu_total_ns": int(r["cpu_total_ns"]),
                "cuda_self_ns": int(r["cuda_self_ns"]),
                "kernels": int(r["kernels"]),
            }
        )
    return out


def _top_kernels(kernels) -> list[dict]:
    order = sorted(range(len(kernels)), key=lambda i: -int(kernels["total_ns"][i]))
    return [
        {
            "name": _name(kernels["name"][i]),
            "device": int(kernels["device"][i]),
            "calls": int(kernels["calls"][i]),
            "total_ns": int(kernels["total_ns"][i]),
            "category": str(kernels["category"][i]),
        }
        for i in order[:ROWS]
        if int(kernels["total_ns"][i]) > 0
    ]


def _findings(results) -> list:
    """The diagnosis's most severe findings, without the CPU hot paths: those are the
    self CPU ranking that the summary holds already, and on a step without GPU
    activity they cost three quarters of the diagnosis."""
    v = diagnose_._View(results)
    if not len(v.steps):
        return []
    found = []
    for check in diagnose_.CHECKS:
        if check is not diagnose_._cpu_hot_path:
            found += check(v)
    return Diagnosis(found, {})[:FINDINGS]


def _memory(prof) -> dict:
    """Peaks over the sampled step: the host's RSS and each device's allocated bytes."""
    ms = prof.memory_summary()
    host = ms.host or {}
    return {
        "host_peak_bytes": host.get("peak_bytes"),
        "devices": {
            name: {"peak_bytes": int(d.peak_bytes), "source": d.peak_source}
            for name, d in ms.devices.items()
        },
    }


def summarize(cap) -> dict:
    """The summary of capture ``cap`` (of ``summary`` kind, its profile stopped).

    Returns:
        ``ok``, ``summary`` (True), ``first_step`` (the program's step number of the
        step sampled), ``n_steps``, ``step_ns`` (its wall time under the profile
        hook), ``parts`` (``step_breakdown``'s columns summed over the steps, ns),
        ``cuda`` (whether GPU activity was recorded), ``cpu_ops`` and ``cuda_ops``
        (the ops with the most self CPU and self CUDA time: name, where, kind,
        calls, cpu_self_ns, cpu_total_ns, cuda_self_ns, kernels), ``kernels``,
        ``memory`` (None unless asked for), ``findings`` (the diagnosis's most
        severe: kind, severity, share_of, title, location), ``dropped_events``,
        ``cut_short``, and ``cost``: seconds
        the sample took from the program (``prepare_s`` and ``summary_s`` of CPU on
        gpuprof's threads, ``start_s`` and ``stop_s`` on the stepping thread); ``ok``
        False with ``error`` when nothing was recorded.

    Raises:
        Exception: whatever reading the results raises; the caller answers with it.
    """
    t0 = time.thread_time()
    prof = cap.prof
    try:
        results = prof.results
    except RuntimeError as e:
        return {"ok": False, "summary": True, "error": f"nothing was recorded ({e})"}
    parts = diagnose_.step_breakdown(results)
    cols = ("step_ns", "gpu_busy_ns", "comm_ns", "data_wait_ns", "sync_wait_ns", "idle_ns")
    ops = results.ops()
    cuda = bool(results.cuda.get("active"))
    doc = {
        "ok": True,
        "summary": True,
        "first_step": cap.first_step,
        "n_steps": len(parts),
        "step_ns": int(parts["step_ns"].sum()) if len(parts) else None,
        "parts": {c: int(parts[c].sum()) for c in cols} if len(parts) else None,
        "cuda": cuda,
        "cpu_ops": _top_ops(ops, "cpu_self_ns"),
        "cuda_ops": _top_ops(ops, "cuda_self_ns") if cuda else [],
        "kernels": _top_kernels(results.kernels()) if cuda else [],
        "memory": _memory(prof) if cap.memory else None,
        "findings": [
            {
                "kind": f.kind,
                "severity": float(f.severity),
                "share_of": f.share_of,
                "title": f.title,
                "location": f.location,
            }
            for f in _findings(results)
        ],
        "dropped_events": int(results.dropped_events),
        "cut_short": cap.cut_short,
    }
    doc["cost"] = {
        "prepare_s": cap.prepare_s,
        "start_s": cap.start_s,
        "stop_s": cap.stop_s,
        "summary_s": time.thread_time() - t0,
    }
    return doc
