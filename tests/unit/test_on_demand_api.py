"""On-demand capture inside one process: gpuprof.arm(), OnDemand.capture() and the files.

The command line (`run --on-demand`, `capture PID`) is tested on real processes in
tests/cli/test_on_demand_cli.py.
"""

import gzip
import json
import os
import signal
import sys

import gpuprof
import pytest
from gpuprof.api import ondemand as _ondemand
from gpuprof.core import _ondemand_proto as proto


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    folder = tmp_path / "runtime"
    monkeypatch.setenv("GPUPROF_RUNTIME_DIR", str(folder))
    yield folder
    gpuprof.disarm()


def work(n=20_000):
    return sum(range(n))  # few events each: a long window stays small


def step_until_done(od, req, limit=100_000):
    """The program's loop: work and a step boundary, until the capture is written."""
    for _ in range(limit):
        if req.done:
            return req.wait(0)
        work()
        od.step()
    raise AssertionError(f"capture not written after {limit} steps: {od.status()}")


# -- signals and folders -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, num",
    [
        ("SIGUSR2", signal.SIGUSR2),
        ("usr1", signal.SIGUSR1),
        (int(signal.SIGUSR2), signal.SIGUSR2),
        (signal.SIGUSR1, signal.SIGUSR1),
        ("SIGRTMIN+2", signal.SIGRTMIN + 2),
        ("none", None),
        (None, None),
    ],
)
def test_parse_signal_takes_user_and_realtime_signals(text, num):
    assert proto.parse_signal(text) == num


@pytest.mark.parametrize("text", ["SIGTERM", "SIGINT", "KILL", 9, "SIGRTMIN+99", "", True])
def test_parse_signal_refuses_signals_with_a_meaning_of_their_own(text):
    with pytest.raises(ValueError, match="SIGUSR1, SIGUSR2, a real-time signal"):
        proto.parse_signal(text)


def test_runtime_folder_open_to_others_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "open"
    folder.mkdir(mode=0o777)
    os.chmod(folder, 0o777)
    monkeypatch.setenv("GPUPROF_RUNTIME_DIR", str(folder))
    with pytest.raises(OSError, match="not private to this user"):
        proto.runtime_dir()
    with pytest.raises(OSError, match="not private"):
        gpuprof.arm(signal=None)
    assert _ondemand.armed() is None


def test_proc_info_of_this_process():
    info = proto.ProcInfo(os.getpid())
    assert info.exists and not info.zombie and info.uid == os.getuid()
    assert info.start_time and info.looks_like_python
    assert info.argv[0] == sys.orig_argv[0]


# -- arming --------------------------------------------------------------------------------------
def test_arm_writes_state_installs_the_handler_and_disarm_undoes_it(runtime):
    before = signal.getsignal(signal.SIGUSR2)
    od = gpuprof.arm()
    state = json.loads((runtime / f"{os.getpid()}.json").read_text())
    assert state["pid"] == os.getpid() and state["signal"] == signal.SIGUSR2
    assert state["start_time"] == proto.ProcInfo(os.getpid()).start_time
    assert signal.getsignal(signal.SIGUSR2) == od._on_signal
    assert proto.ProcInfo(os.getpid()).catches(signal.SIGUSR2)
    assert sys.getprofile() is None  # armed: no hook
    assert gpuprof.arm() is od  # the same arguments: the same object
    gpuprof.disarm()
    assert not (runtime / f"{os.getpid()}.json").exists()
    assert signal.getsignal(signal.SIGUSR2) == before
    assert _ondemand.armed() is None


def test_arm_refuses_a_signal_the_program_handles(runtime):
    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGUSR1, mine)
    try:
        with pytest.raises(ValueError, match="SIGUSR1 already has a handler"):
            gpuprof.arm(signal="SIGUSR1")
        assert signal.getsignal(signal.SIGUSR1) is mine
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"signal": "SIGKILL"}, "signal must be"),
        ({"trigger_dir": "/no/such/folder"}, "trigger_dir: '/no/such/folder' is not a folder"),
        ({"step_fn": "nocolon"}, "step_fn: takes module:function"),
        ({"poll_interval_s": 0}, "poll_interval_s must be"),
    ],
)
def test_arm_bad_arguments(runtime, kwargs, match):
    with pytest.raises(ValueError, match=match):
        gpuprof.arm(**kwargs)


