# Type stub of the C extension gpuprof._gpuprof (csrc/module.c, csrc/profiler.c,
# csrc/threads.c, csrc/testing.c). tests/unit/test_architecture.py checks that it names what the
# extension defines.
from collections.abc import Callable
from typing import Any

import numpy as np
from _typeshed import SupportsWrite

HAVE_CUPTI: int
EVENT_CLOCK: str

# enum values of the C core (csrc/module.c, module_constants; read through gpuprof._constants)
OP_NONE: int
OP_PYTHON: int
OP_CFUNC: int
OP_USER: int
OP_STEP: int
OP_CUDA_API: int
OPF_HIDDEN: int
OPF_GENERATOR: int
OPF_NVTX: int
OPF_LIBRARY: int
OPF_WAIT: int
OPF_AUTOGRAD: int
GPU_KERNEL: int
GPU_MEMCPY: int
GPU_MEMSET: int
GPU_SYNC: int
GPU_MALLOC: int
GPU_FREE: int
GPU_API: int
GF_ATTRIBUTED: int
GF_BLOCKED_THREAD: int
GF_ROLLED_UP: int
SF_ENTERED: int
CAT_COMPUTE: int
CAT_MEMCPY: int
CAT_MEMSET: int
CAT_COMMUNICATION: int
CAT_SYNC: int
APICLASS_OTHER: int
APICLASS_LAUNCH: int
APICLASS_GRAPH: int
APICLASS_MEMCPY: int
APICLASS_MEMCPY_SYNC: int
APICLASS_MEMSET: int
APICLASS_SYNC: int
APICLASS_ALLOC: int
APICLASS_FREE: int
ACT_NONE: int
ACT_WARMUP: int
ACT_RECORD: int
ACT_RECORD_AND_SAVE: int
ACT_EXIT: int
CAPTURE_NONE: int
CAPTURE_PROFILER_API: int
CAPTURE_NVTX: int

class _ThreadEnd:
    """threading.Thread._delete while profiling (csrc/threads.c): keeps the ending
    thread's name in ``names`` (OS thread id -> name), then calls ``original``."""

    def __init__(self, original: Callable[..., object], names: dict[int, str]) -> None: ...
    def __call__(self, thread: Any) -> object: ...
    def __get__(self, obj: object, objtype: type | None = None) -> Callable[[], object]: ...

class Profiler:
    """Low-level profiler session (use gpuprof.profile)."""

    def __init__(
        self,
        max_events: int = ...,
        cuda: bool = ...,
        memory: bool = ...,
        schedule: Any = ...,
        schedule_fn: Callable[[int], object] | None = ...,
        on_trace_ready: Callable[[Any], object] | None = ...,
        owner: Any = ...,
        capture: int = ...,
        capture_name: str | None = ...,
        capture_domain: str | None = ...,
        monitoring: bool = ...,
        cuda_sync_records: bool = ...,
    ) -> None: ...
    @staticmethod
    def nvtx_info() -> dict[str, Any]: ...
    def start(self) -> None: ...
    def step(self) -> None: ...
    def stop(self) -> None: ...
    def buffer_stats(self) -> dict[str, int]: ...
    @property
    def result(self) -> dict[str, Any] | None: ...
    @property
    def step_num(self) -> int: ...
    @property
    def action(self) -> int: ...
    @property
    def running(self) -> bool: ...
    @property
    def cuda(self) -> dict[str, Any]: ...
    @property
    def windows(self) -> int: ...

# ranges (record_function) and threads
def range_push(label: str, /) -> int: ...
def range_pop(token: int, /) -> None: ...
def _thread_bootstrap(frame: Any, event: str, arg: Any, /) -> Any: ...
def _set_hidden_prefix(prefix: str | tuple[str, ...], shown: str | None = ..., /) -> None: ...
def _set_library_roots(roots: tuple[str, ...], /) -> None: ...
def _is_library(file: str, /) -> bool: ...
def _set_seq_peek(address: int, /) -> None: ...
def _set_module_code(code: Any, /) -> None: ...
def _module_instances() -> list[Any]: ...
def _ignore_thread(ident: int, /) -> None: ...
def _ignore_current_thread() -> None: ...
def _after_fork_child() -> None: ...
def _monitoring_configure(
    disable: object, restart_events: Callable[[], object] | None, /
) -> None: ...

# CUDA capture
def cuda_load(path: str, /) -> tuple[bool, str]: ...
def cuda_info() -> dict[str, Any]: ...
def _cuda_stats() -> dict[str, int]: ...
def device_props() -> list[dict[str, Any]]: ...

# clock
def clock_ns() -> int: ...
def epoch_offset_ns() -> int: ...

# results and traces
def _complete_window(raw: dict[str, Any], /) -> dict[str, Any]: ...
def _write_trace(
    dest: str | SupportsWrite[bytes], window: dict[str, Any], meta: dict[str, Any], /
) -> int: ...
def _trace_keep(window: dict[str, Any], min_ns: int, /) -> tuple[np.ndarray, int]: ...

# test entry points (csrc/testing.c)
def _test_binding_function(module_name: str, /) -> Callable[[Any], Any]: ...
def _test_schedule_action(
    wait: int,
    warmup: int,
    active: int,
    repeat: int,
    skip_first: int,
    skip_first_wait: int,
    step: int,
    /,
) -> int: ...
def _test_schedule_transition(prev: int, cur: int, /) -> int: ...
def _test_aggregate(
    ops: list[tuple[int, Any, int]],
    threads: list[tuple[int, int, list[tuple[int, ...]]]],
    gpu: list[dict[str, int]],
    window_start_ns: int,
    window_end_ns: int,
    kernel_names: list[str],
    *args: Any,
) -> dict[str, Any]: ...
def _test_constants() -> dict[str, int]: ...
def _test_api_key(domain: int, cbid: int, /) -> dict[str, Any]: ...
def _test_nvtx_name(message: str, /) -> dict[str, Any]: ...

# sys.monitoring callbacks (Python 3.12+ only)
def _mon_start(*args: Any) -> Any: ...
def _mon_resume(*args: Any) -> Any: ...
def _mon_throw(*args: Any) -> Any: ...
def _mon_return(*args: Any) -> Any: ...
def _mon_unwind(*args: Any) -> Any: ...
def _mon_call(*args: Any) -> Any: ...
def _mon_c_return(*args: Any) -> Any: ...
