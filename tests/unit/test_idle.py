"""Waiting is not CPU (issue 32): time a thread spends blocked (a sleep, a lock, a
queue get, a poll) keeps its rows in ops() but stays out of the tables' Self CPU and
the diagnosis's hot paths unless asked for (key_averages(idle=True)), and the tables
say how much they left out; key_averages(group_by_thread=True) gives rows per thread.

Programs here are real threads doing real work and real waits; no test asserts on a
duration, only on what is waiting and what is computing."""

from __future__ import annotations

import os
import queue
import select
import socket
import threading
import time

import gpuprof
import numpy as np
import pytest
from gpuprof.analysis import diagnose as diagnose_mod


def crunch(n=40):
    total = 0
    for _ in range(n):
        total += sum(i * i for i in range(20_000))
    return total


def poller(stop):
    while not stop.is_set():
        time.sleep(0.005)


@pytest.fixture(scope="module")
def polled():
    """A busy main thread beside a poller thread that sleeps. The poller outlives the
    recording (it is stopped after the module's tests), so its name is still there to
    read."""
    stop = threading.Event()
    t = threading.Thread(target=poller, args=(stop,), name="poller")
    with gpuprof.profile() as prof:
        t.start()
        crunch()
    yield prof
    stop.set()
    t.join()


def table_rows(text):
    lines = text.split("\n")
    rules = [i for i, line in enumerate(lines) if line and set(line) == {"-"}]
    return [line for line in lines[rules[1] + 1 : rules[2]]]


def row(prof, name):
    ops = prof.ops()
    (i,) = np.flatnonzero(ops["name"] == name)
    return ops[i]


def test_ops_keep_the_waits_with_their_times_and_mark_them_idle(polled):
    sleep, work = row(polled, "time.sleep"), row(polled, "sum")
    assert sleep["idle"] and not work["idle"]
    assert sleep["calls"] >= 1 and sleep["cpu_self_ns"] > 0  # the numbers stay as recorded
    assert not row(polled, "poller")["idle"]  # a Python function never is: its child waits
    assert row(polled, "_thread.lock.acquire")["idle"]  # Thread.join, Event.wait


def test_the_table_leaves_the_sleep_out_and_says_so(polled):
    ka = polled.key_averages()
    text = ka.table(sort_by="self_cpu_time_total", row_limit=-1)
    rows = table_rows(text)
    names = [r.split("  ")[0] for r in rows]
    # the top Self CPU row is the main thread's work, and no wait is shown
    assert names[0].startswith(("crunch.<locals>.<genexpr>", "sum")), text
    assert not any(n.startswith(("time.sleep", "_thread.lock.acquire")) for n in names), text
    # the footer says what was left out and how to see it
    (line,) = [ln for ln in text.splitlines() if ln.startswith("Idle: ")]
    assert "of waiting in 2 threads" in line and "time.sleep" in line, line
    assert line.endswith("left out; key_averages(idle=True) shows it")
    # the Self CPU total is the computing: every op but the waits
    ops = polled.ops()
    assert ka.total_self_cpu_ns == int(ops["cpu_self_ns"][~ops["idle"]].sum())
    assert ka.idle_self_ns == int(ops["cpu_self_ns"][ops["idle"]].sum())


def test_idle_true_brings_the_waits_back(polled):
    ka = polled.key_averages(idle=True)
    shown = {e.key: e for e in ka}
    sleep = row(polled, "time.sleep")
    assert shown["time.sleep"].self_cpu_time_total == pytest.approx(sleep["cpu_self_ns"] / 1e3)
    assert shown["time.sleep"].is_idle and not shown["sum"].is_idle
    assert ka.total_self_cpu_ns == int(polled.ops()["cpu_self_ns"].sum())
    text = ka.table(sort_by="self_cpu_time_total")
    assert "time.sleep" in text and "shown and counted in the totals (idle=True)" in text
    with pytest.raises(TypeError, match="idle must be a bool"):
        polled.key_averages(idle="yes")


def test_a_frame_that_waits_is_not_cpu_time_either(polled):
    # the poller's own frame: its self time excludes the sleep by construction, and its
    # CPU total (default) is what it computed: the total less the waits below it
    ka = {e.key.split(" (")[0]: e for e in polled.key_averages()}
    ops = polled.ops()
    (i,) = np.flatnonzero(ops["name"] == "poller")
    waited = int(polled.results.op_idle_ns()[i])
    assert waited > 0 and waited <= int(ops["cpu_total_ns"][i])
    assert ka["poller"].cpu_time_total == pytest.approx((ops["cpu_total_ns"][i] - waited) / 1e3)
    assert ka["poller"].cpu_time_total >= ka["poller"].self_cpu_time_total
    # with idle=True the total is the wall time inside again
    every = {e.key.split(" (")[0]: e for e in polled.key_averages(idle=True)}
    assert every["poller"].cpu_time_total == pytest.approx(ops["cpu_total_ns"][i] / 1e3)


