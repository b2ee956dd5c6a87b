"""The one reader of Chrome/Kineto trace files (ours or any other tool's), for
``gpuprof.merge`` and ``python -m gpuprof report``."""

from __future__ import annotations

import gzip
import json

__all__ = ["read_trace"]


def read_trace(path: str, func: str) -> dict:
    """The trace at ``path`` as a dict with a ``traceEvents`` list: plain or gzip JSON
    (told apart by the gzip magic, not the name), the object form or the bare array
    form of the Trace Event Format.

    Raises:
        OSError: the file cannot be read (the message names ``func`` and ``path``).
        ValueError: it is not JSON, or holds no ``traceEvents`` list.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            f.seek(0)
            if head == b"\x1f\x8b":
                with gzip.GzipFile(fileobj=f) as gz:
                    data = gz.read()
            else:
                data = f.read()
        doc = json.loads(data)
    except OSError as e:
        raise OSError(e.errno, f"{func}(): cannot read {path!r}: {e.strerror or e}", path) from e
    except (ValueError, EOFError) as e:
        raise ValueError(f"{func}(): {path!r} is not a JSON trace ({e})") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError(f"{func}(): {path!r} is not a Chrome trace: it has no traceEvents list")
    return doc
