"""The armed process's side of ``gpuprof dump`` (docs/on-demand.md, "Dumping a hung
job").

Arming starts a native thread (csrc/dump/dump.c) that answers ``gpuprof dump PID`` on a
Unix socket in the runtime folder, ``<pid>.dump``: it reads every thread's stack out
of the interpreter without the GIL (csrc/dump/dump_walk.c), so it answers while a thread
holds the GIL forever. What only Python can say, it asks this module for, through
the on-demand thread, and waits for at most what the requester allows:

- the threads' names (``threading``), also cached here whenever the set of threads
  changes, so that a dump made while the GIL is held still names them;
- for a ``torch.distributed`` job, this rank, the process groups and the
  collectives in flight, from PyTorch's flight recorder (``_dump_fr_trace``, run on
  a helper thread with a deadline, since for NCCL it queries CUDA events: nothing
  of it runs on the dump thread).

Idle, this costs one tuple of thread idents per poll of the on-demand thread.
"""

from __future__ import annotations

import contextlib
import dis
import json
import opcode
import os
import sys
import threading
import time

from ... import _gpuprof
from ...core._paths import PACKAGE_DIR
from ._shared import _say

__all__ = ["Dumper", "socket_path", "tables"]

FR_DEADLINE_S = 0.4  # how long the flight recorder may take (within the requester's 0.5 s)
_NO_DECODE = 0xFF  # csrc/dump/dump_walk.h GP_DUMP_NO_DECODE: the real opcode is stored elsewhere
_UNDECODABLE = ("INSTRUMENTED_LINE", "INSTRUMENTED_INSTRUCTION", "ENTER_EXECUTOR")


def socket_path(runtime: str, pid: int) -> str:
    return os.path.join(runtime, f"{pid}.dump")


# -- this interpreter's bytecode, for the call analysis (csrc/dump/dump_walk.c) ---------------
def tables() -> tuple[bytes, bytes, dict[str, int]]:
    """``(deopt, caches, ops)``: for each stored opcode (specialised or instrumented),
    its base opcode and the inline cache units after it; and the base opcodes by name.
    Read from this interpreter's own ``opcode`` and ``dis`` modules."""
    allmap = dict(getattr(dis, "_all_opmap", opcode.opmap))
    deoptmap = getattr(dis, "deoptmap", {})
    entries = getattr(dis, "_inline_cache_entries", getattr(opcode, "_inline_cache_entries", {}))

    def cache_count(name: str, num: int) -> int:
        if isinstance(entries, dict):  # 3.13: by name
            return int(entries.get(name, 0))
        return int(entries[num]) if num < len(entries) else 0

    deopt = bytearray(range(256))
    caches = bytearray(256)
    for name, num in allmap.items():
        if not 0 <= num < 256:
            continue  # pseudo-instructions never reach the bytecode
        base = deoptmap.get(name, name)
        if name.startswith("INSTRUMENTED_") and name[13:] in opcode.opmap:
            base = name[13:]
        base_num = opcode.opmap.get(base, num)
        if name in _UNDECODABLE or not 0 <= base_num < 256:
            caches[num] = _NO_DECODE
            continue
        deopt[num] = base_num
        caches[num] = cache_count(base, base_num)
    ops = {k: v for k, v in opcode.opmap.items() if 0 <= v < 256}
    return bytes(deopt), bytes(caches), ops


# -- what only Python can say ---------------------------------------------------------------
def thread_names() -> dict:
    """``{"kind": "names", "at": time, "threads": {ident: {...}}}`` from threading."""
    out = {}
    main = threading.main_thread()
    active = threading._active  # type: ignore[attr-defined]  # the private dict: no lock
    for ident, t in list(active.items()):  # a copy of the dict
        with contextlib.suppress(Exception):
            out[str(ident)] = {
                "name": t.name,
                "native_id": getattr(t, "native_id", None),
                "daemon": t.daemon,
                "main": t is main,
            }
    return {"kind": "names", "at": time.time(), "threads": out}


