"""``GPUPROF_ON_DEMAND=1``: arming at ``import gpuprof`` from the environment, except in
gpuprof's own command line and in multiprocessing's helper and child processes."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from ._armed import arm, armed
from ._shared import _say


def _not_for_environment() -> bool:
    """Whether this process is gpuprof's command line (``python -m gpuprof ...``), or a
    helper process of multiprocessing (its children's parent is the one to arm)."""
    argv = list(getattr(sys, "orig_argv", []))
    for i, a in enumerate(argv[1:], 1):
        module = (
            argv[i + 1]
            if a == "-m" and i + 1 < len(argv)
            else a[2:]
            if a.startswith("-m") and len(a) > 2
            else None
        )
        if module is not None:
            return module == "gpuprof" or module.startswith("gpuprof.")
        if a == "-c":  # multiprocessing's spawn, forkserver and resource tracker start so
            return "from multiprocessing" in (argv[i + 1] if i + 1 < len(argv) else "")
        if not a.startswith("-") or a == "-":
            break
    return os.path.basename(sys.argv[0] if sys.argv else "") == "gpuprof"


def arm_from_environment() -> None:
    """``GPUPROF_ON_DEMAND=1``: arm at ``import gpuprof`` (gpuprof's own command line,
    which arms only for ``run --on-demand``, and multiprocessing children excepted).

    Options come from ``GPUPROF_ON_DEMAND_SIGNAL``, ``GPUPROF_TRIGGER_DIR``,
    ``GPUPROF_STEP_FN`` and ``GPUPROF_ON_DEMAND_POLL_S``. A failure is one line on
    stderr, never an exception: the program runs unarmed.
    """
    value = os.environ.get("GPUPROF_ON_DEMAND", "").strip()
    if value in ("", "0") or armed() is not None or _not_for_environment():
        return
    mp = sys.modules.get("multiprocessing")
    if mp is not None and mp.parent_process() is not None:
        return  # a DataLoader worker or pool process: its parent is the one armed
    if value != "1":
        _say(f"GPUPROF_ON_DEMAND={value!r}: set it to 1 to arm, 0 or nothing not to; not armed")
        return
    env = os.environ
    kwargs: dict[str, Any] = {
        "signal": env.get("GPUPROF_ON_DEMAND_SIGNAL", "SIGUSR2"),
        "trigger_dir": env.get("GPUPROF_TRIGGER_DIR") or None,
        "step_fn": env.get("GPUPROF_STEP_FN") or None,
    }
    try:
        kwargs["poll_interval_s"] = float(env.get("GPUPROF_ON_DEMAND_POLL_S", "1"))
    except ValueError:
        _say("GPUPROF_ON_DEMAND_POLL_S must be a number of seconds; not armed")
        return
    try:
        if (
            kwargs["signal"] not in (None, "none")
            and threading.current_thread() is not threading.main_thread()
        ):
            _say(
                "GPUPROF_ON_DEMAND=1: gpuprof was first imported off the main thread, where no "
                "signal handler can be installed; requests are read every "
                f"{kwargs['poll_interval_s']:g} s instead"
            )
            kwargs["signal"] = None
        arm(**kwargs)
    except (ValueError, TypeError, RuntimeError, OSError) as e:
        _say(f"GPUPROF_ON_DEMAND=1: not armed: {e}")
