"""Closing a window: event memory reused across windows and sessions; event
timestamps on the profiler clock."""

import gc
import os
import platform
import subprocess
import sys

import gpuprof
import numpy as np
import pytest
from gpuprof import _gpuprof

CPU = [gpuprof.ProfilerActivity.CPU]


def leaf(x):
    return x + 1


def middle(n):
    total = 0
    for i in range(n):
        total += leaf(i) + len(str(i))
    return total


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
