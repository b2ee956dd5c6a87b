"""Pieces on disk: one window of a child's recording, written by the child, read by
the parent.

A piece is a folder holding one window in the layout of ``gpuprof.core._window_file``
(the one shared with saved profiles): one ``.npy`` entry per array (no pickle), and
``meta.json`` with the child's details and, under ``raw``, the window's names
and scalars. It is renamed into place complete. A folder rather than one file so
that the parent can memory-map the large arrays (spans): reading a piece costs
little until it is used.
"""

from __future__ import annotations

import json
import os
import shutil

from ...core import _window_file

__all__ = ["load_piece", "save_piece"]

_MMAP_BYTES = 1 << 20  # arrays at least this large are memory-mapped when read back
_WINDOW = "raw"  # meta.json's key for the window's names and scalars


def save_piece(path: str, raw: dict, meta: dict) -> None:
    """Write one window dict and the child's ``meta`` as a piece folder, which
    appears at ``path`` complete or not at all."""
    tmp = f"{path}.tmp"
    try:
        os.mkdir(tmp)
        arrays: dict = {}
        doc = dict(meta)
        doc[_WINDOW] = _window_file.split(raw, "", arrays)
        for name, arr in arrays.items():
            with open(os.path.join(tmp, name), "wb") as f:
                _window_file.write_array(f, arr)
        with open(os.path.join(tmp, "meta.json"), "w", encoding="ascii") as f:
            f.write(_window_file.meta_json(doc, "gpuprof child process"))
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_piece(path: str) -> tuple[dict, dict]:
    """Read a piece written by a child: (raw window dict, meta). Large arrays (the
    spans) are memory-mapped, read-only: reading costs nothing until they are used.

    Raises:
        ValueError: the folder is not a complete piece (truncated, foreign, damaged).
        OSError: it cannot be read.
    """
    name = os.path.basename(path)
    try:
        with open(os.path.join(path, "meta.json"), encoding="ascii") as f:
            doc = json.load(f)
        raw = dict(doc.pop(_WINDOW))
        for entry in os.listdir(path):
            parsed = _window_file.parse_entry(entry)
            if parsed is None or parsed[0]:
                continue
            file = os.path.join(path, entry)
            raw[parsed[1]] = _window_file.load_array(file, os.path.getsize(file) >= _MMAP_BYTES)
    except FileNotFoundError as e:
        raise ValueError(f"{name}: missing {os.path.basename(e.filename or '?')}") from None
    except (ValueError, KeyError, EOFError, TypeError, AttributeError, UnicodeError) as e:
        raise ValueError(f"{name}: {type(e).__name__}: {e}") from None
    missing = _window_file.missing_key(raw)
    if missing is not None:
        raise ValueError(f"{name}: missing {missing!r}")
    return raw, doc
