"""gpuprof as a Lightning profiler: ``Trainer(profiler=GpuprofProfiler(...))``.

Imports Lightning (the ``lightning`` package, or else its older name
``pytorch_lightning``) when this module is imported; ``import gpuprof`` never does.
See docs/integrations.md.
"""

from __future__ import annotations

from ._lightning import build
from ._session import require

__all__ = ["GpuprofProfiler"]

_WHAT = "gpuprof.integrations.lightning"


def _import():
    """(profilers, callbacks) modules of ``lightning``, else of ``pytorch_lightning``."""
    try:
        return (
            require(
                "lightning.pytorch.profilers",
                what=_WHAT,
                pip="lightning",
                minimum=(2, 0),
                tested="lightning 2.6",
            ),
            require(
                "lightning.pytorch.callbacks",
                what=_WHAT,
                pip="lightning",
                minimum=(2, 0),
                tested="lightning 2.6",
            ),
        )
    except ImportError as lightning_error:
        try:
            return (
                require(
                    "pytorch_lightning.profilers",
                    what=_WHAT,
                    pip="pytorch-lightning",
                    minimum=(2, 0),
                    tested="pytorch-lightning 2.6",
                ),
                require(
                    "pytorch_lightning.callbacks",
                    what=_WHAT,
                    pip="pytorch-lightning",
                    minimum=(2, 0),
                    tested="pytorch-lightning 2.6",
                ),
            )
        except ImportError:
            raise ImportError(
                f"{lightning_error}; or, for the older package name, "
                "pip install 'pytorch-lightning>=2.0'"
            ) from lightning_error


_profilers, _callbacks = _import()
GpuprofProfiler, _EndOfTraining = build(_profilers, _callbacks, "lightning")
