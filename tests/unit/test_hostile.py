"""Hostile programs: threads, forks, deep stacks, abandoned generators, other
profilers, interpreter exit and full buffers, each run under the profiler.

Every test checks two things: nothing crashes, and the tables that come out
are internally consistent (see ``check_consistent``) with exact counts where
the workload makes them exact.
"""

import asyncio
import cProfile
import gc
import os
import pstats
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest

import gpuprof

CPU = [gpuprof.ProfilerActivity.CPU]
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(gpuprof.__file__)))


# -- workload and helpers ------------------------------------------------------

def leaf(x):
    return x + 1


def middle(n):
    total = 0
    for i in range(n):
        total += leaf(i)
    return total


def marker():
    """Called once after the mayhem: where it lands shows the stack is sound."""
    return 0


def check_consistent(prof_or_results):
    """Internal consistency of one recorded window's tables."""
    res = prof_or_results.results if hasattr(prof_or_results, "results") else prof_or_results
    ops = res.ops()
    assert (ops["calls"] >= 0).all()
    assert (ops["cpu_self_ns"] >= 0).all(), ops[ops["cpu_self_ns"] < 0]
    assert (ops["cpu_total_ns"] >= 0).all(), ops[ops["cpu_total_ns"] < 0]
    assert (ops["cpu_total_ns"] >= ops["cpu_self_ns"]).all(), \
        ops[ops["cpu_total_ns"] < ops["cpu_self_ns"]]
    assert (ops["cpu_min_ns"] <= ops["cpu_max_ns"]).all()
    threads = res.threads()
    # Every nanosecond a thread spent inside a profiled call is some op's self time.
    assert (threads["self_sum_ns"] == threads["busy_ns"]).all(), threads
    assert (threads["busy_ns"] <= threads["last_ns"] - threads["first_ns"]).all(), threads
    assert ops["cpu_self_ns"].sum() == threads["self_sum_ns"].sum()
    tree = res.call_tree()
    assert (tree["self_ns"] >= 0).all() and (tree["total_ns"] >= tree["self_ns"]).all()
    assert ((tree["parent"] >= -1) & (tree["parent"] < tree["id"])).all()
    assert tree["self_ns"].sum() == ops["cpu_self_ns"].sum()
    steps = res.steps()
    assert (steps["end_ns"] >= steps["start_ns"]).all()
    start, end = res.window_bounds()
    assert end >= start
    return ops


def calls(prof, name):
    ops = prof.ops()
    rows = ops[ops["name"] == name]
    return int(rows["calls"].sum())


def parents_of(prof, func):
    """Display names of the call-tree parents of every node of `func`."""
    tree = prof.call_tree()
    prefix = f"{func.__qualname__} ("
    nodes = tree[np.array([str(n).startswith(prefix) for n in tree["name"]], dtype=bool)]
    return {str(tree["name"][p]) if p >= 0 else "<root>" for p in nodes["parent"]}


def run_python(code, timeout=60, **kw):
    """Run `code` in a fresh interpreter that imports this checkout's gpuprof."""
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=env, **kw)


# -- interpreter exit while a profile is active ---------------------------------

EXIT_HEADER = """
import sys, threading, time
import gpuprof
CPU = [gpuprof.ProfilerActivity.CPU]
def work(n):
    return sum(i * i for i in range(n))
"""

EXIT_CASES = {
    "started_never_stopped": """
        prof = gpuprof.profile(activities=CPU)
        prof.start()
        work(100)
    """,
    "unreferenced_profile": """
        gpuprof.profile(activities=CPU).start()
        work(100)
    """,
    "deleted_while_running": """
        prof = gpuprof.profile(activities=CPU)
        prof.start()
        work(100)
        del prof
    """,
    "schedule_and_on_trace_ready": """
        prof = gpuprof.profile(activities=CPU, on_trace_ready=lambda p: p.key_averages(),
                               schedule=gpuprof.schedule(wait=1, warmup=1, active=2))
        prof.start()
        for _ in range(7):
            work(50)
            prof.step()
    """,
    "sys_exit_inside_with": """
        with gpuprof.profile(activities=CPU) as prof:
            work(100)
            sys.exit(0)
    """,
    "daemon_threads_still_running": """
        def spin():
            while True:
                work(20)
        for _ in range(4):
            threading.Thread(target=spin, daemon=True).start()
        prof = gpuprof.profile(activities=CPU)
        prof.start()
        time.sleep(0.05)
    """,
    "atexit_code_runs_while_profiled": """
        import atexit
        prof = gpuprof.profile(activities=CPU)
        prof.start()
        atexit.register(work, 1000)
        work(10)
    """,
    "dropping_events_at_exit": """
        prof = gpuprof.profile(activities=CPU, max_events=1000)
        prof.start()
        for _ in range(3000):
            work(5)
    """,
}


@pytest.mark.parametrize("case", sorted(EXIT_CASES))
def test_interpreter_exits_cleanly_while_profiling(case):
    # given a program that leaves a profile running when the interpreter exits
    code = EXIT_HEADER + textwrap.dedent(EXIT_CASES[case]) + "\nprint('done')\n"
    # when it runs to the end
    proc = run_python(code)
    # then it exits 0 with its own output only
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert proc.stderr == ""
    assert proc.stdout.strip().endswith("done") or case == "sys_exit_inside_with"


def test_keyboard_interrupt_at_top_level_while_profiling():
    code = EXIT_HEADER + textwrap.dedent("""
        prof = gpuprof.profile(activities=CPU)
        prof.start()
        work(10)
        raise KeyboardInterrupt
    """)
    proc = run_python(code)
    # CPython exits by SIGINT (-2) for an unhandled KeyboardInterrupt; no crash on the way out
    assert proc.returncode in (-signal.SIGINT, 130), (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "KeyboardInterrupt"
