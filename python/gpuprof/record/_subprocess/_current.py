"""This process's place in a session with subprocesses: the one module that holds it.

Every module of the package reads and writes these names through this module
(``_current.ctx``), never through a copy made by ``from ... import``.
Protected by the GIL (and, in a child, by ``_Child.lock`` for the session itself).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only
    from ._protocol import Ctx

ctx: Ctx | None = None  # the shared folder while a session with subprocesses runs
# (the modules of these two import this one: no import back, so Any)
child: Any = None  # _child._Child: this process's own child session, if it is a child
parent: Any = None  # _parent.ParentSession: the running parent session of this process
patches: list = []  # (owner, attribute, original) of the multiprocessing patches now on
