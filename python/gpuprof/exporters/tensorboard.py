"""``on_trace_ready`` handler that writes traces for the TensorBoard profiler
plugin and Holistic Trace Analysis, named like torch.profiler's handler."""

from __future__ import annotations

import os
import socket
import time

from ..core._ranks import expand_name
from .chrome import check_min_duration

__all__ = ["tensorboard_trace_handler"]


def tensorboard_trace_handler(
    dir_name,
    worker_name: str | None = None,
    use_gzip: bool = False,
    use_python_export: bool = False,
    *,
    min_duration_us: float = 0.0,
):
    """Return a callable(prof) that writes one trace per recorded window.

    Files are named ``<worker>.<ns timestamp>.pt.trace.json`` (``.gz`` with
    ``use_gzip``) inside ``dir_name``, which is created when missing; point
    ``tensorboard --logdir`` or HTA's ``TraceAnalysis(trace_dir=...)`` at it.

    Args:
        dir_name: the output folder (str or os.PathLike).
        worker_name: unique per process/rank; default ``<hostname>_<pid>``
            (the plugin splits it on the last ``_`` into node and pid).
            ``dir_name`` and ``worker_name`` may hold ``{rank}``, ``{local_rank}``
            and ``{world_size}`` (see gpuprof.distributed.expand_name).
        use_gzip: compress the traces.
        use_python_export: accepted for torch.profiler code, where it picks one of
            torch's two trace writers; gpuprof has one, so it changes nothing.
        min_duration_us: leave out calls shorter than this that launched no CUDA
            work (see ``export_chrome_trace``); 0 keeps every call.

    Example:
        ``gpuprof.profile(schedule=..., on_trace_ready=gpuprof.tensorboard_trace_handler("./log"))``
    """
    if not isinstance(dir_name, (str, os.PathLike)):
        raise TypeError(
            f"tensorboard_trace_handler(): dir_name must be a str or os.PathLike, got {dir_name!r}"
        )
    if worker_name is not None and (
        not isinstance(worker_name, str) or not worker_name or os.sep in worker_name
    ):
        raise ValueError(
            f"tensorboard_trace_handler(): worker_name must be a non-empty file "
            f"name or None, got {worker_name!r}"
        )
    if not isinstance(use_gzip, bool):
        raise TypeError(f"tensorboard_trace_handler(): use_gzip must be a bool, got {use_gzip!r}")
    if not isinstance(use_python_export, bool):
        raise TypeError(
            f"tensorboard_trace_handler(): use_python_export must be a bool, "
            f"got {use_python_export!r}"
        )
    min_duration_us = check_min_duration(min_duration_us, "tensorboard_trace_handler")
    dir_name = os.fspath(dir_name)

    def handler_fn(prof) -> str:
        # -- distributed: {rank}, {local_rank}, {world_size}, expanded per call --
        out_dir = expand_name(dir_name)
        worker = expand_name(worker_name) if worker_name else None
        # -- end distributed --
        os.makedirs(out_dir, exist_ok=True)
        # the default is taken per call: the pid changes in forked workers
        worker = worker or f"{socket.gethostname()}_{os.getpid()}"
        suffix = ".pt.trace.json.gz" if use_gzip else ".pt.trace.json"
        ts = time.time_ns()
        path = os.path.join(out_dir, f"{worker}.{ts}{suffix}")
        while os.path.exists(path):  # two windows within one clock tick
            ts += 1
            path = os.path.join(out_dir, f"{worker}.{ts}{suffix}")
        if min_duration_us:
            return prof.export_chrome_trace(path, min_duration_us=min_duration_us)
        return prof.export_chrome_trace(path)

    return handler_fn
