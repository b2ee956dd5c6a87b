"""Finding and loading CUPTI at run time, and reporting why GPU capture is off.

Search order for libcupti (first that loads wins; one CUPTI per process):
  1. GPUPROF_CUPTI_PATH (a file)
  2. a libcupti already mapped into this process (e.g. loaded by PyTorch)
  3. the nvidia pip wheels (nvidia/cu13/lib, nvidia/cuda_cupti/lib, ...)
  4. CUDA_HOME / CUDA_PATH, /usr/local/cuda (lib64 and extras/CUPTI/lib64)
  5. the dynamic loader's default path (libcupti.so.13, libcupti.so)
"""

from __future__ import annotations

import glob
import os
import sys

from .. import _gpuprof

__all__ = ["cuda_status", "ensure_cupti", "gpu_present"]

_state: dict = {"tried": False, "ok": False, "path": None, "reason": "", "attempts": []}


def _mapped_cupti() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if "libcupti.so" in line})
    except OSError:
        return []


def candidate_paths() -> list[str]:
    """Where gpuprof looks for libcupti, in order."""
    out: list[str] = []
    env = os.environ.get("GPUPROF_CUPTI_PATH")
    if env:
        out.append(env)
    out += _mapped_cupti()
    for root in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_cupti/lib", "nvidia/cu12/lib"):
            out += sorted(glob.glob(os.path.join(root, sub, "libcupti.so*")), reverse=True)
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for root in filter(None, roots):
        for sub in ("lib64", "extras/CUPTI/lib64", "lib"):
            out += sorted(glob.glob(os.path.join(root, sub, "libcupti.so*")), reverse=True)
    out += ["libcupti.so.13", "libcupti.so"]
    return list(dict.fromkeys(out))  # each path once, in order


def ensure_cupti() -> tuple[bool, str]:
    """Load libcupti once; return (ok, reason-if-not)."""
    if _state["tried"]:
        return _state["ok"], _state["reason"]
    _state["tried"] = True
    info = _gpuprof.cuda_info()
    if not info["compiled"]:
        _state["reason"] = info["reason"]
        return False, _state["reason"]
    reasons = []
    for path in candidate_paths():
        ok, why = _gpuprof.cuda_load(path)
        _state["attempts"].append((path, ok, why))
        if ok:
            _state.update(ok=True, path=path, reason="")
            return True, ""
        reasons.append(f"{path}: {why}")
    _state["reason"] = (
        "libcupti could not be loaded (set GPUPROF_CUPTI_PATH, or install the "
        "nvidia-cuda-cupti wheel); tried " + "; ".join(reasons[:4])
    )
    return False, _state["reason"]


def gpu_present() -> bool:
    """An NVIDIA driver is installed (checked without initializing CUDA)."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia/version")


def cuda_status() -> dict:
    """Whether GPU capture can work here, and if not, why.

    Returns a dict: ``compiled`` (built with CUPTI headers), ``loaded``
    (libcupti opened), ``library`` (its path), ``version`` (CUPTI API
    version), ``gpu`` (an NVIDIA driver is present), ``usable`` (compiled,
    loaded and a GPU present), ``mode`` ("callbacks", "activity-only" or
    "off"), ``parts`` (the CUPTI parts a profile switches on, comma-separated:
    API callbacks ``rtcb``/``drvcb``, records ``kernels``, ``memcpy``,
    ``memset``, ``sync``...) and ``reason`` (why it is off or degraded; ""
    when all is well).
    Loading libcupti here does not initialize CUDA.
    """
    info = _gpuprof.cuda_info()
    ok, reason = ensure_cupti() if info["compiled"] else (False, info["reason"])
    info = _gpuprof.cuda_info()
    gpu = gpu_present()
    if ok and not gpu:
        reason = "no NVIDIA driver found (/dev/nvidiactl is missing): GPU capture is off"
    return {
        "compiled": bool(info["compiled"]),
        "loaded": bool(info["loaded"]),
        "library": _state["path"],
        "version": int(info["version"]),
        "gpu": gpu,
        "usable": bool(ok and gpu),
        "mode": info["mode"] if ok else "off",
        "parts": info["parts"] if ok else "",
        "reason": reason or info["reason"],
    }
