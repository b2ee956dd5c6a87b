"""The read-only accessors shared by a live ``gpuprof.profile`` and a loaded
``.gpuprof`` file: one implementation over ``self.results``.

A class using this mixin provides ``results`` (a :class:`gpuprof.Results`),
``profile_memory`` and ``subprocesses`` (bools).
"""

from __future__ import annotations

from ._progress import progress

__all__ = ["ResultAccessors"]


class ResultAccessors:
    """ops(), kernels(), steps(), key_averages(), diagnose(), exports and views."""

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0,
                     pid=None):
        """Op statistics as a :class:`gpuprof.tables.KeyAverages` (``.table()`` prints).
        ``pid``: see :meth:`ops`."""
        from .tables import KeyAverages

        if group_by_input_shape:
            raise ValueError("key_averages(): group_by_input_shape is not supported (gpuprof "
                             "does not record input shapes)")
        if pid is not None:  # -- subprocesses --
            from . import processes

            return processes.key_averages(self.results, pid, self.subprocesses,
                                          group_by_stack_n, self.profile_memory)
        return KeyAverages(self.results, group_by_stack_n=group_by_stack_n,
                           show_memory=self.profile_memory)

    def ops(self, pid=None):
        """One row per op: see docs/tables.md for the fields. ``pid`` (with
        ``subprocesses=True``): None the main process, an int that process,
        "workers" summed over child processes, "all" summed over every process."""
        if pid is not None:  # -- subprocesses --
            from . import processes

            return processes.select(self.results, pid, self.subprocesses).ops()
        return self.results.ops()

    def kernels(self):
        """One row per GPU activity name and device."""
        return self.results.kernels()

    def gpu_events(self):
        """One row per GPU activity, joined to the op that launched it."""
        return self.results.gpu_events()

    def steps(self):
        """One row per recorded step with CPU and GPU time breakdowns."""
        return self.results.steps()

    def call_tree(self):
        """The call tree: node id, parent id, op row, times and calls."""
        return self.results.call_tree()

    def diagnose(self):
        """Findings about the last recorded window, most severe first (see gpuprof.diagnose)."""
        from .diagnose import diagnose

        return diagnose(self.results)

    def export_chrome_trace(self, path, *, min_duration_us: float = 0.0) -> str:
        """Write the last recorded window as a Chrome/Perfetto trace (``.gz`` compresses);
        opens in Perfetto, chrome://tracing, TensorBoard and HTA. ``min_duration_us``
        leaves out shorter calls that launched no CUDA work, and counts them in the
        file's header. See docs/traces.md."""
        from .exporters.chrome import export_chrome_trace

        results = self.results
        with progress(f"writing {path}", len(results.spans())):
            return export_chrome_trace(results, path, min_duration_us=min_duration_us)

    def export_stacks(self, path, metric: str = "self_cpu_time_total") -> str:
        """Write collapsed stacks for flame graphs; ``metric`` is
        ``"self_cpu_time_total"`` or ``"self_cuda_time_total"``."""
        from .exporters.stacks import export_stacks

        return export_stacks(self.results, path, metric)

    def export_html(self, path, *, trace=None, title: str | None = None) -> str:
        """Write one self-contained HTML report (no network needed to open it): the
        diagnosis, the steps, the op and kernel tables, a flame graph of the call tree,
        the memory curves and, where recorded, the processes and this rank's
        communication. ``trace``: the Chrome trace of this profile, when one was
        written; the page links it and opens it in Perfetto on request. See
        docs/report.md."""
        from .exporters.html import export_html

        processes = self.processes() if self.subprocesses else None  # -- subprocesses --
        # a live profile's memory sampler holds the allocator and host curves
        sampler = getattr(self, "_memory_sampler", None)
        return export_html(self.results, path, sampler=sampler, processes=processes,
                           trace=trace, title=title)

    def save(self, path) -> str:
        """Save every kept window to one file; ``gpuprof.load(path)`` reopens it."""
        from .exporters.saved import save

        results = self.results
        with progress(f"saving {path}", sum(len(w["spans"]) for w in results.windows)):
            return save(results, path)

    # -- printable views (terminal text, HTML in notebooks) -----------------
    def kernel_table(self, sort_by: str = "total_ns", row_limit: int = 20):
        """GPU activities by name, most time first (see gpuprof.views.kernel_table)."""
        from .views import kernel_table

        return kernel_table(self.kernels(), sort_by=sort_by, row_limit=row_limit)

    def step_table(self):
        """One line per recorded step: wall, GPU busy/idle, memcpy, comm, sync wait."""
        from .views import step_table

        return step_table(self.steps())

    def plot_steps(self, path_or_ax=None):
        """Stacked bar per step of GPU compute, memcpy, comm, sync wait and idle (matplotlib)."""
        from .views import plot_steps

        return plot_steps(self.steps(), path_or_ax)
