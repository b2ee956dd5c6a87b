"""This process's place in a session with subprocesses: the one module that holds it.

Every module of the package reads and writes these names through this module
(``_current.ctx``), never through a copy made by ``from ... import``.
Protected by the GIL (and, in a child, by ``_Child.lock`` for the session itself).
"""

ctx = None  # _protocol.Ctx: the shared folder while a session with subprocesses runs
child = None  # _child._Child: this process's own child session, if it is a child
parent = None  # _parent.ParentSession: the running parent session of this process
fork_hook = False  # os.register_at_fork done (once per process)
patches: list = []  # (owner, attribute, original) of the multiprocessing patches now on
