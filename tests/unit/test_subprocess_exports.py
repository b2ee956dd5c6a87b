"""Child processes in the exports: Chrome trace lanes (one process lane per child,
on the parent's clock) and prof.save()/gpuprof.load() (format 2 keeps the
children). See docs/subprocesses.md and docs/traces.md.

The children are real fork-pool workers; the trace writer's multi-call mode is
also driven directly with a window recorded in this process."""

import gzip
import io
import json
import multiprocessing as mp
import os
import sys
import zipfile
from dataclasses import asdict, replace

import gpuprof
import numpy as np
import pytest
from gpuprof import _gpuprof
from gpuprof.analysis.processes import ProcessData
from gpuprof.exporters import export_chrome_trace, load, save
from gpuprof.exporters.chrome import trace_meta
from gpuprof.exporters.saved import FORMAT_VERSION

# the trace and table checks of the exporter tests
from test_exporters import assert_nested_per_lane, assert_tables_equal, ns

# the workloads of the subprocess tests (module level there: the workers call them by name)
from test_subprocesses import main_side, slow

CPU = [gpuprof.ProfilerActivity.CPU]
N_ITEMS = 16
DEVICE_SORT_OFFSET = 5_000_000  # trace-format 5

# 3.12+ warns about fork() with threads; the pools' helper threads are expected
pytestmark = pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")


def _both_started(barrier):
    barrier.wait(timeout=60)


def run_pool(n=N_ITEMS):
    # Both workers are up before either takes an item: otherwise a slow start (under
    # ASan) can leave one worker all 16 items and the other nothing to record.
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(2)
    with ctx.Pool(2, initializer=_both_started, initargs=(barrier,)) as pool:
        assert pool.map(slow, range(n), chunksize=1) == [i * i for i in range(n)]


# -- helpers -------------------------------------------------------------------------------


def read_trace(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        text = f.read().decode("utf-8")
    keys = [k for k, _ in json.loads(text, object_pairs_hook=lambda kv: kv)]
    return json.loads(text), keys


def slices(trace, pid=None):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and (pid is None or e["pid"] == pid)]


