"""What the framework integrations share: one ``gpuprof.profile`` driven by the
framework's step events, the metrics of each recorded step as its window closes,
those metrics handed to the framework's logger, and the files and the summary at
the end of training.

Nothing here imports a framework; PyTorch is only read from ``sys.modules`` (for
peak device memory), never imported.
"""

from __future__ import annotations

import collections
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from ..analysis.diagnose import data_wait_per_step, diagnose
from ..api._loaded import LoadedProfile
from ..api.profiler import profile as _profile
from ..exporters.tensorboard import tensorboard_trace_handler
from ..record.schedule import ProfilerAction, Schedule, action_at
from ..results.tables import SORT_KEYS, format_time
from ..results.views import Table

__all__ = [
    "METRIC_NAMES",
    "STEP_METRICS_DTYPE",
    "SessionResults",
    "StepSession",
    "logged_metrics",
    "require",
    "step_metrics",
]

STEP_METRICS_DTYPE = np.dtype(
    [
        ("step", "i8"),
        ("start_ns", "i8"),
        ("end_ns", "i8"),
        ("step_ns", "i8"),
        ("gpu_busy_ns", "i8"),
        ("data_wait_ns", "i8"),
        ("sync_wait_ns", "i8"),
        ("comm_ns", "i8"),
        ("memcpy_ns", "i8"),
        ("kernels", "i8"),
        ("peak_memory_bytes", "i8"),
    ]
)

# The keys of one step's metrics, as loggers receive them (docs/integrations.md).
METRIC_NAMES = (
    "gpuprof/step_time_ms",
    "gpuprof/data_wait_pct",
    "gpuprof/gpu_busy_pct",
    "gpuprof/sync_wait_pct",
    "gpuprof/comm_pct",
    "gpuprof/kernels",
    "gpuprof/peak_memory_mib",
)

# Whether a session starts a profile per window when not told (per_window=None): no,
# one profile runs for the whole training, its hook off while the schedule waits.
PER_WINDOW = False


def require(module: str, *, what: str, pip: str, minimum: tuple[int, ...], tested: str):
    """Import ``module`` (of a framework) or raise ImportError saying what gpuprof's
    integration ``what`` needs and how to install it."""
    import importlib

    top = module.split(".")[0]
    need = ".".join(map(str, minimum))
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{what} needs {top} >= {need} (tested with {tested}), which cannot "
            f"be imported here ({e}); install it with: pip install '{pip}>={need}'"
        ) from e
    version = str(getattr(sys.modules[top], "__version__", "0"))
    found = tuple(
        int("".join(c for c in part if c.isdigit()) or 0)
        for part in version.split("+")[0].split(".")[: len(minimum)]
    )
    if found < minimum:
        raise ImportError(
            f"{what} needs {top} >= {need} (tested with {tested}), found {version};"
            f" upgrade it with: pip install -U '{pip}>={need}'"
        )
    return mod


def step_metrics(
    results, window: int = -1, data_fetch=(), peak_memory=None, step_offset: int = 0
) -> np.ndarray:
    """One row per step of a recorded window: what ``steps()`` holds, plus the time
    the step waited for data and its peak device memory (:data:`STEP_METRICS_DTYPE`).

    Args:
        results: a ``gpuprof.profile`` (after a window closed), a loaded profile, or a
            ``gpuprof.Results``.
        window: which recorded window (with ``acc_events=True`` there are several).
        data_fetch: names of the ops in which the framework fetches its batches (see
            ``gpuprof.diagnose.data_wait_spans``); loader calls made directly under a
            step count without them.
        peak_memory: {step: bytes} of the steps whose peak device memory was read
            (numbered as in the result); other steps get -1.
        step_offset: added to the step numbers (a profile started at the run's step
            ``step_offset`` numbers its steps from 0).
    """
    results = getattr(results, "results", results)
    steps = results.windows[window]["steps"]
    out = np.zeros(len(steps), dtype=STEP_METRICS_DTYPE)
    for f in (
        "step",
        "start_ns",
        "end_ns",
        "gpu_busy_ns",
        "sync_wait_ns",
        "comm_ns",
        "memcpy_ns",
        "kernels",
    ):
        out[f] = steps[f]
    out["step"] += step_offset
    out["step_ns"] = steps["cpu_ns"]
    out["data_wait_ns"] = data_wait_per_step(results, window, data_fetch)
    peaks = peak_memory or {}
    out["peak_memory_bytes"] = [peaks.get(int(s), -1) for s in out["step"]]
    return out


