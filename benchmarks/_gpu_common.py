"""Helpers shared by the GPU benchmarks: building the CUPTI floor and the launch loop,
the floor bits that match a set of gpuprof's CUPTI parts, and the MLP training step."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.path.join(ROOT, "build", "bench")

# gpuprof's CUPTI parts (gpuprof.cuda_status()["parts"]) -> cupti_floor.c's bits.
PART_BITS = {
    "kernels": 1,
    "rtcb": 2,
    "drvcb": 4,
    "memcpy": 32,
    "memset": 128,
    "sync": 256,
    "serial": 512,
    "memory": 1024,
}


def mlp_step(torch, device="cuda", width=256, depth=16, batch=64, act=None, seed=None):
    """A training step of ``depth`` x Linear(width) + ``act`` (ReLU by default) on a batch
    of ``batch``, SGD; the defaults are the benchmarks' launch-bound step (133 kernels a
    step on CUDA). The returned ``step()`` does not synchronize."""
    if seed is not None:
        torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), (act or torch.nn.ReLU)()]
    model = torch.nn.Sequential(*layers).to(device)
    x = torch.randn(batch, width, device=device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    return step


def floor_bits(parts: str | None = None, memory: bool = False) -> int:
    """Floor bits for a comma-separated parts string; None: gpuprof's default parts."""
    if parts is None:
        sys.path.insert(0, os.path.join(ROOT, "python"))
        from gpuprof import _gpuprof

        parts = _gpuprof.cuda_info()["parts"]
    bits = sum(PART_BITS[p] for p in parts.split(",") if p in PART_BITS)
    if "serial" in parts.split(","):
        bits &= ~PART_BITS["kernels"]
    return bits | (PART_BITS["memory"] if memory else 0)


def _cupti_dirs() -> tuple[str | None, str | None]:
    """(include dir with cupti.h, lib dir with libcupti.so.*), wheel first."""
    cands = []
    try:
        import nvidia

        for root in nvidia.__path__:
            cands += [os.path.join(root, sub) for sub in ("cu13", "cuda_cupti", "cu12")]
    except ImportError:
        pass
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    cands += [home, os.path.join(home, "extras", "CUPTI")]
    inc = lib = None
    for c in cands:
        if inc is None and os.path.isfile(os.path.join(c, "include", "cupti.h")):
            inc = os.path.join(c, "include")
        for sub in ("lib", "lib64"):
            if lib is None and glob.glob(os.path.join(c, sub, "libcupti.so*")):
                lib = os.path.join(c, sub)
    return inc, lib


def build_floor() -> str | None:
    """Build benchmarks/cupti_floor.c; its path, or None (with the reason printed)."""
    inc, lib = _cupti_dirs()
    if inc is None or lib is None:
        print(f"floor: no CUPTI headers/library (include {inc}, lib {lib}); floor modes skipped")
        return None
    os.makedirs(BUILD, exist_ok=True)
    out = os.path.join(BUILD, "libgpfloor.so")
    soname = sorted(os.path.basename(p) for p in glob.glob(os.path.join(lib, "libcupti.so*")))[0]
    cuda_inc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")
    cmd = [
        "gcc",
        "-O2",
        "-shared",
        "-fPIC",
        f"-I{inc}",
        f"-I{cuda_inc}",
        *(
            f"-I{d}"
            for d in [os.path.join(ROOT, "csrc"), *glob.glob(os.path.join(ROOT, "csrc", "*/"))]
        ),
        os.path.join(HERE, "cupti_floor.c"),
        "-o",
        out,
        f"-L{lib}",
        f"-l:{soname}",
        f"-Wl,-rpath,{lib}",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"floor: build failed, floor modes skipped:\n{r.stderr[-1500:]}")
        return None
    return out


def build_launch_loop() -> str:
    """Build benchmarks/launch_loop.cu with nvcc; its path."""
    nvcc = shutil.which("nvcc") or os.path.join(
        os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"
    )
    os.makedirs(BUILD, exist_ok=True)
    out = os.path.join(BUILD, "liblaunch.so")
    subprocess.run(
        [
            nvcc,
            "-O2",
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-arch=sm_90",
            os.path.join(HERE, "launch_loop.cu"),
            "-o",
            out,
        ],
        check=True,
    )
    return out
