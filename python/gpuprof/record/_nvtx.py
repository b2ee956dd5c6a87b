"""NVTX in and out: gpuprof as the process's NVTX injection library, its status, and
the ``capture=`` argument of ``gpuprof.profile``.

NVTX (the header-only nvtx3 inside PyTorch, CuPy and the ``nvtx`` package, and the
older libnvToolsExt) reads ``NVTX_INJECTION64_PATH`` at its first call and attaches to
the tool library it names. :func:`setup` (run by ``import gpuprof``) points it at
gpuprof's own extension when it is unset, so NVTX ranges become user ranges in the
results. A library that made its first NVTX call before ``import gpuprof`` stays
detached: :func:`status` probes the libraries it can (torch, nvtx, libnvToolsExt) and
names those. When the variable already names another tool (Nsight Systems), gpuprof
leaves it alone and sends its own ``record_function`` labels and ``ProfilerStep#N``
there instead. ``GPUPROF_NVTX=0`` turns the injection off.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from .. import _gpuprof
from ..core._constants import CAPTURE_NONE, CAPTURE_NVTX, CAPTURE_PROFILER_API

__all__ = ["parse_capture", "setup", "status"]

ENV = "NVTX_INJECTION64_PATH"
PROBE = "gpuprof-nvtx-probe"

_state: dict = {"set_by_gpuprof": False, "disabled": False, "probed": {}}


def _self_path() -> str:
    return os.path.realpath(_gpuprof.__file__)


def _is_self(path: str | None) -> bool:
    if not path:
        return False
    try:
        return os.path.realpath(path) == _self_path()
    except OSError:
        return False


def setup() -> None:
    """Make gpuprof the NVTX injection library, unless a tool already is (import time)."""
    if os.environ.get("GPUPROF_NVTX") == "0":
        _state["disabled"] = True
        return
    if os.environ.get(ENV):
        return
    # Inherited by child processes too: an NVTX client there loads this file and
    # attaches to a gpuprof that records nothing unless that process profiles.
    os.environ[ENV] = _self_path()
    _state["set_by_gpuprof"] = True


def _mapped_libnvtoolsext() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            return sorted({ln.split()[-1] for ln in f if "libnvToolsExt" in ln and "/" in ln})
    except OSError:
        return []


def _probe_callables() -> list[tuple[str, Callable[[str], object]]]:
    """(library, callable(message)) for each NVTX client loaded here that can be probed
    without importing anything."""
    out = []
    torch = sys.modules.get("torch")
    nvtx_mod = getattr(getattr(torch, "cuda", None), "nvtx", None) if torch else None
    if nvtx_mod is not None and hasattr(nvtx_mod, "mark"):
        out.append(("torch", nvtx_mod.mark))
    pkg = sys.modules.get("nvtx")
    if pkg is not None and hasattr(pkg, "mark"):
        out.append(("nvtx", lambda msg, _m=pkg.mark: _m(message=msg)))
    for path in _mapped_libnvtoolsext():

        def mark_v2(msg, _path=path):
            import ctypes

            ctypes.CDLL(_path).nvtxMarkA(msg.encode())

        out.append((os.path.basename(path), mark_v2))
    return out


def probe() -> list[str]:
    """Names of the loaded NVTX libraries that are not attached to gpuprof (they made
    their first NVTX call before ``import gpuprof``). Each is probed once per process
    with an NVTX mark, which also attaches a library that had not called NVTX yet."""
    missed = []
    for lib, mark in _probe_callables():
        seen = _state["probed"].get(lib)
        if seen is None:
            before = _gpuprof.nvtx_info()["probe_hits"]
            try:
                mark(PROBE)
            except Exception:  # a CPU-only torch build has no NVTX: nothing to miss
                _state["probed"][lib] = True
                continue
            seen = _gpuprof.nvtx_info()["probe_hits"] > before
            _state["probed"][lib] = seen
        if not seen:
            missed.append(lib)
    return missed


def status() -> dict:
    """Where NVTX ranges go, for ``gpuprof.cuda_status()["nvtx"]``.

    Keys: ``injection`` ("gpuprof", "off", or the other tool's path), ``clients`` (NVTX
    libraries attached to gpuprof), ``missed`` (libraries whose ranges gpuprof cannot
    see), ``emit`` (gpuprof's own ranges go out to another tool), ``emit_reason``, and
    ``reason`` ("" when NVTX input works, else why not).
    """
    info = _gpuprof.nvtx_info()
    path = os.environ.get(ENV)
    missed: list[str] = []
    if _state["disabled"]:
        injection, reason = "off", "GPUPROF_NVTX=0: gpuprof does not take NVTX ranges"
    elif not path:
        injection, reason = "off", f"{ENV} was unset after import gpuprof: NVTX ranges are not seen"
    elif _is_self(path):
        injection, reason = "gpuprof", ""
        missed = probe()
        if missed:
            reason = (
                f"NVTX in {', '.join(missed)} was used before `import gpuprof`, so its "
                f"ranges are not seen: import gpuprof first, or start the program with "
                f"{ENV}={_self_path()}"
            )
    else:
        injection = path
        reason = (
            f"{ENV} names another NVTX tool ({path}; Nsight Systems?): gpuprof does not see "
            "NVTX ranges, and sends its own labels there"
        )
    return {
        "injection": injection,
        "clients": int(info["clients"]),
        "missed": missed,
        "emit": bool(info["emit"]),
        "emit_reason": info["emit_reason"],
        "reason": reason,
    }


def parse_capture(capture) -> tuple[int, str | None, str | None]:
    """``capture=`` of ``gpuprof.profile`` -> (mode, NVTX name, NVTX domain)."""
    if capture is None:
        return CAPTURE_NONE, None, None
    if not isinstance(capture, str):
        raise TypeError(
            f"profile(): capture must be None, 'cudaProfilerApi' or 'nvtx:NAME', got {capture!r}"
        )
    if capture == "cudaProfilerApi":
        return CAPTURE_PROFILER_API, None, None
    if capture.startswith("nvtx:") and len(capture) > 5:
        name, sep, domain = capture[5:].rpartition("@")
        if not sep:
            name, domain = capture[5:], ""
        if not name:
            raise ValueError(
                f"profile(): capture={capture!r} has no range name; use "
                "'nvtx:NAME' or 'nvtx:NAME@DOMAIN'"
            )
        if len(name.encode()) > 255 or len(domain.encode()) > 255:
            raise ValueError(
                "profile(): capture='nvtx:NAME@DOMAIN': NAME and DOMAIN must be "
                "under 256 bytes each"
            )
        return CAPTURE_NVTX, name, domain
    raise ValueError(
        f"profile(): capture={capture!r} is not one of 'cudaProfilerApi' "
        "(record between cudaProfilerStart and cudaProfilerStop, e.g. "
        "torch.cuda.profiler.start()/stop()) or 'nvtx:NAME' / 'nvtx:NAME@DOMAIN' "
        "(record inside NVTX ranges named NAME)"
    )


# At import (gpuprof/__init__.py imports this module first): NVTX reads the variable at
# its first call, which may come from any library at any time after this.
setup()