def test_arm_with_a_step_function_of_main_that_does_not_exist(runtime):
    with pytest.raises(ValueError, match="step_fn: the script defines no no_such_function"):
        gpuprof.arm(signal=None, step_fn="__main__:no_such_function")


@pytest.mark.parametrize(
    "argv, skip",
    [
        (["python", "-m", "gpuprof", "capture", "1"], True),
        (["python", "-u", "-m", "gpuprof.boot"], True),
        (["python", "-mgpuprof", "run", "x.py"], True),
        (["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"], True),
        (["python", "train.py"], False),
        (["python", "-m", "torch.distributed.run", "train.py"], False),
        (["python", "-c", "import gpuprof"], False),
    ],
)
def test_environment_arming_skips_gpuprof_itself_and_multiprocessing_helpers(
    monkeypatch, argv, skip
):
    monkeypatch.setattr(sys, "orig_argv", argv)
    monkeypatch.setattr(sys, "argv", argv[1:] or [""])
    assert _ondemand._not_for_environment() is skip


# -- captures in the process -----------------------------------------------------------------------
def test_two_captures_of_explicit_steps(runtime, tmp_path):
    od = gpuprof.arm(signal=None, poll_interval_s=0.05)
    for _ in range(4):
        od.step()
    assert od.found == 4
    first = od.capture(steps=3, output=tmp_path / "one")
    assert "records the next 3 steps from its next step boundary (it is at step 4)" in first.message
    res = step_until_done(od, first)
    assert res["ok"], res
    assert res["n_steps"] == 3 and res["steps"] == [res["first_step"], res["first_step"] + 2]
    assert res["first_step"] >= 5
    assert sys.getprofile() is None  # the hook is gone again
    names = sorted(os.path.basename(f) for f in res["files"])
    stem = f"{proto.host()}_{os.getpid()}_step{res['first_step']}"
    assert names == sorted(
        [stem + ext for ext in (".gpuprof", ".pt.trace.json.gz", ".stacks.txt", ".txt")]
        + ["report.html"]
    )
    assert res["html"] == str(tmp_path / "one" / "report.html")
    loaded = gpuprof.load(str(tmp_path / "one" / (stem + ".gpuprof")))
    assert len(loaded.steps()) == 3
    assert "work" in set(loaded.ops()["name"])
    with gzip.open(tmp_path / "one" / (stem + ".pt.trace.json.gz"), "rt") as f:
        trace = json.load(f)
    meta = trace["gpuprof_on_demand"]
    assert meta["first_step"] == res["first_step"] and meta["steps"] == 3
    assert {f"ProfilerStep#{i}" for i in range(3)} <= {e.get("name") for e in trace["traceEvents"]}
    report = (tmp_path / "one" / (stem + ".txt")).read_text()
    assert f"recorded 3 steps, steps {res['first_step']}-{res['first_step'] + 2}" in report
    assert "gpuprof diagnosis" in report and res["diagnosis"] in report
    # again, in the same process
    second = od.capture(steps=2, output=tmp_path / "two")
    res2 = step_until_done(od, second)
    assert res2["ok"] and res2["n_steps"] == 2 and res2["first_step"] > res["steps"][1]
    assert od.status()["captures"] == 2 and od.status()["state"] == "idle"
    for r in (res, res2):  # gpuprof's own threads are in neither capture
        with gzip.open(next(f for f in r["files"] if f.endswith(".json.gz")), "rt") as f:
            threads = [
                e["args"]["name"]
                for e in json.load(f)["traceEvents"]
                if e.get("ph") == "M" and e.get("name") == "thread_name"
            ]
        assert len(threads) == 1 and "MainThread" in threads[0], threads


def test_capture_with_memory(runtime, tmp_path):
    od = gpuprof.arm(signal=None, poll_interval_s=0.05)
    req = od.capture(steps=2, output=tmp_path / "mem", memory=True)
    res = step_until_done(od, req)
    assert res["ok"], res
    loaded = gpuprof.load(next(f for f in res["files"] if f.endswith(".gpuprof")))
    assert loaded.profile_memory and len(loaded.memory_curve("cpu")) > 0
    assert "gpuprof memory summary" in open(res["report"]).read()


