"""Questions about a window's spans (the raw ``spans`` array of a result window),
shared by the memory curves and the diagnosis."""

from __future__ import annotations

import numpy as np

from ._constants import OP_PYTHON
from ._paths import is_library


def span_at(spans: np.ndarray, thread: int, ts: int) -> int:
    """Innermost span of `thread` open at `ts`, or -1."""
    if thread < 0 or not len(spans):
        return -1
    m = (spans["thread"] == thread) & (spans["start_ns"] <= ts) & (spans["end_ns"] >= ts)
    idx = np.flatnonzero(m)
    if not len(idx):
        return -1
    return int(idx[np.argmax(spans["depth"][idx])])


def python_caller(spans: np.ndarray, ops: np.ndarray, i: int) -> tuple[str, int, str]:
    """(file, line, name) of the Python code under span i: its innermost Python
    ancestor, at the call-site line of the C call in between when there is one;
    ("", 0, "") when there is none."""
    line = 0
    while i >= 0:
        row = int(spans["op_row"][i])
        if int(spans["kind"][i]) == OP_PYTHON:
            return str(ops["file"][row]), line or int(ops["line"][row]), str(ops["name"][row])
        if int(spans["line"][i]) > 0 and not line:
            line = int(spans["line"][i])
        i = int(spans["parent"][i])
    return "", 0, ""


def user_caller(spans: np.ndarray, ops: np.ndarray, i: int) -> tuple[str, int, str, str, int]:
    """The user's line under span i, by one rule for every report: (file, line, name)
    of the innermost Python code outside libraries (site-packages, the standard library,
    gpuprof), then (file, line) of the library code it was running when that is where
    :func:`python_caller` lands (else "", 0). A user function's line is the call-site
    line of a C call it made directly, else its definition line (Python-to-Python call
    sites are not recorded). With no user code on the path: the library code alone."""
    file, line, name = python_caller(spans, ops, i)
    if not file or not is_library(file):
        return file, line, name, "", 0
    j = i
    while j >= 0:  # up to the span of that library frame, then on to its ancestors
        if int(spans["kind"][j]) == OP_PYTHON:
            break
        j = int(spans["parent"][j])
    k = int(spans["parent"][j]) if j >= 0 else -1
    while k >= 0:
        ufile, uline, uname = python_caller(spans, ops, k)
        if not ufile:
            break
        if not is_library(ufile):
            return ufile, uline, uname, file, line
        while k >= 0 and int(spans["kind"][k]) != OP_PYTHON:
            k = int(spans["parent"][k])
        k = int(spans["parent"][k]) if k >= 0 else -1
    return file, line, name, "", 0
