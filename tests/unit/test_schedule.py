"""The schedule: actions, transitions, windows, and bounded memory."""

import itertools
import os

import gpuprof
import pytest
from gpuprof import ProfilerAction as A

CPU = [gpuprof.ProfilerActivity.CPU]


def reference(wait, warmup, active, repeat, skip_first, skip_first_wait, step):
    """torch.profiler.schedule's rule, written out independently."""
    if step < skip_first:
        return A.NONE
    step -= skip_first
    if skip_first_wait:
        step += wait
    cycle = wait + warmup + active
    if repeat > 0 and step >= repeat * cycle:
        return A.NONE
    mod = step % cycle
    if mod < wait:
        return A.NONE
    if mod < wait + warmup:
        return A.WARMUP
    return A.RECORD if mod < cycle - 1 else A.RECORD_AND_SAVE


GRID = list(itertools.product([0, 1, 2], [0, 1, 2], [1, 2, 3], [0, 1, 2], [0, 3], [0, 1]))


@pytest.mark.parametrize("params", GRID)
def test_schedule_matches_reference(params):
    sched = gpuprof.Schedule(*params)
    for step in range(40):
        assert sched(step) == reference(*params, step), (params, step)


def test_schedule_table():
    s = gpuprof.schedule(wait=1, warmup=1, active=2, repeat=2, skip_first=1)
    got = [s(i) for i in range(11)]
    assert got == [
        A.NONE,
        A.NONE,
        A.WARMUP,
        A.RECORD,
        A.RECORD_AND_SAVE,
        A.NONE,
        A.WARMUP,
        A.RECORD,
        A.RECORD_AND_SAVE,
        A.NONE,
        A.NONE,
    ]


def test_matches_torch_when_installed():
    torch_profiler = pytest.importorskip("torch.profiler")
    for params in GRID[::7]:
        wait, warmup, active, repeat, skip_first, skip_first_wait = params
        try:
            theirs = torch_profiler.schedule(
                wait=wait,
                warmup=warmup,
                active=active,
                repeat=repeat,
                skip_first=skip_first,
                skip_first_wait=skip_first_wait,
            )
        except TypeError:
            if skip_first_wait:
                continue
            theirs = torch_profiler.schedule(
                wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first
            )
        ours = gpuprof.Schedule(*params)
        assert [int(ours(i)) for i in range(30)] == [theirs(i).value for i in range(30)]


@pytest.mark.parametrize(
    "kwargs, exc, word",
    [
        (dict(wait=-1, warmup=1, active=1), ValueError, "wait"),
        (dict(wait=0, warmup=1, active=0), ValueError, "active"),
        (dict(wait=0, warmup=1.5, active=1), TypeError, "warmup"),
        (dict(wait=0, warmup=1, active=1, repeat=-2), ValueError, "repeat"),
        (dict(wait=0, warmup=1, active=1, skip_first="3"), TypeError, "skip_first"),
    ],
)
def test_bad_schedule_arguments(kwargs, exc, word):
    with pytest.raises(exc, match=word):
        gpuprof.schedule(**kwargs)


def test_non_callable_on_trace_ready():
    with pytest.raises(TypeError, match="on_trace_ready"):
        gpuprof.profile(on_trace_ready=42)


def work(n):
    return sum(i * i for i in range(n))


def test_windows_record_only_active_steps():
    seen = []

    def ready(p):
        steps = p.steps()
        seen.append(list(steps["step"]))

    sched = gpuprof.schedule(wait=1, warmup=1, active=2, repeat=2)
    with gpuprof.profile(activities=CPU, schedule=sched, on_trace_ready=ready) as prof:
        for _ in range(10):
            work(100)
            prof.step()
    assert seen == [[2, 3], [6, 7]]
    # the last completed cycle is what the accessors return
    assert list(prof.steps()["step"]) == [6, 7]
    assert prof.ops()[prof.ops()["name"] == "ProfilerStep*"]["calls"][0] == 2


def test_acc_events_accumulates_cycles():
    sched = gpuprof.schedule(wait=0, warmup=1, active=1, repeat=3)
    with gpuprof.profile(activities=CPU, schedule=sched, acc_events=True) as prof:
        for _ in range(8):
            work(10)
            prof.step()
    assert list(prof.steps()["step"]) == [1, 3, 5]
    row = prof.ops()[prof.ops()["name"] == "work"]
    assert row["calls"][0] == 3


def test_accumulated_windows_merge_each_ops_figures():
    sched = gpuprof.schedule(wait=0, warmup=1, active=1, repeat=3)
    with gpuprof.profile(activities=CPU, schedule=sched, acc_events=True) as prof:
        for i in range(8):
            work(10 * (i + 1))  # a different time in every window
            prof.step()
    res = prof.results
    assert len(res.windows) == 3
    per = [res.window_ops(i) for i in range(3)]
    rows = [w[w["name"] == "work"][0] for w in per]
    merged = prof.ops()
    row = merged[merged["name"] == "work"][0]
    assert row["calls"] == sum(r["calls"] for r in rows) == 3
    assert row["cpu_total_ns"] == sum(r["cpu_total_ns"] for r in rows)
    assert row["cpu_min_ns"] == min(r["cpu_min_ns"] for r in rows)
    assert row["cpu_max_ns"] == max(r["cpu_max_ns"] for r in rows)
    assert (row["file"], row["line"], row["kind"]) == (rows[0]["file"], rows[0]["line"], "python")
    # one row per op, in order of first appearance
    names = [(n, f, ln) for n, f, ln in zip(merged["name"], merged["file"], merged["line"])]
    assert len(set(names)) == len(names)
    assert names[: len(per[0])] == list(zip(per[0]["name"], per[0]["file"], per[0]["line"]))