def test_capture_while_capturing_is_refused(runtime, tmp_path):
    od = gpuprof.arm(signal=None, poll_interval_s=0.05)
    od.step()
    req = od.capture(steps=5, output=tmp_path / "one")
    work()
    od.step()  # recording now
    assert od.status()["state"] == "recording"
    with pytest.raises(RuntimeError, match=r"is already capturing .*: 0 of 5 steps recorded"):
        od.capture(steps=2, output=tmp_path / "two")
    res = step_until_done(od, req)
    assert res["ok"] and res["n_steps"] == 5
    assert not (tmp_path / "two").exists()


def test_a_capture_waiting_to_start_refuses_others(runtime, tmp_path):
    od = gpuprof.arm(signal=None, poll_interval_s=0.05)
    first = od.capture(steps=2, output=tmp_path / "one")
    assert "has found none in the" in first.message and "--duration" in first.message
    with pytest.raises(
        RuntimeError,
        match=rf"pid {os.getpid()} has a capture waiting to start "
        r"\(asked for at [\d:]+ by pid \d+: the next 2 steps from its next step "
        r"boundary; it is at step 0, 0 step\(s\) since\); cancel it with "
        rf"`python -m gpuprof capture {os.getpid()} --cancel`",
    ):
        od.capture(steps=2, output=tmp_path / "two")
    res = step_until_done(od, first)
    assert res["ok"] and res["first_step"] == 1
    assert not (tmp_path / "two").exists()


def test_a_started_capture_is_stopped_only_by_an_abort_and_writes_nothing(runtime, tmp_path):
    """capture --all-ranks undoes its own request when another rank refused it (abort);
    a plain cancel leaves a started capture alone."""
    from gpuprof.record._ondemand_capture import InProcessReply

    od = gpuprof.arm(signal=None, poll_interval_s=0.05)
    od.step()
    req = od.capture(steps=5, output=tmp_path / "x")
    work()
    od.step()  # recording
    rid = od._work.rid
    plain, abort = InProcessReply(), InProcessReply()
    od._handle({"op": "cancel", "target": rid}, plain)
    assert (
        not plain.reply_doc["ok"]
        and "it has started and ends by itself" in plain.reply_doc["message"]
    )
    od._handle({"op": "cancel", "target": rid, "abort": True}, abort)
    assert abort.reply_doc["ok"] and abort.reply_doc["state"] == "aborting"
    assert od.status()["state"] == "recording"
    work()
    od.step()  # the next boundary: stopped, nothing kept
    res = req.wait(0)
    assert not res["ok"] and res["error"] == "aborted by its requester"
    assert od.status()["state"] == "idle" and sys.getprofile() is None
    assert not (tmp_path / "x").exists()


def test_duration_without_steps_is_a_time_window(runtime, tmp_path):
    od = gpuprof.arm(signal=None, poll_interval_s=0.05)
    req = od.capture(duration=0.3, output=tmp_path / "win")
    assert "a time window" in req.message
    while not req.done:
        work()  # no step boundary: the control thread starts and stops the window
    res = req.wait(0)
    assert res["ok"], res
    assert res["first_step"] is None and res["n_steps"] == 0
    assert "s time window" in res["summary"] and 0.25 < res["seconds"] < 5
    loaded = gpuprof.load(next(f for f in res["files"] if f.endswith(".gpuprof")))
    assert "work" in set(loaded.ops()["name"])
    assert sys.getprofile() is None


def test_duration_with_steps_records_whole_steps(runtime, tmp_path):
    od = gpuprof.arm(signal=None, poll_interval_s=0.05)
    od.step()
    req = od.capture(duration=0.2, output=tmp_path / "d")
    res = step_until_done(od, req)
    assert res["ok"] and res["first_step"] >= 2 and res["n_steps"] >= 1
    assert res["seconds"] >= 0.2


def test_disarm_writes_the_capture_in_progress(runtime, tmp_path):
    od = gpuprof.arm(signal=None, poll_interval_s=0.05)
    od.step()
    req = od.capture(steps=100, output=tmp_path / "cut")
    for _ in range(4):
        work()
        od.step()
    gpuprof.disarm()
    res = req.wait(0)
    assert res["ok"] and res["n_steps"] == 3
    assert res["cut_short"] == "the program ended after 3 of the 100 steps"
    assert "cut short: the program ended after 3 of the 100 steps" in open(res["report"]).read()
    assert sys.getprofile() is None