def test_hot_paths_are_the_work_not_the_waiting(polled):
    d = polled.diagnose()
    hot = [f for f in d if f.kind == "cpu_hot_path"]
    assert hot, str(d)
    assert all("time.sleep" not in f.title and "lock.acquire" not in f.title for f in hot), str(d)
    assert hot[0].evidence["hottest"] in ("sum",) or "crunch" in hot[0].evidence["hottest"]
    paths = diagnose_mod.cpu_hot_paths(polled.results)
    total = sum(p["self_ns"] for p in paths)
    ops = polled.ops()
    # every line's time is CPU time: the shares add up to all but the waits
    assert total <= int(ops["cpu_self_ns"][~ops["idle"]].sum())
    assert not any(label.startswith("time.sleep") for p in paths for label, _ in p["ops"])


def test_group_by_thread_names_each_thread(polled):
    ka = polled.key_averages(group_by_thread=True, idle=True)
    by = {(e.key.split(" (")[0], e.thread) for e in ka}
    assert ("time.sleep", "poller") in by
    assert ("sum", "MainThread") in by
    assert not any(name == "time.sleep" and t == "MainThread" for name, t in by)
    text = ka.table(sort_by="self_cpu_time_total", row_limit=-1)
    header = text.split("\n")[1]
    assert header.split()[:2] == ["Name", "Thread"]
    assert any(r.split()[0] == "time.sleep" and "poller" in r for r in table_rows(text))
    # per thread the rows add up to the ops' rows: one op's self time over its threads
    for name in ("_thread.lock.acquire", "sum", "time.sleep"):
        per = [e for e in ka if e.key == name]
        assert sum(e.self_cpu_time_total for e in per) == pytest.approx(
            row(polled, name)["cpu_self_ns"] / 1e3
        )
    # and by default the waits are left out per thread too
    default = polled.key_averages(group_by_thread=True)
    assert not any(e.is_idle for e in default)
    assert "Idle: " in default.table()


# ---- each kind of wait ---------------------------------------------------------------------


# the threads about to make their blocking call: each waiter below adds itself right
# before it (a set's add lets no other thread run in between)
_AT_THE_WAIT: set[int] = set()


def _at_the_wait() -> None:
    _AT_THE_WAIT.add(threading.get_ident())


def _until_blocked_in(t, fn):
    """Return once thread t reached fn's blocking call and sleeps in the kernel three
    looks in a row, the GIL free between looks (a thread waiting for the GIL would take
    it and move on): it is blocked in that wait, however slowly the machine started it
    (starting its feeder thread also sleeps, in Thread.start). Counted, not timed;
    fails rather than hangs."""
    stat = f"/proc/self/task/{t.native_id}/stat"
    seen = 0
    for _ in range(20_000):
        try:
            with open(stat) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return  # no /proc: the crunch below is all there is
        seen = seen + 1 if t.ident in _AT_THE_WAIT and state == "S" else 0
        if seen == 3:
            return
        time.sleep(0.001)
    pytest.fail(f"the waiter never blocked in {fn.__name__}")


def _waits_in(fn):
    """Run fn(done) on a thread that blocks until `done` is set, while the main thread
    computes: the idle ops of the blocked thread (read while it still waits, which the
    window's end closes), and the profile."""
    done = threading.Event()
    _AT_THE_WAIT.clear()  # (a thread's ident is reused once it ended)
    t = threading.Thread(target=fn, args=(done,), name="waiter")
    try:
        with gpuprof.profile() as prof:
            t.start()
            _until_blocked_in(t, fn)
            crunch(10)
        ka = prof.key_averages(group_by_thread=True, idle=True)
    finally:
        done.set()
        t.join()
    return {e.key for e in ka if e.thread == "waiter" and e.is_idle}, prof


def _event_wait(done):
    _at_the_wait()
    done.wait()


def _queue_get(done):
    q = queue.Queue()
    threading.Thread(target=lambda: (done.wait(), q.put(1)), name="feeder").start()
    _at_the_wait()
    q.get()


def _simple_queue_get(done):
    q = queue.SimpleQueue()
    threading.Thread(target=lambda: (done.wait(), q.put(1)), name="feeder").start()
    _at_the_wait()
    q.get()


def _socket_recv(done):
    a, b = socket.socketpair()
    threading.Thread(target=lambda: (done.wait(), b.send(b"x")), name="feeder").start()
    _at_the_wait()
    select.select([a], [], [])
    a.recv(1)
    a.close()
    b.close()


