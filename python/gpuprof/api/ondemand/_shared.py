"""What the armed process's modules share: one line on the program's stderr, and the
interpreter's switch interval lowered while gpuprof's threads work."""

from __future__ import annotations

import contextlib
import sys
import threading


class _ShareTheGil:
    """Lower the interpreter's switch interval while gpuprof's threads work.

    A CPU-bound stepping thread keeps the GIL for a whole switch interval (5 ms
    by default) each time one of gpuprof's threads gives it up for a system
    call, and handling a request or writing a capture makes hundreds of them:
    on small virtual machines that took minutes. While a request is handled or
    files are written, the interval is 0.1 ms, then the program's own value
    comes back (unless the program changed it meanwhile). The interval only
    counts while some thread waits for the GIL, so the program's threads pay
    nothing for it otherwise.
    """

    FAST_S = 1e-4

    def __init__(self):
        self._lock = threading.Lock()
        self._users = 0
        self._saved: float | None = None

    @contextlib.contextmanager
    def __call__(self):
        with self._lock:
            if self._users == 0:
                now = sys.getswitchinterval()
                self._saved = now if now > self.FAST_S else None
                if self._saved is not None:
                    sys.setswitchinterval(self.FAST_S)
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if (
                    self._users == 0
                    and self._saved is not None
                    and abs(sys.getswitchinterval() - self.FAST_S) < 1e-7
                ):
                    sys.setswitchinterval(self._saved)


_share_the_gil = _ShareTheGil()


def _say(line: str) -> None:
    """One line on the program's stderr (never raises into the program)."""
    with contextlib.suppress(Exception):
        stream = sys.__stderr__ or sys.stderr
        stream.write(f"gpuprof: {line}\n")
        stream.flush()
