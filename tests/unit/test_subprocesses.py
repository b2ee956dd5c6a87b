"""profile(subprocesses=True): child processes (fork, spawn, forkserver) are
profiled into their own files and merged per window (docs/subprocesses.md).

The workloads are real multiprocessing pools and processes; counts are exact
where the workload makes them exact (one call of ``slow`` per item)."""

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings

import gpuprof
import pytest
from gpuprof.record import _subprocess
from gpuprof.record._subprocess import _current, _parent, _pieces

CPU = [gpuprof.ProfilerActivity.CPU]
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(gpuprof.__file__)))
METHODS = ["fork", "spawn", "forkserver"]


# -- workloads (module level: spawn children import them by name) ----------------------


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def slow(x):
    spin(0.002)
    return x * x


def main_side(n):
    return sum(range(n))


def crash_after_work(n):
    for i in range(n):
        slow(i)
    os._exit(3)


def work_forever(ready):
    ready.set()
    while True:
        slow(0)


def tick():
    time.sleep(0.002)


def ticker(stop):
    while not stop.is_set():
        tick()


def parent_of_grandchild(n):
    p = mp.get_context("fork").Process(target=crash_free_work, args=(n,))
    p.start()
    p.join()


def crash_free_work(n):
    for i in range(n):
        slow(i)


# -- helpers ---------------------------------------------------------------------------


class FakeClock:
    """The parent's clock (``_parent.time``) in the tests of its waits, so that what a
    wait costs is counted in the parent's own polls and not read off the machine's
    speed. ``monotonic()`` reads it; ``sleep(dt)`` moves it dt forward when
    ``advance_on_sleep``, else leaves it to the test (``now`` set by hand), and in
    both cases only yields the CPU for a moment."""

    def __init__(self, advance_on_sleep=True):
        self.now = 0.0
        self.advance_on_sleep = advance_on_sleep

    def monotonic(self):
        return self.now

    def sleep(self, dt):
        if self.advance_on_sleep:
            self.now += dt
        time.sleep(0.0005)  # the real one: children and other threads run meanwhile


def calls(ops, name):
    return int(ops["calls"][ops["name"] == name].sum())


def workers(prof):
    p = prof.processes()
    return p[p["role"] == "worker"]


@pytest.fixture(autouse=True)
def _session_hygiene(monkeypatch):
    """3.12+ warns about fork() with threads; the pools' helper threads are expected.
    Every session must leave no context and no folder behind."""
    folders = []
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(*args, **kwargs):
        folders.append(real_mkdtemp(*args, **kwargs))
        return folders[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*fork.*")
        yield
    assert _current.ctx is None, "a session left its subprocess context behind"
    if folders:
        time.sleep(3 * _subprocess.POLL_S)  # children still alive have seen the session end
    # (tempfile is shared: multiprocessing's own folders go through it too)
    left = [f for f in folders if "gpuprof-children-" in f and os.path.exists(f)]
    assert not left, f"session folders left behind: {left} {[os.listdir(f) for f in left]}"


# -- arguments ---------------------------------------------------------------------------


def test_subprocesses_must_be_a_bool():
    with pytest.raises(TypeError, match="subprocesses must be a bool"):
        gpuprof.profile(activities=CPU, subprocesses="yes")


def test_pid_argument_is_checked():
    with gpuprof.profile(activities=CPU) as prof:
        main_side(10)
    with pytest.raises(RuntimeError, match="subprocesses=True"):
        prof.ops(pid="workers")
    with pytest.raises(ValueError, match="pid must be"):
        prof.ops(pid=1.5)
    with pytest.raises(ValueError, match="pid must be"):
        prof.ops(pid=True)
    # the main process answers by its pid too, and is the default
    assert calls(prof.ops(pid=os.getpid()), "main_side") == 1
    assert len(prof.processes()) == 1 and prof.processes()["role"][0] == "main"


# -- pools: the slow function shows up in the worker rows with exact counts -----------------


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    "pool_inside", [True, False], ids=["pool-closed-inside", "pool-alive-at-stop"]
)
def test_pool_workers_are_profiled(method, pool_inside):
    n = 24
    ctx = mp.get_context(method)
    if pool_inside:
        # Pool.__exit__ terminates the workers while the parent records: their data
        # is saved before the SIGTERM
        with gpuprof.profile(activities=CPU, subprocesses=True) as prof:
            main_side(100)
            with ctx.Pool(2) as pool:
                assert pool.map(slow, range(n), chunksize=1) == [i * i for i in range(n)]
    else:
        # the workers are alive when the profile stops: they answer the parent's
        # end-of-window request and save their data there
        prof = gpuprof.profile(activities=CPU, subprocesses=True)
        prof.start()
        try:
            pool = ctx.Pool(2)
            main_side(100)
            assert pool.map(slow, range(n), chunksize=1) == [i * i for i in range(n)]
        finally:
            prof.stop()
        pool.close()
        pool.join()

    w = workers(prof)
    assert len(w) == 2, prof.processes()
    assert set(w["start_method"]) == {method}
    assert set(w["status"]) == ({"exited"} if pool_inside else {"ok"})
    assert (w["events"] > 0).all()
    assert (w["ppid"] > 0).all()
    main = prof.processes()[0]
    assert main["role"] == "main" and main["pid"] == os.getpid()
    # every item ran once, in one of the workers
    per_worker = [calls(prof.ops(pid=int(pid)), "slow") for pid in w["pid"]]
    assert sum(per_worker) == n
    assert calls(prof.ops(pid="workers"), "slow") == n
    # the main process's own rows are what they would be without children
    assert calls(prof.ops(), "slow") == 0
    assert calls(prof.ops(), "main_side") == 1
    assert calls(prof.ops(pid="all"), "slow") == n
    assert calls(prof.ops(pid="all"), "main_side") == 1
    # the table of the workers shows the slow function's line
    table = prof.key_averages(pid="workers").table(sort_by="self_cpu_time_total", row_limit=-1)
    assert f"slow (test_subprocesses.py:{slow.__code__.co_firstlineno})" in table
    # slow spins 2 ms per call: its total is at least that, on the workers' clock
    row = prof.ops(pid="workers")
    row = row[row["name"] == "slow"]
    assert row["cpu_total_ns"].sum() >= n * 2_000_000


