"""key_averages() as torch.profiler users read it (issue 20): context frames out of
the tables, row objects with torch's attribute names, table arguments, memory
columns, sort fallbacks, grouping by stack without counting recursion twice, and
prof.events()."""

from __future__ import annotations

import gzip
import json
import runpy
import sys

import gpuprof
import numpy as np
import pytest
from gpuprof import ProfilerActivity
from gpuprof.results.tables import KeyAverages
from test_memory import MiB
from test_memory import _synthetic as _memory_window

CPU = [ProfilerActivity.CPU]


def leaf(n):
    return sum(range(n))


def middle(n):
    return leaf(n) + leaf(2 * n)


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def data_lines(text):
    lines = text.split("\n")
    rules = [i for i, line in enumerate(lines) if line and set(line) == {"-"}]
    return lines[rules[1] + 1 : rules[2]], lines[rules[2] + 1 :]


def shown_names(text):
    rows, _ = data_lines(text)
    return [r.split("  ")[0] for r in rows]


def deep(depth, fn):
    """Call fn() under `depth` frames of this module, like a runner or notebook."""
    return fn() if depth == 0 else deep(depth - 1, fn)


def profiled_under_a_deep_stack():
    out = {}

    def body():
        frame, codes = sys._getframe(), set()
        while frame is not None:
            # runpy's frames (python -m pytest) are hidden like gpuprof's own
            if frame.f_code.co_filename != runpy.run_path.__code__.co_filename:
                codes.add(frame.f_code)
            frame = frame.f_back
        out["running"] = len(codes)  # ops already running when recording begins
        with gpuprof.profile(activities=CPU) as prof:
            with gpuprof.record_function("model_inference"):
                for _ in range(3):
                    middle(200)
        out["prof"] = prof

    deep(15, body)  # fifteen frames already running when recording begins
    return out["prof"], out["running"]


# -- context frames ---------------------------------------------------------------------


def test_frames_running_before_the_window_are_not_results():
    prof, running = profiled_under_a_deep_stack()
    text = prof.key_averages().table(sort_by="cpu_time_total", row_limit=10)
    names = shown_names(text)
    # the user's label is the first row, not row 17 under the running frames
    assert names[0] == "model_inference"
    assert not any(n.startswith(("deep (", "body (", "profiled_under")) for n in names)
    _, footer = data_lines(text)
    assert any(f.startswith(f"Not shown: {running} frames already running") for f in footer), footer
    # they are still in the call tree (and so in the trace), and shown on request
    tree_names = {str(n).split(" (")[0] for n in prof.call_tree()["name"]}
    assert {"deep", "profiled_under_a_deep_stack"} <= tree_names
    full = prof.key_averages(include_context=True)
    ctx = full.rows[full.rows["context"]]
    assert len(ctx) == running and (ctx["calls"] == 0).all()
    assert "deep (test_key_averages.py" in full.table(row_limit=-1)


def test_percentages_keep_the_window_total():
    prof, _ = profiled_under_a_deep_stack()
    ka = prof.key_averages()
    full = prof.key_averages(include_context=True)
    assert ka.total_self_cpu_ns == full.total_self_cpu_ns == prof.ops()["cpu_self_ns"].sum()


def test_a_resumed_generator_is_not_context():
    def gen():
        for i in range(3):
            leaf(10)
            yield i

    g = gen()
    next(g)
    with gpuprof.profile(activities=CPU) as prof:
        list(g)  # started before the window: resumed inside it, 0 new calls
    names = shown_names(prof.key_averages().table(row_limit=-1))
    assert any(
        n.startswith("test_a_resumed_generator_is_not_context.<locals>.gen")
        or n.startswith("gen (")
        for n in names
    ), names


# -- row objects ------------------------------------------------------------------------


def test_iterating_gives_torch_attribute_names():
    with gpuprof.profile(activities=CPU) as prof:
        for _ in range(4):
            middle(100)
            prof.step()
    ka = prof.key_averages()
    rows = {e.key: e for e in ka}
    assert len(rows) == len(ka)
    m = rows[next(k for k in rows if k.startswith("middle ("))]
    ops = prof.ops()
    op = ops[ops["name"] == "middle"][0]
    assert m.count == 4
    assert m.cpu_time_total == pytest.approx(op["cpu_total_ns"] / 1e3)
    assert m.self_cpu_time_total == pytest.approx(op["cpu_self_ns"] / 1e3)
    assert m.cpu_time == pytest.approx(m.cpu_time_total / 4)
    for attr in (
        "device_time_total",
        "cuda_time_total",
        "self_device_time_total",
        "self_cuda_time_total",
        "device_time",
        "cuda_time",
    ):
        assert getattr(m, attr) == 0.0
    for attr in (
        "cpu_memory_usage",
        "self_cpu_memory_usage",
        "device_memory_usage",
        "self_device_memory_usage",
        "cuda_memory_usage",
        "self_cuda_memory_usage",
    ):
        assert getattr(m, attr) == 0
    assert m.input_shapes == [] and m.stack == []
    assert ka[0].key == ka.display[0] and ka[-1].key == ka.display[-1]
    with pytest.raises(IndexError):
        ka[len(ka)]
    # sorting the objects as torch users do
    top = sorted(ka, key=lambda e: e.self_cpu_time_total, reverse=True)[0]
    assert top.self_cpu_time_total == max(e.self_cpu_time_total for e in ka)


