"""Per-process views of a profile made with ``gpuprof.profile(subprocesses=True)``.

The main process's data is what it always was (``prof.ops()``); each child
process adds its own windows. This module turns them into:

- ``prof.processes()``: one row per process (:data:`PROCESSES_DTYPE`);
- ``prof.ops(pid=...)`` and ``prof.key_averages(pid=...)``: the ops of one
  process (``pid=<int>``), summed over the child processes (``"workers"``)
  or over every process (``"all"``);
- :func:`worker_hotspot`: where the workers spent their time, for the
  diagnosis.

Exporters read the children from ``results.subprocesses``: a list of
:class:`ProcessData`, one per child process, each with its raw window dicts
(the same layout as ``results.windows``; timestamps on the same
CLOCK_MONOTONIC clock as the parent's, so child lanes line up with the
main process's). See docs/subprocesses.md.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from ..core._paths import source_location
from ..results._keys import OP_KEY
from ..results._meta import RecordingMeta
from ..results._results import Results, merge_rows
from ..results.tables import KeyAverages

__all__ = ["PROCESSES_DTYPE", "ProcessData", "worker_hotspot", "processes_array", "select"]

PROCESSES_DTYPE = np.dtype(
    [
        ("pid", "i8"),
        ("ppid", "i8"),
        ("role", "U6"),
        ("name", object),
        ("start_method", "U10"),
        ("status", "U7"),
        ("windows", "i4"),
        ("events", "i8"),
        ("dropped", "i8"),
        ("recorded_ns", "i8"),
        ("cpu_self_ns", "i8"),
    ]
)

# A C call whose nearest Python caller is in one of these files is a worker
# waiting for work or handing results back, not doing it.
_WAIT_MARKERS = tuple(
    os.sep + p
    for p in (
        os.path.join("multiprocessing", ""),
        os.path.join("concurrent", "futures", ""),
        "queue.py",
        "threading.py",
        "selectors.py",
        "socket.py",
        os.path.join("torch", "utils", "data", "_utils", "worker.py"),
        os.path.join("torch", "multiprocessing", ""),
    )
)


class ProcessData:
    """One child process's recorded data, over the kept windows of the parent.

    Attributes:
        pid, ppid: process ids (ppid is the child's parent: the main process,
            or another child for a grandchild).
        role: "worker" (every child process).
        name: multiprocessing's process name (e.g. "ForkPoolWorker-1") or the program.
        start_method: "fork", "spawn" or "forkserver".
        status: "ok" (alive, answered), "exited" (ended, its data was saved),
            "lost" (ended without saving: killed or crashed), "timeout" (alive
            but did not answer in time).
        windows: the child's raw window dicts, same layout as
            ``Results.windows`` (several per parent window when the child
            saved pieces, e.g. before being terminated).
    """

    def __init__(
        self, pid: int, ppid: int, name: str, start_method: str, status: str, windows: list[dict]
    ):
        self.pid = pid
        self.ppid = ppid
        self.role = "worker"
        self.name = name
        self.start_method = start_method
        self.status = status
        self.windows = windows

    def __repr__(self) -> str:
        return (
            f"<gpuprof.ProcessData pid={self.pid} {self.name!r} {self.status}: "
            f"{len(self.windows)} window(s)>"
        )

    def ops(self) -> np.ndarray:
        """This process's ops (``prof.ops()`` fields), its windows summed."""
        return _child_ops(self.windows)


def group_children(children) -> list[ProcessData]:
    """ChildWindow entries of several parent windows -> one ProcessData per pid."""
    by_pid: dict[int, ProcessData] = {}
    for c in children:
        p = by_pid.get(c.pid)
        if p is None:
            by_pid[c.pid] = ProcessData(c.pid, c.ppid, c.name, c.how, c.status, list(c.pieces))
            continue
        p.windows += c.pieces
        p.status = c.status  # the latest window's word
        p.name = c.name or p.name
    return [by_pid[k] for k in sorted(by_pid)]


def _child_ops(windows: list[dict]) -> np.ndarray:
    """Ops of a child's windows without the session marker rows (kind "step": a child
    has no steps; its session's start and stop mark one)."""
    if not windows:
        return _empty_ops()
    parts = [Results([w]).ops() for w in windows]
    parts = [p[p["kind"] != "step"] for p in parts]
    if len(parts) == 1:
        return parts[0]
    return _merge(parts)


def _empty_ops() -> np.ndarray:
    from ..results._results import OPS_DTYPE

    return np.zeros(0, dtype=OPS_DTYPE)


def _merge(parts: list[np.ndarray]) -> np.ndarray:
    parts = [p for p in parts if len(p)]
    if not parts:
        return _empty_ops()
    if len(parts) == 1:
        return parts[0]
    return merge_rows(parts, OP_KEY, mins=("cpu_min_ns",), maxs=("cpu_max_ns",))


def _window_events(windows: list[dict]) -> tuple[int, int, int]:
    events = dropped = recorded = 0
    for w in windows:
        th = w["threads"]
        events += int(th["events"].sum())
        dropped += int(w["dropped_events"])
        recorded += int(w["window_end_ns"]) - int(w["window_start_ns"])
    return events, dropped, recorded