def logged_metrics(row, gpu: bool) -> dict[str, float]:
    """The logger's view of one row of :func:`step_metrics`: the step time in ms,
    shares of it in percent, kernels, and peak device memory in MiB. The GPU figures
    are left out when GPU capture was off (they would read 0), as is the memory when
    it was not measured."""
    step_ns = max(int(row["step_ns"]), 1)
    out = {
        "gpuprof/step_time_ms": int(row["step_ns"]) / 1e6,
        "gpuprof/data_wait_pct": 100.0 * int(row["data_wait_ns"]) / step_ns,
    }
    if gpu:
        out["gpuprof/gpu_busy_pct"] = 100.0 * int(row["gpu_busy_ns"]) / step_ns
        out["gpuprof/sync_wait_pct"] = 100.0 * int(row["sync_wait_ns"]) / step_ns
        out["gpuprof/comm_pct"] = 100.0 * int(row["comm_ns"]) / step_ns
        out["gpuprof/kernels"] = float(row["kernels"])
    if int(row["peak_memory_bytes"]) >= 0:
        out["gpuprof/peak_memory_mib"] = int(row["peak_memory_bytes"]) / 2**20
    return out


def check_output(output, who: str):
    """``output``: None (the framework's folder), False (no files) or a folder."""
    if output is None or output is False:
        return output
    if not isinstance(output, (str, os.PathLike)) or not os.fspath(output):
        raise TypeError(
            f"{who}: output must be a folder (str or os.PathLike), None for the "
            f"framework's own folder, or False for no files; got {output!r}"
        )
    if os.path.isfile(output):
        raise ValueError(f"{who}: output={os.fspath(output)!r} is a file; give a folder")
    return os.fspath(output)


def _check_options(who: str, log_metrics, row_limit, sort_by) -> None:
    if not isinstance(log_metrics, bool):
        raise TypeError(f"{who}: log_metrics must be a bool, got {log_metrics!r}")
    if isinstance(row_limit, bool) or not isinstance(row_limit, int) or row_limit < -1:
        raise ValueError(
            f"{who}: row_limit must be an int >= -1 (-1: every row), got {row_limit!r}"
        )
    if sort_by is not None and sort_by not in SORT_KEYS:
        raise ValueError(
            f"{who}: sort_by must be None or a key_averages().table(sort_by=...) "
            f"key ({', '.join(sorted(SORT_KEYS))}); got {sort_by!r}"
        )


_LOOKAHEAD = 10_000  # steps a wait is looked through at once (see StepSession._next_busy)


class SessionResults:
    """``prof`` and ``steps()`` of an integration that records through the
    :class:`StepSession` in its ``_session``."""

    @property
    def prof(self):
        """The last recorded window as a read-only profile (a
        ``gpuprof.exporters.LoadedProfile``: ``key_averages()``, ``kernels()``,
        ``steps()``, ``diagnose()``, ``export_chrome_trace()``, ``save()``...); None
        until a window has closed."""
        return self._session.view

    def steps(self):
        """One row per recorded step of the run, with its step time, data wait, GPU busy,
        sync wait, communication, kernels and peak device memory (docs/integrations.md,
        ``gpuprof.integrations.STEP_METRICS_DTYPE``)."""
        return self._session.steps()