def meta_events(trace, name):
    return {
        e["pid"]: e["args"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == name
    }


def is_call_of(event, func):
    return event["cat"] == "python_function" and event["name"].endswith(
        f"({func.__code__.co_firstlineno}): {func.__qualname__}"
    )


def calls(ops, name):
    return int(ops["calls"][ops["name"] == name].sum())


@pytest.fixture(scope="module")
def pool_prof():
    """The main process maps `slow` over a fork pool of two workers."""
    with gpuprof.profile(activities=CPU, subprocesses=True) as prof:
        main_side(100)
        run_pool()
    w = prof.processes()
    assert list(w["role"]).count("worker") == 2, w
    return prof


# -- the C writer: one file from several calls ---------------------------------------------


@pytest.fixture(scope="module")
def window_res():
    with gpuprof.profile(activities=CPU) as prof:
        main_side(50)
        slow(1)
    return prof.results


def write_calls(calls):
    buf = io.BytesIO()
    n = sum(_gpuprof._write_trace(buf, w, m) for w, m in calls)
    return json.loads(buf.getvalue()), n


def test_writer_parts_compose_one_file(window_res, tmp_path):
    """open + append + close on one writer: a valid trace whose last window is the
    whole-file trace of that window, with the other windows as extra lanes."""
    res = window_res
    w = res.windows[-1]
    meta = trace_meta(res, w, "t")
    main_pid, n = meta.pid, len(w["spans"])
    whole_path = tmp_path / "whole.json"
    _gpuprof._write_trace(str(whole_path), w, meta)
    whole, _ = read_trace(whole_path)

    other = replace(
        meta,
        part="open",
        pid=3_000_001,
        process_name="worker A",
        sort_index=main_pid + 1,
        id_base=n,
    )
    third = replace(
        meta,
        header="",
        part="append",
        pid=3_000_002,
        process_name="worker B",
        sort_index=main_pid + 2,
        id_base=2 * n,
    )
    trace, events = write_calls([(w, other), (w, third), (w, replace(meta, part="close"))])

    # the header and end are the whole file's; the main window's events are unchanged
    assert {k: v for k, v in trace.items() if k != "traceEvents"} == {
        k: v for k, v in whole.items() if k != "traceEvents"
    }
    mine = [e for e in trace["traceEvents"] if e["pid"] not in (3_000_001, 3_000_002)]
    assert mine == whole["traceEvents"]
    assert trace["traceEvents"][-1]["name"] == "Record Window End"
    assert events == len(trace["traceEvents"])
    # each extra window is its own process lane with the same slices, ids moved on
    for pid, name, base in ((3_000_001, "worker A", n), (3_000_002, "worker B", 2 * n)):
        assert meta_events(trace, "process_name")[pid] == {"name": name}
        assert meta_events(trace, "process_labels")[pid] == {"labels": "CPU"}
        theirs, ours = slices(trace, pid), slices(whole, main_pid)
        assert [(e["name"], e["ts"], e["dur"], e["tid"]) for e in theirs] == [
            (e["name"], e["ts"], e["dur"], e["tid"]) for e in ours
        ]
        for a, b in zip(theirs, ours, strict=True):
            for key in ("Python id", "External id", "Ev Idx"):
                if key in b["args"]:
                    assert a["args"][key] == b["args"][key] + base, key
            if b["args"].get("Python parent id") is not None:
                assert a["args"]["Python parent id"] == b["args"]["Python parent id"] + base
    sort = meta_events(trace, "process_sort_index")
    assert sort[main_pid]["sort_index"] == main_pid
    assert sort[3_000_001]["sort_index"] == main_pid + 1
    ids = [e["args"]["Python id"] for e in slices(trace) if e["cat"] == "python_function"]
    assert len(ids) == len(set(ids))
    # the window span markers are written once, by the closing window
    assert sum(e.get("pid") == "Spans" for e in trace["traceEvents"]) == 1


def test_writer_base_ns_moves_time_zero(window_res):
    res = window_res
    w = res.windows[-1]
    meta = trace_meta(res, w, "t")
    plain, _ = write_calls([(w, meta)])
    moved, _ = write_calls([(w, replace(meta, base_ns=int(w["window_start_ns"]) - 5_000))])
    main_pid = meta.pid
    a, b = slices(plain, main_pid), slices(moved, main_pid)
    assert len(a) == len(b) > 0
    assert all(ns(y["ts"]) - ns(x["ts"]) == 5_000 for x, y in zip(a, b, strict=True))
    # times before base_ns are clamped to 0
    late, _ = write_calls([(w, replace(meta, base_ns=int(w["window_end_ns"]) + 10**9))])
    assert all(e["ts"] == 0.0 for e in slices(late, main_pid))


@pytest.mark.parametrize(
    "key, value, error, message",
    [
        (
            "part",
            "middle",
            ValueError,
            r"meta\.part must be 'whole', 'open', 'append' or "
            "'close'",
        ),
        ("part", 3, ValueError, r"meta\.part"),
        ("id_base", -1, ValueError, r"meta\.id_base must be >= 0"),
        ("id_base", 2**32, ValueError, r"meta\.id_base"),
        ("base_ns", "0", TypeError, r"meta\.base_ns must be an int"),
        ("sort_index", 1.5, TypeError, r"meta\.sort_index must be an int"),
    ],
)
def test_writer_rejects_bad_part_arguments(window_res, key, value, error, message):
    w = window_res.windows[-1]
    with pytest.raises(error, match=message):
        meta = replace(trace_meta(window_res, w, "t"), **{key: value})
        _gpuprof._write_trace(io.BytesIO(), w, meta)


def test_writer_takes_a_trace_meta_not_a_dict(window_res):
    w = window_res.windows[-1]
    fields = asdict(trace_meta(window_res, w, "t"))
    with pytest.raises(TypeError, match=r"meta must be a gpuprof\.exporters.*TraceMeta, not dict"):
        _gpuprof._write_trace(io.BytesIO(), w, fields)


# -- export_chrome_trace with child processes ------------------------------------------------


def test_trace_has_a_process_lane_per_worker(pool_prof, tmp_path):
    path = tmp_path / "t.json"
    pool_prof.export_chrome_trace(path)
    trace, keys = read_trace(path)
    main_pid = os.getpid()
    workers = [int(p) for p in pool_prof.processes()["pid"][1:]]
    names = meta_events(trace, "process_name")
    assert set(names) == {main_pid, *workers}  # no GPU lanes in a CPU profile
    # metadata keys before the events, traceName last, the window end last of the events
    assert keys.index("baseTimeNanoseconds") < keys.index("traceEvents") and keys[-1] == "traceName"
    events = trace["traceEvents"]
    assert events[-1]["name"] == "Record Window End"
    end = ns(events[-1]["ts"])
    sort = meta_events(trace, "process_sort_index")
    for child in pool_prof.results.subprocesses:
        pid = child.pid
        # real OS pids: far from the device pids (< 64); sorted after the main process
        assert pid >= 64 and pid != main_pid
        assert names[pid]["name"] == f"worker {pid} ({child.name})"
        assert child.name.startswith("ForkPoolWorker-")
        assert meta_events(trace, "process_labels")[pid] == {"labels": "CPU"}
        assert main_pid < sort[pid]["sort_index"] < DEVICE_SORT_OFFSET
        # the worker's calls of `slow`, as many as its ops say; no step of its own
        mine = slices(trace, pid)
        assert sum(is_call_of(e, slow) for e in mine) == calls(pool_prof.ops(pid=pid), "slow")
        assert not any(e["name"].startswith("ProfilerStep") for e in mine)
        # its main thread is a thread lane named like the parent's
        lane_names = {
            e["tid"]: e["args"]["name"]
            for e in events
            if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid
        }
        assert lane_names[pid] == f"thread {pid} (MainThread)"
        assert {e["tid"] for e in mine} <= set(lane_names)
    assert sum(is_call_of(e, slow) for e in slices(trace)) == N_ITEMS
    assert not any(is_call_of(e, slow) for e in slices(trace, main_pid))
    # every event inside the parent's window; ids unique over the whole file
    for e in events:
        if "ts" in e:
            assert e["ts"] >= 0 and ns(e["ts"] + e.get("dur", 0.0)) <= end, e
    ids = [e["args"]["Python id"] for e in slices(trace) if e["cat"] == "python_function"]
    assert len(ids) == len(set(ids))
    assert_nested_per_lane(trace)


def test_worker_lanes_share_the_parents_clock(pool_prof, tmp_path):
    """Every `slow` call of a worker lies inside the parent's Pool.map call: the
    parent hands out the items after map starts and collects them before it returns."""
    pool_prof.export_chrome_trace(tmp_path / "t.json")
    trace, _ = read_trace(tmp_path / "t.json")
    main_pid = os.getpid()
    # "...pool.py(N): Pool.map"; 3.10 code objects carry no qualname: "...pool.py(N): map"
    (pool_map,) = [
        e
        for e in slices(trace, main_pid)
        if e["name"].endswith(": Pool.map")
        or (sys.version_info < (3, 11) and "pool.py(" in e["name"] and e["name"].endswith(": map"))
    ]
    t0, t1 = ns(pool_map["ts"]), ns(pool_map["ts"] + pool_map["dur"])
    in_workers = [e for e in slices(trace) if is_call_of(e, slow)]
    assert len(in_workers) == N_ITEMS
    for e in in_workers:
        assert t0 <= ns(e["ts"]) and ns(e["ts"] + e["dur"]) <= t1, (pool_map, e)
        assert e["dur"] >= 2000.0  # slow spins 2 ms


def test_main_process_lanes_are_unchanged_by_children(pool_prof, tmp_path):
    res = pool_prof.results
    export_chrome_trace(res, tmp_path / "with.json")
    res.subprocesses = None
    export_chrome_trace(res, tmp_path / "without.json")
    with_, _ = read_trace(tmp_path / "with.json")
    without, _ = read_trace(tmp_path / "without.json")
    main_pid = os.getpid()
    kept = [
        e for e in with_["traceEvents"] if not isinstance(e["pid"], int) or e["pid"] == main_pid
    ]
    assert kept == without["traceEvents"]
    drop = ("traceEvents", "traceName")
    assert {k: v for k, v in with_.items() if k not in drop} == {
        k: v for k, v in without.items() if k not in drop
    }


def test_gzip_trace_with_workers(pool_prof, tmp_path):
    pool_prof.export_chrome_trace(tmp_path / "t.json")
    pool_prof.export_chrome_trace(tmp_path / "t.json.gz")
    plain, _ = read_trace(tmp_path / "t.json")
    packed, _ = read_trace(tmp_path / "t.json.gz")
    assert packed["traceEvents"] == plain["traceEvents"]
    assert sorted(os.listdir(tmp_path)) == ["t.json", "t.json.gz"]  # no temporary left


def test_min_duration_thins_every_process_lane(pool_prof, tmp_path):
    """Workers' lanes lose their short calls too, and the header counts them all:
    `slow` (2 ms) stays in every worker, the calls under 1 ms go."""
    pool_prof.export_chrome_trace(tmp_path / "all.json")
    pool_prof.export_chrome_trace(tmp_path / "thin.json", min_duration_us=1000)
    full, _ = read_trace(tmp_path / "all.json")
    thin, _ = read_trace(tmp_path / "thin.json")
    py = lambda t: [e for e in slices(t) if e["cat"] == "python_function"]  # noqa: E731
    short = [e for e in py(full) if e["dur"] < 1000]
    assert {e["pid"] for e in short} > {os.getpid()}  # workers had short calls too
    assert thin["gpuprof_omitted_calls"] == len(short) == len(py(full)) - len(py(thin))
    assert all(e["dur"] >= 1000 for e in py(thin))
    assert sum(is_call_of(e, slow) for e in slices(thin)) == N_ITEMS
    assert_nested_per_lane(thin)


def test_child_windows_are_cut_to_the_parents_window(window_res, tmp_path):
    """A child's calls outside the parent's window are left out, those across its
    start are cut there; a child window wholly outside gives no lane."""
    res = window_res
    w = res.windows[-1]
    lo, hi = int(w["window_start_ns"]), int(w["window_end_ns"])
    shift = (hi - lo) // 2

    def shifted(d):
        raw = dict(w)
        sp = w["spans"].copy()
        sp["start_ns"] -= d
        sp["end_ns"] -= d
        raw["spans"] = sp
        raw["window_start_ns"], raw["window_end_ns"] = lo - d, hi - d
        return raw

    res.subprocesses = [
        ProcessData(4_000_001, os.getpid(), "ForkPoolWorker-9", "fork", "ok", [shifted(shift)]),
        ProcessData(
            4_000_002, os.getpid(), "MainProcess", "fork", "exited", [shifted(hi - lo + 1)]
        ),
    ]
    try:
        export_chrome_trace(res, tmp_path / "t.json")
    finally:
        res.subprocesses = None
    trace, _ = read_trace(tmp_path / "t.json")
    sp = w["spans"]
    expect = (sp["end_ns"] - shift >= lo) & (sp["kind"] != 4)  # no step marker
    mine = slices(trace, 4_000_001)
    assert len(mine) == int(expect.sum()) > 0
    assert all(ns(e["ts"]) >= 0 for e in mine)
    starts = sorted(int(s) - shift - lo for s in sp["start_ns"][expect])
    assert sorted(ns(e["ts"]) for e in mine) == [max(0, s) for s in starts]
    assert 4_000_002 not in meta_events(trace, "process_name")
    assert_nested_per_lane(trace)


def test_tensorboard_handler_writes_the_workers_of_each_window(tmp_path):
    out = tmp_path / "log"
    with gpuprof.profile(
        activities=CPU,
        subprocesses=True,
        schedule=gpuprof.schedule(wait=0, warmup=1, active=1, repeat=2),
        on_trace_ready=gpuprof.tensorboard_trace_handler(str(out)),
    ) as prof:
        with mp.get_context("fork").Pool(2) as pool:
            for _ in range(4):  # warmup, active, warmup, active
                pool.map(slow, range(4), chunksize=1)
                prof.step()
    files = sorted(os.listdir(out))
    assert len(files) == 2, files
    for f in files:
        trace, _ = read_trace(out / f)
        workers = {e["pid"] for e in slices(trace) if is_call_of(e, slow)}
        assert len(workers) >= 1 and os.getpid() not in workers
        assert sum(is_call_of(e, slow) for e in slices(trace)) == 4
        names = meta_events(trace, "process_name")
        assert all(names[p]["name"].startswith(f"worker {p} (") for p in workers)


# -- save / load keep the children ------------------------------------------------------------


def test_save_load_keeps_the_workers(pool_prof, tmp_path):
    path = tmp_path / "run.gpuprof"
    pool_prof.save(path)
    loaded = load(path)
    assert loaded.subprocesses
    live, back = pool_prof.processes(), loaded.processes()
    assert back.dtype == live.dtype
    for f in live.dtype.names:
        assert list(back[f]) == list(live[f]), f
    for pid in [int(p) for p in live["pid"]] + ["workers", "all", "main"]:
        assert_tables_equal(loaded.ops(pid=pid), pool_prof.ops(pid=pid))
    assert calls(loaded.ops(pid="workers"), "slow") == N_ITEMS
    assert loaded.key_averages(pid="workers").table(
        sort_by="self_cpu_time_total"
    ) == pool_prof.key_averages(pid="workers").table(sort_by="self_cpu_time_total")
    assert str(loaded.diagnose()) == str(pool_prof.diagnose())
    # the same trace, worker lanes included, from the file as from memory
    pool_prof.export_chrome_trace(tmp_path / "a.json")
    loaded.export_chrome_trace(tmp_path / "b.json")
    a, _ = read_trace(tmp_path / "a.json")
    b, _ = read_trace(tmp_path / "b.json")
    assert a["traceEvents"] == b["traceEvents"]
    # the children's arrays are plain .npy entries too
    with np.load(path, allow_pickle=False) as npz:
        child = pool_prof.results.subprocesses[0]
        assert np.array_equal(npz["p0w0/spans"], child.windows[0]["spans"])
    # a bad pid is answered as for a live profile
    with pytest.raises(ValueError, match="no such process"):
        loaded.ops(pid=1)


def test_saved_profile_without_children(tmp_path):
    with gpuprof.profile(activities=CPU) as prof:
        main_side(10)
    prof.save(tmp_path / "a.gpuprof")
    loaded = load(tmp_path / "a.gpuprof")
    assert not loaded.subprocesses and loaded.results.subprocesses is None
    with pytest.raises(RuntimeError, match="subprocesses=True"):
        loaded.ops(pid="workers")
    assert len(loaded.processes()) == 1
    # subprocesses=True without children: workers asked for, none recorded
    with gpuprof.profile(activities=CPU, subprocesses=True) as prof:
        main_side(10)
    prof.save(tmp_path / "b.gpuprof")
    loaded = load(tmp_path / "b.gpuprof")
    assert loaded.subprocesses and loaded.results.subprocesses == []
    with pytest.raises(ValueError, match="no child process"):
        loaded.ops(pid="workers")


def rewrite_meta(path, change):
    with zipfile.ZipFile(path) as zf:
        entries = {n: zf.read(n) for n in zf.namelist()}
    doc = json.loads(entries["meta.json"])
    change(doc)
    entries["meta.json"] = json.dumps(doc).encode()
    with zipfile.ZipFile(path, "w") as zf:
        for n, data in entries.items():
            zf.writestr(n, data)


def test_version_1_files_still_load(tmp_path):
    """A file as gpuprof wrote it before format 2: version 1, no ppid, no children."""
    assert FORMAT_VERSION >= 2
    with gpuprof.profile(activities=CPU) as prof:
        main_side(10)
    path = tmp_path / "old.gpuprof"
    prof.save(path)

    def to_v1(doc):
        doc["version"] = 1
        del doc["meta"]["ppid"]

    rewrite_meta(path, to_v1)
    loaded = load(path)
    assert_tables_equal(loaded.ops(), prof.ops())
    row = loaded.processes()[0]
    assert row["pid"] == os.getpid() and row["ppid"] == -1 and row["role"] == "main"
    with pytest.raises(RuntimeError, match="subprocesses=True"):
        loaded.ops(pid="workers")


def test_newer_or_damaged_child_entries_are_refused(pool_prof, tmp_path):
    path = tmp_path / "new.gpuprof"
    pool_prof.save(path)
    rewrite_meta(path, lambda doc: doc.update(version=FORMAT_VERSION + 1))
    with pytest.raises(ValueError, match="upgrade gpuprof"):
        load(path)
    path = tmp_path / "damaged.gpuprof"
    save(pool_prof.results, path)
    rewrite_meta(path, lambda doc: doc["subprocesses"].pop())
    with pytest.raises(ValueError, match="belongs to no window"):
        load(path)
