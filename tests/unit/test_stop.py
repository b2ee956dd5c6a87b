"""Closing a window: the tables at once, the spans later from the events the
window keeps, the same tables either way; event memory reused across windows
and sessions; event timestamps on the profiler clock."""

import gc
import os
import platform
import subprocess
import sys

import gpuprof
import numpy as np
import pytest
from gpuprof import _gpuprof
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

C = _gpuprof._test_constants()
CPU = [gpuprof.ProfilerActivity.CPU]
TABLES = ("ops", "nodes", "steps", "threads", "kernels", "gpu")


def leaf(x):
    return x + 1


def middle(n):
    total = 0
    for i in range(n):
        total += leaf(i) + len(str(i))
    return total


def outer(depth):
    return middle(20) if depth == 0 else outer(depth - 1) + leaf(depth)


def hidden_helper():
    pass


OPS = [
    (C["OP_PYTHON"], leaf.__code__, 0),
    (C["OP_PYTHON"], middle.__code__, 0),
    (C["OP_PYTHON"], outer.__code__, 0),
    (C["OP_PYTHON"], hidden_helper.__code__, C["OPF_HIDDEN"]),
    (C["OP_USER"], "label", 0),
]
LEAF, MIDDLE, OUTER, HIDDEN, LABEL = 2, 3, 4, 5, 6
PY_OPS = (LEAF, MIDDLE, OUTER, HIDDEN)


def aggregate(threads, end, **kw):
    return _gpuprof._test_aggregate(
        OPS,
        threads,
        [],
        0,
        end,
        [],
        1,
        1 << 20,
        kw.get("spans_now", True),
        kw.get("general_only", False),
    )


def assert_same_window(a, b, spans=True):
    for key in TABLES + (("spans",) if spans else ()):
        assert a[key].dtype == b[key].dtype, key
        assert np.array_equal(a[key], b[key]), key
    for key in ("op_names", "op_files", "op_lines", "dropped_events"):
        assert a[key] == b[key], key


# -- random event streams: what the hook, ranges and steps can write --------------------


@st.composite
def event_streams(draw):
    """A thread's events: calls and returns of Python ops (some hidden), C calls
    (op ids of Python ops, as a stand-in: the aggregation does not tell them
    apart), returns without calls (frames entered before the window), ranges
    and steps, sometimes left open; timestamps increasing, with repeats."""
    events, stack, ts = [], [], 0
    for _ in range(draw(st.integers(0, 120))):
        ts += draw(st.sampled_from([0, 1, 7, 100]))
        what = draw(
            st.sampled_from(
                ["call", "call", "ccall", "ret", "ret", "cret", "range", "pop", "step", "frame"]
            )
        )
        if what == "call":
            op = draw(st.sampled_from(PY_OPS))
            events.append((ts, C["EV_CALL"], op))
            stack.append("py")
        elif what == "frame":
            events.append((ts, C["EV_FRAME"], draw(st.sampled_from(PY_OPS))))
            stack.append("py")
        elif what == "ccall" and (not stack or stack[-1] == "py"):
            site = draw(st.integers(0, 40))
            events.append((ts, C["EV_CCALL"], draw(st.sampled_from(PY_OPS)), site))
            stack.append("c")
        elif what == "ret":
            events.append((ts, C["EV_RETURN"], 0))
            while stack and stack.pop() != "py":
                pass
        elif what == "cret":
            events.append((ts, C["EV_CRETURN"], 0))
            if stack and stack[-1] == "c":
                stack.pop()
        elif what == "range":
            events.append((ts, C["EV_RANGE_PUSH"], LABEL))
        elif what == "pop":
            events.append((ts, C["EV_RANGE_POP"], LABEL))
        elif what == "step":
            n = draw(st.integers(0, 2))
            kind = draw(st.sampled_from(["EV_STEP_BEGIN", "EV_STEP_END"]))
            events.append((ts, C[kind], n))
    return events, ts + draw(st.integers(0, 50))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(event_streams(), min_size=1, max_size=3))
def test_the_fast_path_and_the_general_path_build_the_same_tables(streams):
    threads = [(i + 1, 100 + i, ev) for i, (ev, _) in enumerate(streams)]
    end = max(e for _, e in streams)
    general = aggregate(threads, end, general_only=True)
    fast = aggregate(threads, end)
    assert_same_window(general, fast)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(event_streams(), min_size=1, max_size=3))
