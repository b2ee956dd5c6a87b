"""One window on disk: how a raw window dict (``Profiler.result``, the C core's
result of one recorded window) is stored, defined once for saved profiles
(``exporters.saved``: a ``.gpuprof`` zip) and for child-process pieces
(``_subprocess._pieces``: a folder).

Each array of the dict is one ``.npy`` entry named after its key (``spans.npy``),
under the window's name as a folder (``w0/spans.npy``; a piece's folder is its one
window, so its entries have no folder), written and read without pickle.
Everything else in the dict (names, files, lines, scalars) is the window's JSON
object in the file's ``meta.json``.
"""

from __future__ import annotations

import json

import numpy as np

__all__ = [
    "NPY",
    "REQUIRED_KEYS",
    "entry_name",
    "load_array",
    "meta_json",
    "missing_key",
    "parse_entry",
    "read_array",
    "split",
    "write_array",
]

NPY = ".npy"

# What every stored window has: a reader checks them before trusting one.
REQUIRED_KEYS = (
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
)


def entry_name(window: str, key: str) -> str:
    """The entry of array ``key`` of the window named ``window`` ("" for none)."""
    return f"{window}/{key}{NPY}" if window else key + NPY


def parse_entry(name: str) -> tuple[str, str] | None:
    """(window, key) of an entry written under :func:`entry_name`; None when
    ``name`` is not an array entry."""
    if not name.endswith(NPY):
        return None
    window, _, key = name[: -len(NPY)].rpartition("/")
    return window, key


def split(raw: dict, window: str, arrays: dict[str, np.ndarray]) -> dict:
    """One raw window dict: its arrays go to ``arrays`` under their entry names
    (in the dict's order); the rest, JSON-able, is returned."""
    scalars = {}
    for key, value in raw.items():
        if isinstance(value, np.ndarray):
            arrays[entry_name(window, key)] = value
        else:
            scalars[key] = value
    return scalars


def missing_key(raw: dict) -> str | None:
    """The first of :data:`REQUIRED_KEYS` that a read window lacks, or None."""
    for key in REQUIRED_KEYS:
        if key not in raw:
            return key
    return None


def write_array(f, arr: np.ndarray) -> None:
    """One array entry into the open binary file ``f`` (``.npy``, no pickle)."""
    np.lib.format.write_array(f, np.ascontiguousarray(arr), allow_pickle=False)


def read_array(f) -> np.ndarray:
    """One array entry from the open binary file ``f``, read-only."""
    arr = np.lib.format.read_array(f, allow_pickle=False)
    arr.flags.writeable = False
    return arr


def _with_field(arr: np.ndarray, name: str, fmt: str, offset: int, fill) -> np.ndarray:
    """``arr`` viewed with field ``name`` (``fmt``) in the padding bytes at ``offset``,
    set to ``fill``; ``arr`` itself where it has the field or no such padding."""
    d = arr.dtype
    size = np.dtype(fmt).itemsize
    if name in d.names or offset + size > d.itemsize:
        return arr
    if any(
        o < offset + size and o + f.itemsize > offset for f, o in (d.fields[n][:2] for n in d.names)
    ):
        return arr
    fields = sorted(
        [(d.fields[n][1], n, d.fields[n][0]) for n in d.names] + [(offset, name, np.dtype(fmt))]
    )
    new = np.dtype(
        {
            "names": [n for _, n, _ in fields],
            "formats": [f for _, _, f in fields],
            "offsets": [o for o, _, _ in fields],
            "itemsize": d.itemsize,
        }
    )
    out = np.frombuffer(np.ascontiguousarray(arr).tobytes(), dtype=new).copy()
    out[name] = fill
    out.flags.writeable = False
    return out


def spans_with_seq(spans: np.ndarray) -> np.ndarray:
    """A ``spans`` array read from a file written before spans had their ``seq``
    (PyTorch's sequence number) or their ``module`` (the torch.nn.Module instance of a
    module call; docs/tables.md): ``seq`` -1 (none) in the four padding bytes that
    stood after ``flags``, ``module`` 0 (none) in the four after ``seq``, so that every
    reader, the trace writer included, sees one layout. Other arrays come back as
    they are."""
    d = spans.dtype
    if d.names is None or "flags" not in d.names:
        return spans
    seq_at = -(-(d.fields["flags"][1] + 1) // 4) * 4
    out = _with_field(spans, "seq", "<i4", seq_at, -1)
    if "seq" in out.dtype.names:
        out = _with_field(out, "module", "<u4", out.dtype.fields["seq"][1] + 4, 0)
    return out


def load_array(path: str, mmap: bool) -> np.ndarray:
    """One array entry from the file ``path``, read-only; memory-mapped if ``mmap``."""
    arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    arr.flags.writeable = False
    return arr


def meta_json(doc: dict, what: str) -> str:
    """``meta.json``'s text. ``ensure_ascii`` keeps lone surrogates of labels and
    odd file names intact through json.loads; NumPy scalars become numbers.

    Raises:
        TypeError: a value JSON cannot hold (the message starts with ``what``).
    """

    def default(o):
        if isinstance(o, np.generic):
            return o.item()
        raise TypeError(f"{what}: cannot store {type(o).__name__} {o!r} in meta.json")

    return json.dumps(doc, ensure_ascii=True, default=default)
