"""Input shapes recorded on one step and given to the steps that ran the same
(``reuse_shapes``, the default with ``record_shapes``; csrc/aggregate/shapes.c,
docs/aten.md).

The windows are built by the real C aggregation from synthetic records: the ATen op
ranges as PyTorch's emit_nvtx names them (with ``sizes = [...]`` on the sampled step,
without on the others), the kernel launch inside each, and the kernels with their
launch shapes. A later step gets the sampled step's shapes only where its ops and
every launch's kernel, grid, block, shared memory and copy sizes are the same."""

import gpuprof
import pytest
from gpuprof import _gpuprof
from gpuprof.results import tables
from gpuprof.results._results import Results

C = _gpuprof._test_constants()
gpuprof.cuda_status()  # loads libcupti when present: API names come from it
LAUNCH = _gpuprof._test_api_key(C["API_RUNTIME"], 211)["key"]  # cudaLaunchKernel
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"
RELU = "void at::native::vectorized_elementwise_kernel<4, relu>"
H100 = [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]


def train_step():
    pass


def _name(op, sizes=None):
    """The NVTX name id of PyTorch's range for ``op``, with input ``sizes`` or
    without them (what the steps after the sampled one carry)."""
    text = f"{op}, op_id = 7" + (f", sizes = {sizes}" if sizes is not None else "")
    return _gpuprof._test_nvtx_name(text)["id"]


def _op(t, name, corr, kernel, grid, thread_ops):
    """One op range at ``t`` with one launch (``corr``) of ``kernel`` (a name index)
    on ``grid`` blocks; its GPU record goes to ``thread_ops``'s list."""
    events = [
        (t, C["EV_NVTX_PUSH"], name, 0),
        (t + 5, C["EV_API_ENTER"], corr, LAUNCH),
        (t + 8, C["EV_API_EXIT"], corr),
        (t + 20, C["EV_NVTX_POP"], 0, 0),
    ]
    thread_ops.append(
        dict(
            kind=C["GPU_KERNEL"],
            correlation=corr,
            start_ns=10_000 + 100 * corr,
            end_ns=10_000 + 100 * corr + 50,
            name_id=kernel,
            grid_x=grid,
            block_x=128,
        )
    )
    return events