def test_another_profiler_makes_the_capture_fail_not_the_program(runtime, tmp_path):
    od = gpuprof.arm(signal=None, poll_interval_s=0.05)
    od.step()
    req = od.capture(steps=2, output=tmp_path / "x")

    def other(frame, event, arg):
        pass

    sys.setprofile(other)
    try:
        od.step()  # the program goes on
    finally:
        sys.setprofile(None)
    res = req.wait(0)
    assert not res["ok"] and "could not start recording: " in res["error"]
    assert "another profiler is active" in res["error"]
    assert od.status()["state"] == "idle"


def test_a_capture_leaves_the_programs_own_profile_alone(runtime, tmp_path):
    od = gpuprof.arm(signal=None, poll_interval_s=0.05)
    od.step()
    req = od.capture(steps=2, output=tmp_path / "x")
    with gpuprof.profile() as prof:
        work()
        od.step()  # the capture would start here: the program's profile holds the hook
        work()
        prof.step()
        work()
    res = req.wait(0)
    assert not res["ok"] and "such as the program's own gpuprof.profile" in res["error"]
    assert len(prof.steps()) == 1 and (prof.ops()["name"] == "work").sum() == 1
    assert prof.ops()[prof.ops()["name"] == "work"]["calls"][0] == 3
    assert od.status()["state"] == "idle" and not (tmp_path / "x").exists()


def stepper():
    return None


UNWRAPPED = stepper


def test_arming_again_wraps_the_step_function_once(runtime):
    mod = sys.modules[__name__]
    try:
        od = gpuprof.arm(signal=None, step_fn=f"{__name__}:stepper")
        assert mod.stepper is not UNWRAPPED and mod.stepper.__wrapped__ is UNWRAPPED
        mod.stepper()
        assert od.found == 1
        gpuprof.disarm()
        od2 = gpuprof.arm(signal=None, step_fn=f"{__name__}:stepper")
        assert mod.stepper.__wrapped__ is UNWRAPPED  # the earlier wrapper is not wrapped
        mod.stepper()
        mod.stepper()
        assert od2.found == 2 and od.found == 1
    finally:
        mod.stepper = UNWRAPPED


def test_a_forked_child_is_not_armed(runtime):
    gpuprof.arm(signal=None)
    pid = os.fork()
    if pid == 0:  # the child: not armed, and its exit leaves the parent's state file
        code = 0 if _ondemand.armed() is None else 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (runtime / f"{os.getpid()}.json").exists()


def test_the_programs_switch_interval_comes_back_after_a_capture(runtime, tmp_path):
    """gpuprof's threads lower the switch interval while they work (a CPU-bound
    stepping thread would starve them) and give the program its own value back."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.003)
    try:
        od = gpuprof.arm(signal=None, poll_interval_s=0.05)
        seen = []
        real = _ondemand.capture_.write_files

        def spy(*args):
            seen.append(sys.getswitchinterval())
            return real(*args)

        _ondemand.capture_.write_files = spy
        try:
            res = step_until_done(od, od.capture(steps=2, output=tmp_path / "c"))
        finally:
            _ondemand.capture_.write_files = real
        assert res["ok"], res
        assert seen and seen[0] < 0.001
        gpuprof.disarm()
        assert sys.getswitchinterval() == pytest.approx(0.003)
    finally:
        sys.setswitchinterval(before)


def test_threads_started_after_a_disarm_are_recorded(tmp_path, monkeypatch):
    """The on-demand thread leaves itself out of every recording; once it has ended
    (disarm), a thread that gets its pthread ident is the program's and is recorded."""
    import threading

    monkeypatch.setenv("GPUPROF_RUNTIME_DIR", str(tmp_path / "rt"))
    gpuprof.arm(signal=None)
    gpuprof.disarm()

    def work():
        sum(range(10000))

    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
            t.join()  # one after the other: each may take the ident the last one had
    assert len(prof.results.threads()) == 4  # the main thread and all three
