"""Finding the steps of a program that never calls ``prof.step()`` (``gpuprof run``).

Two sources of step boundaries:

- :class:`OptimizerSteps`: every optimizer step of PyTorch, through its global
  hook (``torch.optim.optimizer.register_optimizer_step_post_hook``), which
  every ``torch.optim.Optimizer`` subclass calls after its ``step()``: SGD,
  AdamW, foreach and fused variants, and the optimizers that Lightning and
  Hugging Face ``Trainer``/accelerate wrap (tests/cli/test_steps.py). A step is an
  optimizer step, so with gradient accumulation one step spans several
  forward/backward passes. The hook is registered when the program imports
  PyTorch; gpuprof itself never imports it.
- :class:`StepFunction`: ``--step-fn module:function``, a function whose every
  return ends a step: a function (or ``Class.method``) of a module the program
  imports, or of the program itself (``__main__:fn``, or the script's file name
  without ``.py``).

Both call :meth:`StepCounter.step`, which calls ``prof.step()`` while the
profiler runs. Their code lives in the gpuprof package, so the profiler hides
its frames; its time counts to the caller.

:class:`StartupApart` is ``run``'s default schedule: the start-up before the first
step boundary (imports, model build, the first step) is a window of its own, kept
apart from the results, which cover the steps after it.
"""

from __future__ import annotations

import ast
import functools
import inspect
import keyword
import sys
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from ._constants import ACT_RECORD, ACT_RECORD_AND_SAVE

__all__ = ["ImportWatch", "OptimizerSteps", "StartupApart", "StepCounter", "StepFunction"]

TORCH_OPTIMIZER_MODULE = "torch.optim.optimizer"


class _Counts(Protocol):
    """What a step source calls at each boundary it finds: a :class:`StepCounter`, or
    the on-demand process's own counter (gpuprof.api.ondemand)."""

    def step(self) -> object: ...


class StepCounter:
    """Counts the steps found and ends the profiler's step for each one."""

    def __init__(self, prof):
        self.prof = prof
        self.found = 0  # steps found, recording or not
        self.error: str | None = None  # prof.step() failed: why (reported at the end)
        self.in_step = False  # inside prof.step() (a --delay signal handler waits)

    def step(self) -> None:
        self.found += 1
        prof = self.prof
        if not prof.running or self.error is not None:
            return
        self.in_step = True
        try:
            prof.step()
        except Exception as e:  # noqa: BLE001 - never into the program: kept and reported
            self.error = f"prof.step() failed at step {self.found}: {e}"
        finally:
            self.in_step = False


class StartupApart:
    """A schedule (``profile(schedule=...)``) with its ``on_trace_ready``: step 0, from
    ``start()`` to the first step boundary, is one window (RECORD_AND_SAVE), closed at
    the first ``prof.step()``; every later step records into a second window that runs
    until ``stop()`` (``until_stop``: it is complete there, not cut short) and replaces
    the first as the results. If no step ever ends, the first window is the whole run.

    :meth:`window_ready` notes the start-up window's bounds and the part of it spent
    in imports, for the line that says what the results leave out.
    """

    until_stop = True  # the window recording at stop() is complete (gpuprof.profile)

    def __init__(self):
        self.start_ns: int | None = None  # the start-up window, once it was closed
        self.end_ns: int | None = None
        self.import_ns = 0  # time in the import system (the outermost imports)

    def __call__(self, step: int) -> int:
        return ACT_RECORD_AND_SAVE if step == 0 else ACT_RECORD

    def window_ready(self, prof) -> None:
        """on_trace_ready: at the first step boundary (step 1 begins), keep what the
        start-up was; the window closed at stop() is the results themselves."""
        if self.end_ns is not None or prof.step_num != 1 or not prof.running:
            return
        results = prof.results
        self.start_ns, self.end_ns = results.window_bounds()
        self.import_ns = _import_ns(results)

    @property
    def apart(self) -> bool:
        """Whether a start-up window was closed and left out of the results."""
        return self.end_ns is not None

    def header(self) -> dict:
        """The ``gpuprof_startup`` header field of the files (docs/api.md, ``run``)."""
        return {
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "import_ns": self.import_ns,
            "in_results": False,
        }


def startup_note(header: dict) -> str | None:
    """One line saying that the start-up is not in the results, from the
    ``gpuprof_startup`` header field (None when it is in them)."""
    from ._format import format_time

    if header.get("in_results", True):
        return None
    duration = int(header["end_ns"]) - int(header["start_ns"])
    imports = int(header.get("import_ns") or 0)
    of_it = f", {format_time(imports)} of it imports" if imports > 0 else ""
    return (
        f"start-up not in these results: the {format_time(duration)} up to the end of "
        f"the first step{of_it}; --whole-run includes it"
    )


