"""gpuprof's start-up hook: with ``GPUPROF_ON_DEMAND=1``, every Python program is armed.

Put this folder on ``PYTHONPATH`` (``python -m gpuprof.boot`` prints it). Python
imports ``sitecustomize`` at start-up: this one first runs the ``sitecustomize`` it
hides (the next one on ``sys.path``, such as a distribution's), then, when
``GPUPROF_ON_DEMAND=1``, imports gpuprof, which arms the process for
``python -m gpuprof capture PID`` (docs/on-demand.md). Without the variable it
only runs the hidden one.
"""

import os as _os
import sys as _sys


def _run_hidden() -> None:
    import importlib.machinery
    import importlib.util

    here = _os.path.dirname(_os.path.abspath(__file__))
    path = [p for p in _sys.path if _os.path.abspath(p or _os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    _sys.modules["sitecustomize"] = module  # `import sitecustomize` gives the hidden one
    spec.loader.exec_module(module)


def _arm() -> None:
    if _os.environ.get("GPUPROF_ON_DEMAND", "").strip() in ("", "0"):
        return
    try:
        import gpuprof  # noqa: F401 - arms at import (gpuprof.api.ondemand.arm_from_environment)
    except Exception as e:  # noqa: BLE001 - another interpreter without gpuprof: run unarmed
        _sys.stderr.write(
            f"gpuprof: GPUPROF_ON_DEMAND=1, but {_sys.executable} cannot import "
            f"gpuprof ({e}); this program is not armed\n"
        )


try:
    _run_hidden()
except Exception as _e:  # noqa: BLE001 - as site.py reports a failing sitecustomize
    _sys.stderr.write(f"Error in sitecustomize (run by gpuprof's start-up hook): {_e!r}\n")
_arm()