class StepSession:
    """A profiled training run whose steps a framework ends, with per-step metrics.

    The integration calls :meth:`start` when training begins, :meth:`step` when a
    step ends, :meth:`stop` when training ends, then :meth:`write_files` and
    :meth:`summary`. Each window's step metrics are kept (:meth:`steps`, the whole
    run) and, with ``log``, handed to ``log(metrics, tag)`` one recorded step at a
    time, ``tag`` being what :meth:`step` was given for that step. ``view`` is the
    last kept window, with the accessors of a profile (``key_averages()``, exports).

    Between recording windows the Python hook costs nothing: one ``gpuprof.profile``
    runs from start to stop, and while its schedule waits the hook is off (its
    ``sys.monitoring`` events on CPython 3.12+, its profile function on 3.10 and
    3.11). ``per_window=True`` instead starts a profile at each window's first step
    and stops it after its last; step numbers inside each window's files then count
    from that window's start.

    A window cut short by the end of training is dropped when an earlier one was
    complete (the last complete window stays the result), as ``gpuprof.profile``
    does, but without its warning: training rarely ends on a cycle's boundary.
    """

    def __init__(
        self,
        who: str,
        *,
        schedule,
        log: Callable[[dict, object], None] | None,
        data_fetch=(),
        on_trace_ready=None,
        row_limit: int = 20,
        sort_by: str | None = None,
        log_metrics: bool = True,
        per_window: bool | None = None,
        **profile_kwargs,
    ):
        _check_options(who, log_metrics, row_limit, sort_by)
        if on_trace_ready is not None and not callable(on_trace_ready):
            raise TypeError(
                f"{who}: on_trace_ready must be callable(prof) or None, got {on_trace_ready!r}"
            )
        if profile_kwargs.get("acc_events"):
            raise ValueError(
                f"{who}: acc_events=True is not supported: steps() already holds "
                "the step metrics of every window, and the last window keeps "
                "the full results"
            )
        self.who = who
        self.schedule = schedule
        if per_window is None:
            per_window = PER_WINDOW
        # per window: the profile's step j is the run's step self._offset + j
        self._cycling = bool(per_window) and schedule is not None
        self._offset = 0
        if self._cycling and not callable(schedule):
            raise TypeError(
                f"{who}: schedule must be gpuprof.schedule(...) or a callable "
                f"step -> ProfilerAction, got {schedule!r}"
            )
        self._profile_kwargs = profile_kwargs
        self._new_profile()  # checks every profile argument now, before training starts
        # the recording profile, made by start(); None keeps the session picklable
        # (Lightning's ddp_spawn pickles the Trainer and its profiler)
        self.live: _profile | None = None
        self.log = log if log_metrics else None
        self.data_fetch = tuple(data_fetch)
        self.row_limit = row_limit
        self.sort_by = sort_by
        self.view: LoadedProfile | None = None  # the last kept window
        self._view_complete = False
        self._user_on_trace_ready = on_trace_ready
        self._pending: list = []  # (results, step offset) of windows closed, not yet read
        self._rows: list[np.ndarray] = []
        self._failed: str | None = None  # why metrics stopped (warned once)
        self.active = False  # between start() and stop()
        self._k = 0  # the run's step now running
        self._quiet_until = 0  # the schedule waits at the steps before this one
        # the tags of the last steps (a window's are read when it closes)
        self._tags: collections.deque = collections.deque(
            maxlen=schedule.active if isinstance(schedule, Schedule) else 100_000
        )
        # -- peak device memory: torch.cuda's peak counter, reset at each recorded step --
        self._torch: Any = None  # torch, when CUDA is there
        self._device = None
        self._peaks: dict[int, int] = {}
        self._peak_armed = False

    # -- lifecycle -------------------------------------------------------------------
    def _new_profile(self):
        """The gpuprof.profile that records; per window, a new one for each window (a
        profile restarted after a complete window cannot be stopped inside a later one
        without an error from its cut-short check)."""
        if self._cycling:
            schedule = self.schedule
            offset = self._offset
            return _profile(
                schedule=lambda j: schedule(offset + j),
                on_trace_ready=self._window_ready,
                **self._profile_kwargs,
            )
        return _profile(
            schedule=self.schedule, on_trace_ready=self._window_ready, **self._profile_kwargs
        )

    def start(self) -> None:
        self.stop()
        self._rows = []
        self._pending = []
        self._tags.clear()
        self._peaks = {}
        self.view = None
        self._view_complete = False
        self._k = 0
        self._offset = 0
        self._quiet_until = 0
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        self._torch = torch if cuda is not None and cuda.is_available() else None
        self.active = True
        action = self._action_at(0)
        self.live = self._new_profile()
        if not self._cycling or action is not ProfilerAction.NONE:
            self.live.start()
        if action is ProfilerAction.NONE:
            self._quiet_until = self._next_busy(0)
        self._arm_peak(0, action)

    def step(self, tag=None) -> None:
        """End the running step, reading its peak device memory first.

        ``tag`` is what the logger receives with this step's metrics: a value, or a
        callable giving it (called only for a step the schedule records); by default
        the step's number.
        """
        k = self._k
        live = self.live
        if self._peak_armed:
            self._peaks[k] = self._torch.cuda.max_memory_allocated(self._device)
        if k >= self._quiet_until:
            self._tags.append((k, k if tag is None else tag() if callable(tag) else tag))
        if live.running:
            live.step()
        self._k = k = k + 1
        if k < self._quiet_until:  # the schedule waits: nothing to ask or do
            if self._pending:  # (a window closed at the step that just ended)
                self._flush()
            return
        action = self._action_at(k)
        if self._cycling:
            if live.running:
                if action is ProfilerAction.NONE:  # the window closed and the schedule waits
                    live.stop()
            elif action is not ProfilerAction.NONE:
                self._offset = k
                self.live = self._new_profile()
                self.live.start()
        if action is ProfilerAction.NONE:
            self._quiet_until = self._next_busy(k)
        if self._pending:
            self._flush()
        self._arm_peak(k, action)

    def _next_busy(self, step: int) -> int:
        """The first step after ``step`` that the schedule does not wait at (looking at
        most _LOOKAHEAD steps ahead). Asking once per wait rather than at every step
        matters: the first call in a step of a large training loop runs from cold
        caches, at several times the cost of a warm one."""
        for j in range(step + 1, step + 1 + _LOOKAHEAD):
            if self._action_at(j) is not ProfilerAction.NONE:
                return j
        return step + 1 + _LOOKAHEAD

    def stop(self) -> None:
        self.active = False
        self._peak_armed = False
        if self.live is not None and self.live.running:
            with warnings.catch_warnings():
                # the window cut short by the end of training: dropped, as documented
                warnings.filterwarnings(
                    "ignore", message="gpuprof: the loop ended at step", category=UserWarning
                )
                self.live.stop()
        self._flush()

    def _action_at(self, step: int) -> ProfilerAction:
        return action_at(self.schedule, step)

    def _arm_peak(self, step: int, action) -> None:
        """Reset torch's peak counter when ``step`` is recorded (only then: reading
        torch's memory statistics costs tens of microseconds)."""
        torch = self._torch
        self._peak_armed = False
        if torch is None or not action.records or not torch.cuda.is_initialized():
            return
        self._device = torch.cuda.current_device()
        torch.cuda.reset_peak_memory_stats(self._device)
        self._peak_armed = True

    # -- windows ---------------------------------------------------------------------
    def _window_ready(self, prof) -> None:
        # The metrics are computed once the step returns (and, per window, once the
        # profile has stopped): here the hook is still installed.
        self._pending.append((prof.results, self._offset))
        if self._user_on_trace_ready is not None:
            self._user_on_trace_ready(prof)

    def _flush(self) -> None:
        """Compute and log the metrics of the windows closed since the last call."""
        while self._pending:
            results, offset = self._pending.pop(0)
            if self._failed is not None:
                continue
            try:
                self._collect(results, offset)
            except Exception as e:  # noqa: BLE001 - never into the training loop
                self._failed = f"{type(e).__name__}: {e}"
                warnings.warn(
                    f"gpuprof: {self.who}: step metrics are off for the rest of the "
                    f"run: {self._failed}",
                    RuntimeWarning,
                    stacklevel=3,
                )

    def _collect(self, results, offset: int) -> None:
        rows = step_metrics(results, -1, self.data_fetch, self._peaks, offset)
        for s in rows["step"]:
            self._peaks.pop(int(s), None)
        if not len(rows):
            return
        last = int(rows["step"][-1])
        complete = (
            self.schedule is None
            or action_at(self.schedule, last) is ProfilerAction.RECORD_AND_SAVE
        )
        if not complete and self._view_complete:
            return  # cut short by the end of training: the complete one stays
        self.view = LoadedProfile(results)
        self._view_complete = complete
        self._rows.append(rows)
        if self.log is None:
            return
        gpu = bool(results.cuda.get("active"))
        tags = dict(self._tags)
        for row in rows:
            self.log(logged_metrics(row, gpu), tags.get(int(row["step"])))

    def __getstate__(self) -> dict:
        if self.active:
            raise TypeError(
                f"{self.who}: cannot be pickled while it records (between the "
                "start and the end of training)"
            )
        state = dict(self.__dict__)
        state["live"] = None  # a stopped profile: its results are in the view
        return state

    # -- results ---------------------------------------------------------------------
    @property
    def steps_run(self) -> int:
        """Steps ended since start()."""
        return self._k

    def steps(self) -> np.ndarray:
        """The metrics of every recorded step of the run (:data:`STEP_METRICS_DTYPE`)."""
        if not self._rows:
            return np.zeros(0, dtype=STEP_METRICS_DTYPE)
        return np.concatenate(self._rows)

    def write_files(self, folder: str, prefix: str) -> list[str]:
        """The last kept window's Chrome trace (``PREFIX.<ns>.pt.trace.json.gz``, the
        name TensorBoard's profiler plugin reads) and its arrays (``PREFIX.gpuprof``) in
        ``folder``. Returns the paths; none without a recorded window."""
        if self.view is None:
            return []
        os.makedirs(folder, exist_ok=True)
        trace = tensorboard_trace_handler(folder, worker_name=prefix, use_gzip=True)(self.view)
        saved = self.view.save(os.path.join(folder, prefix + ".gpuprof"))
        return [trace, saved]

    def summary(self, title: str, files=()) -> str:
        """The op table of the last kept window, the step metrics of the run, the
        diagnosis and the model's top modules, as text."""
        if self.view is None:
            return (
                f"{title}\nNo step was recorded: the run ended after {self._k} step"
                f"{'s' if self._k != 1 else ''}, before the schedule "
                f"({self.schedule!r}) completed a recording window. Run more steps or "
                f"shorten the schedule's wait/warmup.\n"
            )
        view = self.view
        gpu = bool(view.results.cuda.get("active"))
        sort_by = self.sort_by or ("self_cuda_time_total" if gpu else "self_cpu_time_total")
        parts = [title, view.key_averages().table(sort_by=sort_by, row_limit=self.row_limit)]
        metrics = self.steps()
        if len(metrics):
            parts.append(str(metrics_table(metrics, gpu)))
        parts.append(str(diagnose(view.results, data_fetch=self.data_fetch)))
        if len(view.modules()):  # the model's top modules, forward and backward
            parts.append(str(view.module_table(max_depth=2, row_limit=15, min_share=0.01)))
        if files:
            parts.append("gpuprof wrote:\n" + "\n".join(f"  {f}" for f in files) + "\n")
        return "\n".join(p.rstrip("\n") + "\n" for p in parts)


