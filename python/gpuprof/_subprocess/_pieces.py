"""Pieces on disk: one window of a child's recording, written by the child, read by
the parent.

A piece is a folder: one ``.npy`` per array of the raw window dict (no pickle) and
``meta.json`` for the names and scalars; it is renamed into place complete. The
parent memory-maps the large arrays (spans), so reading a piece costs little until
it is used.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

__all__ = ["load_piece", "save_piece"]

_MMAP_BYTES = 1 << 20  # arrays at least this large are memory-mapped when read back


def save_piece(path: str, raw: dict, meta: dict) -> None:
    """Write one window dict as a folder: one ``.npy`` per array (no pickle) and
    ``meta.json`` for the rest. The folder appears at ``path`` complete or not at all."""
    tmp = f"{path}.tmp"
    scalars = {}
    try:
        os.mkdir(tmp)
        for key, value in raw.items():
            if isinstance(value, np.ndarray):
                np.save(os.path.join(tmp, f"{key}.npy"), value, allow_pickle=False)
            else:
                scalars[key] = value
        doc = dict(meta)
        doc["raw"] = scalars
        # ensure_ascii keeps lone surrogates of odd file names intact through json.loads
        with open(os.path.join(tmp, "meta.json"), "w", encoding="ascii") as f:
            json.dump(doc, f, ensure_ascii=True)
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
        raw = dict(doc.pop("raw"))
        for entry in os.listdir(path):
            if not entry.endswith(".npy"):
                continue
            file = os.path.join(path, entry)
            big = os.path.getsize(file) >= _MMAP_BYTES
            arr = np.load(file, mmap_mode="r" if big else None, allow_pickle=False)
            arr.flags.writeable = False
            raw[entry[:-4]] = arr
    except FileNotFoundError as e:
        raise ValueError(f"{name}: missing {os.path.basename(e.filename or '?')}") from None
    except (ValueError, KeyError, EOFError, TypeError, AttributeError, UnicodeError) as e:
        raise ValueError(f"{name}: {type(e).__name__}: {e}") from None
    for key in (
        "ops",
        "nodes",
        "kernels",
        "gpu",
        "steps",
        "spans",
        "threads",
        "op_names",
        "op_files",
        "op_lines",
        "kernel_names",
        "window_start_ns",
        "window_end_ns",
        "dropped_events",
    ):
        if key not in raw:
            raise ValueError(f"{name}: missing {key!r}")
    return raw, doc