def _window(steps, sized=(0,), gpu_records=True, spans_now=True):
    """A window of ``train_step`` calls, one per entry of ``steps``: each a batch
    size ``n`` that runs aten::mm on [n, 64] x [64, 64] and aten::relu on [n, 64],
    their kernels on n // 32 blocks. The steps in ``sized`` carry the sizes.
    ``gpu_records=False`` leaves the kernel records out (the launches alone)."""
    ops = [(C["OP_PYTHON"], train_step.__code__, 0)]
    events, gpu = [], []
    for step, n in enumerate(steps):
        begin = 1000 * step
        events += [(begin, C["EV_STEP_BEGIN"], step), (begin + 10, C["EV_CALL"], 2)]
        mm = f"[[{n}, 64], [64, 64]]" if step in sized else None
        relu = f"[[{n}, 64]]" if step in sized else None
        events += _op(begin + 100, _name("aten::mm", mm), len(gpu) + 1, 0, n // 32, gpu)
        events += _op(begin + 200, _name("aten::relu", relu), len(gpu) + 1, 1, n // 32, gpu)
        events += [(begin + 900, C["EV_RETURN"], 0), (begin + 1000, C["EV_STEP_END"], step)]
    end = 1000 * len(steps) + 10
    gpu = gpu if gpu_records else []
    raw = _gpuprof._test_aggregate(
        ops, [(1, 101, events)], gpu, 0, end, [GEMM, RELU], 1, 1 << 20, spans_now
    )
    return raw, Results([raw], cuda={"active": True}, meta={"device_properties": H100})


def _rows(res, op):
    """{input shapes: calls} of the rows of ``op``."""
    ka = tables.KeyAverages(res, group_by_input_shape=True)
    return {tuple(map(tuple, r.input_shapes)): r.count for r in ka if r.key == op}


def test_the_steps_that_ran_the_same_get_the_sampled_steps_shapes():
    raw, res = _window([64, 64, 64])
    assert raw["shapes_steps"] == {"sampled": 1, "reused": 2, "unmatched": 0}
    assert _rows(res, "aten::mm") == {((64, 64), (64, 64)): 3}
    assert _rows(res, "aten::relu") == {((64, 64),): 3}
    # and so their FLOPs: three calls of 2 * 64 * 64 * 64
    mm = next(r for r in tables.KeyAverages(res) if r.key == "aten::mm")
    assert mm.flops == 3 * 2 * 64**3


def test_a_step_with_other_launches_keeps_no_shapes():
    # step 1 runs a batch of 128: its kernels have other grids, so the 64-row
    # shapes of step 0 are not its shapes; step 2 ran what step 0 ran
    raw, res = _window([64, 128, 64])
    assert raw["shapes_steps"] == {"sampled": 1, "reused": 1, "unmatched": 1}
    assert _rows(res, "aten::mm") == {((64, 64), (64, 64)): 2, (): 1}
    ka = tables.KeyAverages(res, group_by_input_shape=True)
    mm = {tuple(map(tuple, r.input_shapes)): r for r in ka if r.key == "aten::mm"}
    assert mm[()].flops == 0  # no shapes, no FLOPs: never the 64-row count


def test_a_step_that_ran_other_ops_keeps_no_shapes():
    raw, res = _window([64, 64], sized=(0,))
    # the same window, but step 1 runs one op more than step 0
    ops = [(C["OP_PYTHON"], train_step.__code__, 0)]
    events, gpu = [], []
    for step, extra in enumerate((False, True)):
        begin = 1000 * step
        events += [(begin, C["EV_STEP_BEGIN"], step), (begin + 10, C["EV_CALL"], 2)]
        sizes = "[[64, 64], [64, 64]]" if step == 0 else None
        events += _op(begin + 100, _name("aten::mm", sizes), len(gpu) + 1, 0, 2, gpu)
        if extra:
            events += _op(begin + 200, _name("aten::relu"), len(gpu) + 1, 1, 2, gpu)
        events += [(begin + 900, C["EV_RETURN"], 0), (begin + 1000, C["EV_STEP_END"], step)]
    raw = _gpuprof._test_aggregate(ops, [(1, 101, events)], gpu, 0, 2010, [GEMM, RELU], 1)
    assert raw["shapes_steps"] == {"sampled": 1, "reused": 0, "unmatched": 1}
    res = Results([raw], cuda={"active": True})
    assert _rows(res, "aten::mm") == {((64, 64), (64, 64)): 1, (): 1}


def test_every_step_sampled_or_none_leaves_the_window_as_it_was():
    raw, res = _window([64, 128], sized=(0, 1))  # reuse_shapes=False: sizes everywhere
    assert raw["shapes_steps"] == {"sampled": 2, "reused": 0, "unmatched": 0}
    assert _rows(res, "aten::mm") == {((64, 64), (64, 64)): 1, ((128, 64), (64, 64)): 1}
    raw, res = _window([64, 64], sized=())  # aten_ops=True: names alone
    assert "shapes_steps" not in raw or raw["shapes_steps"]["reused"] == 0
    assert _rows(res, "aten::mm") == {(): 2}


def test_another_threads_ops_are_matched_on_that_thread():
    """The backward's ops run on autograd's device thread: each thread's part of a
    step is matched with the same thread's part of the sampled step."""
    ops = [(C["OP_PYTHON"], train_step.__code__, 0)]
    main, worker, gpu = [], [], []
    for step in range(3):
        begin = 1000 * step
        main += [(begin, C["EV_STEP_BEGIN"], step), (begin + 10, C["EV_CALL"], 2)]
        sizes = "[[64, 64], [64, 64]]" if step == 0 else None
        main += _op(begin + 100, _name("aten::mm", sizes), len(gpu) + 1, 0, 2, gpu)
        main += [(begin + 900, C["EV_RETURN"], 0), (begin + 1000, C["EV_STEP_END"], step)]
        # step 2's backward launches on another grid: not step 0's shapes
        grid = 4 if step == 2 else 2
        sizes = "[[64, 64], [64, 64]]" if step == 0 else None
        worker += _op(begin + 400, _name("aten::mm", sizes), len(gpu) + 1, 0, grid, gpu)
    threads = [(1, 101, main), (2, 102, worker)]
    raw = _gpuprof._test_aggregate(ops, threads, gpu, 0, 3010, [GEMM], 1)
    assert raw["shapes_steps"] == {"sampled": 1, "reused": 1, "unmatched": 1}
    res = Results([raw], cuda={"active": True})
    # the main thread's three calls and two of the worker's
    assert _rows(res, "aten::mm") == {((64, 64), (64, 64)): 5, (): 1}


@pytest.mark.parametrize("spans_now", [True, False])
def test_the_trace_slices_have_the_shapes_too(spans_now):
    """The spans (the trace's slices) name the rows with shapes: built at once, or
    later from the window's kept events (a CPU-only window's second aggregation, of
    the events as the first one rewrote them)."""
    raw, res = _window([64, 64, 64], gpu_records=False, spans_now=spans_now)
    assert ("_events" in raw) is not spans_now
    assert raw["shapes_steps"] == {"sampled": 1, "reused": 2, "unmatched": 0}
    w = res.window()
    ops, spans = w.ops(), w.raw["spans"]
    shaped = [str(ops["input_shapes"][r]) for r in spans["op_row"] if ops["name"][r] == "aten::mm"]
    assert shaped == ["[[64, 64], [64, 64]]"] * 3


def test_the_footer_says_which_steps_carry_shapes():
    def line(**shapes):
        aten = {"wanted": "shapes", "on": True, "reason": "", "shapes": shapes}
        return tables._aten_line(aten)

    assert line(reuse=True, sampled=1, reused=49, unmatched=0) == (
        "ATen ops: on, with input shapes (recorded on 1 step, given to 49 that ran the "
        "same launches)"
    )
    text = line(reuse=True, sampled=2, reused=3, unmatched=4)
    assert "recorded on 2 steps, given to 3" in text
    assert "4 ran other launches and show no shapes: reuse_shapes=False" in text
    # every step recorded its own
    assert line(reuse=False, sampled=5, reused=0, unmatched=0) == "ATen ops: on, with input shapes"
