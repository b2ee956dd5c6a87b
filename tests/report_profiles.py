"""Synthetic GPU profiles for the HTML report's tests (tests/unit/test_html_report.py,
tests/browser/test_report_browser.py): a training loop's timeline written as hook events
and GPU records, put through the real C aggregation (``_gpuprof._test_aggregate``).

The profiled functions are compiled from SOURCE under the name ``train.py``, so that the
report names the lines a user would see.
"""

import numpy as np
from timelines import US, C, Timeline

STEP = 1000 * US

LAUNCH, STREAM_SYNC, MALLOC, FREE = 211, 131, 20, 22  # CUPTI runtime callback ids
API_NAMES = {
    LAUNCH: "cudaLaunchKernel",
    STREAM_SYNC: "cudaStreamSynchronize",
    MALLOC: "cudaMalloc",
    FREE: "cudaFree",
}

SOURCE = """\
class Loader:
    def __next__(self):
        pass


def decode(sample):
    pass


def forward(model, batch):
    pass


def log_loss(loss):
    pass


def train_step(model, batch):
    pass
"""
_ns: dict = {}
exec(compile(SOURCE, "train.py", "exec"), _ns)
Loader, decode, forward, log_loss, train_step = (
    _ns["Loader"],
    _ns["decode"],
    _ns["forward"],
    _ns["log_loss"],
    _ns["train_step"],
)
FUNCS = [train_step, Loader.__next__, decode, forward, log_loss]
TRAIN, NEXT, DECODE, FORWARD, LOG, RANGE = range(2, 8)  # op ids: functions, then the label

GEMM = "ampere_sgemm_128x64_nn"
ELEMENTWISE = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>,"
    " at::detail::Array<char*, 3> >(int, at::native::AddFunctor<float>, "
    "at::detail::Array<char*, 3>)"
)
RELU = "void at::native::(anonymous namespace)::relu_kernel<float>(float*, float const*, int)"


def where(func) -> str:
    """The file:line the report gives for a function of SOURCE."""
    return f"train.py:{func.__code__.co_firstlineno}"


class _Timeline(Timeline):
    KERNEL = {"registers": 64, "grid_x": 120, "block_x": 256}

    def results(self, label, meta=None):
        ops = [(C["OP_PYTHON"], f.__code__, 0) for f in FUNCS] + [(C["OP_USER"], label, 0)]
        return self.aggregate(ops, {"profile_memory": True, **(meta or {})}, API_NAMES)


def training_results(steps=6, label="forward pass", meta=None, gemm_us=400, loader_us=300):
    """A training loop with something to find in every section: each step waits
    ``loader_us`` for data (decode inside), runs the forward pass under a record_function
    label (an FP32 GEMM of ``gemm_us`` and three short kernels, a cudaMalloc that grows
    each step), then log_loss blocks in cudaStreamSynchronize until the GPU is done. With
    the defaults a step takes 980 us."""
    tl = _Timeline()
    step = STEP - (300 - loader_us) * US
    for k in range(steps):
        t0 = k * step + 10 * US
        t1 = t0 + loader_us * US  # the data is there: the rest as in a 300-us wait
        tl.ev(t0, "EV_STEP_BEGIN", k)
        tl.ev(t0, "EV_CALL", NEXT)
        tl.ev(t0 + loader_us * US // 15, "EV_CALL", DECODE)  # 20 us into a 300-us wait
        tl.ev(t1 - loader_us * US // 15, "EV_RETURN", 0)
        tl.ev(t1, "EV_RETURN", 0)
        tl.ev(t1, "EV_CALL", TRAIN)
        tl.ev(t1 + 10 * US, "EV_RANGE_PUSH", RANGE)
        tl.ev(t1 + 20 * US, "EV_CALL", FORWARD)
        gpu_t = t1 + 40 * US
        for j, (name, dur) in enumerate(
            ((GEMM, gemm_us), (ELEMENTWISE, 8), (RELU, 6), (ELEMENTWISE, 8))
        ):
            corr = tl.api(LAUNCH, t1 + (30 + 12 * j) * US, 5 * US)
            tl.kernel(corr, gpu_t, gpu_t + dur * US, name)
            gpu_t += (dur + 2) * US
        corr = tl.api(MALLOC, t1 + 100 * US, 10 * US)
        tl.memory("GPU_MALLOC", corr, t1 + 105 * US, (k + 1) << 20, 0x10000 + k)
        tl.ev(t1 + 200 * US, "EV_RETURN", 0)
        tl.ev(t1 + 210 * US, "EV_RANGE_POP", RANGE)
        tl.ev(t1 + 220 * US, "EV_CALL", LOG)
        tl.api(STREAM_SYNC, t1 + 230 * US, max(gpu_t - (t1 + 230 * US), US))
        tl.ev(t1 + 510 * US, "EV_RETURN", 0)
        corr = tl.api(FREE, t1 + 520 * US, 10 * US)
        if k < steps - 1:  # the last step's buffer stays: the peak is at the end
            tl.memory("GPU_FREE", corr, t1 + 525 * US, (k + 1) << 20, 0x10000 + k)
        tl.ev(t1 + 600 * US, "EV_RETURN", 0)
        tl.ev(t0 + step - 20 * US, "EV_STEP_END", k)
    return tl.results(label, meta)


def launch_bound_results(steps=200, layers=48, kernel_names=40):
    """A launch-bound window: ``layers`` 4-us launches per step of 2-us kernels (from
    ``kernel_names`` names), a 100-us step; the size test's stand-in for the
    launch-bound benchmark's 200-step window."""
    tl = _Timeline()
    names = [
        f"void at::native::elementwise_kernel_{i}<128, 4>(int, float*, float const*)"
        for i in range(kernel_names)
    ]
    step = 250 * US
    for k in range(steps):
        t0 = k * step + 10 * US
        tl.ev(t0, "EV_STEP_BEGIN", k)
        tl.ev(t0, "EV_CALL", NEXT)
        tl.ev(t0 + 5 * US, "EV_RETURN", 0)
        tl.ev(t0 + 5 * US, "EV_CALL", TRAIN)
        tl.ev(t0 + 6 * US, "EV_CALL", FORWARD)
        for j in range(layers):
            t = t0 + 7 * US + j * 4 * US
            corr = tl.api(LAUNCH, t, 3 * US)
            tl.kernel(corr, t + 3 * US, t + 5 * US, names[(k + j) % kernel_names])
        tl.ev(t0 + 200 * US, "EV_RETURN", 0)
        tl.ev(t0 + 210 * US, "EV_RETURN", 0)
        tl.ev(t0 + step - 5 * US, "EV_STEP_END", k)
    return tl.results("forward pass")


def rows_of(table_text: str) -> list[list[str]]:
    """The data rows of a printed key_averages() table, split into cells."""
    lines = table_text.splitlines()
    seps = [i for i, ln in enumerate(lines) if ln and set(ln) == {"-"}]
    import re

    return [re.split(r"\s{2,}", ln.strip()) for ln in lines[seps[1] + 1 : seps[2]]]


__all__ = ["training_results", "launch_bound_results", "where", "rows_of", "np"]
