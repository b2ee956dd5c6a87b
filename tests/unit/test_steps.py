"""Steps as torch.profiler users count them (issue 20): a step is what prof.step()
closes, a schedule cut short by the loop's end keeps the last complete window, and
profile() takes torch.profiler's other arguments."""

from __future__ import annotations

import json
import warnings

import gpuprof
import numpy as np
import pytest
from gpuprof import ProfilerActivity

CPU = [ProfilerActivity.CPU]


def work(n):
    return sum(range(n))


def row(prof, name):
    ops = prof.ops()
    hit = ops[ops["name"] == name]
    return hit[0] if len(hit) else None


# -- a step is what prof.step() closes --------------------------------------------------


def test_three_iterations_with_step_after_each_are_three_steps():
    with gpuprof.profile(activities=CPU) as prof:
        for _ in range(3):
            work(1000)
            prof.step()
        work(10)  # after the last step(): recorded, but in no step
    assert list(prof.steps()["step"]) == [0, 1, 2]
    assert row(prof, "ProfilerStep*")["calls"] == 3
    assert row(prof, "work")["calls"] == 4
    # the diagnosis and the step table count the same three steps
    assert prof.diagnose().summary["steps"] == 3
    assert str(prof.diagnose()).splitlines()[2].startswith("3 recorded steps")
    assert len(prof.step_table()) == 3
    # the mean step is that of the three real steps, not lowered by an empty fourth
    steps = prof.steps()
    assert prof.diagnose().summary["step_ns_mean"] == pytest.approx(steps["cpu_ns"].mean(), abs=1)


def test_no_profiler_step_row_without_step_calls():
    with gpuprof.profile(activities=CPU) as prof:
        work(1000)
    assert row(prof, "ProfilerStep*") is None
    assert len(prof.steps()) == 0
    assert "ProfilerStep" not in prof.key_averages().table()
    # the work is still there, under the frame that was running
    assert row(prof, "work")["calls"] == 1


def test_trace_has_one_step_slice_per_closed_step(tmp_path):
    with gpuprof.profile(activities=CPU) as prof:
        for _ in range(2):
            work(100)
            prof.step()
    path = prof.export_chrome_trace(str(tmp_path / "t.json"))
    with open(path) as f:
        names = [e.get("name") for e in json.load(f)["traceEvents"]]
    assert sorted(n for n in names if str(n).startswith("ProfilerStep#")) == [
        "ProfilerStep#0",
        "ProfilerStep#1",
    ]


def test_compare_uses_the_closed_steps():
    profs = []
    for n in (1000, 4000):
        with gpuprof.profile(activities=CPU) as prof:
            for _ in range(3):
                work(n)
                prof.step()
        profs.append(prof)
    c = gpuprof.compare(*profs)
    for prof, mean in ((profs[0], c.step_before_ns), (profs[1], c.step_after_ns)):
        assert mean == pytest.approx(prof.steps()["cpu_ns"].mean())


# -- schedules cut short by the end of the loop ------------------------------------------


def test_cut_short_cycle_keeps_the_last_complete_window_and_says_so():
    # the README's example: wait=1, warmup=1, active=3 over 12 batches; the third
    # cycle has begun recording when the loop ends
    seen = []
    sched = gpuprof.schedule(wait=1, warmup=1, active=3)
    with pytest.warns(UserWarning) as caught:
        with gpuprof.profile(
            activities=CPU,
            schedule=sched,
            on_trace_ready=lambda p: seen.append(list(p.steps()["step"])),
        ) as prof:
            for _ in range(12):
                work(1000)
                prof.step()
    assert seen == [[2, 3, 4], [7, 8, 9]]  # the cut-short window is not handed over
    assert list(prof.steps()["step"]) == [7, 8, 9]
    assert row(prof, "work")["calls"] == 3
    msgs = [str(w.message) for w in caught if "cut-short" in str(w.message)]
    assert len(msgs) == 1 and "\n" not in msgs[0]
    assert "steps 7-9" in msgs[0] and "5 steps each" in msgs[0]
    assert caught[0].filename == __file__  # points at the with statement


def test_cut_short_first_window_is_kept_with_a_warning():
    sched = gpuprof.schedule(wait=1, warmup=1, active=3)
    with pytest.warns(UserWarning, match="first recording window"):
        with gpuprof.profile(activities=CPU, schedule=sched) as prof:
            for _ in range(4):
                work(1000)
                prof.step()
    assert list(prof.steps()["step"]) == [2, 3]


def test_a_restarted_profile_cut_short_in_its_first_window_keeps_it():
    # windows of an earlier start()/stop() run of the same profile do not count as
    # "a complete window came before" in the next run
    prof = gpuprof.profile(activities=CPU, schedule=gpuprof.schedule(wait=0, warmup=1, active=2))
    prof.start()
    for _ in range(3):
        work(100)
        prof.step()
    prof.stop()
    assert list(prof.steps()["step"]) == [1, 2]
    prof.start()
    with pytest.warns(UserWarning, match="first recording window"):
        for _ in range(2):
            work(100)
            prof.step()
        prof.stop()
    assert list(prof.steps()["step"]) == [1]


