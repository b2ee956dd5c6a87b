"""Exporters: one module per output format.

- :func:`export_chrome_trace` (``chrome``): Chrome/Perfetto trace JSON that
  TensorBoard's profiler plugin and Holistic Trace Analysis read.
- :func:`tensorboard_trace_handler` (``tensorboard``): an ``on_trace_ready``
  callable writing one such trace per recorded window into a folder.
- :func:`export_stacks` (``stacks``): collapsed stacks for flame graphs.
- :func:`save` / :func:`load` (``saved``): the recorded arrays in one
  ``.gpuprof`` file, reopened later without the program.
- :func:`export_html` / :func:`export_compare_html` (``html``): one
  self-contained HTML page of a profile or of a comparison (docs/report.md).

See docs/traces.md.
"""

from __future__ import annotations

from .chrome import export_chrome_trace
from .html import export_compare_html, export_html
from .saved import save
from .stacks import export_stacks
from .tensorboard import tensorboard_trace_handler

__all__ = [
    "LoadedProfile",
    "export_chrome_trace",
    "export_compare_html",
    "export_html",
    "export_stacks",
    "load",
    "save",
    "tensorboard_trace_handler",
]


def __getattr__(name: str):
    # load() and LoadedProfile answer as a profile does, so they live above the
    # exporters (gpuprof.api._loaded); they stay reachable here, where they always were.
    if name in ("LoadedProfile", "load"):
        from ..api import _loaded

        return getattr(_loaded, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
