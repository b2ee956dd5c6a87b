"""``gpuprof dump``'s side: ask armed processes for every thread's stack, read the
answers into :class:`Dump` objects, and compare the ranks of a job.

The exchange (csrc/dump/dump.c): connect to the process's Unix socket
``<runtime>/<pid>.dump``, send ``dump WAIT_MS``, read JSON lines until the process
closes the connection: the stacks (``walk``, made without the GIL), the thread
names it had cached (``names``), then what its on-demand thread added within
WAIT_MS (``python``: names, torch.distributed), or that it did not.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time

from ._targets import CaptureError, Target, find_target, job_targets

__all__ = ["Dump", "DumpThread", "dump", "dump_all", "find_dump_target", "compare_ranks"]

PYTHON_WAIT_S = 0.5  # how long the process's on-demand thread may take to add names

# Collectives as torch.distributed names its functions (distributed_c10d.py).
COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "monitored_barrier",
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "send",
        "recv",
        "isend",
        "irecv",
        "batch_isend_irecv",
        "_all_gather_base",
        "_reduce_scatter_base",
    }
)

# What a C call does on the device, for the calls a PyTorch job waits in. The
# tensor methods wait for the GPU only for a CUDA tensor: said when CUDA is on.
CUDA_CALLS = {
    "torch._C._cuda_synchronize": "cudaDeviceSynchronize: waits for all work on the device",
    "torch._C._CudaStreamBase.synchronize": "cudaStreamSynchronize: waits for the stream's work",
    "torch._C._CudaStreamBase.query": "cudaStreamQuery",
    "torch._C._CudaEventBase.synchronize": "cudaEventSynchronize: waits for the event",
    "torch._C._CudaEventBase.wait": "cudaStreamWaitEvent",
    "torch._C._cuda_emptyCache": "frees cached device memory",
    "torch._C._distributed_c10d.Work.wait": "waits for a collective to finish",
    "torch._C._distributed_c10d.Work.synchronize": "waits for a collective's stream",
}
TENSOR_SYNCS = {
    "torch._C.TensorBase.item": "copies one value to the host",
    "torch._C.TensorBase.tolist": "copies the tensor to the host",
    "torch._C.TensorBase.cpu": "copies the tensor to the host",
    "torch._C.TensorBase.numpy": "copies the tensor to the host",
    "torch._C.TensorBase.to": "may copy the tensor to the host",
    "torch._C.TensorBase.__bool__": "copies one value to the host",
    "torch._C.TensorBase.nonzero": "copies the result's size to the host",
}

STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in an uninterruptible wait",
    "T": "stopped",
    "t": "stopped by a debugger",
    "Z": "a zombie",
}


class DumpThread:
    """One Python thread of a dump, names merged in."""

    def __init__(self, raw: dict, name: str | None, main: bool, ours: bool):
        self.raw = raw
        self.ident = raw.get("ident")
        self.native_id = raw.get("native_id")
        self.name = name
        self.main = main
        self.ours = ours  # one of gpuprof's own threads
        self.frames: list[dict] = raw.get("frames") or []
        self.frames_cut = bool(raw.get("frames_cut"))
        self.call: dict | None = raw.get("call")
        self.holds_gil = bool(raw.get("holds_gil"))

    @property
    def label(self) -> str:
        return f'"{self.name}"' if self.name else "(name not known)"

    def os_state(self) -> str:
        state = STATES.get(self.raw.get("state") or "", "")
        sc = self.raw.get("syscall")
        if sc and sc != "running" and state:
            state += f" in {sc}"
        wchan = self.raw.get("wchan")
        if wchan and state and self.raw.get("state") != "R":
            state += f" ({wchan})"
        return state

    def call_text(self) -> str | None:
        """'in C call _thread.lock.acquire (a.acquire())', or None when the innermost
        frame is not in a call."""
        c = self.call
        if not c:
            return None
        expr, callee = c.get("expr"), c.get("callee")
        if c.get("kind") == "with":
            mgr = f" (with {expr[: -len('.__enter__')]}:)" if expr else ""
            return f"in C call {callee}{mgr}" if callee else f"in a C __enter__{mgr}"
        if callee and expr and callee != expr:
            return f"in C call {callee} ({expr}())"
        if callee or expr:
            return f"in C call {callee or expr}()"
        return "in a C call (what it calls is not known)"

    def collective(self) -> str | None:
        """The torch.distributed collective this thread is inside, by its frames."""
        for f in self.frames:
            path = (f.get("file") or "").replace("\\", "/")
            func = (f.get("func") or "").rsplit(".", 1)[-1]
            if path.endswith("torch/distributed/distributed_c10d.py") and func in COLLECTIVES:
                return func
        return None

    def user_frame(self) -> dict | None:
        """The innermost frame of the program's own code: not of the standard library
        or an installed package (by its path, as the target process wrote it)."""
        return next((f for f in self.frames if not _is_library(f.get("file") or "")), None)

    def signature(self) -> tuple:
        return tuple((f.get("file"), f.get("line"), f.get("func")) for f in self.frames)


class Dump:
    """What one armed process answered (or why it did not)."""

    def __init__(self, target: Target):
        self.target = target
        self.pid = target.pid
        self.rank = target.rank
        self.world_size = target.world_size
        self.walk: dict | None = None
        self.names: dict | None = None  # cached by the process
        self.python: dict | None = None  # its on-demand thread's answer
        self.python_missing_ms: int | None = None
        self.error: str | None = None  # no stacks at all: why
        self.seconds = 0.0  # from connecting to the end of the answer

    # -- reading -------------------------------------------------------------------------------
    @property
    def ok(self) -> bool:
        return self.walk is not None and "threads" in self.walk

    def _names(self) -> tuple[dict, str]:
        if self.python and isinstance(self.python.get("threads"), dict):
            return self.python["threads"], "now"
        if self.names and isinstance(self.names.get("threads"), dict):
            at = time.strftime("%H:%M:%S", time.localtime(self.names.get("at") or 0))
            return self.names["threads"], f"as of {at}"
        return {}, "not known"

    def threads(self) -> list[DumpThread]:
        """Every Python thread: the main thread first, then the program's in the
        order they started, then gpuprof's own. The outermost frames of gpuprof's
        launcher (``run``, ``runpy``) are left out."""
        names, _ = self._names()
        hide = self.target.state.get("dump_hide")
        out = []
        for raw in reversed((self.walk or {}).get("threads") or []):  # newest first in CPython
            raw = dict(raw, frames=_without_launcher(raw.get("frames") or [], hide))
            info = names.get(str(raw.get("ident"))) or {}
            name = info.get("name")
            main = bool(info.get("main")) if info else raw.get("native_id") == self.pid
            if name is None and main:
                name = "MainThread"
            ours = bool(name) and str(name).startswith("gpuprof-")
            out.append(DumpThread(raw, name, main, ours))
        return sorted(out, key=lambda t: (not t.main, t.ours))

    def main_thread(self) -> DumpThread | None:
        return next((t for t in self.threads() if t.main), None)

    def gil_holder(self) -> DumpThread | None:
        return next((t for t in self.threads() if t.holds_gil), None)

    def names_source(self) -> str:
        return self._names()[1]

    def distributed(self) -> dict | None:
        return (self.python or {}).get("distributed")


_LIBRARY = re.compile(r"/lib/(pypy|python)\d[.\d]*t?/|[/\\](site|dist)-packages[/\\]|^<frozen ")


def _is_library(path: str) -> bool:
    return bool(_LIBRARY.search(path.replace("\\", "/")))


def _without_launcher(frames: list[dict], hide: str | None) -> list[dict]:
    """``frames`` (innermost first) less the outermost run of gpuprof's and runpy's,
    which ``python -m gpuprof run`` puts under every program; all of them when the
    stack holds nothing else (gpuprof's own threads)."""

    def launcher(f: dict) -> bool:
        path = f.get("file") or ""
        return (
            bool(hide and path.startswith(hide))
            or path in ("<frozen runpy>",)
            or (path.endswith("/runpy.py"))
        )

    end = len(frames)
    while end > 0 and launcher(frames[end - 1]):
        end -= 1
    return frames[:end] if end else frames


def find_dump_target(pid: int) -> Target:
    """The armed process ``pid`` with a dump server, checked without sending it
    anything.

    Raises:
        CaptureError: as ``capture`` refuses the pid (not armed, another user's...),
            or armed without the dump server (the state file says why).
    """
    target = find_target(pid)
    if not target.state.get("dump"):
        why = target.state.get("dump_error") or (
            "it was armed by a gpuprof without `dump` (its state file names no socket)"
        )
        raise CaptureError(f"{target.name} is armed, but cannot be dumped: {why}")
    return target


def dump(target: Target, timeout: float, python_wait: float = PYTHON_WAIT_S) -> Dump:
    """Ask ``target`` for its stacks; never raises for what the process does."""
    d = Dump(target)
    t0 = time.monotonic()
    deadline = t0 + timeout
    path = target.state["dump"]
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as e:
        d.error = f"cannot make a socket: {e}"
        return d
    with s:
        try:
            s.settimeout(max(0.05, deadline - time.monotonic()))
            s.connect(path)
            s.sendall(f"dump {int(python_wait * 1000)}\n".encode())
            buf = b""
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                s.settimeout(left)
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    _take(d, line)
        except FileNotFoundError:
            d.error = f"its dump socket {path} is gone (the process disarmed or exited meanwhile)"
        except ConnectionRefusedError:
            d.error = (
                f"nothing listens on its dump socket {path}: the dump thread has ended "
                "(a forked copy of the armed process, or it is exiting)"
            )
        except TimeoutError:
            if d.walk is None:
                d.error = f"no answer within {timeout:g} s"
        except OSError as e:
            if d.walk is None:
                d.error = f"the dump socket {path} failed: {e}"
    d.seconds = time.monotonic() - t0
    if d.walk is None and d.error is None:
        d.error = "the process closed the connection without answering"
    return d


def _take(d: Dump, line: bytes) -> None:
    try:
        doc = json.loads(line)
    except ValueError:
        return
    if not isinstance(doc, dict):
        return
    kind = doc.get("kind")
    if kind == "walk":
        d.walk = doc
        if doc.get("unsupported"):
            d.error = doc["unsupported"]
    elif kind == "names":
        d.names = doc
    elif kind == "python":
        if doc.get("missing"):
            d.python_missing_ms = int(doc.get("waited_ms") or 0)
        else:
            d.python = doc
    elif kind == "error":
        d.error = str(doc.get("message"))


def dump_all(targets: list[Target], timeout: float) -> list[Dump]:
    """Dump every target at once (one thread each), in the order given."""
    out: list[Dump | None] = [None] * len(targets)

    def one(i: int, t: Target) -> None:
        out[i] = dump(t, timeout)

    threads = [threading.Thread(target=one, args=(i, t)) for i, t in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [d for d in out if d is not None]


def rank_targets(target: Target) -> list[Target]:
    """The ranks of ``target``'s job on this host that can be dumped, by rank."""
    out = []
    for t in job_targets(target):
        try:
            out.append(find_dump_target(t.pid))
        except CaptureError:
            continue
    return sorted(out, key=lambda t: (t.rank if t.rank is not None else 1 << 30, t.pid))


def compare_ranks(dumps: list[Dump]) -> tuple[list[Dump], list[Dump]]:
    """``(usual, different)``: the ranks whose main thread is where most ranks' are,
    and the others. Between groups of one size, the group inside a collective is
    the usual one (in a hang, the ranks that wait in it are the many, the one
    elsewhere is the cause), then the group of the lowest rank."""
    groups: dict[tuple, list[Dump]] = {}
    for d in dumps:
        main = d.main_thread() if d.ok else None
        groups.setdefault(main.signature() if main else ("no stack",), []).append(d)

    def key(item):
        sig, members = item
        in_collective = any(
            (m.main_thread() is not None and m.main_thread().collective()) for m in members
        )
        lowest = min((m.rank if m.rank is not None else 1 << 30) for m in members)
        return (-len(members), not in_collective, lowest)

    ordered = sorted(groups.items(), key=key)
    usual = ordered[0][1] if ordered else []
    different = [d for _, members in ordered[1:] for d in members]
    return usual, different


def pids_for(pid_list: list[int], all_ranks: bool) -> list[Target]:
    """The targets to dump: each pid checked; with ``all_ranks`` and one pid, the
    ranks of its job on this host."""
    targets = [find_dump_target(pid) for pid in pid_list]
    if all_ranks and len(targets) == 1:
        targets = rank_targets(targets[0])
    return targets