def test_spans_built_later_match_spans_built_at_once(streams):
    threads = [(i + 1, 100 + i, ev) for i, (ev, _) in enumerate(streams)]
    end = max(e for _, e in streams)
    now = aggregate(threads, end)
    later = aggregate(threads, end, spans_now=False)
    assert "spans" not in later and "_events" in later
    assert_same_window(now, later, spans=False)
    assert _gpuprof._complete_window(later) is later
    assert "_events" not in later
    assert_same_window(now, later)
    # a second call changes nothing
    spans = later["spans"]
    assert _gpuprof._complete_window(later)["spans"] is spans


def test_a_cpu_window_keeps_its_events_until_its_spans_are_asked_for(no_gc):
    with gpuprof.profile(activities=CPU) as prof:
        outer(5)
    raw = prof._rec.result
    assert "spans" not in raw and "_events" in raw
    ops = prof.ops()  # the tables never need the spans
    assert int(ops[ops["name"] == "leaf"]["calls"][0]) == 25
    assert "spans" not in raw
    spans = prof.results.spans()
    assert "_events" not in raw and raw["spans"] is spans
    names = prof.ops()["name"]
    called = [names[r] for r in spans["op_row"]]
    assert called.count("leaf") == 25 and called.count("outer") == 6
    # every span's node and parent agree with the call tree built at stop()
    tree = prof.results.call_tree()
    assert (tree["op"][spans["node"]] == spans["op_row"]).all()
    parents = spans["parent"]
    has_parent = parents >= 0
    assert (tree["parent"][spans["node"][has_parent]] == spans["node"][parents[has_parent]]).all()


def test_exports_and_saving_build_the_spans(tmp_path):
    with gpuprof.profile(activities=CPU) as prof:
        middle(10)
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    assert "spans" in prof._rec.result
    with gpuprof.profile(activities=CPU) as prof:
        middle(10)
    prof.save(str(tmp_path / "p.gpuprof"))
    loaded = gpuprof.load(str(tmp_path / "p.gpuprof"))
    assert len(loaded.results.spans()) == len(prof.results.spans())


def session_bytes(n):
    with gpuprof.profile(activities=CPU, max_events=2_000_000) as prof:
        for _ in range(n):
            middle(100)
        held = prof.buffer_stats()["bytes_held"]
    return held, prof


def test_event_memory_is_reused_by_the_next_sessions(no_gc):
    first, prof = session_bytes(300)
    assert first >= 60_000 * 16  # 300 x ~200 events
    del prof
    gc.collect()
    for _ in range(3):
        held, prof = session_bytes(300)
        del prof
        gc.collect()
        assert held == first


def test_windows_give_their_events_back_when_their_results_go(no_gc):
    held = []

    def ready(p):
        held.append(p.buffer_stats()["bytes_held"])

    sched = gpuprof.schedule(wait=0, warmup=1, active=1)
    with gpuprof.profile(activities=CPU, schedule=sched, on_trace_ready=ready) as prof:
        for _ in range(40):
            middle(2000)
            prof.step()
    assert len(held) >= 19
    # the kept window and the one being recorded: the pool stops growing at once
    assert max(held[2:]) == max(held[:2])


def test_event_times_are_on_the_profiler_clock(no_gc):
    marks = []

    def timed():
        marks.append(_gpuprof.clock_ns())
        leaf(1)
        marks.append(_gpuprof.clock_ns())

    with gpuprof.profile(activities=CPU) as prof:
        for _ in range(50):
            timed()
    spans = prof.results.spans()
    names = prof.ops()["name"]
    leaf_spans = spans[[names[r] == "leaf" for r in spans["op_row"]]]
    assert len(leaf_spans) == 50
    before, after = np.array(marks[0::2]), np.array(marks[1::2])
    assert (leaf_spans["start_ns"] >= before).all()
    assert (leaf_spans["end_ns"] <= after).all()
    assert (leaf_spans["end_ns"] >= leaf_spans["start_ns"]).all()


@pytest.mark.parametrize("clock", ["monotonic", "tsc"])
def test_the_event_clock_can_be_chosen(clock):
    code = (
        "import gpuprof; from gpuprof import _gpuprof\n"
        "with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as p:\n"
        "    sum(range(10))\n"
        "ops = p.ops(); print(_gpuprof.EVENT_CLOCK, int((ops['cpu_total_ns'] >= 0).all()))"
    )
    env = dict(os.environ, GPUPROF_CLOCK=clock)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    if clock == "tsc" and platform.machine() != "x86_64":
        assert out[0] == "monotonic"
    else:
        assert out[0] == clock
    assert out[1] == "1"
