"""Thread names survive the thread's end: a ``with ThreadPoolExecutor()`` block and a
named thread that end before the export keep their names in ``thread_names()``, the
trace's thread_name metadata, the HTML report and a saved profile (both hook
backends: tests/unit runs again under GPUPROF_HOOK=setprofile on 3.12+)."""

import hashlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import gpuprof
import pytest
from gpuprof.record import _threads
from test_exporters import read_trace
from test_html_report import page_data

CPU = [gpuprof.ProfilerActivity.CPU]
PACKAGE = os.path.dirname(os.path.abspath(gpuprof.__file__)) + os.sep


def digest(i):
    return hashlib.sha256(str(i).encode() * 200).hexdigest()


def poll(native, done):
    native["poller"] = threading.get_native_id()
    while not done.wait(0.001):
        pass


def hash_all(native, n=40):
    """A pool of two hasher threads; their OS ids by name."""

    def work(i):
        native[threading.current_thread().name] = threading.get_native_id()
        return digest(i)

    with ThreadPoolExecutor(2, thread_name_prefix="hasher") as ex:
        return list(ex.map(work, range(n)))


def trace_lane_names(path):
    trace, _, _ = read_trace(path)
    return {
        e["tid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }


@pytest.fixture(scope="module")
def ended():
    """A profile whose poller and hasher threads ended before anything is exported."""
    native, done = {}, threading.Event()
    with gpuprof.profile(activities=CPU) as prof:
        # the poller runs until the pool is done: no two of the threads share an ident
        t = threading.Thread(target=poll, args=(native, done), name="poller")
        t.start()
        hash_all(native)
        done.set()
        t.join()
    alive = {th.name for th in threading.enumerate()}
    assert not {"poller", "hasher_0", "hasher_1"} & alive  # all gone before the export
    return prof, native


def test_thread_names_keeps_the_names_of_ended_threads(ended):
    prof, native = ended
    names = prof.results.thread_names()
    assert sorted(names.values()) == ["MainThread", "hasher_0", "hasher_1", "poller"]
    # each name is on its own thread's row
    by_os = dict(zip(prof.results.threads()["os_tid"].tolist(), names.values(), strict=True))
    assert {by_os[tid]: tid for tid in native.values()} == native


def test_the_trace_names_each_lane_after_its_ended_thread(ended, tmp_path):
    prof, native = ended
    lanes = trace_lane_names(prof.export_chrome_trace(tmp_path / "t.json"))
    for name, tid in native.items():
        assert lanes[tid] == f"thread {tid} ({name})"


def test_the_report_and_a_saved_profile_keep_them(ended, tmp_path):
    prof, native = ended
    data, _ = page_data(prof.export_html(tmp_path / "r.html"))
    assert sorted(data["flame"]["threads"]) == ["MainThread", "hasher_0", "hasher_1", "poller"]
    loaded = gpuprof.load(prof.save(tmp_path / "p.gpuprof"))
    assert loaded.results.thread_names() == prof.results.thread_names()
    lanes = trace_lane_names(loaded.export_chrome_trace(tmp_path / "l.json"))
    assert {lanes[tid] for tid in native.values()} == {
        f"thread {tid} ({name})" for name, tid in native.items()
    }


def test_nothing_of_it_is_recorded_and_threading_is_restored(ended):
    prof, _ = ended
    original = _threads._original_delete
    assert threading.Thread._delete is original  # ours only while profiling
    assert original.__module__ == "threading" and _threads._session is None
    ops = prof.ops()
    # threading's own _delete still runs (once per ended thread), and nothing of ours
    names = [str(n) for n in ops["name"]]
    assert names.count("Thread._delete") == 1
    assert int(ops["calls"][names.index("Thread._delete")]) == 3
    assert not [n for n in names if "ThreadEnd" in n]
    assert not [f for f in ops["file"].tolist() if f.startswith(PACKAGE)]


def test_every_nanosecond_of_an_ended_thread_is_some_ops_self_time(ended):
    threads = ended[0].results.threads()
    assert (threads["self_sum_ns"] == threads["busy_ns"]).all(), threads


def test_the_last_name_a_thread_had_and_threads_that_outlive_the_profile():
    go_on, stop = threading.Event(), threading.Event()

    def renames_itself():
        digest(1)
        threading.current_thread().name = "renamed"

    def outlives():
        go_on.set()
        while not stop.wait(0.001):
            digest(2)

    with gpuprof.profile(activities=CPU) as prof:
        # the long one first: an ended thread's ident may be given to the next one
        long = threading.Thread(target=outlives, name="still-running")
        long.start()
        go_on.wait()
        t = threading.Thread(target=renames_itself, name="first")
        t.start()
        t.join()
        time.sleep(0.005)
    long.name = "renamed-after-stop"
    stop.set()
    long.join()
    names = set(prof.results.thread_names().values())
    # the name when the thread ended; the name it had when profiling stopped
    assert {"renamed", "still-running"} <= names
    assert not {"first", "renamed-after-stop"} & names


def test_threads_one_after_the_other_keep_their_own_names(tmp_path):
    """The system gives an ended thread's ident to the next thread: pools started one
    after the other share one, yet each thread has its row and its name."""
    native = {}

    def work(i):
        native[threading.current_thread().name] = threading.get_native_id()
        return digest(i)

    with gpuprof.profile(activities=CPU) as prof:
        for epoch in range(4):
            with ThreadPoolExecutor(1, thread_name_prefix=f"epoch{epoch}") as ex:
                ex.submit(work, epoch).result()
    rows = prof.results.threads()
    names = dict(zip(rows["os_tid"].tolist(), prof.results.thread_row_names(), strict=True))
    assert {names[tid]: tid for tid in native.values()} == native
    lanes = trace_lane_names(prof.export_chrome_trace(tmp_path / "t.json"))
    assert {lanes[tid] for tid in native.values()} == {
        f"thread {tid} ({name})" for name, tid in native.items()
    }


def test_windows_of_a_schedule_name_the_threads_that_ended_in_them(tmp_path):
    files = []

    def export(p):
        files.append(p.export_chrome_trace(tmp_path / f"w{p.step_num}.json"))

    with gpuprof.profile(
        activities=CPU,
        schedule=gpuprof.schedule(wait=0, warmup=1, active=1, repeat=2),
        on_trace_ready=export,
    ) as prof:
        for step in range(4):
            with ThreadPoolExecutor(1, thread_name_prefix=f"pool{step}") as ex:
                ex.submit(digest, step).result()
            prof.step()
    assert len(files) == 2
    for path, step in zip(files, (1, 3), strict=True):
        names = set(trace_lane_names(path).values())
        assert any(n.endswith(f"(pool{step}_0)") for n in names), names


def test_the_stand_in_keeps_a_name_and_always_calls_the_original():
    calls, names = [], {}
    end = gpuprof._gpuprof._ThreadEnd(calls.append, names)

    class Fake:
        _native_id, _name = 7, "fake"
        _delete = end

    Fake()._delete()
    nameless = type("Nameless", (), {"_delete": end})()
    nameless._delete()  # no _native_id/_name: no name, and the original still runs
    assert names == {7: "fake"} and len(calls) == 2 and calls[1] is nameless
    with pytest.raises(TypeError, match="original must be callable"):
        gpuprof._gpuprof._ThreadEnd(None, {})
    with pytest.raises(TypeError):
        gpuprof._gpuprof._ThreadEnd(calls.append, [])