def _import_ns(results) -> int:
    """Wall time of the outermost imports of a window: the call-tree nodes of
    importlib's ``_find_and_load`` with no other one above them, summed. Nodes are
    numbered parents first, and a node's id is its row."""
    tree = results.call_tree()
    parent = tree["parent"].tolist()
    is_import = [str(n).startswith("_find_and_load (") for n in tree["name"]]
    under = [False] * len(tree)  # an import frame is above this node
    total = 0
    for k, p in enumerate(parent):
        if p >= 0:
            under[k] = under[p] or is_import[p]
        if is_import[k] and not under[k]:
            total += int(tree["total_ns"][k])
    return total


class ImportWatch:
    """A ``sys.meta_path`` finder that calls back once a named module has executed."""

    def __init__(self):
        self._after: dict[str, list[Callable]] = {}

    def when_imported(self, name: str, callback: Callable) -> None:
        """``callback(module)`` right after ``name`` is imported (now if it already is)."""
        if name in sys.modules:
            callback(sys.modules[name])
            return
        self._after.setdefault(name, []).append(callback)

    def install(self) -> None:
        if self._after and self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    # importlib's finder protocol
    def find_spec(self, fullname, path, target=None):
        callbacks = self._after.get(fullname)
        if not callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        # A loader shared by many modules (a class: built-in or frozen modules) is
        # left alone: none of them can hold a step function or an optimizer.
        if loader is None or isinstance(loader, type) or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module):
            original(module)
            del loader.exec_module  # back to the class's method
            for callback in self._after.pop(fullname, ()):
                callback(module)

        loader.exec_module = exec_module
        return spec

    def invalidate_caches(self) -> None:
        pass


