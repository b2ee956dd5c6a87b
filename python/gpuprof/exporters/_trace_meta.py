"""What the C trace writer takes besides the window: :class:`TraceMeta`.

``_gpuprof._write_trace(dest, window, meta)`` (csrc/trace/trace_json.c) formats one
recorded window as Chrome-trace JSON; ``meta`` is a :class:`TraceMeta`, whose fields
the writer reads by name. Each field is named here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["TraceMeta", "Part"]

# A whole file, or one window's events in a file that several calls write on one
# writer (other processes' lanes): "open" writes the header, the opening of
# traceEvents and the events; "append" the events; "close" the events, the window
# markers and the end of the file.
Part = Literal["whole", "open", "append", "close"]


@dataclass
class TraceMeta:
    """One window's trace, beside its arrays.

    Attributes:
        trace_name: the value of the file's final ``traceName`` key.
        pid: the host process id of the window's lane.
        process_name: that lane's name.
        names: the display name per op row (str, or UTF-8 bytes).
        kernel_names: the name per row of the window's ``kernels``.
        thread_names: the name per row of the window's ``threads``.
        header: JSON members written before ``traceEvents``, without braces or a
            trailing comma ("" for none); copied verbatim.
        files: the display file per op row, for a C call's ``CallFrom`` (None: the
            window's recorded ``op_files``).
        sm_counts, warp_sizes: per device index, for the kernels' "blocks per SM"
            and "warps per SM" (None: left out).
        part: see :data:`Part`.
        base_ns: the profiler-clock ns of ``ts == 0`` (None: the window's start);
            earlier times become 0.
        sort_index: the host lane's ``process_sort_index`` (None: ``pid``).
        id_base: added to the Python ids, External ids and Ev Idx of the window's
            host events, so that several windows in one file keep them unique.
        fwdbwd: the forward-to-backward flow arrows (chrome.fwdbwd_flows), or None.
        module_names: per module instance, the name of its call slices, or None.
    """

    trace_name: str
    pid: int
    process_name: str
    names: list[str]
    kernel_names: list[str]
    thread_names: list[str]
    header: str = ""
    files: list[str] | None = None
    sm_counts: list[int] | None = None
    warp_sizes: list[int] | None = None
    part: Part = "whole"
    base_ns: int | None = None
    sort_index: int | None = None
    id_base: int = 0
    fwdbwd: np.ndarray | None = None
    module_names: list[str] | None = None
