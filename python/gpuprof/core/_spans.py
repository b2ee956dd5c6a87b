"""Questions about a window's spans (the raw ``spans`` array of a result window),
shared by the memory curves and the diagnosis."""

from __future__ import annotations

import numpy as np

from ._constants import OP_PYTHON
from ._paths import is_library


def innermost_marked(
    spans: np.ndarray, marked: np.ndarray, stop: np.ndarray | None = None
) -> np.ndarray:
    """Per span: the innermost span at or above it (itself, its parent, ...) that is
    ``marked``, -1 where none; with ``stop``, -1 also where the way up meets a
    ``stop`` span first. Pointer jumping: each pass doubles how far up a pending
    entry looks, so a few passes over the array whatever the depth."""
    up = np.where(marked, np.arange(len(spans)), spans["parent"].astype(np.int64))
    if stop is not None:
        up[stop & ~marked] = -1
    while True:
        pending = up >= 0
        pending[pending] = ~marked[up[pending]]
        if not pending.any():
            return up
        up[pending] = up[up[pending]]


def span_at(spans: np.ndarray, thread: int, ts: int) -> int:
    """Innermost span of `thread` open at `ts`, or -1."""
    if thread < 0 or not len(spans):
        return -1
    m = (spans["thread"] == thread) & (spans["start_ns"] <= ts) & (spans["end_ns"] >= ts)
    idx = np.flatnonzero(m)
    if not len(idx):
        return -1
    return int(idx[np.argmax(spans["depth"][idx])])


def _python_frames(spans: np.ndarray, ops: np.ndarray, i: int):
    """(file, line, name) of each Python frame on the path from span i outward,
    innermost first. Its line is the call site that led on along the path: of the
    frame below it when that call was recorded (every C call; a library function that
    user code called; the frames running when the window opened), else of the
    innermost C call below it; else its definition line, but 0 (unknown) for a
    module's top level, whose line 1 is not where it runs. Ancestors that had returned
    when span i started are not on its stack (a range can outlive the frame that opened
    it, as the step range of an optimizer-step hook): they are passed over."""
    line = 0
    started = int(spans["start_ns"][i]) if i >= 0 else 0
    while i >= 0:
        if int(spans["end_ns"][i]) < started:
            pass
        elif int(spans["kind"][i]) == OP_PYTHON:
            row = int(spans["op_row"][i])
            name = str(ops["name"][row])
            if not line and name != "<module>":
                line = int(ops["line"][row])
            yield str(ops["file"][row]), line, name
            line = int(spans["line"][i])  # where its caller called it, when recorded
        elif int(spans["line"][i]) > 0 and not line:
            line = int(spans["line"][i])
        i = int(spans["parent"][i])


def python_caller(spans: np.ndarray, ops: np.ndarray, i: int) -> tuple[str, int, str]:
    """(file, line, name) of the Python code under span i: its innermost Python
    ancestor, at the call-site line of the C call in between when there is one;
    ("", 0, "") when there is none."""
    return next(_python_frames(spans, ops, i), ("", 0, ""))


def user_caller(spans: np.ndarray, ops: np.ndarray, i: int) -> tuple[str, int, str, str, int]:
    """The user's line under span i, by one rule for every report: (file, line, name)
    of the innermost Python code outside libraries (site-packages, the standard library,
    gpuprof), then (file, line) of the library code it was running when that is where
    :func:`python_caller` lands (else "", 0). A user function's line is the line that
    called on into the library (or a C function), where recorded; else its definition
    line, or 0 at a module's top level. With no user code on the path: the library code
    alone."""
    frames = _python_frames(spans, ops, i)
    file, line, name = next(frames, ("", 0, ""))
    if is_library(file):
        for ufile, uline, uname in frames:
            if not ufile:
                break
            if not is_library(ufile):
                return ufile, uline, uname, file, line
    return file, line, name, "", 0
