"""The Lightning profiler, written once for both package names (``lightning`` and
``pytorch_lightning``): :func:`build` makes the classes from the package's own
``Profiler`` and ``Callback`` base classes."""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING, Any

from ..api.profiler import record_function
from ._session import SessionResults, StepSession, check_output

# Lightning's action names (lightning/pytorch/loops/training_epoch_loop.py): the fetch
# of each training batch, and the batch itself (forward, backward, optimizer step).
FETCH = "[_TrainingEpochLoop].train_dataloader_next"
BATCH = "run_training_batch"

_WHO = "GpuprofProfiler()"


class GpuprofProfilerMixin(SessionResults):
    """Everything of ``GpuprofProfiler`` but its Lightning base class (see :func:`build`)."""

    if TYPE_CHECKING:  # set by Lightning's Profiler and by build(), which compose the class
        _stage: str | None
        _end_callback_class: Any
        dirpath: Any

    def __init__(
        self,
        schedule=None,
        output=None,
        filename: str | None = None,
        *,
        log_metrics: bool = True,
        row_limit: int = 20,
        sort_by: str | None = None,
        on_trace_ready=None,
        dirpath=None,
        **profile_kwargs,
    ):
        # Lightning's Profiler, which build() puts after this class; first: its __del__
        # needs its fields
        super().__init__(dirpath=None, filename=None)  # type: ignore[call-arg]
        if dirpath is not None:
            if output is not None:
                raise ValueError(
                    f"{_WHO}: give output= or dirpath= (Lightning's name for the "
                    "same folder), not both"
                )
            output = dirpath
        output = check_output(output, _WHO)
        if filename is not None and (
            not isinstance(filename, str) or not filename or os.sep in filename
        ):
            raise ValueError(
                f"{_WHO}: filename must be a file name (no folder) or None, got {filename!r}"
            )
        self.dirpath = output or None
        self.filename = filename
        self._output = output
        self._session = StepSession(
            _WHO,
            schedule=schedule,
            log=self._log_to_loggers,
            data_fetch=(FETCH,),
            on_trace_ready=on_trace_ready,
            row_limit=row_limit,
            sort_by=sort_by,
            log_metrics=log_metrics,
            **profile_kwargs,
        )
        self._fetch_range = record_function(FETCH)
        self._in_fetch = False
        self._fitting = False  # between setup("fit") and the end of training
        self._fit_stage = False  # the Trainer's current stage is fit
        self._trainer: weakref.ref[Any] | None = None  # weakref to the Trainer, set in setup()
        self._files: list[str] = []
        self._summary: str | None = None

    # -- the results -------------------------------------------------------------------
    @property
    def files(self) -> list[str]:
        """The files written at the end of training (empty before, or with output=False)."""
        return list(self._files)

    # -- Lightning's Profiler interface ----------------------------------------------------
    def setup(self, stage: str, local_rank=None, log_dir=None) -> None:
        super().setup(stage=stage, local_rank=local_rank, log_dir=log_dir)  # type: ignore[misc]  # Lightning's
        if not self._output:  # the log dir of this run (a new version for each fit)
            self.dirpath = log_dir
        self._summary = None
        self._fit_stage = stage == "fit"
        if not self._fit_stage:
            return
        module = getattr(self, "_lightning_module", None)  # set by the Trainer before setup()
        trainer = getattr(module, "trainer", None) if module is not None else None
        self._trainer = weakref.ref(trainer) if trainer is not None else None
        self._fitting = True
        self._files = []
        if trainer is not None and not any(
            isinstance(cb, self._end_callback_class) and cb.profiler is self
            for cb in trainer.callbacks
        ):
            trainer.callbacks.append(self._end_callback_class(self))

    def start(self, action_name: str) -> None:
        if action_name == FETCH and self._fitting:
            if not self._session.active:
                self._session.start()
            self._fetch_range.__enter__()
            self._in_fetch = True

    def stop(self, action_name: str) -> None:
        if action_name == BATCH:
            if self._session.active:
                self._session.step(self._logger_step)  # called for recorded steps only
        elif action_name == FETCH and self._in_fetch:
            self._in_fetch = False
            self._fetch_range.__exit__(None, None, None)

    def summary(self) -> str:
        if not self._fit_stage:
            return ""  # validate, test and predict are not profiled
        self.end_training()
        if self._summary is None:
            trainer = self._trainer() if self._trainer is not None else None
            rank = f", rank {trainer.global_rank}" if trainer and trainer.world_size > 1 else ""
            self._summary = self._session.summary(
                f"{(self._stage or 'fit').upper()} Profiler Report (gpuprof{rank})", self._files
            )
        return self._summary

    def teardown(self, stage) -> None:
        session = getattr(self, "_session", None)  # __del__ of a half-made profiler
        if session is not None and session.active:
            self._close_fetch()
            session.stop()  # without files: training did not end (the Trainer is going away)
        self._fitting = False
        super().teardown(stage=stage)  # type: ignore[misc]  # Lightning's Profiler, after this class

    # -- pickling (Lightning's ddp_spawn pickles the Trainer and its profiler) ---------------
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_trainer"] = None  # weak references; the Trainer sets them again
        state.pop("_lightning_module", None)
        state["_fetch_range"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._fetch_range = record_function(FETCH)

    # -- internals -------------------------------------------------------------------------
    def end_training(self) -> None:
        """Stop recording and write the files (once per fit); Lightning calls it when
        training ends or fails, and ``summary()`` calls it."""
        self._fitting = False
        self._close_fetch()
        if not self._session.active:
            return
        self._session.stop()
        if self._output is not False and self.dirpath is not None:
            self._files = self._session.write_files(os.fspath(self.dirpath), self._file_prefix())

    def _close_fetch(self) -> None:
        if self._in_fetch:
            self._in_fetch = False
            self._fetch_range.__exit__(None, None, None)

    def _file_prefix(self) -> str:
        """``STAGE[-FILENAME][-RANK]``: the names Lightning's profilers give their files,
        with the global rank (unique across nodes) when there are several processes."""
        parts = [self._stage or "fit"]
        if self.filename:
            parts.append(self.filename)
        trainer = self._trainer() if self._trainer is not None else None
        if trainer is not None and trainer.world_size > 1:
            parts.append(str(trainer.global_rank))
        return "-".join(parts)

    def _logger_step(self):
        """The step Lightning logs this batch's own metrics at (its loggers' x axis)."""
        trainer = self._trainer() if self._trainer is not None else None
        if trainer is None:
            return None
        loop = getattr(trainer.fit_loop, "epoch_loop", None)
        return getattr(loop, "_batches_that_stepped", trainer.global_step)

    def _log_to_loggers(self, metrics: dict, step) -> None:
        trainer = self._trainer() if self._trainer is not None else None
        if trainer is None:
            return
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)


