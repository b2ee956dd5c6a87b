"""Collapsed ("folded") stacks for flame graphs, as torch.profiler's
``export_stacks`` writes them: one ``root;...;leaf value`` line per call
path, the value an integer number of microseconds of self time."""

from __future__ import annotations

from .chrome import atomic_output, check_output_path, trace_names

__all__ = ["export_stacks", "METRICS"]

# metric -> call-tree field (torch's names; "device" is torch's newer spelling of "cuda")
METRICS = {
    "self_cpu_time_total": "self_ns",
    "self_cuda_time_total": "cuda_self_ns",
    "self_device_time_total": "cuda_self_ns",
}

# flamegraph.pl and speedscope split a line on ';' and on its last space.
_FRAME_TABLE = {c: "_" for c in range(0x20)} | {ord(" "): "_", ord(";"): "_", 0x7F: "_"}


def _frame(name: str) -> str:
    return name.translate(_FRAME_TABLE)


def collapsed_stacks(results, metric: str = "self_cpu_time_total") -> dict[str, int]:
    """``{stack: nanoseconds}`` summed over threads and recorded windows."""
    if metric not in METRICS:
        raise ValueError(
            f"export_stacks(): metric must be one of {', '.join(map(repr, METRICS))}"
            f", got metric={metric!r}"
        )
    field = METRICS[metric]
    totals: dict[str, int] = {}
    for raw in results.windows:
        nodes = raw["nodes"]
        frames = [_frame(n) for n in trace_names(raw)]
        parent = nodes["parent"].tolist()
        op_row = nodes["op_row"].tolist()
        values = nodes[field].tolist()
        paths: list[str] = []
        for i in range(len(nodes)):  # a parent always precedes its children
            p = parent[i]
            frame = frames[op_row[i]]
            paths.append(frame if p < 0 else f"{paths[p]};{frame}")
            if values[i] > 0:
                totals[paths[i]] = totals.get(paths[i], 0) + values[i]
    return totals


def export_stacks(results, path, metric: str = "self_cpu_time_total") -> str:
    """Write collapsed stacks of the recorded call tree.

    Each line is ``frame;frame;...;frame value``, root first, ``value`` the
    self time of that call path in whole microseconds (paths under 0.5 us are
    left out). Feed the file to ``flamegraph.pl``, speedscope or
    https://www.speedscope.app.

    Args:
        results: a :class:`gpuprof.Results` (``prof.results``).
        path: the output file.
        metric: ``"self_cpu_time_total"`` (host time) or ``"self_cuda_time_total"``
            (GPU time of the work each path launched; ``"self_device_time_total"``
            is accepted too).

    Raises:
        ValueError: unknown ``metric``.
        OSError: ``path`` cannot be written.
    """
    totals = collapsed_stacks(results, metric)
    path = check_output_path(path, "export_stacks")
    with atomic_output(path, "export_stacks") as tmp:
        with open(tmp, "w", encoding="utf-8", errors="replace", newline="\n") as f:
            for stack, ns in totals.items():
                us = (ns + 500) // 1000
                if us > 0:
                    f.write(f"{stack} {us}\n")
    return path