def _pipe_read(done):
    r, w = os.pipe()
    threading.Thread(target=lambda: (done.wait(), os.write(w, b"x")), name="feeder").start()
    _at_the_wait()
    os.read(r, 1)
    os.close(r)
    os.close(w)


@pytest.mark.parametrize(
    "waiter, expected",
    [
        (_event_wait, {"_thread.lock.acquire"}),  # threading.Event.wait
        (_queue_get, {"_thread.lock.acquire"}),  # queue.Queue.get: Condition.wait
        (_simple_queue_get, {"_queue.SimpleQueue.get"}),
        (_socket_recv, {"select.select"}),
        (_pipe_read, {"posix.read"}),
    ],
    ids=["Event.wait", "Queue.get", "SimpleQueue.get", "select", "os.read"],
)
def test_a_blocked_thread_is_idle_in_its_wait_call(waiter, expected):
    idle, prof = _waits_in(waiter)
    assert expected <= idle, idle
    # and the default table shows none of it, and counts it in the footer
    text = prof.key_averages().table(row_limit=-1)
    for name in expected:
        assert not any(r.split()[0] == name for r in table_rows(text)), text
    assert "Idle: " in text


def test_a_wait_in_flight_when_recording_begins_stays_a_wait():
    """A thread already blocked in lock.acquire when the window opens (a DataLoader's
    feeder thread, run's first step): the window's start sees its Python frames only,
    and the wait's rest is the C call's, idle, not Condition.wait's own time."""
    done = threading.Event()
    _AT_THE_WAIT.clear()
    t = threading.Thread(target=_event_wait, args=(done,), name="waiter")
    # the thread blocks in the warm-up step, and is released in the recorded one
    warm_then_one = gpuprof.schedule(wait=0, warmup=1, active=1)
    try:
        with gpuprof.profile(schedule=warm_then_one) as prof:
            t.start()
            _until_blocked_in(t, _event_wait)
            prof.step()
            began = time.perf_counter_ns()
            crunch(10)
            released = time.perf_counter_ns()
            done.set()
            t.join()
            prof.step()
    finally:
        done.set()
        t.join()
    ka = prof.key_averages(group_by_thread=True, idle=True, include_context=True)
    rows = {e.key: e for e in ka if e.thread == "waiter"}
    acquire = rows["_thread.lock.acquire"]
    # the wait, and Condition.wait's lock taken back after it
    assert acquire.is_idle and acquire.count == 2
    # it waited from the window's start (before `began`) until `released`, at least
    assert acquire.cpu_time_total * 1000 >= released - began
    wait = next(e for k, e in rows.items() if k.startswith("Condition.wait"))
    assert wait.self_cpu_time_total < acquire.cpu_time_total / 10, ka.table(row_limit=-1)


# ---- a DataLoader with workers on PyTorch's CPU ------------------------------------------


def test_dataloader_workers_waiting_do_not_top_the_cpu_table():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 32), torch.randn(512, 1))
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    # Persistent workers: both forks happen in the warm epoch, before any of the
    # loader's threads exist. A fresh loader per epoch would fork while the last
    # one's queue feeder threads exit, which can deadlock the child under gcc's ASan
    # runtime (Makefile, target asan); and a training loop keeps its loader anyway.
    loader = DataLoader(data, batch_size=16, num_workers=2, persistent_workers=True)

    def epoch(prof=None):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if prof is not None:
                prof.step()

    epoch()  # warm: imports and first calls are not what this test is about
    with gpuprof.profile() as prof:
        epoch(prof)
    ka = prof.key_averages()
    text = ka.table(sort_by="self_cpu_time_total", row_limit=10)
    top = ka[int(np.argmax(ka.rows["cpu_self_ns"]))]
    # then the top Self CPU row is real work, not a feeder thread's lock
    assert not top.is_idle, text
    # (Condition.wait's own Python lines may hold self time while its thread waits for
    # the GIL, which is not counted as waiting: docs/tables.md)
    assert not top.key.startswith(("_thread.lock", "select.", "posix.read"))
    # the footer names the waiting it left out
    (line,) = [ln for ln in text.splitlines() if ln.startswith("Idle: ")]
    assert "_thread.lock.acquire" in line or "select.poll.poll" in line, line
    # and idle=True brings those rows back, on the top of the table
    every = prof.key_averages(idle=True)
    idle_rows = [e for e in every if e.is_idle]
    assert {e.key for e in idle_rows} & {"_thread.lock.acquire", "select.poll.poll"}
    assert every.total_self_cpu_ns > ka.total_self_cpu_ns
    # the feeder threads' waits sit on their own threads
    per_thread = prof.key_averages(group_by_thread=True, idle=True)
    waiting_threads = {e.thread for e in per_thread if e.is_idle}
    assert len(waiting_threads) >= 2, waiting_threads
