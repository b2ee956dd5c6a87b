"""gpuprof as a profiler of the ``pytorch_lightning`` package (Lightning's older
name): ``pytorch_lightning.Trainer(profiler=GpuprofProfiler(...))``.

The same profiler as :mod:`gpuprof.integrations.lightning`, built on
``pytorch_lightning``'s own base classes, for programs that import that package
while ``lightning`` is installed too. See docs/integrations.md.
"""

from __future__ import annotations

from ._lightning_base import build
from ._session import require

__all__ = ["GpuprofProfiler"]

_WHAT = "gpuprof.integrations.pytorch_lightning"
_profilers = require(
    "pytorch_lightning.profilers",
    what=_WHAT,
    pip="pytorch-lightning",
    minimum=(2, 0),
    tested="pytorch-lightning 2.6",
)
_callbacks = require(
    "pytorch_lightning.callbacks",
    what=_WHAT,
    pip="pytorch-lightning",
    minimum=(2, 0),
    tested="pytorch-lightning 2.6",
)

GpuprofProfiler, _EndOfTraining = build(_profilers, _callbacks, "pytorch_lightning")
