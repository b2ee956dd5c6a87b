"""Each step's GPU time split into compute, communication (NCCL kernels), their
overlap and the communication left exposed: :func:`comm_overlap`."""

from __future__ import annotations

import numpy as np

from ...core._intervals import cover_split as _cover_split
from ...core._intervals import covered as _covered
from ...core._intervals import union as _union

STEP_FIELDS = (
    "step_ns",
    "compute_ns",
    "comm_ns",
    "overlap_ns",
    "exposed_comm_ns",
    "memcpy_ns",
    "busy_ns",
    "idle_ns",
)

OVERLAP_DTYPE = np.dtype(
    [("step", "i8"), ("start_ns", "i8"), ("end_ns", "i8")] + [(f, "i8") for f in STEP_FIELDS]
)


def _step_breakdown(steps, start, end, compute, comm, memory) -> np.ndarray:
    """One OVERLAP_DTYPE row per step from the GPU activity intervals
    (each a (starts, ends) pair of arrays, any order, may overlap)."""
    out = np.zeros(len(steps), dtype=OVERLAP_DTYPE)
    out["step"], out["start_ns"], out["end_ns"] = steps, start, end
    cu, cm, me = _union(*compute), _union(*comm), _union(*memory)
    busy = _union(np.concatenate([cu[0], cm[0], me[0]]), np.concatenate([cu[1], cm[1], me[1]]))
    out["step_ns"] = out["end_ns"] - out["start_ns"]
    out["compute_ns"], out["comm_ns"], out["overlap_ns"] = _cover_split(cu, cm, start, end)
    out["exposed_comm_ns"] = out["comm_ns"] - out["overlap_ns"]
    out["memcpy_ns"] = _covered(me, start, end)
    out["busy_ns"] = _covered(busy, start, end)
    out["idle_ns"] = out["step_ns"] - out["busy_ns"]
    return out


def comm_overlap(results) -> np.ndarray:
    """Per step: GPU compute, communication, and how much of it overlapped.

    Communication is the NCCL kernels (category "communication" in
    ``prof.kernels()``), compute every other kernel; time is the union of the
    kernels' intervals inside the step (several streams count once).

    Args:
        results: a :class:`gpuprof.profile` after recording, its ``.results``,
            or a loaded profile (``gpuprof.load``).

    Returns:
        A structured array, one row per recorded step: step, start_ns, end_ns,
        step_ns (wall time), compute_ns, comm_ns, overlap_ns (communication
        running while compute kernels run), exposed_comm_ns (comm_ns -
        overlap_ns: communication nothing hides), memcpy_ns (copies and sets),
        busy_ns (any GPU activity), idle_ns (step_ns - busy_ns). ``comm_ns``
        and ``busy_ns`` equal the fields of ``prof.steps()``.

    Raises:
        TypeError: ``results`` has no ``steps()`` and ``gpu_events()``.
    """
    res = getattr(results, "results", results)
    if not (callable(getattr(res, "steps", None)) and callable(getattr(res, "gpu_events", None))):
        raise TypeError(
            "comm_overlap(): pass a gpuprof.profile, prof.results or a loaded "
            f"profile, got {type(results).__name__}"
        )
    steps = res.steps()
    g = res.gpu_events()

    def pick(mask):
        return g["start_ns"][mask], g["end_ns"][mask]

    kernel = g["kind"] == "kernel"
    comm = g["category"] == "communication"
    return _step_breakdown(
        steps["step"],
        steps["start_ns"],
        steps["end_ns"],
        pick(kernel & ~comm),
        pick(kernel & comm),
        pick(np.isin(g["kind"], ("memcpy", "memset"))),
    )