def test_profile_without_children_is_unchanged():
    """subprocesses=True on a program without children: same rows, same steps."""
    with gpuprof.profile(
        activities=CPU, subprocesses=True, schedule=gpuprof.schedule(wait=1, warmup=1, active=2)
    ) as prof:
        for _ in range(5):
            main_side(50)
            prof.step()
    assert calls(prof.ops(), "main_side") == 2
    assert len(prof.steps()) == 2
    assert list(prof.steps()["step"]) == [2, 3]
    assert len(prof.processes()) == 1
    with pytest.raises(ValueError, match="no child process"):
        prof.ops(pid="workers")


# -- failures in children never break the parent -------------------------------------------


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_crashed_child_is_reported_and_skipped(method):
    ctx = mp.get_context(method)
    with pytest.warns(RuntimeWarning, match="ended without saving"):
        with gpuprof.profile(activities=CPU, subprocesses=True) as prof:
            bad = ctx.Process(target=crash_after_work, args=(5,))
            good = ctx.Process(target=crash_free_work, args=(7,))
            bad.start()
            good.start()
            bad.join()
            good.join()
            main_side(10)
    assert bad.exitcode == 3 and good.exitcode == 0
    assert calls(prof.ops(), "main_side") == 1
    procs = {int(r["pid"]): r for r in workers(prof)}
    assert procs[bad.pid]["status"] == "lost"
    assert procs[bad.pid]["windows"] == 0
    assert procs[good.pid]["status"] == "exited"
    assert calls(prof.ops(pid=good.pid), "slow") == 7
    assert calls(prof.ops(pid="workers"), "slow") == 7
    with pytest.raises(ValueError, match="recorded nothing"):
        prof.ops(pid=bad.pid)


def test_killed_child_does_not_delay_or_break_the_parent(monkeypatch):
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    clock = FakeClock()
    with pytest.warns(RuntimeWarning, match="ended without saving"):
        prof = gpuprof.profile(activities=CPU, subprocesses=True)
        prof.start()
        try:
            p = ctx.Process(target=work_forever, args=(ready,))
            p.start()
            assert ready.wait(60)
            os.kill(p.pid, signal.SIGKILL)
            p.join()
            main_side(10)
        finally:
            monkeypatch.setattr(_parent, "time", clock)
            prof.stop()
    assert p.exitcode == -signal.SIGKILL
    # a dead child is seen as dead at once (its lock went with it): the parent's wait
    # for the answers did not run into the ack timeout (counted on the parent's clock)
    assert clock.now < _subprocess.ack_timeout_s() / 2
    assert calls(prof.ops(), "main_side") == 1
    assert workers(prof)["status"].tolist() == ["lost"]


