"""Save recorded windows to one ``.gpuprof`` file and load them back.

The file is a zip archive in NumPy's ``.npz`` layout: one ``.npy`` entry per
array of every window (``w0/spans.npy``, ``w0/gpu.npy``, ...), readable with
``numpy.load`` and no pickle, plus ``meta.json`` holding everything that is
not an array: op names, files and lines, kernel names, the window's scalars,
the CUDA capture state, thread and process names, device properties and the
format version.
"""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np

from .._results import Results
from .chrome import (
    atomic_output,
    check_output_path,
    device_properties,
    distributed_info,
    program_name,
)

__all__ = ["FORMAT", "FORMAT_VERSION", "LoadedProfile", "load", "save"]

FORMAT = "gpuprof-saved"
FORMAT_VERSION = 1


def save(results: Results, path) -> str:
    """Write every recorded window of ``results`` to one file (``.gpuprof`` by
    convention); :func:`gpuprof.load` reads it back.

    Raises:
        OSError: ``path`` cannot be written (the message names it).
    """
    from .. import __version__

    path = check_output_path(path, "save")
    windows = []
    arrays: dict[str, np.ndarray] = {}
    for i, raw in enumerate(results.windows):
        scalars = {}
        for key, value in raw.items():
            if isinstance(value, np.ndarray):
                arrays[f"w{i}/{key}"] = value
            else:
                scalars[key] = value
        windows.append(scalars)
    meta = dict(results.meta)
    meta.setdefault("pid", os.getpid())
    meta.setdefault("process_name", program_name())
    meta.setdefault("thread_names", {str(k): v for k, v in results.thread_names().items()})
    meta.setdefault("device_properties", device_properties(results))
    meta.setdefault("distributed_info", distributed_info())
    doc = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "gpuprof_version": __version__,
        "cuda": results.cuda,
        "meta": meta,
        "windows": windows,
    }
    # ensure_ascii keeps lone surrogates of labels intact through json.loads
    text = json.dumps(doc, ensure_ascii=True, default=_json_default)
    with atomic_output(path, "save") as tmp:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            zf.writestr("meta.json", text)
            for name, arr in arrays.items():
                with zf.open(name + ".npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, np.ascontiguousarray(arr), allow_pickle=False)
    return path


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"gpuprof.save(): cannot store {type(o).__name__} {o!r} in meta.json")


def load(path) -> LoadedProfile:
    """Open a file written by ``prof.save(path)``.

    Returns:
        A read-only :class:`LoadedProfile` with the accessors of a profile
        (``ops()``, ``kernels()``, ``key_averages()``, ``export_chrome_trace()``, ...).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a gpuprof file, or from a newer gpuprof.
    """
    path = os.fspath(path)
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile as e:
        raise ValueError(f"gpuprof.load(): {path!r} is not a gpuprof file ({e})") from None
    with zf:
        try:
            doc = json.loads(zf.read("meta.json"))
        except (KeyError, ValueError) as e:
            raise ValueError(f"gpuprof.load(): {path!r} is not a gpuprof file (meta.json: {e})"
                             ) from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"gpuprof.load(): {path!r} is not a gpuprof file")
        if doc.get("version", 0) > FORMAT_VERSION:
            raise ValueError(f"gpuprof.load(): {path!r} has format version {doc['version']}; "
                             f"this gpuprof reads up to {FORMAT_VERSION}: upgrade gpuprof")
        windows = [dict(w) for w in doc["windows"]]
        for name in zf.namelist():
            if not name.endswith(".npy"):
                continue
            prefix, _, key = name[:-4].partition("/")
            i = int(prefix[1:])
            with zf.open(name) as f:
                arr = np.lib.format.read_array(f, allow_pickle=False)
            arr.flags.writeable = False
            windows[i][key] = arr
    results = Results(windows, cuda=doc.get("cuda"), meta=doc.get("meta"))
    return LoadedProfile(results, path)


class LoadedProfile:
    """A profile read back from a ``.gpuprof`` file (read-only).

    It answers like the ``gpuprof.profile`` that recorded it: ``ops()``,
    ``kernels()``, ``gpu_events()``, ``steps()``, ``call_tree()``,
    ``key_averages()``, ``diagnose()``, ``export_chrome_trace()``,
    ``export_stacks()``; ``results`` is the underlying :class:`gpuprof.Results`.
    """

    def __init__(self, results: Results, path: str | None = None):
        self._results = results
        self.path = path

    def __repr__(self) -> str:
        return f"<gpuprof.LoadedProfile {self.path!r}: {len(self._results.windows)} window(s)>"

    @property
    def results(self) -> Results:
        return self._results

    @property
    def profile_memory(self) -> bool:
        return bool(self._results.meta.get("profile_memory"))

    @property
    def with_stack(self) -> bool:
        return bool(self._results.meta.get("with_stack"))

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0):
        """Op statistics as a :class:`gpuprof.tables.KeyAverages` (``.table()`` prints)."""
        from ..tables import KeyAverages

        if group_by_input_shape:
            raise ValueError("key_averages(): group_by_input_shape is not supported (gpuprof "
                             "does not record input shapes)")
        return KeyAverages(self._results, group_by_stack_n=group_by_stack_n,
                           show_memory=self.profile_memory)

    def ops(self):
        return self._results.ops()

    def kernels(self):
        return self._results.kernels()

    def gpu_events(self):
        return self._results.gpu_events()

    def steps(self):
        return self._results.steps()

    def call_tree(self):
        return self._results.call_tree()

    def diagnose(self):
        from ..diagnose import diagnose

        return diagnose(self._results)

    def export_chrome_trace(self, path) -> str:
        from .chrome import export_chrome_trace

        return export_chrome_trace(self._results, path)

    def export_stacks(self, path, metric: str = "self_cpu_time_total") -> str:
        from .stacks import export_stacks

        return export_stacks(self._results, path, metric)

    def save(self, path) -> str:
        return save(self._results, path)