def _distributed() -> dict | None:
    """This rank of a torch.distributed job, its groups and collectives in flight."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is None:
        return None
    try:
        if not dist.is_available() or not dist.is_initialized():
            return None
        out = {
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
            "backend": str(dist.get_backend()),
        }
    except Exception as e:  # noqa: BLE001 - a half-made process group says so
        return {"error": f"torch.distributed: {e!r}"}
    out["flight_recorder"] = _flight_recorder()
    return out


def _flight_recorder() -> dict:
    """PyTorch's flight recorder (every backend that has one; TORCH_FR_BUFFER_SIZE):
    each group's last enqueued/started/completed collective and the entries not yet
    completed. Run on a helper thread: for NCCL it queries CUDA events, which must
    not stall this thread; after FR_DEADLINE_S the dump goes on without it."""
    import pickle

    c10d = sys.modules.get("torch._C._distributed_c10d")
    fn = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
    if fn is None:
        return {"missing": "this PyTorch has no flight recorder"}
    box: dict = {}

    def run():
        try:
            box["raw"] = fn(includeCollectives=True, includeStackTraces=False, onlyActive=False)
        except Exception as e:  # noqa: BLE001
            box["error"] = repr(e)

    t = threading.Thread(target=run, name="gpuprof-dump-fr", daemon=True)
    t.start()
    t.join(FR_DEADLINE_S)
    if t.is_alive():
        return {"missing": f"the flight recorder did not answer within {FR_DEADLINE_S:g} s"}
    if "error" in box:
        return {"missing": f"the flight recorder failed: {box['error']}"}
    try:
        doc = pickle.loads(box["raw"])
    except Exception as e:  # noqa: BLE001
        return {"missing": f"the flight recorder's dump could not be read: {e!r}"}
    return summarize_flight_recorder(doc)


def summarize_flight_recorder(doc: dict) -> dict:
    """The parts of a flight recorder dump a hang needs, as plain JSON data: per
    group, the last collective enqueued, started and completed; the entries not
    completed (oldest first), with their thread, sizes and age."""
    now = time.time_ns()
    names = {}
    for key, cfg in (doc.get("pg_config") or {}).items():
        if isinstance(cfg, dict):
            names[str(key)] = cfg
    groups = {}
    for pg, st in (doc.get("pg_status") or {}).items():
        if isinstance(st, dict):
            groups[str(pg)] = {
                k: st.get(k)
                for k in (
                    "last_enqueued_collective",
                    "last_started_collective",
                    "last_completed_collective",
                )
            }
    open_entries = []
    for e in doc.get("entries") or []:
        if not isinstance(e, dict):
            continue
        pg = e.get("process_group") or ("", "")
        if isinstance(pg, (list, tuple)) and len(pg) > 1 and pg[1]:
            names.setdefault(str(pg[0]), {"name": pg[0], "desc": pg[1]})
        done = e.get("state") == "completed" or e.get("retired")
        if done:
            continue
        created = e.get("time_created_ns")
        open_entries.append(
            {
                "pg_id": e.get("pg_id"),
                "pg": list(pg) if isinstance(pg, (list, tuple)) else [str(pg), ""],
                "seq": e.get("collective_seq_id"),
                "p2p_seq": e.get("p2p_seq_id"),
                "is_p2p": bool(e.get("is_p2p")),
                "op": e.get("profiling_name"),
                "state": e.get("state"),
                "thread_id": e.get("thread_id"),
                "thread_name": e.get("thread_name"),
                "input_sizes": e.get("input_sizes"),
                "age_s": (now - created) / 1e9 if isinstance(created, int) else None,
            }
        )
    return {
        "version": doc.get("version"),
        "groups": groups,
        "configs": {
            k: {"name": v.get("name"), "desc": v.get("desc")}
            for k, v in names.items()
            if v.get("name") or v.get("desc")
        },
        "in_flight": open_entries[-64:],
    }


def python_side() -> dict:
    """What the on-demand thread adds to a dump: names, torch.distributed, torch.cuda."""
    out = {"kind": "python", **thread_names()}
    out["kind"] = "python"
    dist = _distributed()
    if dist is not None:
        out["distributed"] = dist
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is not None:
        with contextlib.suppress(Exception):  # never initialises CUDA
            out["cuda_initialized"] = bool(cuda.is_initialized())
    return out


# -- the server's lifetime, on an OnDemand ----------------------------------------------------
class Dumper:
    """The dump server of one armed process: started at arming, answered on its
    on-demand thread, stopped at disarming."""

    def __init__(self):
        self.path: str | None = None
        self.error: str | None = None
        self._idents: tuple = ()
        self._failed = False

    def start(self, runtime: str, pid: int, wake_fd: int) -> None:
        """Start the server; a failure is kept in ``error`` (the state file says it),
        since arming for capture must not fail for it."""
        path = socket_path(runtime, pid)
        try:
            _gpuprof._dump_tables(*tables())
        except (ValueError, RuntimeError, AttributeError, TypeError) as e:
            self.error = f"the bytecode tables could not be made ({e}); calls are not named"
        try:
            _gpuprof._dump_start(path, wake_fd)
        except (OSError, RuntimeError, ValueError) as e:
            self.error = str(e)
            return
        self.path = path
        self.tick()

    def state(self) -> dict:
        """The state file's entries: the socket, or why there is none; gpuprof's
        folder, whose outermost frames (``run``'s launcher) a dump leaves out."""
        return {
            "dump": self.path,
            "dump_error": None if self.path else self.error,
            "dump_hide": PACKAGE_DIR,
        }

    def stop(self) -> None:
        if self.path is not None:
            self.path = None
            _gpuprof._dump_stop()

    def forked(self) -> None:
        self.path = None  # the child has no server thread (csrc/dump/dump.c after_fork_child)

    def tick(self) -> None:
        """On the on-demand thread, at each wake-up: answer a dump waiting for us;
        hand the server new thread names when the set of threads has changed.
        Never raises: a failure is said once on stderr, and the dump goes on
        without what this would have added."""
        try:
            self._tick()
        except Exception as e:  # noqa: BLE001 - the on-demand thread must not die for it
            if not self._failed:
                self._failed = True
                _say(f"on-demand: answering a dump failed: {e!r}")

    def _tick(self) -> None:
        if self.path is None:
            return
        req = _gpuprof._dump_pending()
        if req:
            try:
                doc = python_side()
            except Exception as e:  # noqa: BLE001 - the dump goes on without it
                doc = {"kind": "python", "error": repr(e)}
            _gpuprof._dump_answer(req, json.dumps(doc, default=str).encode())
        idents = tuple(threading._active)  # type: ignore[attr-defined]  # a private dict
        if idents != self._idents:
            self._idents = idents
            _gpuprof._dump_names(json.dumps(thread_names(), default=str).encode())