def test_whole_cycles_do_not_warn():
    sched = gpuprof.schedule(wait=1, warmup=1, active=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with gpuprof.profile(activities=CPU, schedule=sched) as prof:
            for _ in range(10):
                work(100)
                prof.step()
    assert list(prof.steps()["step"]) == [7, 8, 9]


def test_acc_events_keeps_the_cut_short_window_too():
    sched = gpuprof.schedule(wait=0, warmup=1, active=2)
    with pytest.warns(UserWarning):
        with gpuprof.profile(activities=CPU, schedule=sched, acc_events=True) as prof:
            for _ in range(7):  # cycles 0-2 and 3-5, then step 7 recording
                work(100)
                prof.step()
    assert list(prof.steps()["step"]) == [1, 2, 4, 5]


# -- torch.profiler's other arguments ----------------------------------------------------


@pytest.mark.parametrize(
    "arg, value",
    [
        ("experimental_config", object()),
        ("execution_trace_observer", object()),
        ("post_processing_timeout_s", 5.0),
        ("custom_trace_id_callback", lambda: "id"),
    ],
)
def test_arguments_gpuprof_cannot_honour_warn_once_naming_them(arg, value):
    with pytest.warns(UserWarning) as caught:
        prof = gpuprof.profile(activities=CPU, **{arg: value})
    named = [w for w in caught if f"{arg}=" in str(w.message)]
    assert len(named) == 1, [str(w.message) for w in caught]
    with warnings.catch_warnings():  # and only once: not again when it runs
        warnings.simplefilter("error")
        with prof:
            work(10)


def test_with_modules_is_honoured_silently():
    # the module hierarchy is in the call tree without asking
    class Block:
        def forward(self):
            return work(10)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with gpuprof.profile(activities=CPU, with_modules=True, with_flops=False) as prof:
            Block().forward()
    tree = prof.call_tree()
    names = [str(n) for n in tree["name"]]
    block = [
        i
        for i, n in enumerate(names)  # bare "forward" on 3.10 (no co_qualname)
        if n.split(" (")[0].endswith("forward") and "test_steps.py" in n
    ]
    assert block
    assert any(
        names[i].startswith("work") and tree["parent"][i] == block[0] for i in range(len(tree))
    )


def test_use_cuda_false_means_cpu_only_and_the_footer_says_why():
    with gpuprof.profile(use_cuda=False) as prof:
        work(10)
    assert prof.activities == {ProfilerActivity.CPU}
    assert "CUDA capture: off (use_cuda=False)" in prof.key_averages().table()


def test_footer_always_names_the_cuda_capture_mode():
    with gpuprof.profile(activities=CPU) as prof:
        work(10)
    lines = prof.key_averages().table().splitlines()
    assert "CUDA capture: off (ProfilerActivity.CUDA is not in activities)" in lines
    with gpuprof.profile() as prof:  # the default: CUDA when usable
        work(10)
    footer = [
        ln for ln in prof.key_averages().table().splitlines() if ln.startswith("CUDA capture:")
    ]
    assert len(footer) == 1
    if not gpuprof.cuda_status()["usable"]:
        assert footer[0].startswith("CUDA capture: off (") and footer[0].endswith(")")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"with_flops": 1}, "with_flops must be a bool"),
        ({"with_modules": "yes"}, "with_modules must be a bool"),
        ({"use_cuda": "cuda"}, "use_cuda must be a bool or None"),
        ({"post_processing_timeout_s": -1}, "post_processing_timeout_s must be a number >= 0"),
        ({"custom_trace_id_callback": "id"}, "custom_trace_id_callback must be callable"),
    ],
)
def test_bad_compat_arguments_raise_naming_them(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        gpuprof.profile(activities=CPU, **kwargs)


def test_add_metadata_reaches_the_trace(tmp_path):
    with gpuprof.profile(activities=CPU) as prof:
        work(10)
    prof.add_metadata("run", "baseline")
    prof.add_metadata_json("config", '{"lr": 0.1, "layers": [1, 2]}')
    path = prof.export_chrome_trace(str(tmp_path / "t.json"))
    with open(path) as f:
        doc = json.load(f)
    assert doc["run"] == "baseline"
    assert doc["config"] == {"lr": 0.1, "layers": [1, 2]}
    # and survives save/load
    loaded = gpuprof.load(prof.save(str(tmp_path / "p.gpuprof")))
    path2 = loaded.export_chrome_trace(str(tmp_path / "t2.json"))
    with open(path2) as f:
        assert json.load(f)["config"] == {"lr": 0.1, "layers": [1, 2]}


def test_add_metadata_rejects_bad_input():
    prof = gpuprof.profile(activities=CPU)
    with pytest.raises(TypeError, match="add_metadata"):
        prof.add_metadata("k", 3)
    with pytest.raises(ValueError, match="JSON"):
        prof.add_metadata_json("k", "{not json")
    with pytest.raises(TypeError, match="add_metadata_json"):
        prof.add_metadata_json(1, "1")


def test_steps_array_fields_unchanged():
    with gpuprof.profile(activities=CPU) as prof:
        for _ in range(2):
            work(100)
            prof.step()
    s = prof.steps()
    assert (s["cpu_ns"] == s["end_ns"] - s["start_ns"]).all()
    assert np.all(s["end_ns"][:-1] <= s["start_ns"][1:])
