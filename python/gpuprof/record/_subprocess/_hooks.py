"""How children are reached: fork, spawn and forkserver, and Process.terminate().

Forked children through the recording's fork handler (``_recording.at_fork_in_child``);
spawn and forkserver children through one extra entry in multiprocessing's preparation
data, whose unpickling in the child starts its session before the child's ``__main__``
is imported; a child about to be terminated is asked for its piece first. Exits go
through multiprocessing's finalizers (workers leave with ``os._exit``) and ``atexit``
(``_child``). The multiprocessing patches are on while a parent session runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
from types import FrameType

from ...core._paths import PACKAGE_DIR
from .._recording import at_fork_in_child
from . import _current
from ._child import _Child
from ._protocol import Ctx

__all__ = ["boot_spawned", "install_fork_hook", "patch", "unpatch"]

_PKG_PARENT = os.path.dirname(os.path.dirname(PACKAGE_DIR))  # the folder gpuprof is in


# ---- the child's session starts ---------------------------------------------------


def _boot(ctx: Ctx, how: str) -> None:
    """Start this process's child session (idempotent per process)."""
    old = _current.child
    if old is not None and old.pid == os.getpid():
        return
    if old is not None and old.reg_fd >= 0:
        # a grandchild: the parent's registration lock must stay the parent's
        with contextlib.suppress(OSError):
            os.close(old.reg_fd)
        old.reg_fd = -1
    _current.child = None
    _current.ctx = ctx
    install_fork_hook()
    child = _Child(ctx, how)
    if not child.register():
        _current.ctx = None
        return
    _current.child = child
    child.begin()


def _after_fork_in_child() -> None:
    ctx = _current.ctx
    if ctx is None:
        return
    # subprocess.Popen(preexec_fn=...) runs the at-fork handlers from C (fork_exec),
    # in a child about to exec another program: its Python caller is the only sign
    caller: FrameType | None = sys._getframe(1)
    while caller is not None:
        if (
            caller.f_code.co_name == "_execute_child"
            and caller.f_globals.get("__name__") == "subprocess"
        ):
            return
        caller = caller.f_back
    try:
        _boot(ctx, "fork")
    except Exception as e:  # a child must run even if it cannot be profiled
        with contextlib.suppress(Exception):
            sys.stderr.write(f"gpuprof: child process {os.getpid()} is not profiled: {e}\n")


def install_fork_hook() -> None:
    # run after the recording's own handler drops the parent's session
    at_fork_in_child(_after_fork_in_child)


def boot_spawned(folder: str, top_pid: int, max_events: int, how: str = "spawn") -> None:
    """Entry point run in a spawn/forkserver child while multiprocessing unpickles
    its preparation data (before the child's __main__ is imported)."""
    if not os.path.isdir(folder):
        return
    _boot(Ctx(folder, top_pid, max_events), how)


class _SpawnBoot:
    """Unpickles in the child as a call of boot_spawned (through exec, so the child
    needs nothing importable before gpuprof's folder is on its path)."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def __reduce__(self):
        # Pickled by Popen._launch of popen_spawn_posix or popen_forkserver, with
        # itself as the spawning Popen: its class says which start method it is.
        context = sys.modules.get("multiprocessing.context")
        popen = context.get_spawning_popen() if context is not None else None
        how = getattr(popen, "method", None)
        how = how if how in ("spawn", "forkserver") else "spawn"
        src = (
            "try:\n"
            "    import sys as _s\n"
            f"    _s.path.insert(0, {_PKG_PARENT!r})\n"
            "    try:\n"
            "        import gpuprof.record._subprocess._hooks as _g\n"
            "    finally:\n"
            f"        if _s.path and _s.path[0] == {_PKG_PARENT!r}:\n"
            "            del _s.path[0]\n"
            f"    _g.boot_spawned({self.ctx.dir!r}, {self.ctx.top_pid}, {self.ctx.max_events}, "
            f"{how!r})\n"
            "except Exception as _e:\n"
            "    import sys as _s\n"
            "    _s.stderr.write('gpuprof: spawned child is not profiled: %r\\n' % (_e,))\n"
        )
        return (exec, (src, {}))


# ---- multiprocessing patches (installed while a parent session runs) ---------------


def _wrap_preparation_data(orig):
    def get_preparation_data(name, *args, **kwargs):
        d = orig(name, *args, **kwargs)
        ctx = _current.ctx
        if ctx is not None and isinstance(d, dict):
            d["gpuprof_subprocess"] = _SpawnBoot(ctx)
        return d

    get_preparation_data._gpuprof_orig = orig
    return get_preparation_data


def _wrap_terminate(orig):
    def terminate(self, *args, **kwargs):
        parent = _current.parent
        if parent is not None and getattr(self, "returncode", 0) is None:
            with contextlib.suppress(Exception):
                parent.flush_before_terminate(int(self.pid))
        return orig(self, *args, **kwargs)

    terminate._gpuprof_orig = orig
    return terminate


def patch() -> None:
    import multiprocessing.popen_fork as popen_fork
    import multiprocessing.spawn as spawn

    for owner, attr, wrap in (
        (spawn, "get_preparation_data", _wrap_preparation_data),
        (popen_fork.Popen, "terminate", _wrap_terminate),
    ):
        cur = getattr(owner, attr)
        if getattr(cur, "_gpuprof_orig", None) is not None:
            continue  # already ours (a second session in a child)
        setattr(owner, attr, wrap(cur))
        _current.patches.append((owner, attr, cur))


def unpatch() -> None:
    while _current.patches:
        owner, attr, orig = _current.patches.pop()
        cur = getattr(owner, attr, None)
        if getattr(cur, "_gpuprof_orig", None) is orig:
            setattr(owner, attr, orig)