def processes_array(results: Results) -> np.ndarray:
    """One row per process: the main process first, then each child by pid."""
    children = results.subprocesses or []
    out = np.zeros(1 + len(children), dtype=PROCESSES_DTYPE)
    ev, dr, rec = _window_events(results.windows)
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    main_ops = results.ops()
    out[0] = (
        int(results.meta.pid or os.getpid()),
        os.getppid(),
        "main",
        os.path.basename(argv0) or "python",
        "",
        "ok",
        len(results.windows),
        ev,
        dr,
        rec,
        int(main_ops["cpu_self_ns"].sum()),
    )
    for i, c in enumerate(children, 1):
        ev, dr, rec = _window_events(c.windows)
        out[i] = (
            c.pid,
            c.ppid,
            c.role,
            c.name,
            c.start_method,
            c.status,
            len(c.windows),
            ev,
            dr,
            rec,
            int(c.ops()["cpu_self_ns"].sum()),
        )
    return out


class ProcessResults(Results):
    """A :class:`Results` whose ops() are one process's or a sum over processes
    (what ``key_averages(pid=...)`` tabulates)."""

    def __init__(
        self,
        windows: list[dict],
        ops: np.ndarray,
        cuda: dict | None,
        meta: RecordingMeta | None,
        label: str,
    ):
        super().__init__(windows, cuda=cuda, meta=meta)
        self._ops_rows = ops
        self.label = label

    def ops(self) -> np.ndarray:
        return self._ops_rows

    def call_tree(self) -> np.ndarray:
        if len(self._windows) == 1:
            return super().call_tree()
        raise NotImplementedError(
            f"call_tree() of {self.label}: it spans several windows or "
            "processes; group_by_stack_n and top_level_events_only need "
            "one process and one window (pid=<int>, acc_events=False)"
        )


def _check_pid(pid) -> None:
    if isinstance(pid, bool) or not (
        pid is None or isinstance(pid, (int, np.integer)) or pid in ("workers", "all", "main")
    ):
        raise ValueError(
            f"pid must be None, a process id (int), 'main', 'workers' or 'all', got {pid!r}"
        )


def select(results: Results, pid, subprocesses: bool) -> ProcessResults:
    """The :class:`ProcessResults` of ``pid``: None or "main" the main process, an
    int that process, "workers" every child summed, "all" every process summed.

    Raises:
        ValueError: ``pid`` is not one of the above, or no such process was recorded.
        RuntimeError: workers were asked for but the profile was made without
            ``subprocesses=True``.
    """
    _check_pid(pid)
    main_pid = int(results.meta.pid or os.getpid())
    children = results.subprocesses or []
    if pid is None or pid == "main" or (not isinstance(pid, str) and int(pid) == main_pid):
        return ProcessResults(
            results.windows, results.ops(), results.cuda, results.meta, f"process {main_pid} (main)"
        )
    if not subprocesses:
        raise RuntimeError(
            f"pid={pid!r}: child processes were not profiled; use "
            "gpuprof.profile(subprocesses=True)"
        )
    if pid == "workers":
        wins = [w for c in children for w in c.windows]
        if not wins:
            raise ValueError(
                "pid='workers': no child process recorded anything in the kept "
                "window(s); see prof.processes()"
            )
        ops = _merge([c.ops() for c in children])
        return ProcessResults(
            wins,
            ops,
            {"active": False, "mode": "off", "error": None},
            None,
            f"{len(children)} worker process(es)",
        )
    if pid == "all":
        wins = list(results.windows) + [w for c in children for w in c.windows]
        ops = _merge([results.ops()] + [c.ops() for c in children])
        return ProcessResults(
            wins, ops, results.cuda, results.meta, f"{1 + len(children)} processes"
        )
    pid = int(pid)
    for c in children:
        if c.pid == pid:
            if not c.windows:
                raise ValueError(
                    f"pid={pid}: process {pid} recorded nothing in the kept "
                    f"window(s) (status {c.status!r}); see prof.processes()"
                )
            return ProcessResults(
                c.windows,
                c.ops(),
                {"active": False, "mode": "off", "error": None},
                RecordingMeta(pid=pid, process_name=c.name),
                f"process {pid} ({c.name or 'worker'})",
            )
    known = ", ".join(str(p) for p in [main_pid] + [c.pid for c in children])
    raise ValueError(
        f"pid={pid}: no such process in this profile; recorded: {known} (see prof.processes())"
    )


def key_averages(
    results: Results,
    pid,
    subprocesses: bool,
    group_by_stack_n: int,
    show_memory: bool,
    include_context: bool = False,
    idle: bool = False,
    group_by_thread: bool = False,
) -> KeyAverages:
    sel = select(results, pid, subprocesses)
    return KeyAverages(
        sel,
        group_by_stack_n=group_by_stack_n,
        show_memory=show_memory and pid in (None, "main"),
        include_context=include_context,
        idle=idle,
        group_by_thread=group_by_thread,
    )


