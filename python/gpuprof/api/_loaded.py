"""A profile read back from a ``.gpuprof`` file: :func:`load` and
:class:`LoadedProfile`, which answers the calls of the live ``gpuprof.profile``
through the same accessors (gpuprof.api._accessors). The file format is
gpuprof.exporters.saved's."""

from __future__ import annotations

import os

import numpy as np

from ..analysis import processes
from ..exporters.saved import read
from ..results._results import Results
from ._accessors import ResultAccessors

__all__ = ["LoadedProfile", "load"]


def load(path: str | os.PathLike[str]) -> LoadedProfile:
    """Open a file written by ``prof.save(path)``.

    Returns:
        A read-only :class:`LoadedProfile` with the accessors of a profile
        (``ops()``, ``kernels()``, ``key_averages()``, ``export_chrome_trace()``, ...).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a gpuprof file, or from a newer gpuprof.
    """
    path = os.fspath(path)
    return LoadedProfile(read(path), path)


class LoadedProfile(ResultAccessors):
    """A profile read back from a ``.gpuprof`` file (read-only).

    It answers like the ``gpuprof.profile`` that recorded it: ``ops()``,
    ``kernels()``, ``gpu_events()``, ``steps()``, ``call_tree()``,
    ``key_averages()``, ``diagnose()``, ``export_chrome_trace()``,
    ``export_stacks()``; ``results`` is the underlying :class:`gpuprof.Results`.
    """

    def __init__(self, results: Results, path: str | None = None) -> None:
        self._results = results
        self.path = path

    def __repr__(self) -> str:
        return f"<gpuprof.LoadedProfile {self.path!r}: {len(self._results.windows)} window(s)>"

    @property
    def results(self) -> Results:
        return self._results

    @property
    def profile_memory(self) -> bool:
        return bool(self._results.meta.profile_memory)

    @property
    def with_stack(self) -> bool:
        return bool(self._results.meta.with_stack)

    @property
    def subprocesses(self) -> bool:
        """Whether the recording profiled child processes (``subprocesses=True``)."""
        return self._results.subprocesses is not None

    def processes(self) -> np.ndarray:
        """One row per recorded process, the main process first, as
        ``profile.processes()`` returned it when it was saved."""
        out = processes.processes_array(self._results)
        meta = self._results.meta
        # the main process's row as it was recorded, not the reader's own
        out[0]["ppid"] = -1 if meta.ppid is None else int(meta.ppid)
        out[0]["name"] = str(meta.process_name or out[0]["name"])
        return out
