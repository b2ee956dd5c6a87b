"""gpuprof in a training loop written with Hugging Face ``accelerate``.

    from gpuprof.integrations.accelerate import profile

    with profile(accelerator, schedule=gpuprof.schedule(wait=98, warmup=1, active=1),
                 output="prof") as prof:
        for batch in train_dataloader:
            ...
            prof.step()

Imports ``accelerate`` when this module is imported; ``import gpuprof`` never
does. See docs/integrations.md.
"""

from __future__ import annotations

from ._session import SessionResults, StepSession, check_output, require

__all__ = ["profile"]

_accelerate = require(
    "accelerate",
    what="gpuprof.integrations.accelerate",
    pip="accelerate",
    minimum=(0, 20),
    tested="accelerate 1.15",
)

_WHO = "gpuprof.integrations.accelerate.profile()"


class profile(SessionResults):
    """Profile an ``accelerate`` training loop: ``prof.step()`` after each step.

    As each recording window closes, the metrics of its steps (step time, data wait,
    and with GPU capture GPU busy, sync wait, communication, kernels; peak device
    memory on CUDA) go to ``accelerator.log(..., step=N)`` under ``gpuprof/...``
    names, N being the step's number (``prof.step()`` calls before it): every
    tracker of ``Accelerator(log_with=...)`` receives them, on the main process.
    The time a step waits for data is the time the loop spends in the data loader's
    iterator (``for batch in loader:``), or in the ops named in ``data_fetch``.

    When the block ends, each process writes the last window's Chrome trace
    (``gpuprof-train[-RANK].<ns>.pt.trace.json.gz``) and the recorded windows
    (``gpuprof-train[-RANK].gpuprof``) to ``output`` when it is given.

    Args:
        accelerator: the ``accelerate.Accelerator`` of the loop.
        schedule: ``gpuprof.schedule(...)``; None records every step.
        output: folder for the files; None: no files.
        log_metrics: log each recorded step's metrics with ``accelerator.log``.
        data_fetch: names of ops (``record_function`` labels or Python functions, as
            ``prof.ops()`` names them) in which the loop fetches its batches, when it
            does not iterate the loader itself.
        row_limit, sort_by: the op table of :meth:`summary`.
        on_trace_ready: callable(prof) called as each window closes.
        **profile_kwargs: any other ``gpuprof.profile`` argument.

    Raises:
        TypeError, ValueError: a bad argument, named.
    """

    def __init__(
        self,
        accelerator,
        schedule=None,
        output=None,
        *,
        log_metrics: bool = True,
        data_fetch=(),
        row_limit: int = 20,
        sort_by: str | None = None,
        on_trace_ready=None,
        **profile_kwargs,
    ):
        if not isinstance(accelerator, _accelerate.Accelerator):
            raise TypeError(
                f"{_WHO}: accelerator must be an accelerate.Accelerator, got {accelerator!r}"
            )
        if isinstance(data_fetch, str) or not all(isinstance(n, str) for n in data_fetch):
            raise TypeError(
                f"{_WHO}: data_fetch must be a list of op names (str), got {data_fetch!r}"
            )
        output = check_output(output, _WHO)
        self._output = None if output is False else output
        self.accelerator = accelerator
        self._session = StepSession(
            _WHO,
            schedule=schedule,
            log=self._log,
            data_fetch=tuple(data_fetch),
            on_trace_ready=on_trace_ready,
            row_limit=row_limit,
            sort_by=sort_by,
            log_metrics=log_metrics,
            **profile_kwargs,
        )
        self.files: list[str] = []
        self._summary: str | None = None

    def start(self) -> None:
        self.files = []
        self._summary = None
        self._session.start()

    def step(self) -> None:
        """End a step."""
        self._session.step()

    def stop(self) -> None:
        """Stop recording and write the files."""
        if not self._session.active:
            return
        self._session.stop()
        if self._output:
            acc = self.accelerator
            rank = f"-{acc.process_index}" if acc.num_processes > 1 else ""
            self.files = self._session.write_files(self._output, "gpuprof-train" + rank)

    def __enter__(self) -> profile:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.stop()
        except Exception:
            if exc_type is None:
                raise

    def summary(self) -> str:
        """Op table, step metrics and diagnosis, as text (after the block)."""
        if self._session.active:
            raise RuntimeError(
                f"{_WHO}: summary() needs the profile stopped (after the with "
                "block, or prof.stop())"
            )
        if self._summary is None:
            acc = self.accelerator
            title = "gpuprof report" + (
                f" (rank {acc.process_index})" if acc.num_processes > 1 else ""
            )
            self._summary = self._session.summary(title, self.files)
        return self._summary

    def _log(self, metrics: dict, step) -> None:
        self.accelerator.log(dict(metrics), step=step)
