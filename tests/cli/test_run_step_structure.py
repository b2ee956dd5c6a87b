"""One step structure for every way of marking steps, on real PyTorch (issue 32).

The same training loop, written as people write it, is profiled twice: unmodified under
``python -m gpuprof run`` (steps end in PyTorch's optimizer-step hook, deep inside the
training step) and with ``prof.step()`` written after each iteration. Both must give the
same structure: steps are siblings under the loop's function, what runs inside a step
is the same call paths, and the trace's ``ProfilerStep#N`` slices follow each other,
each holding one of the steps the optimizer's own post-step hook stamped. HTA and the TensorBoard
profiler plugin read the trace's steps.
"""

import gzip
import json
import os
import re
import subprocess
import sys

import pytest
from test_cli import PYTHONPATH, gpuprof, script

torch = pytest.importorskip("torch", reason="PyTorch is not installed (CI installs it)")

SCHEDULE = ("--wait", "1", "--warmup", "1", "--active", "3")  # records steps 2, 3, 4
RECORDED = [2, 3, 4]


def stacks(path):
    return [line.rsplit(" ", 1)[0].split(";") for line in open(path).read().splitlines()]


def name(frame):
    """A stacks frame without its file and line: ``torch_steps.py(29):_train_step`` ->
    ``train_step``."""
    return re.sub(r"^.*?\(\d+\):_", "", frame)


def under_step(found):
    """The call paths inside steps (names only, the step's caller dropped)."""
    out = set()
    for frames in found:
        if "ProfilerStep*" in frames:
            i = frames.index("ProfilerStep*")
            out.add(tuple(name(f) for f in frames[i + 1 : i + 3]))
    return out


def step_slices(path):
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return {
        int(e["name"].split("#")[1]): e
        for e in events
        if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")
    }


