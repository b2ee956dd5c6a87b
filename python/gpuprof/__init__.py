"""gpuprof: an in-process profiler for Python programs that drive GPUs.

    import gpuprof
    with gpuprof.profile(schedule=gpuprof.schedule(wait=1, warmup=1, active=3)) as prof:
        for batch in loader:
            train_step(batch)
            prof.step()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=10))

Importing gpuprof never touches CUDA; ``gpuprof.cuda_status()`` says whether
GPU capture is usable here and why not.
"""

from __future__ import annotations

import os as _os
import runpy as _runpy
from typing import Any

# first: gpuprof becomes the NVTX injection before anything else loads NVTX (docs/nvtx.md)
from .record import _nvtx  # isort: skip

# The public module paths users import (gpuprof.tables, gpuprof.schedule, ...) are
# facades of the layer folders below; these two are loaded before their functions of
# the same name are bound here, so that importing them later keeps the functions.
from . import compare as _compare_module  # noqa: F401  # isort: skip
from . import schedule as _schedule_module  # noqa: F401  # isort: skip
from . import _gpuprof
from ._version import __version__
from .analysis.distributed import merge
from .api._loaded import load
from .api.compare import compare
from .api.ondemand import arm, disarm  # on-demand capture (docs/on-demand.md)
from .api.ondemand import arm_from_environment as _arm_from_environment
from .api.profiler import ProfilerActivity, profile, record_function
from .core import _paths
from .exporters import tensorboard_trace_handler
from .record._cuda import cuda_status as _cuda_status
from .record.schedule import ProfilerAction, Schedule, schedule
from .results._results import Results
from .results.tables import KeyAverages


def cuda_status() -> dict[str, Any]:
    """Whether GPU capture can work here, and if not, why (see ``gpuprof.record._cuda.cuda_status``
    for the keys), plus ``nvtx``: where NVTX ranges go and which libraries' ranges gpuprof
    cannot see (``gpuprof.record._nvtx.status``, docs/nvtx.md), and ``autograd_nodes``:
    ``usable`` (backward kernels can be charged to autograd nodes: a CUDA build of
    PyTorch, imported, whose NVTX reaches gpuprof) and ``reason`` (why not; "" when
    usable; docs/backward.md)."""
    from .record import _autograd

    status = _cuda_status()
    status["nvtx"] = _nvtx.status()
    reason = _autograd.torch_reason()
    status["autograd_nodes"] = {"usable": not reason, "reason": reason}
    return status


__all__ = [
    "KeyAverages",
    "ProfilerAction",
    "ProfilerActivity",
    "Results",
    "Schedule",
    "arm",
    "compare",
    "cuda_status",
    "disarm",
    "load",
    "merge",
    "profile",
    "record_function",
    "schedule",
    "tensorboard_trace_handler",
    "__version__",
]


# Frames of gpuprof's own Python code are not shown: their time goes to the caller.
# Nor are runpy's, which starts `python -m ...` programs (gpuprof's command line
# among them) below the program's own frames. The bundled workloads
# (gpuprof/workloads/) are user code and are shown.
_here = _os.path.dirname(_os.path.abspath(__file__)) + _os.sep
_gpuprof._set_hidden_prefix(
    (_here, _runpy.run_path.__code__.co_filename), _here + "workloads" + _os.sep
)
# Where library code lives besides installed packages (the standard library, gpuprof):
# the user's line of a finding is outside it, and the hook records the line where the
# user's code calls into it (gpuprof.core._paths.is_library).
_gpuprof._set_library_roots(_paths.library_roots())

# GPUPROF_ON_DEMAND=1: arm this process for `python -m gpuprof capture PID` (docs/on-demand.md).
_arm_from_environment()


# The public module paths that are not imported above (gpuprof.diagnose, gpuprof.tables,
# ...) load on first use, so that `import gpuprof; gpuprof.diagnose.diagnose(res)` works
# without paying for every module at import.
_FACADES = frozenset(
    "boot deepdive demo diagnose distributed events memory occupancy processes profiler"
    " tables views".split()
)


def __getattr__(name: str) -> Any:
    if name in _FACADES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