class OptimizerSteps:
    """Steps from PyTorch's global optimizer-step hook: once per optimizer step.

    Counted once per real step: an optimizer whose ``step()`` calls another's
    (a wrapper, a subclass calling ``super().step()``) counts only the outermost
    one. With several optimizers (a GAN's generator and discriminator), the
    steps of the optimizer that stepped first count; if another one steps twice
    while it does not (a new optimizer for a second phase), that one counts from
    then on.
    """

    def __init__(self, counter: _Counts):
        self.counter = counter
        self.imported = False
        self.optimizers: dict[str, None] = {}  # class names of the counted optimizers, in order
        self._handle = None
        # weakref to the optimizer whose steps count (or a callable returning it)
        self._lead: Callable[[], Any] | None = None
        self._others: dict[int, int] = {}  # id(optimizer) -> steps since the lead's last one

    def install(self, watch: ImportWatch) -> None:
        watch.when_imported(TORCH_OPTIMIZER_MODULE, self._register)

    def uninstall(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _register(self, module) -> None:
        register = getattr(module, "register_optimizer_step_post_hook", None)
        if register is None:  # PyTorch < 2.0
            return
        self.imported = True
        self._handle = register(self._post_hook)

    def _post_hook(self, optimizer, args, kwargs) -> None:
        # Called by torch's step wrapper (Optimizer.profile_hook_step): if a frame
        # of the same wrapper is further up, this step runs inside another one.
        caller = sys._getframe(1)
        wrapper = caller.f_code
        f = caller.f_back
        while f is not None:
            if f.f_code is wrapper:
                return
            f = f.f_back
        lead = self._lead() if self._lead is not None else None
        if lead is None or lead is optimizer:
            self._take_lead(optimizer)
            return
        n = self._others.get(id(optimizer), 0) + 1
        if n >= 2:
            self._take_lead(optimizer)
        else:
            self._others[id(optimizer)] = n

    def _take_lead(self, optimizer) -> None:
        try:
            self._lead = weakref.ref(optimizer)
        except TypeError:  # no weak references: keep it alive instead
            self._lead = lambda: optimizer
        self._others.clear()
        self.optimizers.setdefault(type(optimizer).__name__, None)
        self.counter.step()

    def describe(self) -> str:
        return "torch optimizer steps: " + (", ".join(self.optimizers) or "none ran")

    def problem(self) -> str | None:
        """Why no step was found, or None."""
        if self.optimizers:
            return None
        if not self.imported:
            return "the program did not use PyTorch, whose optimizer steps end steps"
        return "no torch optimizer step ran"


class StepFunction:
    """``--step-fn module:function``: every return of that function ends a step.

    ``module`` is a module the program imports (wrapped right after its import),
    or the program itself: ``__main__`` or the script's name, whose top-level
    definitions are wrapped as they are made (the script's syntax tree gets a call
    after each statement that binds the name, so that the script's own loop,
    which runs before the script ends, already calls the wrapper).
    """

    GLOBAL = "__gpuprof_step_fn__"  # the binder, in the program's globals

    def __init__(self, spec: str, counter: _Counts, main_names: set[str]):
        self.spec = spec
        self.module, self.attr = parse(spec)
        self.counter = counter
        self.in_main = self.module in main_names
        self.imported = False
        self.wrapped = False
        self.calls = 0
        self._missing: str | None = None  # the part of the path not found
        self._not_callable: str | None = None  # type name of what the path names

    def install(self, watch: ImportWatch) -> None:
        if self.module != "__main__":
            # also a module of that name: the script's name when the script imports itself
            watch.when_imported(self.module, self._wrap_in)

    # -- the program itself ------------------------------------------------------------
    def transform(self, tree: ast.Module) -> ast.Module:
        """Insert ``__gpuprof_step_fn__()`` after every top-level binding of the name."""
        first = self.attr.split(".")[0]
        tree.body = self._insert(tree.body, first)
        return ast.fix_missing_locations(tree)

    def _insert(self, body: list, name: str) -> list:
        out = []
        for stmt in body:
            for field in ("body", "orelse", "finalbody"):  # if/for/while/with/try blocks
                inner = getattr(stmt, field, None)
                if isinstance(inner, list) and not isinstance(
                    stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
                ):
                    setattr(stmt, field, self._insert(inner, name))
            for handler in getattr(stmt, "handlers", ()):
                handler.body = self._insert(handler.body, name)
            for case in getattr(stmt, "cases", ()):
                case.body = self._insert(case.body, name)
            out.append(stmt)
            if name in _bound_names(stmt):
                call = ast.Expr(ast.Call(ast.Name(self.GLOBAL, ast.Load()), [], []))
                out.append(ast.copy_location(call, stmt))
        return out

    def binder(self) -> dict:
        """The globals the transformed program needs."""

        def bind():
            self._wrap_in(sys.modules["__main__"])

        return {self.GLOBAL: bind}

    # -- wrapping ------------------------------------------------------------------------
    def _wrap_in(self, module) -> None:
        self.imported = True
        owner = module
        parts = self.attr.split(".")
        for i, part in enumerate(parts[:-1]):
            owner = getattr(owner, part, None)
            if owner is None:
                self._missing = ".".join(parts[: i + 1])
                return
        name = parts[-1]
        raw = inspect.getattr_static(owner, name, None)
        if raw is None:
            self._missing = self.attr
            return
        rewrap = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        fn = raw.__func__ if rewrap else getattr(owner, name)
        if getattr(fn, "_gpuprof_step_of", None) is self:
            return
        while getattr(fn, "_gpuprof_step_of", None) is not None:  # an earlier arm()'s wrapper
            fn = fn.__wrapped__
        self._missing = None
        if not callable(fn):
            self._not_callable = type(fn).__name__
            return
        wrapper = self._wrapper(fn)
        setattr(owner, name, rewrap(wrapper) if rewrap else wrapper)
        self._not_callable = None
        self.wrapped = True

    def _wrapper(self, fn):
        counter = self.counter

        def counted():
            self.calls += 1
            counter.step()

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def wrapper(*args, **kwargs):
                try:
                    return await fn(*args, **kwargs)
                finally:
                    counted()
        else:

            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                try:
                    return fn(*args, **kwargs)
                finally:
                    counted()

        wrapper._gpuprof_step_of = self
        return wrapper

    # -- the end -----------------------------------------------------------------------
    def describe(self) -> str:
        return f"returns of {self.spec}"

    def problem(self) -> str | None:
        """Why this function never ended a step, or None."""
        if self.calls:
            return None
        where = "the script" if self.in_main else f"module {self.module}"
        if not self.imported and not self.in_main:
            return f"the program never imported {self.module}"
        if self._not_callable:
            return f"{self.attr} of {where} is a {self._not_callable}, not a function"
        if not self.wrapped:
            missing = self._missing or self.attr
            if self.in_main:
                return (
                    f"the script defines no {missing} at its top level (a function "
                    "defined inside another one cannot be named)"
                )
            return f"{where} has no attribute {missing}"
        return "the program never called it"


def parse(spec: str) -> tuple[str, str]:
    """``"module:function"`` -> (module, attribute path); ValueError says what is wrong."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(
            f"takes module:function (e.g. train:train_step or __main__:Trainer.step), got {spec!r}"
        )
    for part, what in ((module, "module"), (attr, "function")):
        if not all(p.isidentifier() and not keyword.iskeyword(p) for p in part.split(".")):
            raise ValueError(f"{part!r} is not a {what} name (in {spec!r})")
    return module, attr


def _bound_names(stmt) -> set[str]:
    """Names a statement binds at the level it runs in (not inside nested functions)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    targets = []
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        targets = [stmt.target]
    elif isinstance(stmt, (ast.For, ast.AsyncFor)):
        targets = [stmt.target]
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        targets = [i.optional_vars for i in stmt.items if i.optional_vars is not None]
    names = set()
    for t in targets:
        for node in ast.walk(t):
            if isinstance(node, ast.Name):
                names.add(node.id)
    return names
