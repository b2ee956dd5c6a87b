"""gpuprof where training code already lives (docs/integrations.md).

- :mod:`gpuprof.integrations.lightning`: ``GpuprofProfiler``, for
  ``Trainer(profiler=...)`` (``pytorch_lightning``: :mod:`.pytorch_lightning`).
- :mod:`gpuprof.integrations.transformers`: ``GpuprofCallback``, for Hugging Face's
  ``Trainer(callbacks=[...])``.
- :mod:`gpuprof.integrations.accelerate`: ``profile(accelerator, ...)``, for a loop
  written with ``accelerate``.

Each recorded step's metrics (step time, data wait, GPU busy, sync wait,
communication, kernels, peak device memory) go to the framework's logger and to the
integration's ``steps()`` (:data:`STEP_METRICS_DTYPE`). Importing this package
imports no framework; each module above imports its own when it is imported, and
says which version it needs when it cannot.
"""

from __future__ import annotations

from ._session import METRIC_NAMES, STEP_METRICS_DTYPE, logged_metrics, step_metrics

__all__ = ["METRIC_NAMES", "STEP_METRICS_DTYPE", "logged_metrics", "step_metrics"]
