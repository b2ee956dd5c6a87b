"""Child-process profiling for ``gpuprof.profile(subprocesses=True)`` (docs/subprocesses.md).

The parent and its children share nothing but a private folder: the parent's
``state`` file, each child's registration and answers, and the pieces of the
children's recordings. Each child runs its own C session (CPU only) driven by
that state file; at a window's end the parent waits for the live children's
answers, then reads their pieces of that window.

One job per module:

``_protocol``
    the shared folder: file names, the state and ack lines, liveness by ``flock``,
    the timeouts.
``_pieces``
    one window of a child's recording on disk, saved and loaded.
``_child``
    a child's own session and the poll thread that follows the parent's state.
``_hooks``
    how children are reached: fork, spawn, forkserver, Process.terminate().
``_parent``
    the parent's session (``ParentSession``) and a child's data of one window
    (``ChildWindow``).
``_current``
    this process's place in a session: the only module-level mutable state.
"""

from ._parent import ChildWindow, ParentSession
from ._pieces import load_piece, save_piece
from ._protocol import POLL_S, ack_timeout_s, terminate_flush_s, work_timeout_s

__all__ = [
    "POLL_S",
    "ChildWindow",
    "ParentSession",
    "ack_timeout_s",
    "load_piece",
    "save_piece",
    "terminate_flush_s",
    "work_timeout_s",
]
