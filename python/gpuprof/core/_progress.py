"""Progress lines on a terminal for long operations (closing a large window,
writing a large trace or saved profile).

Shown on stderr only when it is a terminal and the work is large; set
GPUPROF_PROGRESS=1 to always show them, =0 to never show them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

__all__ = ["done", "progress"]

# Below this many events/spans the operation takes well under a second.
LARGE = 1_000_000


def _enabled(size: int) -> bool:
    env = os.environ.get("GPUPROF_PROGRESS", "")
    if env in ("0", "1"):
        return env == "1"
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):
        tty = False
    return tty and size >= LARGE


@contextlib.contextmanager
def progress(what: str, size: int):
    """``with progress("writing trace.json", n_spans): ...`` prints a start and an end line."""
    if not _enabled(size):
        yield
        return
    t0 = time.perf_counter()
    print(f"gpuprof: {what} ({size:,} events)...", file=sys.stderr, flush=True)
    ok = False
    try:
        yield
        ok = True
    finally:
        dt = time.perf_counter() - t0
        print(
            f"gpuprof: {what}: {'done' if ok else 'failed'} in {dt:.2f} s",
            file=sys.stderr,
            flush=True,
        )


def done(what: str, size: int, seconds: float) -> None:
    """One line after an operation that could not announce itself (closing a window:
    anything run before it would be recorded in that window)."""
    if _enabled(size):
        print(f"gpuprof: {what} ({size:,} events) in {seconds:.2f} s", file=sys.stderr, flush=True)
