"""The Python call profiler: counts, times, naming, and the hard cases."""

import asyncio
import os
import sys
import threading

import gpuprof
import numpy as np


def _row(prof, name, kind=None):
    ops = prof.ops()
    mask = ops["name"] == name
    if kind:
        mask &= ops["kind"] == kind
    rows = ops[mask]
    assert len(rows) == 1, f"{name!r}: {len(rows)} rows in {sorted(set(ops['name']))}"
    return rows[0]


def leaf(x):
    return x + 1


def middle(n):
    total = 0
    for i in range(n):
        total += leaf(i)
    return total


def test_call_counts_are_exact(no_gc):
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        middle(10)
        middle(5)
    assert _row(prof, "middle")["calls"] == 2
    assert _row(prof, "leaf")["calls"] == 15
    assert _row(prof, "leaf")["file"] == __file__


def test_total_ge_self_and_self_sums_to_thread_time(no_gc):
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            middle(200)
    ops = prof.ops()
    assert (ops["cpu_total_ns"] >= ops["cpu_self_ns"]).all()
    threads = prof.results.threads()
    main = threads[threads["ident"] == threading.get_ident()][0]
    # Every nanosecond of the thread's busy time is some op's self time.
    assert main["self_sum_ns"] == main["busy_ns"]
    assert ops["cpu_self_ns"].sum() == threads["self_sum_ns"].sum()
    # The window started inside this test function: it is the root and covers the window.
    me = _row(prof, "test_total_ge_self_and_self_sums_to_thread_time")
    assert me["calls"] == 0  # entered before the window
    assert me["cpu_total_ns"] == main["last_ns"] - main["first_ns"]


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def test_recursion_counts_total_once(no_gc):
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        fib(12)
    row = _row(prof, "fib")
    assert row["calls"] == 465  # calls of fib(12)
    tree = prof.call_tree()
    display = f"fib ({__file__.rsplit('/', 1)[-1]}:{fib.__code__.co_firstlineno})"
    top = tree[(tree["name"] == display) & (tree["calls"] == 1)]
    outer = top[np.argmax(top["total_ns"])]
    # The outermost fib's total is the op's total: inner calls are not added again.
    assert row["cpu_total_ns"] == outer["total_ns"]
    assert row["cpu_self_ns"] <= row["cpu_total_ns"]


def test_c_functions_are_named():
    data = []
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        for _ in range(4):
            data.append(len(data))
        np.arange(3).sum()
    names = set(prof.ops()["name"])
    assert "len" in names
    assert "list.append" in names
    assert _row(prof, "list.append")["calls"] == 4
    assert _row(prof, "len")["kind"] == "c"


def test_binding_library_functions_take_their_module_name():
    # pybind11 binds a free function as a C function whose self is a private record
    # (a capsule; since pybind11 3.0 an object of type pybind11_builtins.pybind11_detail_
    # function_record_...); it is named after its __module__, as Python shows it
    from gpuprof import _gpuprof

    fn = _gpuprof._test_binding_function("torchlike._C")
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        for i in range(3):
            assert fn(i) == i
    row = _row(prof, "torchlike._C.bound_identity")
    assert row["kind"] == "c" and row["calls"] == 3
    assert not any("capsule" in str(n).lower() for n in prof.ops()["name"])


def gen(n):
    for i in range(n):
        yield i


def test_generator_resume_is_not_a_call(no_gc):
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        total = 0
        for _ in range(3):
            total += sum(gen(5))
    assert _row(prof, "gen")["calls"] == 3


async def co_leaf():
    await asyncio.sleep(0)
    return 1


async def co_main():
    return sum([await co_leaf() for _ in range(4)])


def test_coroutines(no_gc):
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        asyncio.run(co_main())
    assert _row(prof, "co_leaf")["calls"] == 4
    assert _row(prof, "co_main")["calls"] == 1


def raiser(depth):
    if depth == 0:
        raise ValueError("boom")
    raiser(depth - 1)


def test_exceptions_unwind_the_stack(no_gc):
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            try:
                raiser(4)
            except ValueError:
                pass
        leaf(1)
    assert _row(prof, "raiser")["calls"] == 15
    tree = prof.call_tree()
    leaf_nodes = tree[np.array([str(n).startswith("leaf (") for n in tree["name"]])]
    # leaf is called from this test's body, not from inside a raiser frame left open
    parents = {str(tree["name"][p]).split(" (")[0] for p in leaf_nodes["parent"]}
    assert parents == {"test_exceptions_unwind_the_stack"}


def worker(n, out):
    out.append(middle(n))


def test_threads_started_inside_the_window(no_gc):
    out = []
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        ts = [threading.Thread(target=worker, args=(50, out)) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert len(out) == 4
    assert _row(prof, "worker")["calls"] == 4
    assert _row(prof, "leaf")["calls"] == 200
    threads = prof.results.threads()
    assert len(threads) >= 5
    tree = prof.call_tree()
    worker_nodes = tree[np.array([str(n).startswith("worker (") for n in tree["name"]])]
    assert len(set(worker_nodes["thread"])) == 4


def test_started_and_stopped_at_depth(no_gc):
    prof = gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU])

    def inner_start():
        prof.start()
        leaf(1)

    def inner_stop():
        leaf(2)
        prof.stop()

    inner_start()  # returns from a frame entered before the window
    middle(3)
    inner_stop()  # a frame still open when the window closes
    assert _row(prof, "middle")["calls"] == 1
    assert _row(prof, "leaf")["calls"] == 5
    assert (
        _row(
            prof,
            inner_stop.__code__.co_name if sys.version_info < (3, 11) else inner_stop.__qualname__,
        )["calls"]
        == 1
    )
    ops = prof.ops()
    assert (ops["cpu_self_ns"] >= 0).all()
    assert (ops["cpu_total_ns"] >= 0).all()


def test_gpuprof_frames_are_hidden():
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            leaf(0)
            prof.step()
    # the package's own folder, not "gpuprof" anywhere: a clone lives in .../gpuprof/
    package = os.path.dirname(os.path.abspath(gpuprof.__file__)) + os.sep
    files = {str(f) for f in prof.ops()["file"]}
    assert any(f.endswith("test_hook.py") for f in files), files
    assert not any(f.startswith(package) for f in files), files
    names = set(prof.ops()["name"])
    assert "step" not in names and "Profiler.step" not in names


def test_runpy_frames_are_hidden(tmp_path):
    """runpy starts `python -m` programs: its frames are the launcher's, not the program's."""
    import runpy

    script = tmp_path / "prog.py"
    script.write_text("def work():\n    return sum(range(1000))\n\nwork()\n")
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        runpy.run_path(str(script))
    ops = prof.ops()
    files = {str(f) for f in ops["file"]}
    assert str(script) in files and "work" in set(ops["name"])
    assert runpy.run_path.__code__.co_filename not in files, files


def test_event_record_is_16_bytes():
    assert gpuprof._gpuprof._test_constants()["EVENT_BYTES"] <= 24


def test_c_call_sites_resolve_to_the_callers_line():
    import inspect

    data = []
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        line = inspect.currentframe().f_lineno + 1  # the next line's
        data.append(1)
    ops = prof.ops()
    row = int(np.flatnonzero(ops["name"] == "list.append")[0])
    spans = prof.results.spans()
    site = spans[spans["op_row"] == row]
    assert len(site) == 1
    assert site["line"][0] == line