def test_unresponsive_child_times_out(monkeypatch):
    """A child that cannot answer (stopped here with SIGSTOP; in real life a C call
    holding the GIL) costs the parent the answer timeout, no more."""
    monkeypatch.setenv("GPUPROF_SUBPROCESS_TIMEOUT_S", "0.3")
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    clock = FakeClock()
    with pytest.warns(RuntimeWarning, match="did not answer within 0.3s"):
        prof = gpuprof.profile(activities=CPU, subprocesses=True)
        prof.start()
        p = ctx.Process(target=work_forever, args=(ready,))
        try:
            p.start()
            assert ready.wait(60)
            os.kill(p.pid, signal.SIGSTOP)
            main_side(10)
        finally:
            monkeypatch.setattr(_parent, "time", clock)
            prof.stop()
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.join()
    # the parent's clock moved through its own polls alone: the whole timeout, once
    # (a second wait, or a wait for the saving, would be 0.3 s more)
    assert 0.3 <= clock.now < 2 * 0.3
    assert calls(prof.ops(), "main_side") == 1
    assert workers(prof)["status"].tolist() == ["timeout"]


def consume_and_ack(q, done):
    while q.get() is not None:
        slow(0)
        done.put(1)


def test_slow_saving_child_is_waited_for(monkeypatch):
    """A child that has answered is given time to finish saving (work_timeout_s).

    The parent's clock stands still until the child has answered and begun to save;
    then it is moved past the ack timeout (as if saving took millions of events'
    time) before the child may finish. The parent must still be waiting, within
    work_timeout_s, and take the piece."""
    ack_s = _subprocess.ack_timeout_s()
    clock = FakeClock(advance_on_sleep=False)
    ctx = mp.get_context("fork")
    saving, may_finish = ctx.Event(), ctx.Event()
    real_save = _pieces.save_piece

    def slow_save(*args):  # runs in the child, after its answer (ack) is written
        saving.set()
        may_finish.wait(60)
        real_save(*args)

    def drive():
        if saving.wait(60):
            clock.now = 3 * ack_s  # past the ack deadline, inside the work deadline
            may_finish.set()

    monkeypatch.setattr(_pieces, "save_piece", slow_save)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        prof = gpuprof.profile(activities=CPU, subprocesses=True)
        prof.start()
        try:
            q, done = ctx.Queue(), ctx.Queue()
            p = ctx.Process(target=consume_and_ack, args=(q, done))
            p.start()
            for _ in range(3):
                q.put(1)
            for _ in range(3):
                done.get(timeout=60)  # the child has registered and made its 3 calls
        finally:
            monkeypatch.setattr(_parent, "time", clock)
            driver = threading.Thread(target=drive)
            driver.start()
            prof.stop()
            driver.join()
        q.put(None)
        p.join()
    assert ack_s < clock.now < _subprocess.work_timeout_s()
    assert workers(prof)["status"].tolist() == ["ok"]
    assert calls(prof.ops(pid=p.pid), "slow") == 3