def test_total_average_sums_the_shown_rows():
    with gpuprof.profile(activities=CPU) as prof:
        middle(100)
    ka = prof.key_averages()
    total = ka.total_average()
    assert total.key == "Total"
    assert total.count == sum(e.count for e in ka)
    assert total.self_cpu_time_total == pytest.approx(sum(e.self_cpu_time_total for e in ka))


def test_grouped_rows_carry_their_stack():
    with gpuprof.profile(activities=CPU) as prof:
        middle(10)
    rows = [e for e in prof.key_averages(group_by_stack_n=2) if e.key.startswith("leaf (")]
    assert rows and rows[0].stack[0].startswith("middle (")


# -- grouping by stack ------------------------------------------------------------------


def test_group_by_stack_counts_recursion_once():
    with gpuprof.profile(activities=CPU) as prof:
        fib(14)
    ops = prof.ops()
    total = int(ops[ops["name"] == "fib"]["cpu_total_ns"][0])
    grouped = prof.key_averages(group_by_stack_n=3)
    fib_rows = grouped.rows[grouped.rows["name"] == "fib"]
    # no group of fib holds more time than all of fib; the calls add up to all calls
    assert (fib_rows["cpu_total_ns"] <= total).all()
    assert fib_rows["calls"].sum() == ops[ops["name"] == "fib"]["calls"][0]
    # the deepest group (fib called by fib, fib, fib) recurses into itself: counted once
    deepest = fib_rows[fib_rows["calls"] == fib_rows["calls"].max()][0]
    assert deepest["cpu_total_ns"] < total


# -- table arguments --------------------------------------------------------------------


def test_time_unit_and_width_arguments():
    with gpuprof.profile(activities=CPU) as prof:
        middle(100)
    ka = prof.key_averages()
    text = ka.table(time_unit="ms", max_shapes_column_width=20, max_src_column_width=30)
    rows, footer = data_lines(text)
    for line in rows:
        times = [c for c in line.split() if c.endswith("s") and c[0].isdigit()]
        assert times and all(t.endswith("ms") for t in times), line
    assert footer[0].endswith("ms")
    assert "us" in ka.table(time_unit="us").split("\n")[3]
    with pytest.raises(ValueError, match="time_unit"):
        ka.table(time_unit="minutes")
    with pytest.raises(ValueError, match="max_shapes_column_width"):
        ka.table(max_shapes_column_width=0)
    with pytest.raises(TypeError, match="top_level_events_only"):
        ka.table(top_level_events_only="yes")


def test_top_level_events_only_shows_calls_made_from_the_running_frames():
    with gpuprof.profile(activities=CPU) as prof:
        for _ in range(2):
            middle(100)
            prof.step()
        leaf(5)  # outside any step: called from this test's frame
    names = shown_names(prof.key_averages().table(top_level_events_only=True, row_limit=-1))
    assert sorted(n.split(" (")[0] for n in names) == ["ProfilerStep*", "leaf"]


def test_sorting_by_cuda_time_without_cuda_falls_back_and_says_so():
    with gpuprof.profile(activities=CPU) as prof:
        leaf(10)
        middle(1000)
    ka = prof.key_averages()
    text = ka.table(sort_by="self_cuda_time_total")
    assert text == ka.table(sort_by="self_cpu_time_total").replace(
        "CUDA capture",
        "Sorted by self CPU time: sort_by='self_cuda_time_total' has no figures "
        "(no CUDA time was recorded)\nCUDA capture",
        1,
    )
    assert "Sorted by self CPU time" in ka.table(sort_by="cpu_memory_usage")
    assert "Sorted by" not in ka.table(sort_by="count")


def test_group_by_input_shape_groups_by_name_with_the_reason():
    """torch.profiler without record_shapes groups by name when asked for shapes; a
    recipe's on_trace_ready asking for them must not end the job."""
    with gpuprof.profile(activities=CPU) as prof:
        leaf(1)
    with pytest.warns(UserWarning, match="no input shapes were recorded"):
        by_shape = prof.key_averages(group_by_input_shape=True)
    by_name = prof.key_averages()
    assert [(r.key, r.count) for r in by_shape] == [(r.key, r.count) for r in by_name]
    assert any(r.key.startswith("leaf ") for r in by_shape)
    with pytest.raises(TypeError, match="group_by_input_shape"):
        prof.key_averages(group_by_input_shape="yes")
    with pytest.raises(TypeError, match="include_context"):
        prof.key_averages(include_context=1)


# -- memory columns ---------------------------------------------------------------------