class _FirstStepApart:
    """Step 0 saved alone, then one window to stop(); ``until_stop`` as given."""

    def __init__(self, until_stop):
        self.until_stop = until_stop

    def __call__(self, step):
        return A.RECORD_AND_SAVE if step == 0 else A.RECORD


@pytest.mark.parametrize("until_stop", [True, False])
def test_a_schedule_recording_until_stop_keeps_its_last_window(until_stop, recwarn):
    """``until_stop``: the window open at stop() is complete; without it, it is cut
    short, dropped for the complete one before it, and a warning says so."""
    ready = []
    with gpuprof.profile(
        activities=CPU,
        schedule=_FirstStepApart(until_stop),
        on_trace_ready=lambda p: ready.append(p.steps()["step"].tolist()),
    ) as prof:
        for _ in range(4):
            work(10)
            prof.step()
    cut = [w for w in recwarn if "the loop ended at step 4" in str(w.message)]
    if until_stop:
        assert ready == [[0], [1, 2, 3]] and not cut
        assert prof.steps()["step"].tolist() == [1, 2, 3]
        assert prof.ops()[prof.ops()["name"] == "work"]["calls"][0] == 3
    else:
        assert ready == [[0]] and len(cut) == 1
        assert prof.steps()["step"].tolist() == [0]


def test_no_schedule_records_everything_and_marks_steps():
    with gpuprof.profile(activities=CPU) as prof:
        for _ in range(4):
            work(10)
            prof.step()
    steps = prof.steps()
    assert list(steps["step"]) == [0, 1, 2, 3]  # what prof.step() closed; stop() ends none
    assert (steps["end_ns"] >= steps["start_ns"]).all()
    assert (steps["cpu_ns"] == steps["end_ns"] - steps["start_ns"]).all()
    assert prof.ops()[prof.ops()["name"] == "work"]["calls"][0] == 4


def test_step_outside_profiler_raises():
    prof = gpuprof.profile(activities=CPU)
    with pytest.raises(RuntimeError, match="not running"):
        prof.step()


def test_exception_in_block_keeps_results():
    with pytest.raises(KeyError):
        with gpuprof.profile(activities=CPU) as prof:
            work(10)
            raise KeyError("x")
    assert prof.ops()[prof.ops()["name"] == "work"]["calls"][0] == 1


def test_keyboard_interrupt_in_block_keeps_results():
    with pytest.raises(KeyboardInterrupt):
        with gpuprof.profile(activities=CPU) as prof:
            work(10)
            raise KeyboardInterrupt
    assert prof.ops()[prof.ops()["name"] == "work"]["calls"][0] == 1


def test_second_profiler_raises():
    with gpuprof.profile(activities=CPU):
        with pytest.raises(RuntimeError, match="already running"):
            gpuprof.profile(activities=CPU).start()


def test_results_before_any_window_raise():
    sched = gpuprof.schedule(wait=5, warmup=1, active=1)
    with gpuprof.profile(activities=CPU, schedule=sched) as prof:
        prof.step()
    with pytest.raises(RuntimeError, match="no recorded window"):
        prof.ops()


def _rss_kb():
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_memory_stays_flat_over_10000_steps():
    calls = []
    sched = gpuprof.schedule(wait=1, warmup=1, active=2)

    def ready(p):
        calls.append(p.buffer_stats()["bytes_held"])

    with gpuprof.profile(activities=CPU, schedule=sched, on_trace_ready=ready) as prof:
        rss = []
        for i in range(10_000):
            work(20)
            prof.step()
            if i in (1000, 9999):
                rss.append(_rss_kb())
    assert len(calls) == 2500
    # the chunk pool reaches its size in the first cycles and never grows after
    assert max(calls[10:]) == max(calls[:10])
    assert rss[1] - rss[0] < 8 * 1024, rss  # < 8 MiB drift over 9,000 steps


def test_forked_child_stops_recording_and_parent_is_unaffected():
    with gpuprof.profile(activities=CPU) as prof:
        work(10)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: keeps running, records nothing, step/stop are no-ops
            import sys

            ok = sys.getprofile() is None
            prof.step()
            work(1000)
            os.write(w, b"1" if ok and not prof.running else b"0")
            os._exit(0)
        os.close(w)
        _, status = os.waitpid(pid, 0)
        child_ok = os.read(r, 1)
        os.close(r)
        work(10)
    assert status == 0 and child_ok == b"1"
    assert prof.ops()[prof.ops()["name"] == "work"]["calls"][0] == 2
