"""What an armed process answers `gpuprof top` for a sampled step (api/ondemand/_summary.py),
and how top prints it (cli/_top.py), on synthetic GPU steps put through the real C
aggregation: GPU time, the ops that launched it and the kernels, the shares of the
step, and the same figures on the line and on the screen.

The CPU side runs on real processes in tests/cli/test_top_cli.py; GPU steps need a
GPU there, so they are made here.
"""

import json

import pytest
import timelines
from gpuprof.api.ondemand import _summary
from gpuprof.cli import _top as cli_top
from gpuprof.cli.ondemand._top import Interval, Proc, Row, Top
from timelines import US, C

LAUNCH = 211  # CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000
GEMM = "ampere_sgemm_128x64_nn"
STEP = 100 * US
T0 = 1 * US


def train_step():
    pass


def log_loss():
    pass


OPS = [train_step, log_loss]
TRAIN, LOG = 2, 3


def one_step(kernel_us: int, loss_us: int):
    """One step: train_step launches a GEMM that runs kernel_us on the GPU, then
    log_loss runs loss_us on the host."""
    tl = timelines.Timeline()
    tl.events.append((T0, C["EV_STEP_BEGIN"], 0))
    tl.call(TRAIN, T0)
    corr = tl.api(LAUNCH, T0 + 2 * US, US // 2)
    tl.kernel(corr, T0 + 5 * US, T0 + (5 + kernel_us) * US, GEMM)
    tl.ret(T0 + 10 * US)
    tl.call(LOG, T0 + 10 * US)
    tl.ret(T0 + (10 + loss_us) * US)
    tl.events.append((T0 + STEP, C["EV_STEP_END"], 0))
    return tl.aggregate([(C["OP_PYTHON"], f.__code__, 0) for f in OPS])


class _Prof:
    def __init__(self, results):
        self.results = results


class _Cap:
    """The fields of a capture that summarize() reads."""

    memory = False
    cut_short = None
    prepare_s, start_s, stop_s = 0.001, 0.0005, 0.002

    def __init__(self, results, first_step):
        self.prof = _Prof(results)
        self.first_step = first_step


def test_a_gpu_step_is_summed_up_small():
    doc = _summary.summarize(_Cap(one_step(kernel_us=60, loss_us=30), first_step=41))
    assert doc["ok"] and doc["summary"] and doc["cuda"]
    assert doc["first_step"] == 41 and doc["n_steps"] == 1
    assert doc["step_ns"] == STEP
    assert doc["parts"]["gpu_busy_ns"] == 60 * US
    assert sum(doc["parts"][k] for k in doc["parts"] if k != "step_ns") == STEP
    (cuda_op,) = doc["cuda_ops"]  # only train_step launched anything
    assert cuda_op["name"] == "train_step" and cuda_op["cuda_self_ns"] == 60 * US
    assert cuda_op["kernels"] == 1 and cuda_op["where"].startswith("test_top_summary.py:")
    (kernel,) = doc["kernels"]
    assert kernel["name"] == GEMM and kernel["total_ns"] == 60 * US and kernel["calls"] == 1
    by_cpu = [o["name"] for o in doc["cpu_ops"]]
    assert by_cpu.index("log_loss") < by_cpu.index("train_step")  # 30 us against 8.5 us
    assert {"prepare_s", "start_s", "stop_s", "summary_s"} <= set(doc["cost"])
    assert doc["cost"]["stop_s"] == _Cap.stop_s
    assert len(json.dumps(doc)) < 8000  # it travels back whole in the done answer


def test_long_kernel_names_are_cut():
    name = "k" * 500
    tl = timelines.Timeline()
    tl.events.append((T0, C["EV_STEP_BEGIN"], 0))
    tl.call(TRAIN, T0)
    tl.kernel(tl.api(LAUNCH, T0 + US, US // 2), T0 + 2 * US, T0 + 3 * US, name)
    tl.ret(T0 + 5 * US)
    tl.events.append((T0 + STEP, C["EV_STEP_END"], 0))
    doc = _summary.summarize(
        _Cap(tl.aggregate([(C["OP_PYTHON"], f.__code__, 0) for f in OPS]), first_step=0)
    )
    (kernel,) = doc["kernels"]
    assert len(kernel["name"]) == _summary._NAME_CHARS and kernel["name"].endswith("...")


def _interval(tmp_path, samples, rate=50.0):
    """An interval of `top --trigger-dir` over processes whose latest samples are ``samples``
    (one per rank), each counted at ``rate`` steps/s over the last second."""
    top = Top(trigger_dir=str(tmp_path))
    rows = []
    for rank, doc in enumerate(samples):
        proc = Proc(f"h_{100 + rank}", {"pid": 100 + rank, "host": "h", "rank": rank}, None)
        proc.status = {"found": 1000, "state": "idle"}
        proc.points.append((0.0, 1000 - int(rate)))
        proc.points.append((1.0, 1000))
        proc.mark = proc.points[0]
        proc.sample, proc.sample_at, proc.sampled = doc, 1.0, 1
        rows.append(Row(proc, int(rate), 1.0, 1.0))
    return Interval(top, rows, 1.0, 1.0)


def test_the_line_and_the_screen_show_the_gpu_figures(tmp_path):
    doc = _summary.summarize(_Cap(one_step(kernel_us=60, loss_us=30), first_step=41))
    iv = _interval(tmp_path, [doc])
    text = cli_top.line(iv, iv.rows[0])
    assert text.split(": ", 1)[1].startswith("50.0 steps/s (step 20.0 ms); sampled 1 of 50 steps")
    assert "step 41 took 100 us under the hook: GPU busy 60.0%, comm 0.0%" in text
    assert "self CUDA: train_step 60.0%" in text
    assert "self CPU: log_loss 30.0%" in text
    screen = cli_top.screen(iv, 200, 60, "rank 0")
    assert any(ln.startswith("rank 0 (pid 100)") and " 60.0% " in ln for ln in screen), screen
    cuda = screen.index(next(ln for ln in screen if ln.startswith("SELF CUDA TIME of step 41")))
    assert "train_step (test_top_summary.py:" in screen[cuda + 2]
    assert screen[cuda + 2].split()[:3] == ["60", "us", "60.0%"]


def test_the_screen_sums_the_ranks_samples(tmp_path):
    docs = [
        _summary.summarize(_Cap(one_step(kernel_us=k, loss_us=30), first_step=41)) for k in (60, 20)
    ]
    iv = _interval(tmp_path, docs)
    screen = cli_top.screen(iv, 200, 60, "2 ranks")
    title = "SELF CUDA TIME of steps 41, 41 of 2 processes"
    cuda = screen.index(next(ln for ln in screen if ln.startswith(title)))
    # 80 us of the two steps' 200 us
    assert screen[cuda + 2].split()[:3] == ["80", "us", "40.0%"]
    head = next(i for i, ln in enumerate(screen) if ln.startswith("PROCESS"))
    rows = screen[head + 1 : screen.index("", head)]
    assert [r.split()[0:2] for r in rows] == [["rank", "0"], ["rank", "1"]]
    assert " 60.0% " in rows[0] and " 20.0% " in rows[1]


def test_a_sample_costs_its_work_and_what_the_hook_added_to_the_step():
    """What top paces its samples by (the next one comes cost / --overhead later)."""
    proc = Proc("h_1", {"pid": 1, "host": "h"}, None)
    work = {"prepare_s": 0.001, "start_s": 0.0005, "stop_s": 0.002, "summary_s": 0.0015}
    hooked = {"step_ns": 14_000_000, "n_steps": 1, "cost": work}
    # no step rate known yet: the whole sampled step counts
    assert proc.cost_s(hooked) == pytest.approx(0.005 + 0.014)
    proc.points.extend([(0.0, 0), (1.0, 100)])  # the job steps in 10 ms
    assert proc.cost_s(hooked) == pytest.approx(0.005 + 0.004)
    # a sampled step no slower than usual adds nothing
    assert proc.cost_s({**hooked, "step_ns": 9_000_000}) == pytest.approx(0.005)


def test_samples_are_paced_so_that_all_of_them_stay_within_the_overhead():
    from gpuprof.cli.ondemand._top import next_sample_at

    # a cheap sample: a refresh later (its own cost over 1% is less than that)
    assert next_sample_at(10.0, 1.0, 0.0, 0.005, 0.01) == 11.0
    # a dear one: its cost over the overhead
    assert next_sample_at(10.0, 3.0, 0.0, 0.03, 0.01) == 13.0
    # the first sample paid 0.16 s of imports and CUPTI at top's start: the next waits
    # until the samples so far are 1% of the time since, 16 s, not one refresh
    assert next_sample_at(0.5, 1.0, 0.0, 0.16, 0.01) == pytest.approx(16.0)
    # --overhead 5: five times sooner
    assert next_sample_at(0.5, 1.0, 0.0, 0.16, 0.05) == pytest.approx(3.2)
