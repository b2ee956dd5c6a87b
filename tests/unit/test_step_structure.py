"""One step structure, wherever prof.step() is called from (issue 32).

``gpuprof run``, the integrations and on-demand captures end a step from inside the
optimizer's step (its post-hook), frames deep into the training step. The results
must be those of the same loop with ``prof.step()`` written after the optimizer step:
steps are siblings under the loop's function, never nested in each other, and each
``ProfilerStep#N`` slice spans its step's wall time on the stepping thread. The frames
that straddle a boundary (the training step, the optimizer's step, its hook) are cut
there: the piece before ends with the old step, the call goes on in the new one as the
same call (no second call counted).
"""

from __future__ import annotations

import gc
import glob
import gzip
import json
import time

import gpuprof
import pytest
from gpuprof import ProfilerActivity
from gpuprof.exporters.stacks import collapsed_stacks

CPU = [ProfilerActivity.CPU]


def spin(n):
    return sum(range(n))


class Optimizer:
    """An optimizer whose post-step hook may end the profiler's step, as PyTorch's
    global optimizer hook does under ``gpuprof run``."""

    def __init__(self, prof, hooked, stamps):
        self.prof, self.hooked, self.stamps = prof, hooked, stamps

    def step(self):
        spin(20_000)
        self._post_hooks()

    def _post_hooks(self):
        if self.hooked:
            self.stamps.append(time.perf_counter_ns())
            self.prof.step()


def load():
    return spin(30_000)


def forward_backward():
    return spin(120_000)


def train_step(opt):
    forward_backward()
    opt.step()
    spin(5_000)  # zero_grad, logging: after the optimizer step


def loop(hooked, steps=8):
    """The loop; with hooked=False prof.step() is written after each iteration. Both
    stamp the time right before they call prof.step()."""
    stamps = []
    with gpuprof.profile(activities=CPU) as prof:
        opt = Optimizer(prof, hooked, stamps)
        for _ in range(steps):
            load()
            train_step(opt)
            if not hooked:
                stamps.append(time.perf_counter_ns())
                prof.step()
    return prof, stamps


def stacks(prof, path):
    """The call paths of export_stacks(), and those under its 0.5 us cut-off: a
    sub-microsecond call such as Optimizer.__init__ rounds away in one loop or not."""
    prof.export_stacks(str(path))
    written = [line.rsplit(" ", 1)[0] for line in path.read_text().splitlines()]
    every = list(collapsed_stacks(prof.results))
    assert set(written) <= set(every)
    return [stack.split(";") for stack in every]


def below_step(frames):
    """The frames under ProfilerStep*, with no line numbers."""
    i = frames.index("ProfilerStep*")
    return tuple(f.split("):_", 1)[-1] for f in frames[i + 1 :])


def step_slices(prof, path):
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")]


def assert_nested(events):
    """Slices on each (pid, tid) nest: none ends after the slice it starts in."""
    lanes = {}
    for e in events:
        if e.get("ph") == "X":
            lanes.setdefault((e["pid"], e["tid"]), []).append(e)
    for lane in lanes.values():
        lane.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ = []
        for e in lane:
            while open_ and open_[-1]["ts"] + open_[-1]["dur"] <= e["ts"] + 1e-3:
                open_.pop()
            if open_:
                parent = open_[-1]
                assert e["ts"] + e["dur"] <= parent["ts"] + parent["dur"] + 1e-3, (
                    f"{e['name']} overlaps the end of {parent['name']}"
                )
            open_.append(e)


@pytest.fixture(scope="module")
def both():
    # the call paths are compared exactly: a collection during one loop would run
    # gc.callbacks (pytest plugins install some) inside that loop's steps only
    was = gc.isenabled()
    gc.disable()
    try:
        return loop(hooked=False), loop(hooked=True)
    finally:
        if was:
            gc.enable()


