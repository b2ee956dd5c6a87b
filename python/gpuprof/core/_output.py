"""Output files: the checks every writer makes on a path before any work
(:func:`check_output_path`, which also expands ``{rank}`` placeholders),
:func:`atomic_output`, under which a file appears complete or not at all, and
:func:`write_atomic` for gpuprof's own small state and message files."""

from __future__ import annotations

import contextlib
import errno
import os

from ._ranks import expand_name

__all__ = ["atomic_output", "check_output_path", "reraise_os_error", "write_atomic"]


def check_output_path(path, func: str) -> str:
    """Return ``path`` as a str, or raise an OSError naming it when the file
    cannot be created there (a directory, a missing or read-only folder)."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{func}(): path must be a str or os.PathLike, got {path!r}")
    path = os.fspath(path)
    if "{" in path:  # {rank}, {local_rank}, {world_size}: one file per rank
        path = expand_name(path)
    if not path:
        raise FileNotFoundError(errno.ENOENT, f"{func}(): path is empty", path)
    if os.path.isdir(path):
        raise IsADirectoryError(
            errno.EISDIR, f"{func}(): {path!r} is a directory; pass a file name inside it", path
        )
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(parent):
        raise FileNotFoundError(
            errno.ENOENT, f"{func}(): cannot write {path!r}: folder {parent!r} does not exist", path
        )
    if not os.path.isdir(parent):
        raise NotADirectoryError(
            errno.ENOTDIR, f"{func}(): cannot write {path!r}: {parent!r} is not a folder", path
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(
            errno.EACCES,
            f"{func}(): cannot write {path!r}: folder {parent!r} is not writable",
            path,
        )
    return path


def reraise_os_error(e: OSError, func: str, path: str):
    """An OSError from the writer, re-raised naming the user's path."""
    raise OSError(e.errno, f"{func}(): cannot write {path!r}: {e.strerror or e}", path) from e


@contextlib.contextmanager
def atomic_output(path: str, func: str):
    """Yield a temporary name next to ``path``; on success it replaces ``path``, on
    failure it is removed. OSErrors come out naming ``path`` and ``func``."""
    tmp = path + ".tmp"
    try:
        try:
            yield tmp
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
    except OSError as e:
        reraise_os_error(e, func, path)


def write_atomic(path: str, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` whole, through a temporary file of this process renamed
    into place (readers in other processes never see part of it). Calls into C only,
    so it may run while a hook records."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)
