"""Module instances: the part of a profile that has the hook note which ``torch.nn.Module``
instance each ``Module.__call__`` ran on, and names the instances as the model does
(``transformer.h.3.attn.c_attn``), for the modules table (docs/backward.md, "Modules").

The hook compares each Python call with ``Module.__call__``'s code and, for those calls,
reads ``self`` from the frame and writes the instance's number into the call's span
(csrc/record/hook.c, "module instances"). The numbers index the instances the C side holds for
the session; this part turns them into names while they are alive (at each window's end
and at ``stop()``), so that saved profiles and results outlive the model.

``torch`` is never imported here: the part reads ``sys.modules`` at ``start()``.
"""

from __future__ import annotations

import sys

from .. import _gpuprof
from ._parts import Part
from ._recording import RecordingState

__all__ = ["ModuleInstances", "module_call_code", "qualified_names"]


def module_call_code(torch):
    """The code object of the Python function every module call goes through
    (``Module._wrapped_call_impl`` since PyTorch 2.1, ``Module._call_impl`` before),
    or None."""
    module = getattr(getattr(torch, "nn", None), "Module", None)
    for name in ("_wrapped_call_impl", "_call_impl"):
        fn = getattr(module, name, None)
        code = getattr(fn, "__code__", None)
        if code is not None:
            return code
    return None


def qualified_names(instances: list) -> tuple[list[str], list[str]]:
    """(name, class name) per instance. The model's top modules (those inside no other
    instance of the list) are named by their class (``GPT2LMHeadModel``, ``#2`` for a
    second of a class); the modules inside one by their path in it
    (``transformer.h.3.attn``), as ``named_modules()`` gives it, under the top
    module's name when there are several top modules."""
    index = {id(m): i for i, m in enumerate(instances)}
    inside: set[int] = set()
    for m in instances:
        try:
            for sub in m.modules():
                if sub is not m and id(sub) in index:
                    inside.add(id(sub))
        except Exception:  # a module whose modules() fails: it names only itself
            continue
    classes = [type(m).__name__ for m in instances]
    names = [""] * len(instances)
    tops = [m for m in instances if id(m) not in inside]
    seen: dict[str, int] = {}
    for top in tops:
        cls = type(top).__name__
        seen[cls] = seen.get(cls, 0) + 1
        top_name = cls if seen[cls] == 1 else f"{cls}#{seen[cls]}"
        names[index[id(top)]] = top_name
        try:
            below = list(top.named_modules())
        except Exception:
            continue
        for path, sub in below:
            i = index.get(id(sub))
            if i is None or sub is top or names[i]:
                continue
            names[i] = path if len(tops) == 1 else f"{top_name}.{path}"
    for i, n in enumerate(names):
        if not n:  # (a module reachable only through one whose modules() failed)
            names[i] = f"{classes[i]}@{i}"
    return names, classes


class ModuleInstances(Part):
    """``modules=True`` with PyTorch imported: each module call's instance, named."""

    def __init__(self, wanted: bool):
        self.wanted = wanted
        # at each step, until PyTorch is imported (`run` starts before the program does)
        self.steps = wanted
        self._on = False
        self._names: tuple[list[str], list[str]] | None = None  # fixed at stop()

    def started(self, state: RecordingState) -> None:
        self._on = False
        self._names = None
        self._switch_on()

    def after_step(self, state: RecordingState) -> None:
        if not self._on and self._names is None:
            self._switch_on()

    def _switch_on(self) -> None:
        torch = sys.modules.get("torch")
        code = module_call_code(torch) if self.wanted and torch is not None else None
        if code is not None:
            _gpuprof._set_module_code(code)
            self._on = True

    def _current(self) -> tuple[list[str], list[str]]:
        if self._names is not None:
            return self._names
        return qualified_names(_gpuprof._module_instances())

    def window_ended(self, state: RecordingState, raw: dict | None) -> None:
        if self._on and raw is not None:
            raw["module_names"], raw["module_classes"] = self._current()

    def stopping(self, state: RecordingState) -> None:
        if self._on:
            self._names = qualified_names(_gpuprof._module_instances())

    def stopped(self, state: RecordingState) -> None:
        if self._on:
            _gpuprof._set_module_code(None)  # the instances go
            self._on = False

    def contribute(self, results) -> None:
        if self._names is None and not self._on:
            return
        names, classes = self._current()
        for raw in results.raw_windows():
            if "module_names" not in raw or len(raw["module_names"]) < len(names):
                raw["module_names"], raw["module_classes"] = names, classes
