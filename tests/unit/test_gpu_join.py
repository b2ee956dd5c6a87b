"""GPU attribution through the real C aggregation, fed synthetic records (no GPU needed)."""

import gpuprof
import pytest
from gpuprof import _gpuprof
from gpuprof.results import tables
from gpuprof.results._results import Results

C = _gpuprof._test_constants()
gpuprof.cuda_status()  # loads libcupti when present: API names and classes come from it
LAUNCH = 211  # CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000
DEVSYNC = 165  # CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020
HAVE_CLASSES = _gpuprof._test_api_key(C["API_RUNTIME"], DEVSYNC)["class"] != 0


def key(cbid):
    return _gpuprof._test_api_key(C["API_RUNTIME"], cbid)["key"]


def train_step():
    pass


def run(events_main, gpu, extra_threads=(), names=("_Z6kernelv",), start=0, end=1000):
    ops = [(C["OP_PYTHON"], train_step.__code__, 0), (C["OP_USER"], "linear", 0)]
    threads = [(1, 101, events_main)] + list(extra_threads)
    raw = _gpuprof._test_aggregate(ops, threads, gpu, start, end, list(names), 1)
    return Results([raw], cuda={"active": True, "mode": "callbacks", "error": None})


TRAIN, LINEAR = 2, 3


def main_thread_events():
    return [
        (50, C["EV_STEP_BEGIN"], 0),
        (100, C["EV_CALL"], TRAIN),
        (110, C["EV_RANGE_PUSH"], LINEAR),
        (120, C["EV_API_ENTER"], 7, key(LAUNCH)),
        (125, C["EV_API_EXIT"], 7),
        (130, C["EV_RANGE_POP"], LINEAR),
        (140, C["EV_API_ENTER"], 8, key(DEVSYNC)),
        (400, C["EV_API_EXIT"], 8),
        (500, C["EV_RETURN"], 0),
        (550, C["EV_STEP_END"], 0),
    ]


def kernel(corr, start, end, name_id=0, **kw):
    rec = dict(
        kind=C["GPU_KERNEL"],
        correlation=corr,
        start_ns=start,
        end_ns=end,
        name_id=name_id,
        stream=7,
        device=0,
        registers=32,
        grid_x=8,
        block_x=256,
    )
    rec.update(kw)
    return rec


def test_kernel_time_goes_to_the_launching_op():
    res = run(main_thread_events(), [kernel(7, 200, 300)])
    ops = res.ops()
    linear = ops[ops["name"] == "linear"][0]
    train = ops[ops["name"] == "train_step"][0]
    assert linear["cuda_self_ns"] == 100 and linear["kernels"] == 1
    assert linear["cuda_total_ns"] == 100
    assert train["cuda_self_ns"] == 0 and train["cuda_total_ns"] == 100
    launch = ops[ops["kind"] == "cuda_api"]
    assert set(launch["calls"]) == {1}
    assert res.attributed_gpu_fraction == 1.0


def test_api_calls_are_ops_with_their_own_self_time():
    res = run(main_thread_events(), [kernel(7, 200, 300)])
    ops = res.ops()
    api = ops[ops["kind"] == "cuda_api"]
    assert sorted(api["cpu_self_ns"]) == [5, 260]
    if res.cuda["active"] and gpuprof.cuda_status()["loaded"]:
        assert "cudaLaunchKernel" in set(api["name"])
    # the range's self time excludes the API call inside it
    linear = ops[ops["name"] == "linear"][0]
    assert linear["cpu_self_ns"] == 20 - 5


def test_kernel_table_and_gpu_events():
    gpu = [kernel(7, 200, 300), kernel(8, 310, 350)]
    res = run(main_thread_events(), gpu)
    k = res.kernels()
    assert len(k) == 1
    assert k[0]["name"] == "kernel()"  # demangled
    assert k[0]["calls"] == 2 and k[0]["total_ns"] == 140
    assert k[0]["min_ns"] == 40 and k[0]["max_ns"] == 100
    assert k[0]["category"] == "compute"
    assert list(k[0]["grid"]) == [8, 0, 0] and k[0]["registers"] == 32
    ev = res.gpu_events()
    assert ev["op_name"][0] == "linear"
    assert ev["op_name"][1].startswith("train_step (")  # launched outside the range
    assert ev["correlation"].tolist() == [7, 8]