def test_steps_ended_in_the_optimizers_hook_are_siblings_as_in_the_loop(both, tmp_path):
    (hand, _), (hooked, _) = both
    hand_stacks = stacks(hand, tmp_path / "hand.txt")
    hooked_stacks = stacks(hooked, tmp_path / "hooked.txt")
    for frames in hand_stacks + hooked_stacks:
        assert frames.count("ProfilerStep*") <= 1, frames
    # the step sits under the loop's function in both
    for found in (hand_stacks, hooked_stacks):
        callers = {f[f.index("ProfilerStep*") - 1] for f in found if "ProfilerStep*" in f}
        assert len(callers) == 1 and callers.pop().endswith("_loop")
    # and what runs in a step is the same call paths
    hand_paths = {below_step(f) for f in hand_stacks if "ProfilerStep*" in f}
    hooked_paths = {below_step(f) for f in hooked_stacks if "ProfilerStep*" in f}
    # where each loop stamps the time
    hooked_paths -= {("train_step", "Optimizer.step", "Optimizer._post_hooks"),
                     ("train_step", "Optimizer.step", "Optimizer._post_hooks",
                      "<built-in_function_time.perf_counter_ns>"),
                     ("train_step", "Optimizer.step", "Optimizer._post_hooks",
                      "<built-in_method_append_of_list_object>")}  # fmt: skip
    hand_paths -= {("train_step", "Optimizer.step", "Optimizer._post_hooks"),
                   ("<built-in_function_time.perf_counter_ns>",),
                   ("<built-in_method_append_of_list_object>",)}  # fmt: skip
    assert hooked_paths == hand_paths


def test_a_call_cut_at_a_step_boundary_is_one_call(both):
    (hand, _), (hooked, _) = both
    for prof in (hand, hooked):
        ops = prof.ops()
        row = {n: ops[ops["name"] == n][0] for n in ("train_step", "forward_backward")}
        assert row["train_step"]["calls"] == 8
        # min and max are of whole calls: every train_step holds a forward_backward,
        # also when the step boundary cut it after its optimizer step
        assert row["train_step"]["cpu_min_ns"] > row["forward_backward"]["cpu_min_ns"]
        call_tree = prof.call_tree()
        steps = call_tree[call_tree["name"] == "ProfilerStep*"]
        assert len(steps) == 1 and steps[0]["calls"] == 8


STAMP = "<built-in function time.perf_counter_ns>"
APPEND = "<built-in method append of list object>"  # stamps.append(the stamp)


def starts_inside(events, s, cat="python_function"):
    """The events of ``cat`` that start inside slice ``s``, in time order."""
    return sorted(
        (e for e in events if e.get("cat") == cat and s["ts"] <= e["ts"] < s["ts"] + s["dur"]),
        key=lambda e: e["ts"],
    )


def test_step_slices_span_the_measured_step(both, tmp_path):
    """Each slice spans its iteration, up to the stamp each loop takes right before it
    calls prof.step(). Checked by the order of the recorded events, not by durations
    measured twice (which a preempted thread makes differ)."""
    for (prof, stamps), name in zip(both, ("hand", "hooked"), strict=True):
        slices = step_slices(prof, tmp_path / f"{name}.json")
        events = json.loads((tmp_path / f"{name}.json").read_text())["traceEvents"]
        assert [s["name"] for s in slices] == [f"ProfilerStep#{i}" for i in range(8)]
        assert len(stamps) == 8
        for a, b in zip(slices, slices[1:]):
            # each step begins where one ends (prof.step() itself runs between the two,
            # and nothing of the program)
            assert b["ts"] >= a["ts"] + a["dur"] - 1e-3
            gap = [
                e
                for e in events
                if e.get("cat") == "python_function" and a["ts"] + a["dur"] <= e["ts"] < b["ts"]
            ]
            assert not gap, gap
        for s in slices:
            # each step holds its iteration: one load, one forward and backward
            inside = [
                e["name"].split(": ")[-1]
                for e in events
                if e.get("cat") == "python_function"
                and s["ts"] <= e["ts"]
                and e["ts"] + e["dur"] <= s["ts"] + s["dur"]
            ]
            assert inside.count("load") == 1 and inside.count("forward_backward") == 1, s
            # and ends with the loop's stamp: nothing but its append starts after it
            started = [e["name"] for e in starts_inside(events, s)]
            assert started.count(STAMP) == 1, (name, s)
            assert started[started.index(STAMP) + 1 :] in ([], [APPEND]), (name, started[-3:])


def test_the_trace_nests_on_every_lane(both, tmp_path):
    for (prof, _), name in zip(both, ("hand", "hooked"), strict=True):
        path = tmp_path / f"{name}.json"
        prof.export_chrome_trace(str(path))
        assert_nested(json.loads(path.read_text())["traceEvents"])


