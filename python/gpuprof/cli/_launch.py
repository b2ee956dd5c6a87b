"""Run a script or a module as ``__main__``, as ``python FILE`` or ``python -m NAME`` would.

``python -m gpuprof run`` starts the program from gpuprof's own frames, without
runpy: the profiler hides every frame of the gpuprof package (and the C calls
made from them, such as ``exec``), so tables and traces begin at the program's
``<module>``, with no runpy row above it.

The program is found and compiled before the profiler starts (:func:`find`,
:meth:`Program.compile`), so a missing file or a syntax error is reported
before anything is recorded; :meth:`Program.run` then executes it in a fresh
``__main__`` module, as runpy does.
"""

from __future__ import annotations

import ast
import builtins
import importlib.machinery
import importlib.util
import io
import os
import sys
import types
from collections.abc import Callable

__all__ = ["LaunchError", "Program", "find"]


class LaunchError(Exception):
    """The target cannot be run: no such file or module (one line, for the user)."""


class Program:
    """A script or module found and ready to run as ``__main__``.

    Attributes:
        target: what the user named (a path, or a module name with ``-m``).
        filename: the file whose code runs.
        module_name: the name the code would have if imported (the script's file
            name without ``.py``, or the module's dotted name).
        spec: the module spec with ``-m`` (None for a script).
        path0: the folder that goes first on ``sys.path``.
    """

    def __init__(
        self, target: str, filename: str, module_name: str, spec, path0: str, source: bytes | None
    ):
        self.target = target
        self.filename = filename
        self.module_name = module_name
        self.spec = spec
        self.path0 = path0
        self._source = source

    def compile(self, transform: Callable[[ast.Module], ast.Module] | None = None):
        """The program's code object; ``transform`` may rewrite its syntax tree first.

        Raises:
            SyntaxError: the program does not compile (the program's own error).
            LaunchError: a transform is asked for a module without source.
        """
        if self._source is None:
            if transform is not None:
                raise LaunchError(
                    f"{self.target}: no source code to read (only compiled code was found)"
                )
            return self.spec.loader.get_code(self.spec.name)
        if transform is None:
            # dont_inherit: not this module's `from __future__ import annotations`
            return compile(self._source, self.filename, "exec", dont_inherit=True)
        tree = ast.parse(self._source, self.filename)
        return compile(transform(tree), self.filename, "exec", dont_inherit=True)

    def run(self, code, argv: list[str], init_globals: dict | None = None) -> None:
        """Execute ``code`` as ``__main__`` with ``sys.argv = [filename] + argv``.

        ``sys.modules["__main__"]`` is the program's module while it runs (pickle
        and multiprocessing's spawn find it there) and is restored afterwards, as
        runpy restores it. Whatever the program raises propagates.
        """
        main = types.ModuleType("__main__")
        spec = self.spec
        main.__dict__.update(
            {
                "__file__": self.filename,
                "__cached__": getattr(spec, "cached", None),
                "__loader__": getattr(spec, "loader", None),
                "__package__": spec.parent if spec is not None else "",
                "__spec__": spec,
                "__builtins__": builtins,  # the module, as in `python FILE`
            }
        )
        if init_globals:
            main.__dict__.update(init_globals)
        sys.argv = [self.filename] + list(argv)
        if sys.path and sys.path[0] != self.path0:
            sys.path.insert(0, self.path0)
        saved = sys.modules.get("__main__")
        sys.modules["__main__"] = main
        try:
            exec(code, main.__dict__)
        finally:
            if saved is not None:
                sys.modules["__main__"] = saved


def find(target: str, as_module: bool) -> Program:
    """Locate a script (a ``.py`` file, or a folder or zip file with ``__main__.py``)
    or, with ``as_module``, a module or package (its ``__main__``) on ``sys.path``.

    For a dotted module name its parent packages are imported, as Python's ``-m``
    imports them. Nothing of the program itself runs.

    Raises:
        LaunchError: no such script or module, or one that cannot be run.
    """
    if as_module:
        return _find_module(target)
    if not os.path.exists(target):
        raise LaunchError(f"no such script: {target!r}")
    path = os.path.abspath(target)
    if os.path.isdir(path) or (os.path.isfile(path) and _is_zip(path)):
        # a folder or zip file with __main__.py, as `python FOLDER` runs it
        spec = importlib.machinery.PathFinder.find_spec("__main__", [path])
        if spec is None or spec.loader is None:
            raise LaunchError(f"{target!r} has no __main__.py to run")
        return Program(target, spec.origin, "__main__", spec, path, _source_of(spec))
    try:
        with io.open_code(path) as f:
            source = f.read()
    except OSError as e:
        raise LaunchError(f"cannot read {target!r}: {e.strerror or e}") from None
    stem = os.path.splitext(os.path.basename(path))[0]
    return Program(target, target, stem, None, os.path.dirname(path), source)


def _find_module(name: str) -> Program:
    path0 = os.getcwd()  # python -m puts the working directory first
    if sys.path[:1] != [path0]:
        sys.path.insert(0, path0)
    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(name + ".__main__")
            if spec is None:
                raise LaunchError(
                    f"{name!r} is a package and cannot be run: it has no __main__ module"
                )
    except (ImportError, ValueError) as e:  # a parent package failed to import, or ''
        raise LaunchError(f"no module named {name!r} ({e})") from None
    if spec is None:
        raise LaunchError(f"no module named {name!r}")
    if spec.loader is None or not hasattr(spec.loader, "get_code"):
        raise LaunchError(f"module {name!r} cannot be run as a program (no code to run)")
    return Program(name, spec.origin, spec.name, spec, path0, _source_of(spec))


def _source_of(spec) -> bytes | None:
    get_data = getattr(spec.loader, "get_data", None)
    if spec.origin and get_data is not None and spec.origin.endswith(".py"):
        try:
            return get_data(spec.origin)
        except OSError:
            return None
    return None


def _is_zip(path: str) -> bool:
    import zipfile

    return zipfile.is_zipfile(path)
