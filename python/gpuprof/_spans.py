"""Questions about a window's spans (the raw ``spans`` array of a result window),
shared by the memory curves and the diagnosis."""

from __future__ import annotations

import numpy as np

from ._constants import OP_PYTHON


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
