"""The C core's enum values, read from the extension in one place.

The extension exports them as module constants (csrc/module.c,
``module_constants``); every Python module that needs one imports it from here,
and the name maps of the public arrays (``ops()["kind"]``, ``kernels()["category"]``,
``gpu_events()["kind"]``) are built from them.
"""

from __future__ import annotations

from .. import _gpuprof as _c

__all__ = [
    "GPU_KINDS",
    "KERNEL_CATEGORIES",
    "OP_KINDS",
]

# op kinds (ops()["kind"], spans' kind) and op flags (GP_OP_*, GP_OPF_*)
OP_NONE, OP_PYTHON, OP_CFUNC, OP_USER, OP_STEP, OP_CUDA_API = (
    _c.OP_NONE,
    _c.OP_PYTHON,
    _c.OP_CFUNC,
    _c.OP_USER,
    _c.OP_STEP,
    _c.OP_CUDA_API,
)
OPF_HIDDEN, OPF_GENERATOR, OPF_NVTX = _c.OPF_HIDDEN, _c.OPF_GENERATOR, _c.OPF_NVTX
OPF_LIBRARY, OPF_WAIT = _c.OPF_LIBRARY, _c.OPF_WAIT
OPF_AUTOGRAD = _c.OPF_AUTOGRAD  # with OPF_NVTX: an autograd node's range
# GPU record kinds (GP_GPU_*) and GPU event flags (GP_GF_*)
GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET, GPU_SYNC, GPU_MALLOC, GPU_FREE, GPU_API = (
    _c.GPU_KERNEL,
    _c.GPU_MEMCPY,
    _c.GPU_MEMSET,
    _c.GPU_SYNC,
    _c.GPU_MALLOC,
    _c.GPU_FREE,
    _c.GPU_API,
)
# what Self CUDA counts: GPU work (not syncs, allocations or API records)
GPU_WORK = (GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET)
GF_ATTRIBUTED, GF_BLOCKED_THREAD, GF_ROLLED_UP = (
    _c.GF_ATTRIBUTED,
    _c.GF_BLOCKED_THREAD,
    _c.GF_ROLLED_UP,
)
# span flags (GP_SF_*)
SF_ENTERED = _c.SF_ENTERED
# kernel categories (GP_CAT_*)
CAT_COMPUTE, CAT_MEMCPY, CAT_MEMSET, CAT_COMMUNICATION, CAT_SYNC = (
    _c.CAT_COMPUTE,
    _c.CAT_MEMCPY,
    _c.CAT_MEMSET,
    _c.CAT_COMMUNICATION,
    _c.CAT_SYNC,
)
# what a CUDA API call does: the flags of an OP_CUDA_API op row (GP_APICLASS_*)
(
    API_OTHER,
    API_LAUNCH,
    API_GRAPH,
    API_MEMCPY,
    API_MEMCPY_SYNC,
    API_MEMSET,
    API_SYNC,
    API_ALLOC,
    API_FREE,
) = (
    _c.APICLASS_OTHER,
    _c.APICLASS_LAUNCH,
    _c.APICLASS_GRAPH,
    _c.APICLASS_MEMCPY,
    _c.APICLASS_MEMCPY_SYNC,
    _c.APICLASS_MEMSET,
    _c.APICLASS_SYNC,
    _c.APICLASS_ALLOC,
    _c.APICLASS_FREE,
)
# schedule actions (GP_ACT_*; the values of torch.profiler's ProfilerAction)
ACT_NONE, ACT_WARMUP, ACT_RECORD, ACT_RECORD_AND_SAVE, ACT_EXIT = (
    _c.ACT_NONE,
    _c.ACT_WARMUP,
    _c.ACT_RECORD,
    _c.ACT_RECORD_AND_SAVE,
    _c.ACT_EXIT,
)
# the actions of steps that a window keeps, and of those the hook runs in (warm-up too)
ACTS_KEPT = (ACT_RECORD, ACT_RECORD_AND_SAVE)
ACTS_HOOKED = (ACT_WARMUP, ACT_RECORD, ACT_RECORD_AND_SAVE)
# capture ranges (GP_CAPTURE_*)
CAPTURE_NONE, CAPTURE_PROFILER_API, CAPTURE_NVTX = (
    _c.CAPTURE_NONE,
    _c.CAPTURE_PROFILER_API,
    _c.CAPTURE_NVTX,
)

# the names the public arrays show
OP_KINDS = {
    OP_NONE: "none",
    OP_PYTHON: "python",
    OP_CFUNC: "c",
    OP_USER: "user",
    OP_STEP: "step",
    OP_CUDA_API: "cuda_api",
}
KERNEL_CATEGORIES = {
    CAT_COMPUTE: "compute",
    CAT_MEMCPY: "memcpy",
    CAT_MEMSET: "memset",
    CAT_COMMUNICATION: "communication",
    CAT_SYNC: "sync",
}
GPU_KINDS = {
    GPU_KERNEL: "kernel",
    GPU_MEMCPY: "memcpy",
    GPU_MEMSET: "memset",
    GPU_SYNC: "sync",
    GPU_MALLOC: "malloc",
    GPU_FREE: "free",
    GPU_API: "api",
}
