"""gpuprof as a Hugging Face ``Trainer`` callback:
``Trainer(..., callbacks=[GpuprofCallback(...)])``.

Imports ``transformers`` when this module is imported; ``import gpuprof`` never
does. See docs/integrations.md.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any

from ._session import SessionResults, StepSession, check_output, require

__all__ = ["GpuprofCallback"]

_transformers: Any = require(  # the module, imported at run time
    "transformers",
    what="gpuprof.integrations.transformers",
    pip="transformers",
    minimum=(4, 46),
    tested="transformers 5.24",
)

# Where Trainer fetches the batches of one optimizer step (transformers >= 4.46); on
# CPython 3.10 code objects have no qualified name.
FETCH = ("Trainer.get_batch_samples", "get_batch_samples")

_WHO = "GpuprofCallback()"
_log = logging.getLogger(__name__)


class GpuprofCallback(SessionResults, _transformers.TrainerCallback):
    """gpuprof as a ``transformers.TrainerCallback``.

    Each optimizer step is a step (``on_step_end``; with gradient accumulation it
    spans several batches): it runs from the end of the previous step through the
    fetch of its batches (``Trainer.get_batch_samples``), forward, backward and
    optimizer step. Recording runs from ``on_train_begin`` to ``on_train_end``. As
    each recording window closes, the metrics of its steps (step time, data wait, and
    with GPU capture GPU busy, sync wait, communication, kernels; peak device memory
    on CUDA) go through ``Trainer.log``, under ``gpuprof/...`` names: into
    ``trainer.state.log_history`` and to every ``report_to`` integration
    (TensorBoard, W&B, MLflow...), at the global step the window closed at.
    ``steps()`` returns them for the whole run.

    At the end of training, the last window's Chrome trace
    (``gpuprof-train[-RANK].<ns>.pt.trace.json.gz``), the recorded windows
    (``gpuprof-train[-RANK].gpuprof``) and the summary (``gpuprof-train[-RANK].txt``:
    op table, step metrics, diagnosis) are written to ``output``, by default
    ``args.output_dir``; ``summary()`` returns the same text.

    Args:
        schedule: ``gpuprof.schedule(...)`` over optimizer steps; None records every
            step. ``gpuprof.schedule(wait=98, warmup=1, active=1)`` records one step
            in 100: metrics over the whole run at about 1% cost.
        output: folder for the files; None: ``args.output_dir``; False: no files.
        log_metrics: log each recorded step's metrics with ``Trainer.log``.
        row_limit: rows of the op table in the summary (-1: all).
        sort_by: a ``key_averages().table(sort_by=...)`` key; default
            ``self_cuda_time_total`` with GPU capture, else ``self_cpu_time_total``.
        on_trace_ready: callable(prof) called as each window closes.
        **profile_kwargs: any other ``gpuprof.profile`` argument.

    Raises:
        TypeError, ValueError: a bad argument, named, when the callback is made.

    If training raises, Hugging Face calls no callback: call :meth:`stop` (or let the
    process end) to stop recording.
    """

    def __init__(
        self,
        schedule=None,
        output=None,
        *,
        log_metrics: bool = True,
        row_limit: int = 20,
        sort_by: str | None = None,
        on_trace_ready=None,
        **profile_kwargs,
    ):
        self._output = check_output(output, _WHO)
        self._session = StepSession(
            _WHO,
            schedule=schedule,
            log=self._log_to_trainer,
            data_fetch=FETCH,
            on_trace_ready=on_trace_ready,
            row_limit=row_limit,
            sort_by=sort_by,
            log_metrics=log_metrics,
            **profile_kwargs,
        )
        self._trainer = None
        self._state = None
        self._files: list[str] = []
        self._summary: str | None = None

    # -- the results -------------------------------------------------------------------
    @property
    def files(self) -> list[str]:
        """The files written at the end of training."""
        return list(self._files)

    def summary(self) -> str:
        """Op table, step metrics and diagnosis of the run ("" before training ends)."""
        return self._summary or ""

    def stop(self) -> None:
        """Stop recording now (after training raised, for example); no files."""
        self._session.stop()

    # -- TrainerCallback -----------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self._session.stop()  # a run that raised left it recording
        self._trainer = _calling_trainer()
        self._state = state
        if self._trainer is None and self._session.log is not None:
            warnings.warn(
                "gpuprof: GpuprofCallback could not find the Trainer calling it; step "
                "metrics go to state.log_history only, not to report_to "
                "integrations",
                RuntimeWarning,
                stacklevel=2,
            )
        self._files = []
        self._summary = None
        self._session.start()

    def on_step_end(self, args, state, control, **kwargs):
        if self._session.active:
            self._session.step()

    def on_train_end(self, args, state, control, **kwargs):
        if not self._session.active:
            return
        self._session.stop()
        rank = f"-{args.process_index}" if args.world_size > 1 else ""
        prefix = "gpuprof-train" + rank
        folder = args.output_dir if self._output is None else self._output
        if self._output is not False and folder:
            self._files = self._session.write_files(folder, prefix)
        title = "gpuprof report" + (f" (rank {args.process_index})" if rank else "")
        self._summary = self._session.summary(title, self._files)
        if self._output is not False and folder:
            path = os.path.join(folder, prefix + ".txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(self._summary)
            self._files.append(path)
        _log.info("%s", self._summary)
        self._trainer = None

    # -- logging -------------------------------------------------------------------------
    def _log_to_trainer(self, metrics: dict, step) -> None:
        if self._trainer is not None:
            self._trainer.log(dict(metrics))
        elif self._state is not None:
            self._state.log_history.append({**metrics, "step": self._state.global_step})


def _calling_trainer():
    """The ``transformers.Trainer`` whose callback handler is calling us: a callback
    is handed the arguments, state and model, but not the Trainer, whose ``log()``
    reaches every ``report_to`` integration."""
    trainer_type = _transformers.Trainer
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_varnames[:1] == ("self",):
            obj = f.f_locals.get("self")
            if isinstance(obj, trainer_type):
                return obj
        f = f.f_back
    return None
