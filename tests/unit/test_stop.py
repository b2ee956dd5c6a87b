"""Closing a window: the replay's fast path and its general path give the same
tables; event memory reused across windows and sessions; event timestamps on
the profiler clock."""

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


def aggregate(threads, end, general_only=False):
    return _gpuprof._test_aggregate(OPS, threads, [], 0, end, [], 1, 1 << 20, general_only)


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
        what = draw(st.sampled_from(["call", "call", "ccall", "ret", "ret", "cret", "range",
                                     "pop", "step", "frame"]))
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
    # the pool stops growing at once
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
    code = ("import gpuprof; from gpuprof import _gpuprof\n"
            "with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as p:\n"
            "    sum(range(10))\n"
            "ops = p.ops(); print(_gpuprof.EVENT_CLOCK, int((ops['cpu_total_ns'] >= 0).all()))")
    env = dict(os.environ, GPUPROF_CLOCK=clock)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    if clock == "tsc" and platform.machine() != "x86_64":
        assert out[0] == "monotonic"
    else:
        assert out[0] == clock
    assert out[1] == "1"
