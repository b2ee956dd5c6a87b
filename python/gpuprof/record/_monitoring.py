"""The sys.monitoring (PEP 669) hook backend, CPython 3.12+.

The callbacks are C functions (csrc/record/hook.c, gp_hook_mon_*); this module
claims the profiler tool id and registers them. Set GPUPROF_HOOK=setprofile
or =monitoring to choose; the default is monitoring where available (see
docs/benchmarks.md for the measurement behind that choice).
"""

from __future__ import annotations

import os
import sys

from .. import _gpuprof

__all__ = ["available", "install", "uninstall", "use_monitoring"]

_TOOL_NAME = "gpuprof"


def available() -> bool:
    return hasattr(sys, "monitoring") and hasattr(_gpuprof, "_mon_start")


def use_monitoring() -> bool:
    """Whether profiles use sys.monitoring (GPUPROF_HOOK overrides the default)."""
    choice = os.environ.get("GPUPROF_HOOK", "").strip().lower()
    if choice not in ("", "setprofile", "monitoring"):
        raise ValueError(f"GPUPROF_HOOK must be 'setprofile' or 'monitoring', got {choice!r}")
    if choice == "setprofile":
        return False
    if choice == "monitoring" and not available():
        raise ValueError("GPUPROF_HOOK=monitoring needs Python 3.12+ (sys.monitoring)")
    return available()


def _events():
    m = sys.monitoring
    E = m.events
    return m, [
        (E.PY_START, _gpuprof._mon_start),
        (E.PY_RESUME, _gpuprof._mon_resume),
        (E.PY_THROW, _gpuprof._mon_throw),
        (E.PY_RETURN, _gpuprof._mon_return),
        (E.PY_YIELD, _gpuprof._mon_return),
        (E.PY_UNWIND, _gpuprof._mon_unwind),
        (E.CALL, _gpuprof._mon_call),
        (E.C_RETURN, _gpuprof._mon_c_return),
        (E.C_RAISE, _gpuprof._mon_c_return),
    ]


def install() -> None:
    """Claim sys.monitoring's profiler slot and register the C callbacks."""
    m, events = _events()
    tool = m.PROFILER_ID
    if m.get_tool(tool) == _TOOL_NAME:
        raise RuntimeError(
            "gpuprof.profile.start(): another gpuprof profiler is already running "
            "in this process; stop it first (profiling is per process)"
        )
    m.use_tool_id(tool, _TOOL_NAME)  # ValueError if another tool holds it
    _gpuprof._monitoring_configure(m.DISABLE, m.restart_events)
    mask = 0
    for event, fn in events:
        m.register_callback(tool, event, fn)
        mask |= event
    m.set_events(tool, mask)


def uninstall() -> None:
    m, events = _events()
    tool = m.PROFILER_ID
    if m.get_tool(tool) != _TOOL_NAME:
        return
    m.set_events(tool, 0)
    for event, _ in events:
        m.register_callback(tool, event, None)
    m.free_tool_id(tool)
    _gpuprof._monitoring_configure(None, None)
    m.restart_events()  # re-arm what our DISABLE switched off, for other tools