def test_nccl_kernels_are_communication():
    res = run(
        main_thread_events(),
        [kernel(7, 200, 300, name_id=1)],
        names=["_Z6kernelv", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"],
    )
    assert res.kernels()[0]["category"] == "communication"
    assert res.steps()[0]["comm_ns"] == 100


def test_step_breakdown():
    gpu = [
        kernel(7, 200, 300),
        dict(
            kind=C["GPU_MEMCPY"],
            correlation=0,
            start_ns=320,
            end_ns=340,
            bytes=4096,
            subkind=C["COPY_HTOD"],
            src_mem=C["MEM_PINNED"],
            dst_mem=C["MEM_DEVICE"],
            stream=7,
        ),
    ]
    res = run(main_thread_events(), gpu)
    s = res.steps()
    assert len(s) == 1
    s = s[0]
    assert (s["start_ns"], s["end_ns"], s["cpu_ns"]) == (50, 550, 500)
    assert s["gpu_busy_ns"] == 120
    assert s["gpu_idle_ns"] == 380
    assert s["memcpy_ns"] == 20
    assert s["kernels"] == 1
    if HAVE_CLASSES:
        assert s["sync_wait_ns"] == 260
    names = set(res.kernels()["name"])
    assert "Memcpy HtoD (Pinned -> Device)" in names


def test_off_python_launch_is_charged_to_the_blocked_thread():
    helper = (2, 202, [(210, C["EV_API_ENTER"], 9, key(LAUNCH)), (215, C["EV_API_EXIT"], 9)])
    res = run(main_thread_events(), [kernel(9, 220, 260)], extra_threads=[helper])
    ev = res.gpu_events()
    assert ev["op_name"][0].startswith("train_step")
    assert ev["blocked_thread"][0]
    ops = res.ops()
    assert ops[ops["name"] == "train_step"][0]["cuda_self_ns"] == 40


def test_activity_only_api_records_join_by_thread_and_time():
    api = dict(
        kind=C["GPU_API"],
        correlation=11,
        start_ns=150,
        end_ns=155,
        thread_id=101,
        name_id=key(LAUNCH),
        subkind=C["API_RUNTIME"],
    )
    res = run(main_thread_events(), [api, kernel(11, 600, 650)])
    ops = res.ops()
    train = ops[ops["name"] == "train_step"][0]
    assert train["cuda_self_ns"] == 50
    assert train["kernels"] == 1


def test_unmatched_records_before_the_window_are_dropped():
    res = run(main_thread_events(), [kernel(99, 10, 20), kernel(98, 700, 720)], start=30)
    ev = res.gpu_events()
    assert ev["correlation"].tolist() == [98]
    assert ev["op"][0] == -1
    assert res.attributed_gpu_fraction == 0.0


def test_activity_launched_before_the_window_is_told_apart():
    # correlation 5 was launched before the window (its launch is not in it) and ran
    # 20 ns in it; 7 is the window's own launch, 9 a later launch nobody recorded
    res = run(main_thread_events(), [kernel(5, 20, 40), kernel(7, 200, 300), kernel(9, 300, 340)])
    assert res.attributed_gpu_fraction == pytest.approx(100 / 160)
    assert res.launched_before_window_ns == 20
    footer = "\n".join(tables._footer(res))
    assert "62.5% of GPU time attributed" in footer, footer
    assert "12.5% was launched before recording began" in footer, footer


def test_recursion_counts_gpu_total_once():
    ev = [
        (100, C["EV_CALL"], TRAIN),
        (110, C["EV_CALL"], TRAIN),
        (120, C["EV_API_ENTER"], 7, key(LAUNCH)),
        (125, C["EV_API_EXIT"], 7),
        (130, C["EV_RETURN"], 0),
        (140, C["EV_RETURN"], 0),
    ]
    res = run(ev, [kernel(7, 200, 300)])
    train = res.ops()[res.ops()["name"] == "train_step"][0]
    assert train["cuda_total_ns"] == 100
    assert train["cuda_self_ns"] == 100
    tree = res.call_tree()
    assert sorted(tree["cuda_total_ns"].tolist())[-2:] == [100, 100]


def test_dropped_events_keep_tables_consistent():
    n = C["CHUNK_EVENTS"] * 2
    events = []
    for i in range(n // 2):
        events.append((10 + 2 * i, C["EV_CALL"], TRAIN))
        events.append((11 + 2 * i, C["EV_RETURN"], 0))
    ops = [(C["OP_PYTHON"], train_step.__code__, 0)]
    raw = _gpuprof._test_aggregate(ops, [(1, 1, events)], [], 0, 10**6, [], 1, C["CHUNK_EVENTS"])
    res = Results([raw])
    assert res.dropped_events == n - C["CHUNK_EVENTS"]
    row = res.ops()[0]
    assert row["calls"] == (C["CHUNK_EVENTS"] + 1) // 2  # the last call lost its return
    assert row["cpu_self_ns"] >= 0 and row["cpu_total_ns"] >= row["cpu_self_ns"]
    thread = res.threads()[0]
    assert thread["last_ns"] <= 10 + n  # closed where dropping began, not at window end


def test_activity_only_api_records_from_unknown_threads_go_to_the_blocked_thread():
    # an autograd-style device thread: never ran Python, so gpuprof has no buffer for it
    api = dict(
        kind=C["GPU_API"],
        correlation=12,
        start_ns=210,
        end_ns=215,
        thread_id=999,
        name_id=key(LAUNCH),
        subkind=C["API_RUNTIME"],
    )
    res = run(main_thread_events(), [api, kernel(12, 220, 260)])
    ev = res.gpu_events()
    assert ev["op_name"][0].startswith("train_step")
    assert ev["blocked_thread"][0]


def test_sync_fix_depends_on_the_call():
    from gpuprof.analysis.diagnose import _sync_fix

    assert "pin_memory" in _sync_fix({"torch._C.TensorBase.cuda"})
    assert ".item()" in _sync_fix({"torch._C.TensorBase.item"})


def custom_backward():
    pass


def blocked_in_backward(helper_call_ts):
    """The stepping thread waits in `run_backward` (140..400) while a helper thread
    runs `custom_backward` from `helper_call_ts` and launches a kernel at 210."""
    ops = [
        (C["OP_PYTHON"], train_step.__code__, 0),
        (C["OP_USER"], "run_backward", 0),
        (C["OP_PYTHON"], custom_backward.__code__, 0),
    ]
    train, run_backward, backward = 2, 3, 4
    main = [
        (50, C["EV_STEP_BEGIN"], 0),
        (100, C["EV_CALL"], train),
        (140, C["EV_RANGE_PUSH"], run_backward),
        (400, C["EV_RANGE_POP"], run_backward),
        (500, C["EV_RETURN"], 0),
        (550, C["EV_STEP_END"], 0),
    ]
    helper = [
        (helper_call_ts, C["EV_CALL"], backward),
        (210, C["EV_API_ENTER"], 9, key(LAUNCH)),
        (215, C["EV_API_EXIT"], 9),
        (230, C["EV_RETURN"], 0),
    ]
    raw = _gpuprof._test_aggregate(
        ops, [(1, 101, main), (2, 202, helper)], [kernel(9, 220, 260)], 0, 1000, ["_Z4bwdv"], 1
    )
    return Results([raw], cuda={"active": True, "mode": "callbacks", "error": None})


def totals(res):
    ops = res.ops()
    return {
        str(n): (int(s), int(t))
        for n, s, t in zip(ops["name"], ops["cuda_self_ns"], ops["cuda_total_ns"])
    }


def test_python_launch_for_a_blocked_call_rolls_up_under_it():
    # given: a helper thread whose Python call began while the step waits in run_backward
    # when: it launches a 40 ns kernel
    res = blocked_in_backward(helper_call_ts=200)
    # then: the kernel stays on the helper's op (self time, its thread, the trace) and
    # is also in the totals of the blocked call and of the step function above it
    ev = res.gpu_events()
    assert ev["op_name"][0].startswith("custom_backward")
    assert ev["thread"][0] == 1
    assert ev["rolled_up"][0] and not ev["blocked_thread"][0]
    t = totals(res)
    assert t["custom_backward"] == (40, 40)
    assert t["run_backward"] == (0, 40)
    assert t["train_step"] == (0, 40)
    tree = res.call_tree()
    by_name = {str(n).split(" (")[0]: int(c) for n, c in zip(tree["name"], tree["cuda_total_ns"])}
    assert by_name == {
        "ProfilerStep*": 40,
        "train_step": 40,
        "run_backward": 40,
        "custom_backward": 40,
        "cudaLaunchKernel": 0,
    }
    assert res.attributed_gpu_fraction == 1.0


def test_a_thread_already_running_before_the_call_does_not_roll_up():
    # given: the helper's call began before the step's blocked call (a data loader thread)
    res = blocked_in_backward(helper_call_ts=90)
    # then: its kernel is its own, not the step function's
    assert not res.gpu_events()["rolled_up"][0]
    t = totals(res)
    assert t["custom_backward"] == (40, 40)
    assert t["run_backward"] == (0, 0) and t["train_step"] == (0, 0)


def _flows(res, tmp_path, **kw):
    import json

    from gpuprof.exporters.chrome import export_chrome_trace

    path = str(tmp_path / "trace.json")
    export_chrome_trace(res, path, **kw)
    events = json.load(open(path))["traceEvents"]
    slices = {(e["tid"], e["ts"]): e["name"] for e in events if e.get("ph") == "X"}
    flows = [e for e in events if e.get("cat") == "blocked_call"]
    return flows, slices


def test_the_trace_links_the_blocked_call_to_the_work_done_for_it(tmp_path):
    # given: the helper's kernel rolled up under run_backward
    res = blocked_in_backward(helper_call_ts=200)
    # when: the window is written as a trace
    flows, slices = _flows(res, tmp_path)
    # then: one flow starts on the blocked call and ends on the helper's call, each
    # bound to its slice (same thread and start)
    assert [f["ph"] for f in flows] == ["s", "f"]
    start, end = flows
    assert start["id"] == end["id"] and end["bp"] == "e"
    assert slices[(start["tid"], start["ts"])] == "run_backward"
    assert slices[(end["tid"], end["ts"])].endswith("custom_backward")
    assert (start["tid"], end["tid"]) == (101, 202)


def test_no_flow_for_work_that_was_not_done_for_the_blocked_call(tmp_path):
    flows, _ = _flows(blocked_in_backward(helper_call_ts=90), tmp_path)
    assert flows == []
