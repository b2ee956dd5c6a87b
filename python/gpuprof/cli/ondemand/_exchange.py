"""``gpuprof capture``'s exchanges: a request to some armed processes (or to a trigger
folder), the folder for their answers, and the waits for those answers."""

from __future__ import annotations

import contextlib
import os
import shutil
import time

from ...core import _ondemand_proto as proto
from ._targets import CaptureError, Target

POLL_S = 0.02  # how often the requester looks for answers
PREPARE_S = 60.0  # how long a process that has received a capture request may take to decide


# -- one exchange: a request, its replies, its results -------------------------------------------
class _Exchange:
    """A request to some targets (or to a trigger folder) and the folder for their answers."""

    def __init__(self, base: str, shared: bool):
        self.rid = proto.new_request_id()
        self.shared = shared
        self.base = base
        self.folder = os.path.join(base, f"rep.{self.rid}")
        os.mkdir(self.folder, 0o755 if shared else 0o700)
        self.sent: list[str] = []  # request files written

    def send_local(self, target: Target, doc: dict) -> None:
        path = proto.request_path(target.runtime, self.rid, target.pid)
        proto.write_json(path, {**doc, "id": self.rid})
        self.sent.append(path)
        signum = target.signal()
        if signum is not None:
            try:
                os.kill(target.pid, signum)
            except ProcessLookupError:
                pass  # gone meanwhile: no answer comes, the wait says so
            except PermissionError as e:
                raise CaptureError(f"cannot signal {target.name}: {e}") from None

    def send_shared(self, doc: dict) -> None:
        path = proto.request_path(self.base, self.rid)
        proto.write_json(path, {**doc, "id": self.rid}, 0o644)
        self.sent.append(path)

    def withdraw(self) -> list[str]:
        """Remove the request files still there; return those another process took."""
        taken = []
        for path in self.sent:
            try:
                os.unlink(path)
            except FileNotFoundError:
                taken.append(path)
            except OSError:
                pass
        self.sent = []
        return taken

    def answers(self, done: bool = False) -> dict[str, dict]:
        out = {}
        suffix = ".done.json" if done else ".reply.json"
        with contextlib.suppress(OSError):
            for name in os.listdir(self.folder):
                if name.endswith(suffix):
                    doc = proto.read_json(os.path.join(self.folder, name))
                    if doc is not None:
                        out[name[: -len(suffix)]] = doc
        return out

    def close(self) -> None:
        self.withdraw()
        shutil.rmtree(self.folder, ignore_errors=True)


def _wait_local(ex: _Exchange, targets: list[Target], timeout: float) -> dict[int, dict]:
    """The answers of ``targets``, by pid; CaptureError(1) naming those that gave none.

    A process answers "received" at once and decides after (a capture's first profile
    loads CUPTI, seconds on a busy machine): one that has received the request gets
    PREPARE_S more to decide. At the deadline the requests nobody has read are
    withdrawn, so that those processes never see them.
    """
    limit = timeout + max((t.poll_s for t in targets if t.signal() is None), default=0.0)
    deadline = time.monotonic() + limit
    want = {t.reply_file[: -len(".reply.json")]: t for t in targets}
    taken: list[str] = []
    withdrawn = False
    while True:
        got = ex.answers()
        final = {k: d for k, d in got.items() if k in want and d.get("state") != "received"}
        if len(final) == len(want):
            return {want[k].pid: final[k] for k in want}
        now = time.monotonic()
        if now > deadline:
            if withdrawn:
                break
            withdrawn = True
            taken = ex.withdraw()  # read meanwhile: those answer "received" right after
            waiting = any(k in got for k in want if k not in final)
            deadline = now + (PREPARE_S if waiting else 2.0 if taken else 0.0)
            continue
        time.sleep(POLL_S)
    got = ex.answers()
    silent = [t for k, t in want.items() if k not in final]
    gone = [t for t in silent if not t.alive()]
    if gone:
        raise CaptureError(f"{', '.join(t.name for t in gone)} exited before answering", code=1)
    names = ", ".join(t.name for t in silent)
    if any(k in got or want[k].pid in {_pid_of(p) for p in taken} for k in want if k not in final):
        raise CaptureError(
            f"{names} received the request but did not decide within "
            f"{limit + PREPARE_S:g} s; it may still start the capture, which "
            f"`python -m gpuprof capture PID --cancel` cancels until it starts",
            code=1,
        )
    raise CaptureError(
        f"no answer from {names} within {limit:g} s; the request was withdrawn and "
        "nothing will be captured. The program may be stuck in native code with "
        "its main thread (which runs signal handlers) busy; try again with a "
        "larger --timeout",
        code=1,
    )


def _pid_of(request_path: str) -> int | None:
    head = os.path.basename(request_path).split(".")[0]
    return int(head) if head.isdigit() else None


def _wait_shared(ex: _Exchange, timeout: float, expect: set[str] | None) -> dict[str, dict]:
    """Decisions from the trigger folder: those of ``expect``, or, when None, of every
    watcher that answers (all ranks of the job once the world size is known, else those
    that answer within two poll intervals of the first). A watcher that has answered
    "received" gets PREPARE_S more to decide."""
    deadline = time.monotonic() + timeout
    first_at = None
    extended = False
    while True:
        answers = ex.answers()
        got = {k: d for k, d in answers.items() if d.get("state") != "received"}
        pending = set(answers) - set(got)
        now = time.monotonic()
        if expect is not None:
            if expect <= set(got):
                break
        elif got and not pending:
            if first_at is None:
                first_at = now
            worlds = {d.get("world_size") for d in got.values()}
            world = worlds.pop() if len(worlds) == 1 else None
            if world is not None and len(got) >= world:
                break
            poll = max(float(d.get("poll_interval_s") or 1.0) for d in got.values())
            if world is None and now > first_at + 2 * poll + 1.0:
                break
        if now > deadline:
            if pending and not extended:
                extended = True
                deadline = now + PREPARE_S
            else:
                break
        time.sleep(POLL_S)
    ex.withdraw()
    return {k: d for k, d in ex.answers().items() if d.get("state") != "received"}
