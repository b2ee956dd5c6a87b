"""The read-only accessors shared by a live ``gpuprof.profile`` and a loaded
``.gpuprof`` file: one implementation over ``self.results``.

A class using this mixin provides ``results`` (a :class:`gpuprof.Results`,
whose ``memory_samples`` holds the host and allocator samples), ``profile_memory``
and ``subprocesses`` (bools).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from ..core._progress import progress

if TYPE_CHECKING:  # for the annotations alone: each method imports what it calls
    import os

    import numpy as np

    from ..analysis.diagnose import Diagnosis
    from ..analysis.memory import MemorySummary
    from ..results._results import Results
    from ..results.events import EventList
    from ..results.tables import KeyAverages
    from ..results.views import Table

    Path = str | os.PathLike[str]

__all__ = ["ResultAccessors"]


class ResultAccessors:
    """ops(), kernels(), steps(), key_averages(), diagnose(), exports and views."""

    if TYPE_CHECKING:  # what a class using the mixin provides (the module's docstring)

        @property
        def results(self) -> Results: ...

        @property
        def profile_memory(self) -> bool: ...

        @property
        def subprocesses(self) -> bool: ...

        def processes(self) -> np.ndarray: ...

    def key_averages(
        self,
        group_by_input_shape: bool = False,
        group_by_stack_n: int = 0,
        pid: int | str | None = None,
        *,
        include_context: bool = False,
        group_by_overload_name: bool = False,
        idle: bool = False,
        group_by_thread: bool = False,
    ) -> KeyAverages:
        """Op statistics as a :class:`gpuprof.tables.KeyAverages`: ``.table()`` prints
        them, iterating gives one row object with torch.profiler's attribute names.

        Args:
            group_by_input_shape: one row per ATen op and input shapes, with an
                Input Shapes column, as torch.profiler groups them. Shapes are
                recorded with ``record_shapes=True`` on a CUDA build of PyTorch
                (docs/aten.md); without them True groups by name alone, as torch
                does without ``record_shapes``, and a warning says so.
            group_by_stack_n: group each op by its N nearest Python callers.
            pid: with ``subprocesses=True``, whose ops (see :meth:`ops`).
            include_context: also show the frames that were already running when
                recording began (the script's ``<module>``, a notebook's IPython
                frames): 0 calls, context rather than results, left out by default.
            group_by_overload_name: accepted for torch.profiler code; C functions have
                no overloads, so there is nothing to group.
            idle: also show the time threads spent waiting (sleeps, lock acquires,
                polls, queue gets: ``ops()["idle"]``), as py-spy's ``--idle``. Left out
                by default: those rows are not shown, their time is not in the Self CPU
                total, each op's CPU total is the time it computed, and a footer line
                says how much waiting was left out.
            group_by_thread: one row per op and thread, with a Thread column naming
                each thread (``thread_names()``); combines with ``group_by_stack_n``.
        """
        from ..results.tables import KeyAverages

        if not isinstance(group_by_input_shape, bool):
            raise TypeError(
                f"key_averages(): group_by_input_shape must be a bool, got {group_by_input_shape!r}"
            )
        if group_by_input_shape and not (self.results.ops()["input_shapes"] != "").any():
            # torch.profiler code (a recipe's on_trace_ready) asks for it: refusing
            # would end the job at the first window, so the rows are what torch
            # gives without record_shapes, and the warning says why
            warnings.warn(
                "key_averages(group_by_input_shape=True): no input shapes were "
                "recorded (they come with record_shapes=True, from PyTorch's NVTX "
                "ranges on a CUDA build: docs/aten.md), so rows are grouped by name "
                "alone; group_by_stack_n=N splits an op by its callers",
                UserWarning,
                stacklevel=2,
            )
        if not isinstance(group_by_overload_name, bool):
            raise TypeError(
                f"key_averages(): group_by_overload_name must be a bool, "
                f"got {group_by_overload_name!r}"
            )
        if pid is not None:  # -- subprocesses --
            from ..analysis import processes

            return processes.key_averages(
                self.results,
                pid,
                self.subprocesses,
                group_by_stack_n,
                self.profile_memory,
                include_context=include_context,
                idle=idle,
                group_by_thread=group_by_thread,
            )
        return KeyAverages(
            self.results,
            group_by_stack_n=group_by_stack_n,
            show_memory=self.profile_memory,
            include_context=include_context,
            idle=idle,
            group_by_thread=group_by_thread,
            group_by_input_shape=group_by_input_shape,
        )

    def ops(self, pid: int | str | None = None) -> np.ndarray:
        """One row per op: see docs/tables.md for the fields. ``pid`` (with
        ``subprocesses=True``): None the main process, an int that process,
        "workers" summed over child processes, "all" summed over every process."""
        if pid is not None:  # -- subprocesses --
            from ..analysis import processes

            return processes.select(self.results, pid, self.subprocesses).ops()
        return self.results.ops()

    def events(self) -> EventList:
        """Every call, range and CUDA API call of the last window, one
        :class:`gpuprof.events.FunctionEvent` each (torch.profiler's ``prof.events()``;
        times in microseconds)."""
        from ..results.events import EventList

        return EventList(self.results)

    def kernels(self) -> np.ndarray:
        """One row per GPU activity name and device."""
        return self.results.kernels()

    def gpu_events(self) -> np.ndarray:
        """One row per GPU activity, joined to the op that launched it."""
        return self.results.gpu_events()

    def steps(self) -> np.ndarray:
        """One row per recorded step with CPU and GPU time breakdowns."""
        return self.results.steps()

    def call_tree(self) -> np.ndarray:
        """The call tree: node id, parent id, op row, times and calls."""
        return self.results.call_tree()

    def diagnose(self) -> Diagnosis:
        """Findings about the last recorded window, most severe first (see gpuprof.diagnose)."""
        from ..analysis.diagnose import diagnose

        return diagnose(self.results)

    def export_chrome_trace(
        self,
        path: Path,
        use_python_export: bool = False,
        *,
        min_duration_us: float = 0.0,
        max_events: int | None = None,
    ) -> str:
        """Write the last recorded window as a Chrome/Perfetto trace (``.gz`` compresses);
        opens in Perfetto, chrome://tracing, TensorBoard and HTA. ``min_duration_us``
        leaves out shorter calls that launched no CUDA work, and counts them in the
        file's header; ``max_events`` keeps about that many events, those of the first
        and the last steps, and says in the header which steps it left out (default
        None: every event). See docs/traces.md.

        ``use_python_export`` is accepted for torch.profiler code (its
        ``tensorboard_trace_handler`` passes it): it picks between torch's two trace
        writers, and gpuprof has one, so it changes nothing."""
        from ..exporters.chrome import export_chrome_trace

        if not isinstance(use_python_export, bool):
            raise TypeError(
                f"export_chrome_trace(): use_python_export must be a bool, "
                f"got {use_python_export!r}"
            )

        results = self.results
        n = len(results.spans()) + len(results.windows[-1]["gpu"])
        if max_events is not None and isinstance(max_events, int):
            n = min(n, max_events)
        with progress(f"writing {path}", n):
            return export_chrome_trace(
                results, path, min_duration_us=min_duration_us, max_events=max_events
            )

    def export_stacks(self, path: Path, metric: str = "self_cpu_time_total") -> str:
        """Write collapsed stacks for flame graphs; ``metric`` is
        ``"self_cpu_time_total"`` or ``"self_cuda_time_total"``."""
        from ..exporters.stacks import export_stacks

        results = self.results
        with progress(f"writing {path}", sum(len(w["nodes"]) for w in results.windows)):
            return export_stacks(results, path, metric)

    def export_html(
        self, path: Path, *, trace: Path | None = None, title: str | None = None
    ) -> str:
        """Write one self-contained HTML report (no network needed to open it): the
        diagnosis, the steps, the op and kernel tables, a flame graph of the call tree,
        the memory curves and, where recorded, the processes and this rank's
        communication. ``trace``: the Chrome trace of this profile, when one was
        written; the page links it and opens it in Perfetto on request. See
        docs/report.md."""
        from ..exporters.html import export_html

        processes = self.processes() if self.subprocesses else None  # -- subprocesses --
        # a live profile's memory sampler holds the allocator and host curves
        sampler = getattr(self, "_memory_sampler", None)
        results = self.results
        with progress(f"writing {path}", len(results.spans())):
            return export_html(
                results, path, sampler=sampler, processes=processes, trace=trace, title=title
            )

    def save(self, path: Path) -> str:
        """Save every kept window to one file; ``gpuprof.load(path)`` reopens it."""
        from ..exporters.saved import save

        results = self.results
        with progress(f"saving {path}", sum(len(w["spans"]) for w in results.windows)):
            return save(results, path)

    # -- memory (gpuprof.memory, docs/memory.md) ------------------------------
    def _memory_check(self, what: str) -> None:
        if not self.profile_memory:
            path = getattr(self, "path", None)
            if path is not None:
                raise RuntimeError(
                    f"{what}: {path!r} has no memory data: it was recorded "
                    "without profile_memory=True (python -m gpuprof run "
                    "--memory)"
                )
            raise RuntimeError(
                f"{what}: memory was not recorded; use gpuprof.profile(profile_memory=True)"
            )

    def memory_curve(self, device: str = "cuda:0", source: str = "auto") -> np.ndarray:
        """Memory over time of one device, as a NumPy structured array.

        Args:
            device: "cuda:N" (or "cuda" for "cuda:0") for device memory: fields
                timestamp_ns, allocated_bytes, reserved_bytes; "cpu" for the host:
                timestamp_ns, rss_bytes. Timestamps are on the profiler clock.
            source: for a CUDA device, "auto" (every framework allocator that held
                memory on the device, summed, each at its latest sample: PyTorch's and CuPy's
                together when both allocate there; CUPTI's device allocations when
                none was sampled; ``memory_summary()`` names the one used), "cupti"
                (device allocations CUPTI recorded, relative to the window start),
                "torch" or "cupy" (that allocator alone).

        Raises:
            ValueError: a device or source not of the forms above.
            RuntimeError: the profile was made without profile_memory=True.
        """
        from ..analysis import memory

        memory.parse_device(device)
        memory.parse_source(source)
        self._memory_check("memory_curve()")
        results = self.results
        return memory.memory_curve(results, device, sampler=results.memory_samples, source=source)

    def memory_summary(self) -> MemorySummary:
        """Peak memory per device and on the host, the op and line that reached it, the
        largest allocations, and allocator overhead (a :class:`gpuprof.memory.MemorySummary`:
        ``print()`` it, ``.to_dict()``).

        Raises:
            RuntimeError: the profile was made without profile_memory=True.
        """
        from ..analysis import memory

        self._memory_check("memory_summary()")
        results = self.results
        return memory.memory_summary(results, sampler=results.memory_samples)

    def plot_memory(self, path_or_ax: Any = None) -> Any:
        """Plot the memory curves with matplotlib (``pip install matplotlib``).

        Args:
            path_or_ax: None returns a new matplotlib Figure; a file path saves the
                figure there (format from the extension) and returns it; a matplotlib
                Axes is drawn into and returned.
        """
        from ..analysis import memory

        self._memory_check("plot_memory()")
        results = self.results
        return memory.plot_memory(results, path_or_ax, sampler=results.memory_samples)

    def export_memory_timeline(self, path: Path, device: str | None = None) -> str:
        """Write memory over time, as torch.profiler's ``export_memory_timeline``: a path
        ending in ``.html`` gets the plot (a PNG inside, needs matplotlib); ``.json`` or
        ``.json.gz`` gets ``[times, sizes]``: times in microseconds on the profiler
        clock and, per time, the sizes in bytes (``[allocated, reserved]`` for a CUDA
        device, ``[rss]`` for "cpu").

        Args:
            path: the file to write.
            device: "cuda:N" or "cpu"; default "cuda:0" when CUDA was captured, else "cpu".

        Returns:
            The path written.

        Raises:
            RuntimeError: the profile was made without profile_memory=True.
            ValueError: a path suffix or device not of the forms above.
        """
        import gzip
        import io
        import json

        import numpy as np

        self._memory_check("export_memory_timeline()")
        path = str(path)
        if not path.endswith((".html", ".json", ".json.gz")):
            raise ValueError(
                f"export_memory_timeline(): path must end in .html, .json or .json.gz, got {path!r}"
            )
        if device is None:
            device = "cuda:0" if self.results.cuda.get("active") else "cpu"
        curve = self.memory_curve(device)
        if path.endswith(".html"):
            import base64

            fig = self.plot_memory()
            png = io.BytesIO()
            fig.savefig(png, format="png", bbox_inches="tight")
            img = base64.b64encode(png.getvalue()).decode("ascii")
            text = (
                f"<html><head><meta charset='utf-8'><title>gpuprof memory timeline"
                f"</title></head><body><img src='data:image/png;base64,{img}'></body>"
                f"</html>\n"
            )
        else:
            fields = [f for f in curve.dtype.names or () if f != "timestamp_ns"]
            times = (curve["timestamp_ns"] / 1e3).tolist()
            sizes = np.stack([curve[f] for f in fields], axis=1).tolist() if len(curve) else []
            text = json.dumps([times, sizes])
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "wt", encoding="utf-8") as f:
            f.write(text)
        return path

    # -- printable views (terminal text, HTML in notebooks) -----------------
    def kernel_table(self, sort_by: str = "total_ns", row_limit: int = 20) -> Table:
        """GPU activities by name, most time first (see gpuprof.views.kernel_table)."""
        from ..results.views import kernel_table

        return kernel_table(self.kernels(), sort_by=sort_by, row_limit=row_limit)

    def module_table(
        self,
        max_depth: int | None = None,
        row_limit: int | None = None,
        min_share: float = 0.0,
    ) -> Table:
        """One line per ``torch.nn.Module`` instance, nested as the model is, with its
        forward and backward GPU time (see gpuprof.views.module_table, docs/backward.md)."""
        from ..results.views import module_table

        res = self.results
        return module_table(
            res.modules(), res.gpu_work_ns(), max_depth, row_limit, min_share=min_share
        )

    def modules(self) -> np.ndarray:
        """The modules table as a NumPy structured array (docs/backward.md, "Modules")."""
        return self.results.modules()

    def step_table(self) -> Table:
        """One line per recorded step: wall, GPU busy/idle, memcpy, comm, sync wait."""
        from ..results.views import step_table

        return step_table(self.steps())

    def plot_steps(self, path_or_ax: Any = None) -> Any:
        """Stacked bar per step of GPU compute, memcpy, comm, sync wait and idle (matplotlib)."""
        from ..results.views import plot_steps

        return plot_steps(self.steps(), path_or_ax)
