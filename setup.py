"""Build description of the gpuprof C extension (metadata lives in pyproject.toml).

CUPTI headers decide how cuda/ is built:
  GPUPROF_NO_CUDA=1          build cuda/cuda_stub.c (no GPU capture)
  GPUPROF_CUPTI_INCLUDE=DIR  use cupti.h from DIR
  otherwise                  $CUDA_HOME/include, /usr/local/cuda/include, the CUPTI
                             folder of a CUDA toolkit, then the nvidia-cuda-cupti wheel
libcupti is never linked: it is opened at run time (python/gpuprof/record/_cuda.py).
"""

import glob
import os
import site
import sys
import sysconfig

import numpy
from setuptools import Extension, setup


def _candidate_include_dirs():
    env = os.environ.get("GPUPROF_CUPTI_INCLUDE")
    if env:
        yield env
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            yield os.path.join(root, "include")
            yield os.path.join(root, "extras", "CUPTI", "include")
    yield "/usr/local/cuda/include"
    yield "/usr/local/cuda/extras/CUPTI/include"
    roots = list(site.getsitepackages()) + [site.getusersitepackages(), sysconfig.get_paths()["purelib"]]
    for root in roots:
        for sub in ("nvidia/cu13/include", "nvidia/cuda_cupti/include", "nvidia/cu12/include"):
            yield os.path.join(root, sub)


def find_cupti_include():
    if os.environ.get("GPUPROF_NO_CUDA") == "1":
        return None
    for d in _candidate_include_dirs():
        if os.path.isfile(os.path.join(d, "cupti.h")):
            return d
    return None


def extension():
    # csrc/record/nvtx.c (the NVTX injection library) needs no CUDA headers: always built.
    # csrc/ is one folder per layer (record, aggregate, results, trace, dump; the module
    # and its test entry points at the top); headers are included by name from any of them
    sources = sorted(glob.glob("csrc/*.c") + glob.glob("csrc/*/*.c"))
    include_dirs = [numpy.get_include(), "csrc", *sorted(glob.glob("csrc/*/")), "cuda"]
    macros = []
    cupti = find_cupti_include()
    if cupti:
        sources += sorted(glob.glob("cuda/cupti_*.c"))
        include_dirs.append(cupti)
        macros.append(("GPUPROF_HAVE_CUPTI", "1"))
        print(f"gpuprof: building with CUPTI headers from {cupti}", file=sys.stderr)
    else:
        sources.append("cuda/cuda_stub.c")
        print("gpuprof: CUPTI headers not found; building without GPU capture", file=sys.stderr)
    cflags = ["-std=c11", "-O2", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-fvisibility=hidden"]
    if os.environ.get("GPUPROF_WERROR") == "1":
        cflags.append("-Werror")
    if os.environ.get("GPUPROF_DEBUG") == "1":
        macros.append(("GPUPROF_DEBUG", "1"))
        cflags += ["-O0", "-g"]
    sanitize = os.environ.get("GPUPROF_SANITIZE")
    ldflags = ["-ldl", "-lpthread"]
    if sanitize:
        cflags += [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-g"]
        ldflags += [f"-fsanitize={sanitize}"]
    return Extension(
        "gpuprof._gpuprof",
        sources=sources,
        include_dirs=include_dirs,
        define_macros=macros,
        extra_compile_args=cflags,
        extra_link_args=ldflags,
    )


setup(ext_modules=[extension()])