def build(profilers, callbacks, package: str):
    """(GpuprofProfiler, its end-of-training callback) for one Lightning package, from
    its ``profilers`` and ``callbacks`` modules."""

    class _EndOfTraining(callbacks.Callback):
        """Added to the Trainer's callbacks by the profiler's setup(): stops recording
        and writes the files when training ends or raises."""

        def __init__(self, profiler):
            self._profiler = weakref.ref(profiler)

        @property
        def profiler(self):
            return self._profiler()

        @property
        def state_key(self) -> str:
            return "GpuprofProfiler"

        def on_train_end(self, trainer, pl_module) -> None:
            p = self._profiler()
            if p is not None:
                p.end_training()

        def on_exception(self, trainer, pl_module, exception) -> None:
            self.on_train_end(trainer, pl_module)

    # Lightning calls every callable hook of every callback at each batch, each inside
    # a profiler action (call.py, _call_callback_hooks: ``if callable(fn)``): a no-op
    # hook of Callback's costs microseconds per batch. The hooks this callback does
    # not use are None, which Lightning skips. (Checkpoint hooks are called without
    # that check, and stay.)
    for name in dir(callbacks.Callback):
        if name.startswith("on_") and name not in (
            "on_train_end",
            "on_exception",
            "on_save_checkpoint",
            "on_load_checkpoint",
        ):
            setattr(_EndOfTraining, name, None)

    class GpuprofProfiler(GpuprofProfilerMixin, profilers.Profiler):
        __doc__ = _DOC.format(package=package)
        _end_callback_class = _EndOfTraining

    for cls in (GpuprofProfiler, _EndOfTraining):
        cls.__module__ = f"gpuprof.integrations.{package}"
        cls.__qualname__ = cls.__name__
    return GpuprofProfiler, _EndOfTraining


_DOC = """gpuprof as a Lightning profiler: ``Trainer(profiler=GpuprofProfiler(...))``.

    Each training batch is a step: it runs from the end of the previous batch
    through the fetch of this one (Lightning's ``train_dataloader_next``) to the end
    of its forward, backward and optimizer step. Recording starts at the first
    batch (after the sanity check) and ends when training ends. For each recorded
    step, the step metrics (step time, data wait, and with GPU capture GPU busy,
    sync wait, communication, kernels; peak device memory on CUDA) go to every
    logger of the Trainer, under ``gpuprof/...`` names, at the step Lightning logs
    that batch's own metrics at; ``steps()`` returns them for the whole run.

    At the end of training, the last window's Chrome trace
    (``STAGE[-FILENAME][-RANK].<ns>.pt.trace.json.gz``) and the recorded windows
    (``STAGE[-FILENAME][-RANK].gpuprof``) are written to ``output``, by default the
    Trainer's log dir, as Lightning's PyTorchProfiler does; ``summary()`` (printed
    by Lightning at the end of ``fit``) gives the op table, the step metrics and the
    diagnosis. Validation, test and predict stages are not profiled.

    Args:
        schedule: ``gpuprof.schedule(...)`` (steps are training batches); None records
            every batch. ``gpuprof.schedule(wait=98, warmup=1, active=1)`` records one
            batch in 100: metrics over the whole run at about 1% cost.
        output: folder for the files; None: the Trainer's ``log_dir``; False: no files.
        filename: as Lightning's profilers: the summary goes to ``FILENAME.txt`` in
            that folder instead of the log, and the files' names include it.
        log_metrics: send each recorded step's metrics to the Trainer's loggers.
        row_limit: rows of the op table in ``summary()`` (-1: all).
        sort_by: a ``key_averages().table(sort_by=...)`` key; default
            ``self_cuda_time_total`` with GPU capture, else ``self_cpu_time_total``.
        on_trace_ready: callable(prof) called as each window closes (for example
            ``gpuprof.tensorboard_trace_handler(dir)`` for a trace per window).
        dirpath: Lightning's name for ``output``.
        **profile_kwargs: any other ``gpuprof.profile`` argument (``activities``,
            ``profile_memory``, ``acc_events``, ``max_events``...).

    Raises:
        TypeError, ValueError: a bad argument, named, before training starts.

    Needs the ``{package}`` package (Lightning 2.0 or later).
    """