def test_damaged_piece_is_skipped_with_a_counted_warning():
    with pytest.warns(RuntimeWarning, match="2 child profile piece"):
        with gpuprof.profile(activities=CPU, subprocesses=True) as prof:
            folder = prof._subprocs.ctx.dir
            # a piece folder that is not one
            os.mkdir(os.path.join(folder, "999999.0.1.piece"))
            with open(os.path.join(folder, "999999.0.1.piece", "meta.json"), "w") as f:
                f.write("{not json")
            # a real piece whose largest array was cut in half
            ctx = mp.get_context("fork")
            p = ctx.Process(target=crash_free_work, args=(3,))
            p.start()
            p.join()
            names = [
                n for n in os.listdir(folder) if n.startswith(f"{p.pid}.") and n.endswith(".piece")
            ]
            assert names, os.listdir(folder)
            piece = os.path.join(folder, names[0])
            spans = os.path.join(piece, "spans.npy")
            with open(spans, "r+b") as f:
                f.truncate(os.path.getsize(spans) // 2)
            main_side(10)
    assert prof._subprocs.skipped == 2
    assert calls(prof.ops(), "main_side") == 1
    procs = {int(r["pid"]): r for r in workers(prof)}
    assert procs[p.pid]["status"] == "lost"
    assert not os.path.exists(folder)


def test_piece_round_trip_keeps_every_array(tmp_path):
    """What a child writes is what the parent reads: the same window dict."""
    with gpuprof.profile(activities=CPU) as prof:
        crash_free_work(3)
    raw = prof.results.windows[0]
    path = str(tmp_path / "1.0.1.piece")
    _subprocess.save_piece(path, raw, {"pid": 1, "how": "fork"})
    back, meta = _subprocess.load_piece(path)
    assert meta["pid"] == 1 and meta["how"] == "fork"
    assert set(back) == set(raw)
    for key, value in raw.items():
        if hasattr(value, "dtype"):
            assert back[key].dtype == value.dtype and (back[key] == value).all(), key
            assert not back[key].flags.writeable
        else:
            assert back[key] == value, key
    assert calls(gpuprof.Results([back]).ops(), "slow") == 3
    with pytest.raises(ValueError, match="meta.json"):
        _subprocess.load_piece(str(tmp_path))


# -- schedules: persistent workers record only while the parent records -----------------------


@pytest.mark.filterwarnings("ignore:.*warmup=0")
def test_persistent_worker_follows_the_schedule():
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    step_s = 0.1
    sched = gpuprof.schedule(wait=1, warmup=0, active=1, repeat=2)
    with gpuprof.profile(
        activities=CPU, subprocesses=True, schedule=sched, acc_events=True
    ) as prof:
        p = ctx.Process(target=ticker, args=(stop,))
        p.start()  # forked while the parent waits: it must not record yet
        for _ in range(5):
            time.sleep(step_s)
            prof.step()
        stop.set()
        p.join()
    windows = prof.results.windows
    assert len(windows) == 2
    child = prof.results.subprocesses
    assert [c.pid for c in child] == [p.pid]
    pieces = child[0].windows
    assert len(pieces) == 2
    # Same clock, and each bound is an order of events, not a speed: the parent asks
    # its children to start before the step that opens its window and waits for their
    # answer, so the child's window starts first; it asks them to stop after its window
    # closed, and waits for them again before it goes on to the next window.
    for parent_w, piece in zip(windows, pieces, strict=True):
        assert piece["window_start_ns"] <= parent_w["window_start_ns"]
        assert piece["window_end_ns"] >= parent_w["window_end_ns"]
    assert pieces[0]["window_end_ns"] <= windows[1]["window_start_ns"]
    assert pieces[1]["window_start_ns"] >= windows[0]["window_end_ns"]
    counts = []
    for piece in pieces:
        n = calls(gpuprof.results._results.Results([piece]).ops(), "tick")
        # a tick sleeps at least 2 ms, so the child's own window bounds the count
        fits = (piece["window_end_ns"] - piece["window_start_ns"]) / 2e6 + 1
        assert 1 <= n <= fits, (n, fits)
        counts.append(n)
    # the child ticked through all 5 steps; its rows are those of the 2 recorded windows
    assert calls(prof.ops(pid=p.pid), "tick") == sum(counts)


@pytest.mark.filterwarnings("ignore:.*warmup=0")
def test_spawned_pool_created_while_waiting_starts_recording_later():
    sched = gpuprof.schedule(wait=1, warmup=0, active=1)
    ctx = mp.get_context("spawn")
    with gpuprof.profile(activities=CPU, subprocesses=True, schedule=sched) as prof:
        with ctx.Pool(2) as pool:
            pool.map(slow, range(6), chunksize=1)  # step 0: not recorded
            prof.step()
            pool.map(slow, range(10), chunksize=1)  # step 1: recorded
            prof.step()
            pool.map(slow, range(4), chunksize=1)  # step 2: not recorded
    assert calls(prof.ops(pid="workers"), "slow") == 10


# -- other kinds of children ------------------------------------------------------------------


def test_grandchildren_are_profiled():
    ctx = mp.get_context("fork")
    with gpuprof.profile(activities=CPU, subprocesses=True) as prof:
        p = ctx.Process(target=parent_of_grandchild, args=(4,))
        p.start()
        p.join()
    w = workers(prof)
    assert len(w) == 2
    child = w[w["pid"] == p.pid][0]
    grandchild = w[w["ppid"] == p.pid][0]
    assert child["ppid"] == os.getpid()
    assert calls(prof.ops(pid=int(grandchild["pid"])), "slow") == 4
    assert calls(prof.ops(pid=p.pid), "slow") == 0


def test_plain_os_fork_child_saves_at_normal_exit(tmp_path):
    script = tmp_path / "forker.py"
    script.write_text(
        textwrap.dedent("""
        import os, sys, time
        import gpuprof

        def child_work():
            for _ in range(9):
                sum(range(1000))

        with gpuprof.profile(subprocesses=True) as prof:
            pid = os.fork()
            if pid == 0:
                child_work()
                sys.exit(0)          # normal exit: atexit saves the child's data
            os.waitpid(pid, 0)
        ops = prof.ops(pid=pid)
        print(int(ops["calls"][ops["name"] == "child_work"].sum()),
              prof.processes()["status"][1])
    """)
    )
    env = dict(os.environ, PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "exited"]


def test_subprocess_with_preexec_fn_is_not_a_child_to_wait_for():
    """subprocess.Popen(preexec_fn=...) runs the at-fork handlers, then execs another
    program: not a Python child to profile, nor a lost one to warn about."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with gpuprof.profile(activities=CPU, subprocesses=True) as prof:
            out = subprocess.run(
                [sys.executable, "-c", "print(7)"],
                preexec_fn=lambda: None,
                capture_output=True,
                text=True,
                timeout=60,
            )
            main_side(5)
    assert out.stdout.strip() == "7"
    assert len(prof.processes()) == 1


def test_children_after_stop_are_not_profiled():
    with gpuprof.profile(activities=CPU, subprocesses=True) as prof:
        folder = prof._subprocs.ctx.dir
        main_side(3)
    assert not os.path.exists(folder)
    assert _current.ctx is None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        ok = _current.child is None and sys.getprofile() is None
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"
    os.close(r)


# -- results for exporters and the diagnosis ---------------------------------------------------


def test_results_carry_child_windows_on_the_same_clock():
    ctx = mp.get_context("fork")
    with gpuprof.profile(activities=CPU, subprocesses=True) as prof:
        p = ctx.Process(target=crash_free_work, args=(3,))
        p.start()
        p.join()
    res = prof.results
    (child,) = res.subprocesses
    assert child.pid == p.pid and child.role == "worker" and child.start_method == "fork"
    start, end = res.window_bounds()
    for raw in child.windows:
        assert start <= raw["window_start_ns"] <= raw["window_end_ns"] <= end
        sp = raw["spans"]
        assert len(sp) and sp["start_ns"].min() >= start and sp["end_ns"].max() <= end
    assert calls(child.ops(), "slow") == 3


def batches(pool, n):
    """A generator: the data loader the training loop waits in."""
    yield from pool.imap(slow, range(n), chunksize=1)


def test_diagnosis_names_the_workers_hottest_function():
    ctx = mp.get_context("fork")
    with gpuprof.profile(activities=CPU, subprocesses=True) as prof:
        with ctx.Pool(1) as pool:
            for _ in batches(pool, 40):
                prof.step()
    d = prof.diagnose()
    stall = [f for f in d if f.kind == "data_stall"]
    assert stall, str(d)
    ev = stall[0].evidence
    assert ev["workers"] == 1
    # slow's self time is the loop around time.perf_counter; either is the hot spot
    assert ev["workers_hottest"].startswith(("slow (", "spin (", "time.perf_counter")), ev
    assert 0 < ev["workers_hottest_share"] <= 1
    assert "workers spent" in str(d)


def work(x):
    spin(0.01)  # well above what a forked worker spends importing (~20 ms in all, loaded)
    return x * x


def consume(q, done):
    while q.get() is not None:
        work(0)
        done.put(1)


def test_worker_hotspot_leaves_out_waiting_for_work():
    """A starved worker waits in the queue most of the time: the hot spot is still
    the work it does, and the busy share says it is starved."""
    ctx = mp.get_context("fork")
    with gpuprof.profile(activities=CPU, subprocesses=True) as prof:
        q, done = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=consume, args=(q, done))
        p.start()
        for _ in range(10):
            q.put(1)
            done.get(timeout=60)
            time.sleep(0.05)  # the worker has done its item: it waits in q.get meanwhile
        q.put(None)
        p.join()
    from gpuprof.analysis.processes import worker_hotspot

    hot = worker_hotspot(prof.results)
    assert hot["workers"] == 1
    assert hot["workers_hottest"].startswith(("work (", "spin (", "time.perf_counter")), hot
    assert calls(prof.ops(pid=p.pid), "work") == 10
    # The parent slept only while the worker had nothing to do, so the worker's busy
    # time is at most its recorded wall time less the parent's recorded sleeps: a
    # bound from the order of events and the profiler's own durations, not a speed.
    (child,) = prof.results.subprocesses
    wall = sum(int(w["window_end_ns"]) - int(w["window_start_ns"]) for w in child.windows)
    ops = prof.ops()
    slept = int(ops["cpu_total_ns"][ops["name"] == "time.sleep"].sum())
    assert slept >= 10 * 0.05e9
    assert hot["workers_busy_share"] <= 1 - slept / wall + 0.01, (hot, slept, wall)


def test_worker_hotspot_without_children_is_empty():
    with gpuprof.profile(activities=CPU) as prof:
        main_side(10)
    from gpuprof.analysis.processes import worker_hotspot

    assert worker_hotspot(prof.results) == {}


# -- torch DataLoader (skipped without torch) -----------------------------------------------


class SlowDataset:
    """A map-style dataset (DataLoader needs no Dataset subclass): 2 ms per item."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        spin(0.002)
        return i


def getitem_calls(ops):
    """Calls of SlowDataset.__getitem__ only (torch has __getitem__ methods too)."""
    m = ops["name"] == "SlowDataset.__getitem__"  # names are qualified names
    return int(ops["calls"][m].sum())


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("persistent", [False, True], ids=["workers-exit", "persistent"])
def test_dataloader_workers(method, persistent):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    n = 32
    loader = DataLoader(
        SlowDataset(n),
        batch_size=4,
        num_workers=2,
        multiprocessing_context=method,
        persistent_workers=persistent,
    )
    with gpuprof.profile(activities=CPU, subprocesses=True) as prof:
        seen = 0
        for batch in loader:
            seen += len(batch)
            prof.step()
    assert seen == n
    w = workers(prof)
    assert len(w) == 2, prof.processes()
    assert set(w["start_method"]) == {method}
    # non-persistent workers exit at the end of the epoch (multiprocessing's
    # finalizers save their data); persistent ones answer the parent at stop()
    assert set(w["status"]) == ({"ok"} if persistent else {"exited"})
    assert getitem_calls(prof.ops(pid="workers")) == n
    assert getitem_calls(prof.ops()) == 0


@pytest.mark.filterwarnings("ignore:.*warmup=0")
def test_dataloader_persistent_workers_follow_the_schedule():
    """One step per epoch, only epoch 1 recorded: the persistent workers load the
    whole of epoch 1 inside the window, and nothing of epochs 0 and 2."""
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    n = 24
    loader = DataLoader(
        SlowDataset(n),
        batch_size=4,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="fork",
    )
    sched = gpuprof.schedule(wait=1, warmup=0, active=1, repeat=1)
    with gpuprof.profile(activities=CPU, subprocesses=True, schedule=sched) as prof:
        for _epoch in range(3):
            assert sum(len(b) for b in loader) == n
            prof.step()
    assert len(prof.results.windows) == 1
    assert len(workers(prof)) == 2
    assert getitem_calls(prof.ops(pid="workers")) == n


def test_dataloader_data_stall_names_the_workers_function():
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    loader = DataLoader(
        SlowDataset(40), batch_size=1, num_workers=1, multiprocessing_context="fork"
    )
    with gpuprof.profile(activities=CPU, subprocesses=True) as prof:
        for _ in loader:
            main_side(100)
            prof.step()
    stall = [f for f in prof.diagnose() if f.kind == "data_stall"]
    assert stall, str(prof.diagnose())
    ev = stall[0].evidence
    assert ev["workers"] == 1
    assert ev["workers_hottest"].startswith(
        ("SlowDataset.__getitem__ (", "spin (", "time.perf_counter")
    ), ev
    assert "workers spent" in stall[0].title