# ---- diagnosis -------------------------------------------------------------------------


def _is_wait_file(file: str) -> bool:
    return any(m in file for m in _WAIT_MARKERS)


def _nearest_python(spans: np.ndarray, is_py_row: np.ndarray) -> np.ndarray:
    """For each span, the index of the nearest span at or above it that is a Python
    call (-1 if none), by pointer jumping over the parent links."""
    n = len(spans)
    idx = np.arange(n, dtype=np.int64)
    is_py = is_py_row[spans["op_row"].astype(np.int64)] if n else np.zeros(0, dtype=bool)
    parent = spans["parent"].astype(np.int64)
    cur = np.where(is_py, idx, parent)
    while True:
        valid = cur >= 0
        settled = ~valid
        settled[valid] = is_py[cur[valid]]
        if settled.all():
            return cur
        nxt = cur.copy()
        m = ~settled
        nxt[m] = parent[cur[m]]
        cur = nxt


# importlib's own frames and the C calls they make (loading extension modules,
# unmarshalling code) count as one thing: importing modules
_IMPORT_KEY = ("importing modules", "<frozen importlib._bootstrap>", 0, "import")


def _is_import_file(file: str) -> bool:
    return file.startswith("<frozen importlib")


def _worker_time(windows: list[dict]):
    """Where the workers' recorded time went, from their spans.

    Self time of each call is charged to a Python function: a Python call's to
    itself, a C call's to the Python function that made it (as py-spy shows
    native code: ``Image.resize`` rather than the C routine it calls). Time in
    the multiprocessing/queue/DataLoader machinery is waiting; time in importlib
    is importing.

    Returns (busy ns per op key, waiting ns, wall ns): wall is the recorded
    duration of each process summed, the denominator of the shares.
    """
    busy: dict[tuple, int] = {}
    waiting = wall = 0
    for raw in windows:
        wall += int(raw["window_end_ns"]) - int(raw["window_start_ns"])
        sp = raw["spans"]
        ops = Results([raw]).ops()
        if not len(sp) or not len(ops):
            continue
        kinds = ops["kind"]
        files = [str(f) for f in ops["file"]]
        is_py = kinds == "python"
        rows = sp["op_row"].astype(np.int64)
        dur = (sp["end_ns"] - sp["start_ns"]).astype(np.int64)
        par = sp["parent"].astype(np.int64)
        child_sum = np.zeros(len(sp), dtype=np.int64)
        has_p = par >= 0
        np.add.at(child_sum, par[has_p], dur[has_p])
        self_t = dur - child_sum
        owner = _nearest_python(sp, is_py)
        # the row each span's self time is charged to
        c_span = (kinds == "c")[rows] & (owner >= 0)
        target = np.where(c_span, rows[np.maximum(owner, 0)], rows)
        wait_row = np.array([_is_wait_file(f) for f in files], dtype=bool)
        import_row = np.array([_is_import_file(f) for f in files], dtype=bool)
        skip = (kinds == "step")[target]
        is_wait = wait_row[target] & ~skip
        is_import = import_row[target] & ~is_wait & ~skip
        waiting += int(self_t[is_wait].sum())
        imported = int(self_t[is_import].sum())
        if imported:
            busy[_IMPORT_KEY] = busy.get(_IMPORT_KEY, 0) + imported
        keep = ~(skip | is_wait | is_import)
        per_row = np.bincount(target[keep], weights=self_t[keep], minlength=len(ops))
        for r in np.flatnonzero(per_row > 0):
            key = (str(ops["name"][r]), files[r], int(ops["line"][r]), str(kinds[r]))
            busy[key] = busy.get(key, 0) + int(per_row[r])
    return busy, waiting, wall


def worker_hotspot(results: Results) -> dict:
    """Where the child processes spent their recorded time, for the data-stall finding.

    Returns {} without worker data, else:
        workers: child processes with data,
        workers_hottest: the Python function with the most time of its own plus
            the C calls it made, "name (file:line)"; or "importing modules",
        workers_hottest_share: that time over the workers' recorded wall time
            (each process's recorded duration, summed),
        workers_busy_share: the time not spent waiting for work in the
            multiprocessing/queue/DataLoader machinery, over the same wall time
            (helper threads that only wait count nothing).
    """
    children = [c for c in (results.subprocesses or []) if c.windows]
    if not children:
        return {}
    busy, _waiting, wall = _worker_time([w for c in children for w in c.windows])
    if not busy or wall <= 0:
        return {}
    key = max(busy, key=lambda k: busy[k])
    name, file, line, kind = key
    if key == _IMPORT_KEY:
        label = "importing modules (importlib)"
    elif kind == "python":
        label = f"{name} ({source_location(file, line)})"
    else:
        label = name
    return {
        "workers": len(children),
        "workers_hottest": label,
        "workers_hottest_share": min(1.0, busy[key] / wall),
        "workers_busy_share": min(1.0, sum(busy.values()) / wall),
    }
