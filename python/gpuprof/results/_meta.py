"""What a recording says about itself besides its windows: :class:`RecordingMeta`
(``Results.meta``), read by the exporters, the report and saved profiles."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RecordingMeta"]


@dataclass
class RecordingMeta:
    """A recording's settings and the process it ran in.

    The profile fills the settings; a saved profile (``gpuprof.save``) also holds the
    process fields, which a live one leaves None and the exporters take from the
    running process.

    Attributes:
        profile_memory: ``profile(profile_memory=True)``: memory was recorded.
        with_stack: ``profile(with_stack=True)``.
        trace_metadata: ``prof.add_metadata()`` / ``add_metadata_json()``: key to JSON
            text, written into the trace's header.
        thread_names_by_tid: every thread of the session by OS thread id, kept past
            each thread's end (gpuprof.record._threads); keys are str in a saved file.
        pid, ppid, process_name: the recorded process (saved profiles).
        thread_names: ``Results.thread_names()`` as saved: thread ident (str) to name.
        device_properties: the GPUs' properties as saved (the trace's
            ``deviceProperties``); None: ask the driver when GPU capture was on.
        distributed_info: the rank's ``distributedInfo`` as saved; None: ask
            torch.distributed or the environment.
    """

    profile_memory: bool = False
    with_stack: bool = False
    trace_metadata: dict[str, str] = field(default_factory=dict)
    thread_names_by_tid: dict[Any, str] | None = None
    pid: int | None = None
    ppid: int | None = None
    process_name: str | None = None
    thread_names: dict[str, str] | None = None
    device_properties: list[dict[str, Any]] | None = None
    distributed_info: dict[str, Any] | None = None

    @classmethod
    def of(cls, meta: RecordingMeta | Mapping[str, Any] | None) -> RecordingMeta:
        """A copy of ``meta``; a mapping is read as a saved file's ``meta`` (keys this
        version does not know, from a later one, are ignored)."""
        if meta is None:
            return cls()
        if isinstance(meta, RecordingMeta):
            return dataclasses.replace(meta)
        if not isinstance(meta, Mapping):
            raise TypeError(
                f"Results(meta=...): expected a gpuprof RecordingMeta or a mapping, "
                f"got {type(meta).__name__}"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        out = cls(**{k: v for k, v in meta.items() if k in known})
        out.profile_memory, out.with_stack = bool(out.profile_memory), bool(out.with_stack)
        out.trace_metadata = dict(out.trace_metadata or {})
        return out

    def to_json(self) -> dict[str, Any]:
        """The fields that are set, as a saved file's ``meta`` holds them."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }
