"""gpuprof as a Lightning profiler: ``Trainer(profiler=GpuprofProfiler(...))``.

Imports Lightning (the ``lightning`` package, or else its older name
``pytorch_lightning``) when this module is imported; ``import gpuprof`` never does.
See docs/integrations.md.
"""

from __future__ import annotations

from ._lightning_base import build
from ._session import require

__all__ = ["GpuprofProfiler"]

_WHAT = "gpuprof.integrations.lightning"


def _import_from(package: str, pip: str):
    """(profilers, callbacks) modules of ``package``."""
    return tuple(
        require(
            f"{package}.{sub}",
            what=_WHAT,
            pip=pip,
            minimum=(2, 0),
            tested=f"{pip} 2.6",
        )
        for sub in ("profilers", "callbacks")
    )


def _import():
    """(profilers, callbacks) modules of ``lightning``, else of ``pytorch_lightning``."""
    try:
        return _import_from("lightning.pytorch", "lightning")
    except ImportError as lightning_error:
        try:
            return _import_from("pytorch_lightning", "pytorch-lightning")
        except ImportError:
            raise ImportError(
                f"{lightning_error}; or, for the older package name, "
                "pip install 'pytorch-lightning>=2.0'"
            ) from lightning_error


_profilers, _callbacks = _import()
GpuprofProfiler, _EndOfTraining = build(_profilers, _callbacks, "lightning")