def metrics_table(metrics: np.ndarray, gpu: bool) -> Table:
    """Median and maximum of each step metric over the recorded steps."""
    step_ns = np.maximum(metrics["step_ns"], 1).astype(np.float64)
    cols: list[tuple[str, np.ndarray, Callable[[float], str]]] = [
        ("Step time", metrics["step_ns"].astype(np.float64), format_time),
        ("Data wait", 100 * metrics["data_wait_ns"] / step_ns, _pct),
    ]
    if gpu:
        cols += [
            ("GPU busy", 100 * metrics["gpu_busy_ns"] / step_ns, _pct),
            ("Sync wait", 100 * metrics["sync_wait_ns"] / step_ns, _pct),
            ("Communication", 100 * metrics["comm_ns"] / step_ns, _pct),
            ("Kernels", metrics["kernels"].astype(np.float64), lambda v: f"{v:.0f}"),
        ]
    peaks = metrics["peak_memory_bytes"]
    if (peaks >= 0).any():
        cols.append(("Peak memory", peaks[peaks >= 0] / 2**20, lambda v: f"{v:.1f} MiB"))
    rows = [[name, fmt(float(np.median(v))), fmt(float(np.max(v)))] for name, v, fmt in cols]
    return Table(
        "Step metrics",
        ["Metric", "Median", "Max"],
        rows,
        "lrr",
        footer=f"over {len(metrics)} recorded step{'s' if len(metrics) != 1 else ''}, "
        f"steps {int(metrics['step'][0])}-{int(metrics['step'][-1])}",
    )


def _pct(v: float) -> str:
    return f"{v:.1f}%"