def test_a_step_begun_right_after_a_window_opens_has_no_empty_pieces(tmp_path):
    """A schedule opens its window at a step boundary inside the hook: the frames then
    running (the window's first snapshot) go on inside the first step, with no
    zero-length piece before it."""
    stamps = []
    with gpuprof.profile(
        activities=CPU, schedule=gpuprof.schedule(wait=1, warmup=1, active=3)
    ) as prof:
        opt = Optimizer(prof, True, stamps)
        for _ in range(6):
            spin(30_000)
            train_step(opt)
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    assert_nested(events)
    steps = [e for e in events if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")]
    assert [s["name"] for s in steps] == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    first = steps[0]["ts"]
    before = [
        e
        for e in events
        if e.get("ph") == "X" and e.get("cat") == "python_function" and e["ts"] < first
    ]
    assert all(e["dur"] > 0 for e in before), before
    for frames in stacks(prof, tmp_path / "s.txt"):
        assert frames.count("ProfilerStep*") <= 1


# -- the integrations: Lightning and Hugging Face end steps from their own hooks -----------


def _recorded_structure(loaded, trace_path, stamps, tmp_path, iteration):
    """What every way of marking steps must give: at most one step in any stack, each
    step slice holding one call of ``iteration`` (the framework's training step) and
    the stamp of the framework's own step-end callback before it."""
    for frames in stacks(loaded, tmp_path / "stacks.txt"):
        assert frames.count("ProfilerStep*") <= 1, frames
    with gzip.open(trace_path, "rt") as f:
        events = json.load(f)["traceEvents"]
    assert_nested(events)
    slices = [e for e in events if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")]
    assert len(slices) == 2
    for s in slices:
        inside = [
            e
            for e in events
            if e.get("cat") == "python_function"
            and e["name"].endswith(iteration)
            and s["ts"] <= e["ts"]
            and e["ts"] + e["dur"] <= s["ts"] + s["dur"]
        ]
        assert len(inside) == 1, (s["name"], len(inside))
    # Each slice spans the framework's step: it begins before the callback that
    # stamped the end of the step before (the framework calls it after the step ends)
    # and holds the iteration; the stamp of its own end falls in the next slice.
    # Checked by the order of the recorded events, not by measuring durations twice.
    assert len(stamps) >= 2
    for s in sorted(slices, key=lambda s: s["ts"]):
        started = [e["name"] for e in starts_inside(events, s)]
        assert started.count(STAMP) == 1, (s["name"], started.count(STAMP))
        first_iteration = next(i for i, n in enumerate(started) if n.endswith(iteration))
        assert started.index(STAMP) < first_iteration, s["name"]


def test_lightning_steps_are_siblings_spanning_their_batches(tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (make frameworks)")
    from test_integrations import fit, lightning_or_skip

    L = lightning_or_skip()
    from gpuprof.integrations.lightning import GpuprofProfiler

    stamps = []

    class BatchEnds(L.Callback):
        def on_train_batch_end(self, *args):
            stamps.append(time.perf_counter_ns())

    profiler = GpuprofProfiler(schedule=gpuprof.schedule(wait=2, warmup=1, active=2, repeat=1))
    real_fit_trainer = L.Trainer

    def trainer_with_stamps(*args, **kwargs):
        return real_fit_trainer(*args, callbacks=[BatchEnds()], **kwargs)

    L.Trainer = trainer_with_stamps
    try:
        trainer = fit(L, tmp_path, profiler, sleep=0.005)
    finally:
        L.Trainer = real_fit_trainer
    assert torch is not None and len(stamps) == 12
    (trace,) = glob.glob(f"{trainer.log_dir}/fit.*.pt.trace.json.gz")
    loaded = gpuprof.load(f"{trainer.log_dir}/fit.gpuprof")
    _recorded_structure(loaded, trace, stamps, tmp_path, "Regressor.training_step")


def test_hugging_face_trainer_steps_are_siblings_spanning_their_steps(tmp_path):
    pytest.importorskip("torch", reason="PyTorch is not installed (make frameworks)")
    from test_integrations import hf_or_skip, hf_train

    transformers = hf_or_skip()
    from gpuprof.integrations.transformers import GpuprofCallback

    stamps = []

    class StepEnds(transformers.TrainerCallback):
        def on_step_end(self, *args, **kwargs):
            stamps.append(time.perf_counter_ns())

    cb = GpuprofCallback(schedule=gpuprof.schedule(wait=2, warmup=1, active=2, repeat=1))
    hf_train(transformers, tmp_path, [cb, StepEnds()], sleep=0.005)
    assert len(stamps) == 10
    out = tmp_path / "hf"
    (trace,) = glob.glob(str(out / "gpuprof-train.*.pt.trace.json.gz"))
    loaded = gpuprof.load(str(out / "gpuprof-train.gpuprof"))
    _recorded_structure(loaded, trace, stamps, tmp_path, "Trainer.training_step")
