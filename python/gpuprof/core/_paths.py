"""How gpuprof shows a source file: short, and the same everywhere.

Traces and flame graphs name a file relative to the folder it was imported from
(``torch/nn/modules/module.py``), as torch.profiler names Python frames and py-spy
names files. Text reports (the diagnosis, memory and process tables) show a file
under the working directory relative to it (``examples/train.py``), and any other
file as a trace does.
"""

from __future__ import annotations

import contextlib
import os
import sys

from .. import _gpuprof

__all__ = [
    "import_roots",
    "display_files",
    "source_path",
    "source_location",
    "is_library",
    "library_roots",
    "user_location",
]

_library_cache: dict[str, bool] = {}


# gpuprof's own folder (this file is in gpuprof/core/), with a trailing separator
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")


def library_roots() -> tuple[str, ...]:
    """Folders whose files are not the user's besides installed packages (which
    is_library tells by their site-packages or dist-packages folder): the standard
    library and gpuprof itself. Computed once; gpuprof's import hands them to the
    extension, which applies the rule."""
    global _LIBRARY_ROOTS
    if _LIBRARY_ROOTS is None:
        import sysconfig

        paths = sysconfig.get_paths()
        roots = [PACKAGE_DIR]
        roots += [paths[k] for k in ("stdlib", "platstdlib") if paths.get(k)]
        _LIBRARY_ROOTS = tuple(os.path.join(os.path.abspath(r), "") for r in roots)
    return _LIBRARY_ROOTS


_LIBRARY_ROOTS: tuple[str, ...] | None = None


def import_roots() -> list[str]:
    """The folders Python imports from (sys.path, site-packages, the user's base and
    site-packages), each ending in a separator, longest first; never "/"."""
    import site

    roots = [r for r in sys.path if isinstance(r, str)]
    for get in (site.getsitepackages, lambda: [site.getuserbase(), site.getusersitepackages()]):
        with contextlib.suppress(Exception):  # some virtual environments lack these
            roots += [r for r in get() if isinstance(r, str)]
    out = {os.path.join(os.path.abspath(r or os.curdir), "") for r in roots}  # "" is the cwd
    out.discard(os.sep)  # "/" would make every absolute path relative
    return sorted(out, key=len, reverse=True)


def _under_root(path: str, roots: list[str]) -> str:
    return next((path[len(r) :] for r in roots if path.startswith(r)), path)


def display_files(files: list, roots: list[str] | None = None) -> list:
    """``files`` with each absolute path under an import root made relative to the
    longest such root; other names (``<string>``, relative paths, None) as they are."""
    roots = import_roots() if roots is None else roots
    seen: dict = {}
    out = []
    for f in files:
        short = seen.get(f)
        if short is None:
            short = _under_root(f, roots) if isinstance(f, str) and f.startswith(os.sep) else f
            seen[f] = short
        out.append(short)
    return out


def source_path(file: str, roots: list[str] | None = None) -> str:
    """``file`` for a text report: relative to the working directory when it lies
    under it, else relative to its import root, else as it is."""
    if not file or not os.path.isabs(file):
        return file
    with contextlib.suppress(ValueError, OSError):  # no cwd, or another drive
        rel = os.path.relpath(file)
        if not rel.startswith(os.pardir + os.sep) and rel != os.pardir:
            return rel
    return _under_root(file, import_roots() if roots is None else roots)


def source_location(file: str, line: int) -> str:
    """``path:line`` (see :func:`source_path`); the path alone for line 0 (unknown),
    "" without a file."""
    if not file:
        return ""
    shown = source_path(file)
    return f"{shown}:{line}" if line > 0 else shown


def is_library(file: str) -> bool:
    """Whether ``file`` is library code rather than the user's: under site-packages or
    dist-packages, in the standard library, frozen (``<frozen ...>``), or gpuprof's own.
    Scripts, notebooks' cells and everything else count as the user's. The rule is the
    extension's, which the hook also applies to decide where to record call sites."""
    hit = _library_cache.get(file)
    if hit is None:
        hit = _gpuprof._is_library(file) if isinstance(file, str) else False
        _library_cache[file] = hit
    return hit


def user_location(file: str, line: int, lib_file: str = "", lib_line: int = 0) -> str:
    """``path:line`` of the user's line, with the library line that it led to beside
    it: ``train.py:42 (in torch/nn/modules/batchnorm.py:174)``."""
    where = source_location(file, line)
    if lib_file:
        lib = source_location(lib_file, lib_line)
        return f"{where} (in {lib})" if where else lib
    return where