def test_memory_columns_have_totals_and_sort_by_them():
    res = _memory_window()  # alloc_three -> three 'empty' calls of 256 MiB each
    ka = KeyAverages(res, show_memory=True)
    text = ka.table(sort_by="cuda_memory_usage", row_limit=-1)
    header = text.split("\n")[1]
    assert "CUDA Mem" in header and "Self CUDA Mem" in header
    assert "CPU Mem" not in header  # host memory per op is not measured: no zero column
    rows = {e.key.split(" (")[0]: e for e in ka}
    assert rows["empty"].self_device_memory_usage == 768 * MiB
    assert rows["empty"].device_memory_usage == 768 * MiB
    assert rows["alloc_three"].self_device_memory_usage == 0
    assert rows["alloc_three"].device_memory_usage == 768 * MiB  # what it called
    assert rows["ProfilerStep*"].cuda_memory_usage == 768 * MiB
    lines, _ = data_lines(text)
    assert "768.00 Mb" in lines[0]
    order = [ln.split("  ")[0].split(" (")[0] for ln in lines]
    assert order.index("empty") < len(order)
    # sorting by the self column puts 'empty' first
    first = data_lines(ka.table(sort_by="self_cuda_memory_usage"))[0][0]
    assert first.startswith("empty")


def test_no_memory_columns_without_profile_memory():
    res = _memory_window()
    header = KeyAverages(res, show_memory=False).table().split("\n")[1]
    assert "Mem" not in header


# -- prof.events() ----------------------------------------------------------------------


def test_events_are_the_calls_of_the_window():
    with gpuprof.profile(activities=CPU) as prof:
        for _ in range(2):
            middle(50)
    ev = prof.events()
    spans = prof.results.spans()
    assert len(ev) == len(spans)
    names = [e.name.split(" (")[0] for e in ev]
    assert names.count("middle") == 2 and names.count("leaf") == 4
    m = next(e for e in ev if e.name.startswith("middle ("))
    kids = [c.name.split(" (")[0] for c in m.cpu_children]
    assert kids == ["leaf", "leaf"]
    assert all(c.cpu_parent.id == m.id for c in m.cpu_children)
    # (microseconds from ns timestamps near 1e9 us: differences agree to about 1e-6 us)
    assert m.cpu_time_total == pytest.approx(m.time_range.elapsed_us(), abs=1e-3)
    assert m.self_cpu_time_total == pytest.approx(
        m.cpu_time_total - sum(c.cpu_time_total for c in m.cpu_children), abs=1e-3
    )
    assert m.count == 1 and m.device_time_total == 0.0
    assert ev[0].is_context  # this test's own frame


def test_events_device_time_joins_gpu_work_to_its_launch():
    from test_views import _synthetic

    res = _synthetic()  # f launches one 30 ns kernel through cudaLaunchKernel

    class Loaded(gpuprof.api._loaded.LoadedProfile):
        pass

    ev = Loaded(res).events()
    f = next(e for e in ev if e.kind == "python")
    assert f.self_device_time_total == pytest.approx(0.030)
    assert f.device_time_total == pytest.approx(0.030)
    api = next(e for e in ev if e.kind == "cuda_api")
    assert api.device_time_total == pytest.approx(0.030) and api.cpu_parent.id == f.id


# -- export_memory_timeline ---------------------------------------------------------------


def test_export_memory_timeline(tmp_path):
    with gpuprof.profile(
        activities=CPU, profile_memory=True, memory_sample_interval_s=0.001
    ) as prof:
        blocks = [bytearray(1 << 20) for _ in range(20)]
        leaf(100)
    del blocks
    for name in ("m.json", "m.json.gz"):
        path = prof.export_memory_timeline(str(tmp_path / name))
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt") as f:
            times, sizes = json.load(f)
        curve = prof.memory_curve("cpu")
        assert times == pytest.approx((curve["timestamp_ns"] / 1e3).tolist())
        assert [s[0] for s in sizes] == curve["rss_bytes"].tolist()
    with pytest.raises(ValueError, match="must end in"):
        prof.export_memory_timeline(str(tmp_path / "m.txt"))
    with gpuprof.profile(activities=CPU) as bare:
        leaf(1)
    with pytest.raises(RuntimeError, match="profile_memory=True"):
        bare.export_memory_timeline(str(tmp_path / "x.json"))


def test_export_memory_timeline_html(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    with gpuprof.profile(activities=CPU, profile_memory=True) as prof:
        leaf(100)
    path = prof.export_memory_timeline(str(tmp_path / "m.html"))
    text = open(path).read()
    assert text.startswith("<html>") and "data:image/png;base64," in text


def test_context_rows_of_accumulated_windows():
    sched = gpuprof.schedule(wait=0, warmup=1, active=1)
    with gpuprof.profile(activities=CPU, schedule=sched, acc_events=True) as prof:
        for _ in range(4):
            leaf(10)
            prof.step()
    ctx = prof.results.context_rows()
    ops = prof.ops()
    assert ctx.dtype == bool and len(ctx) == len(ops)
    assert not ctx[ops["name"] == "leaf"].any()
    assert np.all(ops["calls"][ctx] == 0)