@pytest.fixture(scope="module", params=["sgd", "adamw"])
def profiled(request, tmp_path_factory):
    kind = request.param
    tmp = tmp_path_factory.mktemp(kind)
    run_dir, hand_dir = tmp / "run", tmp / "hand"
    hand_dir.mkdir()
    r = gpuprof(
        "run", "--no-cuda", *SCHEDULE, "-o", str(run_dir), script("torch_steps.py"), kind,
        str(tmp / "run_stamps.json"), timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    h = subprocess.run(
        [sys.executable, script("torch_steps.py"), kind, str(tmp / "hand_stamps.json"),
         "--hand", str(hand_dir)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=PYTHONPATH),
    )  # fmt: skip
    assert h.returncode == 0, h.stderr
    (run_trace,) = run_dir.glob("*.pt.trace.json.gz")
    (run_stacks,) = run_dir.glob("*.stacks.txt")
    return {
        "run": (stacks(run_stacks), run_trace, json.load(open(tmp / "run_stamps.json"))),
        "hand": (
            stacks(hand_dir / "hand.stacks.txt"),
            hand_dir / "hand.pt.trace.json.gz",
            json.load(open(tmp / "hand_stamps.json")),
        ),
    }


def test_steps_are_siblings_under_the_loops_function(profiled):
    for how, (found, _, _) in profiled.items():
        assert found, how
        for frames in found:
            assert frames.count("ProfilerStep*") <= 1, (how, frames)
        callers = {name(f[f.index("ProfilerStep*") - 1]) for f in found if "ProfilerStep*" in f}
        assert callers == {"main"}, how


def test_the_same_call_paths_run_inside_a_step(profiled):
    run_paths = under_step(profiled["run"][0])
    hand_paths = under_step(profiled["hand"][0])
    assert ("train_step", "Optimizer.profile_hook_step.<locals>.wrapper") in hand_paths
    assert ("train_step", "Module._wrapped_call_impl") in hand_paths
    # the hand loop's own stamp, stamps.append(time.perf_counter_ns())
    hand_paths -= {("<built-in_function_time.perf_counter_ns>",)}
    hand_paths -= {("<built-in_method_append_of_list_object>",)}
    assert run_paths == hand_paths


STAMP = "<built-in function time.perf_counter_ns>"


def trace_events(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def assert_contiguous(slices, events):
    """Each slice begins where the one before ends, with nothing of the program
    recorded between them (gpuprof's own step runs there)."""
    for a, b in zip(slices, slices[1:]):
        end = a["ts"] + a["dur"]
        assert b["ts"] >= end - 1e-3, (a["name"], b["name"])
        gap = [e for e in events if e.get("cat") == "python_function" and end <= e["ts"] < b["ts"]]
        assert not gap, gap


def test_step_slices_span_the_measured_steps(profiled):
    """Each slice spans one step as the program stamped it: slices follow each other
    with no gap, and each holds exactly one of the program's stamps (taken in the
    optimizer's post-step hook, or right before prof.step()). Checked by the order of
    the recorded events, not by durations measured twice, which a preempted thread
    makes differ."""
    for how, (_, trace_path, stamps) in profiled.items():
        slices = step_slices(trace_path)
        assert sorted(slices) == RECORDED, how
        assert len(stamps) == 10, how  # the program stamped every step
        events = trace_events(trace_path)
        ordered = [slices[n] for n in RECORDED]
        assert_contiguous(ordered, events)
        for s in ordered:
            inside = [
                e
                for e in events
                if e.get("cat") == "python_function"
                and e["name"] == STAMP
                and s["ts"] <= e["ts"] < s["ts"] + s["dur"]
            ]
            assert len(inside) == 1, (how, s["name"], len(inside))


def test_hta_finds_the_steps(profiled, tmp_path):
    trace_mod = pytest.importorskip(
        "hta.common.trace", reason="Holistic Trace Analysis is not installed"
    )
    _, trace_path, _ = profiled["run"]
    (tmp_path / "t").mkdir()
    os.symlink(trace_path, tmp_path / "t" / "rank0.pt.trace.json.gz")
    t = trace_mod.Trace(trace_dir=str(tmp_path / "t"))
    t.parse_traces(use_multiprocessing=False, use_memory_profiling=False)
    assert t.get_iterations() == RECORDED
    df = t.get_trace(0)
    host = df[df["stream"] < 0]
    # every host slice that starts inside the steps' span is in one of the steps
    slices = step_slices(trace_path)
    lo, hi = slices[2]["ts"], slices[4]["ts"] + slices[4]["dur"]
    inside = host[(host["ts"] >= lo) & (host["ts"] < hi)]
    assert len(inside) > 100
    assert (inside["iteration"] >= 0).all()


def test_tensorboard_plugin_reads_the_steps(profiled, tmp_path):
    data = pytest.importorskip(
        "torch_tb_profiler.profiler.data", reason="torch-tb-profiler is not installed"
    )
    from torch_tb_profiler.profiler.event_parser import ProfileRole

    _, trace_path, _ = profiled["run"]
    run = data.RunProfileData.parse("w", "1", str(trace_path), str(tmp_path))
    assert run.steps_names == [str(n) for n in RECORDED]
    # the plugin's step time is the step slice gpuprof wrote
    slices = step_slices(trace_path)
    for n in RECORDED:
        total = run.steps_costs[RECORDED.index(n)].costs[ProfileRole.Total]
        assert total == pytest.approx(slices[n]["dur"], rel=1e-6), n


def test_a_capture_of_an_armed_job_has_the_same_structure(tmp_path):
    """``gpuprof capture`` of an armed, unmodified PyTorch loop: its steps end in the
    optimizer's hook too, and come out as siblings spanning their iterations."""
    from test_on_demand_cli import TORCH_LOOP, Program

    env = dict(
        os.environ, GPUPROF_RUNTIME_DIR=str(tmp_path / "runtime"), OMP_NUM_THREADS="1",
        PYTHONPATH=PYTHONPATH,
    )  # fmt: skip
    prog = Program(env, tmp_path / "stop", sys.executable, "-m", "gpuprof", "run",
                   "--on-demand", TORCH_LOOP, str(tmp_path / "stop"))  # fmt: skip
    try:
        r = subprocess.run(
            [sys.executable, "-m", "gpuprof", "capture", str(prog.pid), "--steps", "4",
             "--wait", "--output", str(tmp_path / "cap")],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
    finally:
        code, _, err = prog.end()
    assert code == 0, err
    (stacks_path,) = (tmp_path / "cap").glob("*.stacks.txt")
    found = stacks(stacks_path)
    for frames in found:
        assert frames.count("ProfilerStep*") <= 1, frames
    assert {name(f[f.index("ProfilerStep*") - 1]) for f in found if "ProfilerStep*" in f} == {
        "main"
    }
    (trace_path,) = (tmp_path / "cap").glob("*.pt.trace.json.gz")
    events = trace_events(trace_path)
    slices = sorted(step_slices(trace_path).values(), key=lambda e: e["ts"])
    assert len(slices) == 4
    assert_contiguous(slices, events)
    # the model's forward: one top-level call a step, so each slice holds one
    calls = [  # module calls, named by instance (docs/backward.md, "Modules")
        e
        for e in events
        if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: ")
    ]
    forwards = [
        e
        for e in calls
        if not any(
            p is not e and p["ts"] <= e["ts"] and e["ts"] + e["dur"] <= p["ts"] + p["dur"]
            for p in calls
        )
    ]
    for s in slices:
        inside = [e for e in forwards if s["ts"] <= e["ts"] < s["ts"] + s["dur"]]
        assert len(inside) == 1, (s["name"], len(inside))
