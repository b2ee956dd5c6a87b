"""Exporters: Chrome trace schema (trace-format.md section 11), gzip, the
TensorBoard handler, collapsed stacks, save/load. GPU records are synthetic
(no GPU needed): they go through the real C aggregation."""

import collections
import gzip
import io
import json
import os
import re
import socket
import sys
import threading
import zipfile

import gpuprof
import numpy as np
import pytest
from gpuprof import _gpuprof, record_function
from gpuprof.exporters import export_chrome_trace, export_stacks, load, save
from gpuprof.exporters._trace_meta import TraceMeta
from gpuprof.exporters.stacks import collapsed_stacks
from gpuprof.results._meta import RecordingMeta
from gpuprof.results._results import Results
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

C = _gpuprof._test_constants()
US = 1000  # synthetic timestamps are in microseconds
TB_NAME = re.compile(r"^(.*?)(\.\d+)?\.pt\.trace\.json(\.gz)?$")
HOST_CATS = {"python_function", "user_annotation", "cuda_runtime", "cuda_driver", "cpu_op"}
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"}
META_KEYS = [
    "schemaVersion",
    "deviceProperties",
    "distributedInfo",
    "displayTimeUnit",
    "baseTimeNanoseconds",
]


# ---- workloads -------------------------------------------------------------------


def leaf(n):
    return sum(range(n))


def work(n):
    out = 0
    for _ in range(3):
        out += leaf(n)
        isinstance(out, int)
    return out


def cpu_profile(steps=3):
    """A real CPU profile: steps, nested record_function ranges, a second thread."""

    def helper():
        with record_function("helper range"):
            work(50)

    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            with record_function("forward"):
                work(200)
                with record_function("inner"):
                    leaf(5000)  # ~20 us: its path in the stacks outlasts the 0.5 us cut
            t = threading.Thread(target=helper, name="helper-thread")
            t.start()
            t.join()
            prof.step()
    return prof


def train_step():
    pass


def api_key(cbid):
    return _gpuprof._test_api_key(C["API_RUNTIME"], cbid)["key"]


LAUNCH, MEMCPY, MEMSET, MALLOC, DEVSYNC = 211, 41, 116, 20, 165
API_NAMES = {
    LAUNCH: "cudaLaunchKernel",
    MEMCPY: "cudaMemcpyAsync",
    MEMSET: "cudaMemsetAsync",
    MALLOC: "cudaMalloc",
    DEVSYNC: "cudaDeviceSynchronize",
}
TRAIN, LINEAR = 2, 3


def synthetic_gpu_results(real_api_names=False):
    """Three steps with launches, a copy, a set, a sync, an allocation and its
    free; one kernel on stream 0 and one with no launch on record."""
    ev = [
        (50, C["EV_STEP_BEGIN"], 0),
        (100, C["EV_CALL"], TRAIN),
        (110, C["EV_RANGE_PUSH"], LINEAR),
        (120, C["EV_API_ENTER"], 7, api_key(LAUNCH)),
        (125, C["EV_API_EXIT"], 7),
        (126, C["EV_API_ENTER"], 9, api_key(MEMCPY)),
        (127, C["EV_API_EXIT"], 9),
        (128, C["EV_API_ENTER"], 14, api_key(MEMSET)),
        (129, C["EV_API_EXIT"], 14),
        (130, C["EV_RANGE_POP"], LINEAR),
        (140, C["EV_API_ENTER"], 8, api_key(DEVSYNC)),
        (400, C["EV_API_EXIT"], 8),
        (500, C["EV_RETURN"], 0),
        (550, C["EV_STEP_END"], 0),
        (560, C["EV_STEP_BEGIN"], 1),
        (600, C["EV_CALL"], TRAIN),
        (610, C["EV_API_ENTER"], 10, api_key(LAUNCH)),
        (615, C["EV_API_EXIT"], 10),
        (620, C["EV_API_ENTER"], 11, api_key(MALLOC)),
        (630, C["EV_API_EXIT"], 11),
        (700, C["EV_RETURN"], 0),
        (750, C["EV_STEP_END"], 1),
        (760, C["EV_STEP_BEGIN"], 2),
        (770, C["EV_API_ENTER"], 12, api_key(LAUNCH)),
        (775, C["EV_API_EXIT"], 12),
        (800, C["EV_STEP_END"], 2),
    ]
    ev = [(e[0] * US,) + e[1:] for e in ev]

    def rec(kind, corr, start, end, **kw):
        d = dict(
            kind=C[kind], correlation=corr, start_ns=start * US, end_ns=end * US, stream=7, device=0
        )
        d.update(kw)
        return d

    gpu = [
        rec("GPU_KERNEL", 7, 200, 300, name_id=0, registers=32, grid_x=8, block_x=256),
        rec(
            "GPU_MEMCPY",
            9,
            310,
            340,
            bytes=4096,
            subkind=C["COPY_HTOD"],
            src_mem=C["MEM_PINNED"],
            dst_mem=C["MEM_DEVICE"],
        ),
        rec("GPU_MEMSET", 14, 345, 350, bytes=1024, dst_mem=C["MEM_DEVICE"], stream=0),
        rec("GPU_SYNC", 8, 300, 400, subkind=C["SYNC_STREAM"]),
        rec("GPU_KERNEL", 10, 650, 690, name_id=1, grid_x=4, block_x=128),
        rec("GPU_MALLOC", 11, 625, 625, bytes=1 << 20, address=0x7000, dst_mem=C["MEM_DEVICE"]),
        rec("GPU_FREE", 0, 720, 720, bytes=1 << 20, address=0x7000, dst_mem=C["MEM_DEVICE"]),
        rec("GPU_KERNEL", 12, 780, 790, name_id=0, stream=20),
        rec("GPU_KERNEL", 99, 795, 798, name_id=1, stream=20),
    ]
    ops = [(C["OP_PYTHON"], train_step.__code__, 0), (C["OP_USER"], "linear", 0)]
    raw = _gpuprof._test_aggregate(
        ops, [(1, 101, ev)], gpu, 0, 1000 * US, ["_Z6kernelv", "_Z4gemmPfS_"], 1
    )
    if real_api_names:  # libcupti names them only on a machine with the driver
        for i, (kind, op) in enumerate(zip(raw["ops"]["kind"], raw["ops"]["op"], strict=True)):
            if kind == C["OP_CUDA_API"]:
                raw["op_names"][i] = API_NAMES[int(op) & 0xFFFFF]
    return Results([raw], cuda={"active": True, "mode": "callbacks", "error": None})


# ---- reading a trace back -----------------------------------------------------------


def read_trace(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    text = data.decode("utf-8")  # strict: the file must be valid UTF-8
    pairs = json.loads(text, object_pairs_hook=lambda kv: kv)
    return json.loads(text), [k for k, _ in pairs], text


def ns(x):
    return round(x * 1000)


def slices(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def assert_nested_per_lane(trace):
    """No two slices on a lane (pid, tid) overlap partially. Returns each lane's
    (start, end) in ns, in file order."""
    lanes = collections.defaultdict(list)
    for e in slices(trace):
        lanes[(e["pid"], e["tid"])].append((ns(e["ts"]), ns(e["ts"] + e["dur"])))
    for lane, sl in lanes.items():
        stack = []
        for s, e in sorted(sl, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or e <= stack[-1], f"partial overlap on {lane} at {s}"
            stack.append(e)
    return lanes


def check_schema(trace, keys, text):
    """Every checkable rule of trace-format.md section 11 (and sections 2-7); returns the
    ac2g flows by id."""
    events = trace["traceEvents"]
    # 1. metadata keys first, in order; baseTimeNanoseconds present; traceName last
    assert keys.index("traceEvents") > max(keys.index(k) for k in META_KEYS)
    assert [k for k in keys if k in META_KEYS] == META_KEYS
    assert keys[-1] == "traceName"
    assert trace["schemaVersion"] == 1 and trace["displayTimeUnit"] == "ms"
    assert isinstance(trace["baseTimeNanoseconds"], int) and trace["baseTimeNanoseconds"] > 0
    assert isinstance(trace["deviceProperties"], list)
    # 7. distributedInfo: space after the colon, as HTA's rank lookup needs
    assert re.search(r'"distributedInfo": \{"rank": 0, "world_size": 1\}', text)
    # 2. ts/dur: numbers with exactly three decimals, non-negative
    for m in re.finditer(r'"(ts|dur)": ([^,}]*)', text):
        assert re.fullmatch(r"\d+\.\d{3}", m.group(2)), m.group(0)
    for e in events:
        if "ts" in e:
            assert isinstance(e["ts"], float) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], float) and e["dur"] >= 0
            for f in ("ts", "dur", "name", "cat", "pid", "tid"):
                assert f in e, (f, e)
    # the window end marker is last and nothing ends after it
    assert events[-1]["name"] == "Record Window End" and events[-1]["ph"] == "i"
    end = events[-1]["ts"]
    assert all(ns(e["ts"] + e.get("dur", 0.0)) <= ns(end) for e in events)
    # 3. lanes
    host_pid = None
    for e in events:
        if e["ph"] != "X":
            continue
        if e["cat"] in HOST_CATS:
            host_pid = e["pid"] if host_pid is None else host_pid
            assert e["pid"] == host_pid and isinstance(e["tid"], int) and e["tid"] > 0
            assert "stream" not in e.get("args", {})
        elif e["cat"] in GPU_CATS:
            assert isinstance(e["pid"], int) and 0 <= e["pid"] < 64
            assert isinstance(e["tid"], int) and e["tid"] > 0
            assert e["args"]["device"] == e["pid"]
            if e["cat"] != "cuda_sync":
                assert e["args"]["stream"] == e["tid"]
            else:
                assert e["args"]["cuda_sync_kind"] == e["name"]
        elif e["cat"] == "gpu_user_annotation":
            # 6.7: on a stream's lane, and no stream arg (HTA would count it as a GPU op)
            assert isinstance(e["pid"], int) and 0 <= e["pid"] < 64
            assert isinstance(e["tid"], int) and 0 < e["tid"] < 1000000
            assert list(e["args"]) == ["External id"]
        else:
            assert e["cat"] == "Trace"
    # 4. slices nest per lane; equal starts: longest first in file order
    for lane, sl in assert_nested_per_lane(trace).items():
        for (s0, e0), (s1, e1) in zip(sl, sl[1:], strict=False):
            if s0 == s1:
                assert e0 >= e1, (lane, s0)
    # 5. flows: pairs; ac2g bound exactly to an API slice and the GPU slice it produced,
    # blocked_call from a host slice of one thread to a host slice of another
    by_pos = collections.defaultdict(list)
    for e in slices(trace):
        by_pos[(e["pid"], e["tid"], e["ts"])].append(e)
    flows = collections.defaultdict(dict)
    for e in events:
        if e["ph"] in "sf":
            assert e["cat"] == e["name"] and e["cat"] in ("ac2g", "blocked_call"), e
            key = (e["cat"], e["id"])
            assert e["ph"] not in flows[key], "flow id used twice"
            flows[key][e["ph"]] = e
            bound = by_pos[(e["pid"], e["tid"], e["ts"])]
            if e["ph"] == "f":
                assert e["bp"] == "e"
            if e["cat"] == "blocked_call":
                assert e["pid"] == host_pid and bound, e
                continue
            cats = (
                {"cuda_runtime", "cuda_driver"}
                if e["ph"] == "s"
                else {"kernel", "gpu_memcpy", "gpu_memset"}
            )
            assert any(b["cat"] in cats and b["args"]["correlation"] == e["id"] for b in bound), e
    for fid, pair in flows.items():
        assert set(pair) == {"s", "f"}, f"dangling flow half {fid}"
        if fid[0] == "blocked_call":
            assert pair["s"]["tid"] != pair["f"]["tid"], pair
    # External id and python ids
    ids = [e["args"]["Python id"] for e in slices(trace) if e["cat"] == "python_function"]
    assert len(ids) == len(set(ids))
    for e in slices(trace):
        if e["cat"] in ("user_annotation", "cpu_op"):
            assert isinstance(e["args"]["External id"], int) and e["args"]["External id"] > 0
        if "External id" in e.get("args", {}):
            assert e["args"]["External id"] != 0
    # a GPU range is named like the host range whose External id it carries, and lies on a
    # lane that has GPU ops
    ranges = {
        e["args"]["External id"]: e["name"] for e in slices(trace) if e["cat"] == "user_annotation"
    }
    op_lanes = {(e["pid"], e["tid"]) for e in slices(trace) if e["cat"] in GPU_CATS}
    for e in slices(trace):
        if e["cat"] == "gpu_user_annotation":
            assert ranges[e["args"]["External id"]] == e["name"]
            assert (e["pid"], e["tid"]) in op_lanes
    return {fid: pair for (fam, fid), pair in flows.items() if fam == "ac2g"}


def check_python_parents(py):
    """Each python_function's parent is the innermost python_function around it on its
    thread (null when there is none). Returns the events by Python id."""
    by_id = {e["args"]["Python id"]: e for e in py}
    stacks = collections.defaultdict(list)
    for e in sorted(py, key=lambda e: (e["tid"], ns(e["ts"]), -ns(e["dur"]))):
        stack = stacks[e["tid"]]
        while stack and ns(stack[-1]["ts"] + stack[-1]["dur"]) <= ns(e["ts"]):
            stack.pop()
        want = stack[-1]["args"]["Python id"] if stack else None
        if (
            e["dur"] == 0
            and stack
            and ns(stack[-1]["ts"]) == ns(e["ts"]) == ns(stack[-1]["ts"] + stack[-1]["dur"])
        ):
            want = e["args"]["Python parent id"]  # zero-length twins: either order is right
        assert e["args"]["Python parent id"] == want, e
        stack.append(e)
    return by_id


# ---- CPU profile -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cpu_prof():
    return cpu_profile()


def test_cpu_trace_schema(cpu_prof, tmp_path):
    path = tmp_path / "cpu.json"
    assert cpu_prof.export_chrome_trace(path) == str(path)
    assert not os.path.exists(str(path) + ".tmp")
    trace, keys, text = read_trace(path)
    check_schema(trace, keys, text)
    assert trace["traceName"] == str(path)
    assert trace["deviceProperties"] == []
    assert trace["baseTimeNanoseconds"] == (
        cpu_prof.results.windows[-1]["window_start_ns"]
        + cpu_prof.results.windows[-1]["epoch_offset_ns"]
    )
    xs = slices(trace)
    # 6. ProfilerStep#n for every recorded step, on the thread calling step()
    step_names = sorted(e["name"] for e in xs if e["name"].startswith("ProfilerStep#"))
    assert step_names == sorted(f"ProfilerStep#{s}" for s in cpu_prof.steps()["step"])
    assert len(step_names) >= 3
    assert all(e["cat"] == "user_annotation" for e in xs if e["name"] in step_names)
    # host lanes are the OS ids; the helper thread has its own
    pid = os.getpid()
    assert all(e["pid"] == pid for e in xs if e["cat"] != "Trace")
    os_tids = set(cpu_prof.results.threads()["os_tid"].tolist())
    tids = {e["tid"] for e in xs if e["cat"] != "Trace"}
    assert tids <= os_tids and len(tids) == 4  # main + one helper per step
    names = {
        e["tid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    main_tid = threading.get_native_id()
    assert names[main_tid] == f"thread {main_tid} (MainThread)"
    assert set(names) == os_tids
    labels = {e["name"]: e for e in xs if e["cat"] == "user_annotation"}
    assert {"forward", "inner", "helper range"} <= set(labels)
    # Python names and parent links agree with containment
    py = [e for e in xs if e["cat"] == "python_function"]
    work_ev = [e for e in py if e["name"].endswith(": work")]
    # files are named relative to their import root; pytest put this test's folder on sys.path
    assert os.path.dirname(__file__) in {os.path.abspath(p or ".") for p in sys.path}
    this_file = os.path.basename(__file__)
    assert work_ev and work_ev[0]["name"] == f"{this_file}({work.__code__.co_firstlineno}): work"
    assert any(e["name"] == "<built-in function isinstance>" for e in py)
    by_id = check_python_parents(py)
    leafs = [e for e in py if e["name"].endswith(": leaf")]
    assert all(
        by_id[e["args"]["Python parent id"]]["name"].endswith(": work")
        for e in leafs
        if e["args"]["Python parent id"] in by_id
        and not by_id[e["args"]["Python parent id"]]["name"].endswith(": cpu_profile")
    )
    calls = [e for e in py if e["name"] == "<built-in function isinstance>"]
    # work()'s isinstance calls point back into this file (library code may call
    # isinstance too, e.g. threading on 3.13)
    assert any(e["args"]["CallFrom"].startswith(this_file + ":") for e in calls)
    # lane metadata
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert {
        "process_name",
        "process_labels",
        "process_sort_index",
        "thread_name",
        "thread_sort_index",
    } <= {e["name"] for e in meta}
    assert any(e["name"] == "process_labels" and e["args"]["labels"] == "CPU" for e in meta)


def test_files_are_named_relative_to_their_import_root(tmp_path):
    from gpuprof.core._paths import display_files, import_roots

    sep = os.sep
    site = f"{sep}venv{sep}lib{sep}site-packages{sep}"
    roots = [site, f"{sep}venv{sep}lib{sep}", f"{sep}work{sep}"]
    roots.sort(key=len, reverse=True)
    files = [
        f"{site}torch{sep}nn{sep}module.py",
        f"{sep}venv{sep}lib{sep}typing.py",
        f"{sep}work{sep}train.py",
        f"{sep}elsewhere{sep}x.py",
        "<string>",
        "rel.py",
        f"{sep}workshop{sep}y.py",
        None,
    ]
    assert display_files(files, roots) == [
        f"torch{sep}nn{sep}module.py",
        "typing.py",
        "train.py",
        f"{sep}elsewhere{sep}x.py",
        "<string>",
        "rel.py",
        f"{sep}workshop{sep}y.py",
        None,
    ]
    # the real roots: sys.path and site-packages, each once, longest first, never "/"
    real = import_roots()
    # (roots of one length come in any order: compare lengths, not a re-sorted set)
    assert [len(r) for r in real] == sorted((len(r) for r in real), reverse=True)
    assert len(real) == len(set(real)) and sep not in real
    assert all(r.endswith(sep) for r in real)


def test_reports_show_files_under_the_working_directory_relative_to_it(tmp_path, monkeypatch):
    from gpuprof.core._paths import source_location, source_path

    work, lib = tmp_path / "work", tmp_path / "venv" / "site-packages"
    (work / "pkg").mkdir(parents=True)
    (lib / "torch").mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "path", [str(lib)])
    mine, theirs, other = str(work / "pkg" / "train.py"), str(lib / "torch" / "nn.py"), "/x/y.py"
    assert source_path(mine) == os.path.join("pkg", "train.py")
    assert source_path(theirs) == os.path.join("torch", "nn.py")  # not ../venv/site-packages/...
    assert source_path(other) == other and source_path("<string>") == "<string>"
    assert source_location(mine, 12) == os.path.join("pkg", "train.py") + ":12"
    assert source_location(theirs, 0) == os.path.join("torch", "nn.py")  # line unknown
    assert source_location("", 5) == ""


def test_gzip_round_trip(cpu_prof, tmp_path):
    plain, gz = tmp_path / "a.json", tmp_path / "a.json.gz"
    cpu_prof.export_chrome_trace(plain)
    cpu_prof.export_chrome_trace(gz)
    with open(gz, "rb") as f:
        assert f.read(2) == b"\x1f\x8b"
    t1, _, text1 = read_trace(plain)
    t2, keys, text2 = read_trace(gz)
    check_schema(t2, keys, text2)
    assert t1["traceEvents"] == t2["traceEvents"]
    assert text1.replace(str(plain), "") == text2.replace(str(gz), "")
    assert sorted(os.listdir(tmp_path)) == ["a.json", "a.json.gz"]


def test_no_window_is_an_error(tmp_path):
    prof = gpuprof.profile()
    with pytest.raises(RuntimeError, match="no recorded window"):
        prof.export_chrome_trace(tmp_path / "x.json")
    assert os.listdir(tmp_path) == []


# ---- leaving out the shortest calls (min_duration_us) ------------------------------------


def python_slices(trace):
    return [e for e in slices(trace) if e["cat"] == "python_function"]


def test_min_duration_leaves_out_shorter_calls_and_counts_them(cpu_prof, tmp_path):
    cpu_prof.export_chrome_trace(tmp_path / "all.json")
    full, _, _ = read_trace(tmp_path / "all.json")
    assert "gpuprof_omitted_calls" not in full
    durs = sorted(e["dur"] for e in python_slices(full))
    cut = durs[len(durs) // 2]  # the median call: about half are left out
    assert 0 < cut < durs[-1]
    cpu_prof.export_chrome_trace(tmp_path / "thin.json", min_duration_us=cut)
    thin, keys, text = read_trace(tmp_path / "thin.json")
    check_schema(thin, keys, text)
    assert keys.index("gpuprof_omitted_calls") < keys.index("traceEvents")
    # exactly the calls of `cut` or more are written (no CUDA work here), each once
    lane = lambda e: (str(e["tid"]), e["ts"], e["dur"], e["name"])  # noqa: E731
    kept = [lane(e) for e in python_slices(full) if e["dur"] >= cut]
    assert sorted(lane(e) for e in python_slices(thin)) == sorted(kept)
    omitted = len(python_slices(full)) - len(kept)
    assert omitted > 0
    assert thin["gpuprof_min_duration_us"] == cut and thin["gpuprof_omitted_calls"] == omitted
    # parents point at the nearest call still in the file; ranges and steps all stay
    check_python_parents(python_slices(thin))
    others = lambda t: sorted(lane(e) for e in slices(t) if e["cat"] != "python_function")  # noqa: E731
    assert others(thin) == others(full)
    # gzip and the TensorBoard handler thin the same way
    cpu_prof.export_chrome_trace(tmp_path / "thin.json.gz", min_duration_us=cut)
    assert read_trace(tmp_path / "thin.json.gz")[0]["traceEvents"] == thin["traceEvents"]
    handler = gpuprof.tensorboard_trace_handler(tmp_path / "tb", min_duration_us=cut)
    tb, _, _ = read_trace(handler(cpu_prof))
    assert tb["gpuprof_omitted_calls"] == omitted


def test_min_duration_keeps_the_calls_that_launch_cuda_work(tmp_path):
    # step() [400 us] > inner() [30 us] > launch;  step() > leaf() [3 us], no launch;
    # leaf() [2 us] > launch directly.  With a 1 ms cut only the bare leaf() goes.
    step_, inner, leaf_ = 2, 3, 4
    ev = [
        (100, C["EV_CALL"], step_),
        (105, C["EV_CALL"], leaf_),
        (108, C["EV_RETURN"], 0),
        (110, C["EV_CALL"], inner),
        (120, C["EV_API_ENTER"], 7, api_key(LAUNCH)),
        (125, C["EV_API_EXIT"], 7),
        (140, C["EV_RETURN"], 0),
        (150, C["EV_CALL"], leaf_),
        (151, C["EV_API_ENTER"], 8, api_key(LAUNCH)),
        (151, C["EV_API_EXIT"], 8),
        (152, C["EV_RETURN"], 0),
        (500, C["EV_RETURN"], 0),
    ]
    ev = [(e[0] * US,) + e[1:] for e in ev]
    gpu = [
        dict(
            kind=C["GPU_KERNEL"],
            correlation=c,
            start_ns=a * US,
            end_ns=b * US,
            stream=7,
            device=0,
            name_id=0,
        )
        for c, a, b in ((7, 200, 300), (8, 300, 310))
    ]

    def inner_fn():
        pass

    def leaf_fn():
        pass

    ops = [
        (C["OP_PYTHON"], train_step.__code__, 0),
        (C["OP_PYTHON"], inner_fn.__code__, 0),
        (C["OP_PYTHON"], leaf_fn.__code__, 0),
    ]
    raw = _gpuprof._test_aggregate(ops, [(1, 101, ev)], gpu, 0, 1000 * US, ["_Z6kernelv"], 1)
    results = Results([raw], cuda={"active": True, "mode": "callbacks", "error": None})
    export_chrome_trace(results, tmp_path / "t.json", min_duration_us=1000)
    trace, keys, text = read_trace(tmp_path / "t.json")
    flows = check_schema(trace, keys, text)
    py = python_slices(trace)
    # (the function's own name: 3.10 code objects have no qualname)
    names = sorted((e["name"].rsplit(": ", 1)[1].rsplit(".", 1)[-1], e["dur"]) for e in py)
    assert names == [("inner_fn", 30.0), ("leaf_fn", 2.0), ("train_step", 400.0)]
    assert trace["gpuprof_omitted_calls"] == 1
    check_python_parents(py)
    assert len(flows) == 2 and all(set(f) == {"s", "f"} for f in flows.values())


@pytest.mark.parametrize(
    "bad, exc",
    [
        (-1, ValueError),
        (float("inf"), ValueError),
        (float("nan"), ValueError),
        ("5", TypeError),
        (True, TypeError),
        (None, TypeError),
    ],
)
def test_min_duration_bad_values_name_the_argument(cpu_prof, tmp_path, bad, exc):
    with pytest.raises(exc, match="export_chrome_trace\\(\\): min_duration_us"):
        cpu_prof.export_chrome_trace(tmp_path / "t.json", min_duration_us=bad)
    with pytest.raises(exc, match="tensorboard_trace_handler\\(\\): min_duration_us"):
        gpuprof.tensorboard_trace_handler(tmp_path / "tb", min_duration_us=bad)
    assert os.listdir(tmp_path) == []


# ---- a bounded trace (max_events) --------------------------------------------------------------


def step_work():
    return work(20)


@pytest.fixture(scope="module")
def long_prof():
    """200 steps of the same work: one step_work() and three leaf() calls each."""
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        for _ in range(200):
            step_work()
            prof.step()
    return prof


def named(trace, name):
    return [e for e in slices(trace) if e["name"].endswith(name)]


def step_slices(trace):
    return [e for e in slices(trace) if e["name"].startswith("ProfilerStep#")]


def test_max_events_keeps_the_first_and_last_steps_whole_and_says_what_it_left_out(
    long_prof, tmp_path
):
    long_prof.export_chrome_trace(tmp_path / "all.json")
    full, _, _ = read_trace(tmp_path / "all.json")
    assert "gpuprof_max_events" not in full
    budget = len(slices(full)) // 4
    long_prof.export_chrome_trace(tmp_path / "thin.json.gz", max_events=budget)
    thin, keys, text = read_trace(tmp_path / "thin.json.gz")
    check_schema(thin, keys, text)
    check_python_parents(python_slices(thin))
    assert len(slices(thin)) <= budget + 10  # the frames open across the cut stay too
    assert thin["gpuprof_max_events"] == budget
    assert thin["gpuprof_omitted_events"] == len(slices(full)) - len(slices(thin))
    first, last = thin["gpuprof_omitted_steps"]
    assert 0 < first < last < 199
    steps = {int(e["name"].split("#")[1]) for e in step_slices(thin)}
    kept = set(range(200)) - set(range(first, last + 1))
    assert steps == kept and 0 in kept and 199 in kept
    # each kept step is whole: its step_work() and three leaf() calls
    for step in step_slices(thin):
        inside = lambda e: step["ts"] <= e["ts"] < step["ts"] + step["dur"]  # noqa: E731, B023
        assert sum(map(inside, named(thin, "step_work"))) == 1, step["name"]
        assert sum(map(inside, named(thin, ": leaf"))) == 3, step["name"]
    lo, hi = thin["gpuprof_omitted_us"]
    assert not [e for e in slices(thin) if lo <= e["ts"] and e["ts"] + e["dur"] <= hi]
    # what the command line prints, before writing
    from gpuprof.exporters.chrome import trace_budget

    plan = trace_budget(long_prof.results, budget)
    assert plan["steps"] == (first, last) and plan["n_steps"] == last - first + 1
    assert plan["omitted_events"] == thin["gpuprof_omitted_events"]
    assert plan["total_steps"] == 200
    # a budget the window fits in changes nothing
    assert trace_budget(long_prof.results, len(slices(full)) + 50) is None
    long_prof.export_chrome_trace(tmp_path / "fits.json", max_events=len(slices(full)) + 50)
    assert read_trace(tmp_path / "fits.json")[0]["traceEvents"] == full["traceEvents"]


def test_max_events_without_steps_keeps_the_start_and_the_end(tmp_path):
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        for _ in range(100):
            step_work()
    prof.export_chrome_trace(tmp_path / "all.json")
    full, _, _ = read_trace(tmp_path / "all.json")
    prof.export_chrome_trace(tmp_path / "thin.json", max_events=100)
    thin, _, _ = read_trace(tmp_path / "thin.json")
    assert thin["gpuprof_omitted_steps"] == []
    assert len(slices(thin)) <= 110
    works = sorted(e["ts"] for e in named(full, "step_work"))
    kept = sorted(e["ts"] for e in named(thin, "step_work"))
    assert kept[0] == works[0] and kept[-1] == works[-1] and len(kept) < len(works)


def test_max_events_on_gpu_work_keeps_memory_events_and_whole_flows(tmp_path):
    res = synthetic_gpu_results()
    export_chrome_trace(res, tmp_path / "all.json")
    full, _, _ = read_trace(tmp_path / "all.json")
    export_chrome_trace(res, tmp_path / "t.json", max_events=12)
    trace, keys, text = read_trace(tmp_path / "t.json")
    flows = check_schema(trace, keys, text)
    assert all(set(f) == {"s", "f"} for f in flows.values())  # no arrow without its ends
    assert trace["gpuprof_omitted_steps"] == [1, 1]
    lo, hi = trace["gpuprof_omitted_us"]
    assert not [e for e in slices(trace) if lo <= e["ts"] and e["ts"] + e["dur"] <= hi]
    # (the GPU lanes also draw projections of the annotations, which are no records)
    assert 0 < trace["gpuprof_omitted_events"] <= len(slices(full)) - len(slices(trace))
    # the allocation and the free stay, so the memory counter still adds up
    counters = lambda t: [e for e in t["traceEvents"] if e["ph"] == "C"]  # noqa: E731
    assert counters(trace) == counters(full) and len(counters(full)) == 2


@pytest.mark.parametrize(
    "bad, exc",
    [(0, ValueError), (1, ValueError), (2.5, TypeError), ("9", TypeError), (True, TypeError)],
)
def test_max_events_bad_values_name_the_argument(long_prof, tmp_path, bad, exc):
    with pytest.raises(exc, match="export_chrome_trace\\(\\): max_events"):
        long_prof.export_chrome_trace(tmp_path / "t.json", max_events=bad)
    assert os.listdir(tmp_path) == []


# ---- synthetic GPU window --------------------------------------------------------------------


def test_gpu_trace_schema(tmp_path):
    res = synthetic_gpu_results()
    path = tmp_path / "gpu.json"
    export_chrome_trace(res, path)
    trace, keys, text = read_trace(path)
    flows = check_schema(trace, keys, text)
    xs = slices(trace)
    gpu = [e for e in xs if e["cat"] in GPU_CATS]
    host = [e for e in xs if e["cat"] in HOST_CATS]
    assert sorted(e["cat"] for e in gpu) == sorted(
        ["kernel"] * 4 + ["gpu_memcpy", "gpu_memset", "cuda_sync"]
    )
    # ac2g: exactly the launches, copies and sets that produced GPU work
    assert sorted(flows) == [7, 9, 10, 12, 14]
    for corr, pair in flows.items():
        api = [e for e in host if e["args"].get("correlation") == corr][0]
        dev = [e for e in gpu if e["args"]["correlation"] == corr][0]
        assert (pair["s"]["pid"], pair["s"]["tid"], pair["s"]["ts"]) == (
            api["pid"],
            api["tid"],
            api["ts"],
        )
        assert (pair["f"]["pid"], pair["f"]["tid"], pair["f"]["ts"]) == (
            dev["pid"],
            dev["tid"],
            dev["ts"],
        )
        assert api["tid"] == 101 and api["cat"] == "cuda_runtime"
        assert (
            api["args"]["cbid"] == {7: LAUNCH, 9: MEMCPY, 14: MEMSET, 10: LAUNCH, 12: LAUNCH}[corr]
        )
    # External id: the range a launch happened in, on the API call and its GPU work
    linear = [e for e in host if e["name"] == "linear"][0]
    lin_id = linear["args"]["External id"]
    for corr in (7, 9, 14):
        assert [e for e in host if e["args"].get("correlation") == corr][0]["args"][
            "External id"
        ] == lin_id
        assert [e for e in gpu if e["args"]["correlation"] == corr][0]["args"][
            "External id"
        ] == lin_id
    step1 = [e for e in host if e["name"] == "ProfilerStep#1"][0]
    k10 = [e for e in gpu if e["args"]["correlation"] == 10][0]
    assert k10["args"]["External id"] == step1["args"]["External id"]
    k99 = [e for e in gpu if e["args"]["correlation"] == 99][0]
    assert "External id" not in k99["args"]
    # GPU lanes: stream 0 is remapped to an unused positive id; syncs get their own row
    memset = [e for e in gpu if e["cat"] == "gpu_memset"][0]
    assert memset["tid"] not in (0, 7, 20) and memset["tid"] > 0
    assert memset["name"] == "Memset (Device)"
    sync = [e for e in gpu if e["cat"] == "cuda_sync"][0]
    assert sync["name"] == "Stream Sync" and sync["tid"] == 7 + 1000000
    assert sync["args"]["stream"] == 7
    memcpy = [e for e in gpu if e["cat"] == "gpu_memcpy"][0]
    assert memcpy["name"] == "Memcpy HtoD (Pinned -> Device)"
    assert memcpy["args"]["bytes"] == 4096
    assert memcpy["args"]["memory bandwidth (GB/s)"] == pytest.approx(4096 / 30000, abs=0.01)
    k7 = [e for e in gpu if e["args"]["correlation"] == 7][0]
    assert k7["name"] == "kernel()" and k7["ts"] == 200.0 and k7["dur"] == 100.0
    assert k7["args"]["grid"] == [8, 0, 0] and k7["args"]["block"] == [256, 0, 0]
    assert k7["args"]["registers per thread"] == 32
    # steps
    assert sorted(e["name"] for e in host if e["name"].startswith("ProfilerStep")) == [
        "ProfilerStep#0",
        "ProfilerStep#1",
        "ProfilerStep#2",
    ]
    # memory: a counter per device and [memory] instants on the launching thread
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert [(e["name"], e["pid"], e["ts"], e["args"]["allocated"]) for e in counters] == [
        ("GPU 0 memory", 0, 625.0, 1 << 20),
        ("GPU 0 memory", 0, 720.0, 0),
    ]
    mem = [e for e in trace["traceEvents"] if e.get("name") == "[memory]"]
    assert len(mem) == 1 and mem[0]["tid"] == 101 and mem[0]["s"] == "t"
    assert mem[0]["args"] == {
        "Device Type": 1,
        "Device Id": 0,
        "Addr": 0x7000,
        "Bytes": 1 << 20,
        "Total Allocated": 1 << 20,
        "Total Reserved": 1 << 20,
    }
    # device lane metadata
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert any(
        e["name"] == "process_labels" and e["pid"] == 0 and e["args"]["labels"] == "GPU 0"
        for e in meta
    )
    assert any(
        e["name"] == "process_sort_index" and e["pid"] == 0 and e["args"]["sort_index"] == 5000000
        for e in meta
    )
    lane_names = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"
    }
    assert lane_names[(0, 7)] == "stream 7" and lane_names[(0, 20)] == "stream 20"
    assert lane_names[(0, 1000007)] == "stream 7 sync"
    assert trace["traceEvents"][-1]["ts"] == 1000.0


def test_kernel_occupancy_args_with_device_properties(tmp_path):
    res = synthetic_gpu_results()
    res.meta.device_properties = [
        {
            "id": 0,
            "name": "Fake",
            "numSms": 4,
            "warpSize": 32,
            "computeMajor": 9,
            "totalGlobalMem": 1 << 30,
        }
    ]
    export_chrome_trace(res, tmp_path / "t.json")
    trace, _, _ = read_trace(tmp_path / "t.json")
    assert trace["deviceProperties"][0]["numSms"] == 4
    k7 = [e for e in slices(trace) if e["cat"] == "kernel" and e["args"]["correlation"] == 7][0]
    assert k7["args"]["blocks per SM"] == 2.0  # 8 blocks / 4 SMs
    assert k7["args"]["warps per SM"] == 16.0  # 8 blocks * 8 warps / 4 SMs


def test_unordered_and_overlapping_spans_are_nested(tmp_path):
    # A range left open by a returning function outlives it: clamped, not overlapping.
    ev = [
        (10, C["EV_CALL"], TRAIN),
        (20, C["EV_RANGE_PUSH"], LINEAR),
        (30, C["EV_RETURN"], 0),
        (40, C["EV_CALL"], TRAIN),
        (50, C["EV_RETURN"], 0),
        (60, C["EV_RANGE_POP"], LINEAR),
    ]
    ops = [(C["OP_PYTHON"], train_step.__code__, 0), (C["OP_USER"], "linear", 0)]
    raw = _gpuprof._test_aggregate(ops, [(1, 101, ev)], [], 0, 100, [], 1)
    export_chrome_trace(Results([raw]), tmp_path / "t.json")
    trace, keys, text = read_trace(tmp_path / "t.json")
    check_schema(trace, keys, text)


# ---- GPU ranges (gpu_user_annotation, trace-format 6.7) -----------------------------------

FORWARD, ATTN, MLP, IDLE = 2, 3, 4, 5
RANGE_OPS = [
    (C["OP_USER"], "forward", 0),
    (C["OP_USER"], "attn", 0),
    (C["OP_USER"], "mlp", 0),
    (C["OP_USER"], "idle", 0),
]


def nested_ranges_results():
    """Two steps. Step 0: forward > (attn, mlp, idle) launching on streams 7 and 20, then a
    launch in the step outside any range; step 1: forward with one kernel that starts where
    step 0's last one ends. `idle` only synchronizes. Times in ns."""
    ev, gpu = [], []

    def launch(t, corr, stream, start, end, kind="GPU_KERNEL", cbid=LAUNCH, **kw):
        ev.append((t, C["EV_API_ENTER"], corr, api_key(cbid)))
        ev.append((t + 2, C["EV_API_EXIT"], corr))
        gpu.append(
            dict(
                kind=C[kind],
                correlation=corr,
                start_ns=start,
                end_ns=end,
                stream=stream,
                device=0,
                **kw,
            )
        )

    ev.append((1000, C["EV_STEP_BEGIN"], 0))
    ev.append((1100, C["EV_RANGE_PUSH"], FORWARD))
    launch(1110, 1, 7, 2000, 2200, name_id=0)
    ev.append((1120, C["EV_RANGE_PUSH"], ATTN))
    launch(1125, 2, 7, 2200, 2400, name_id=1)  # starts where kernel 1 ends
    launch(1130, 3, 20, 2300, 2600, name_id=0)
    launch(
        1135,
        4,
        20,
        2650,
        2700,
        kind="GPU_MEMCPY",
        cbid=MEMCPY,
        bytes=64,
        subkind=C["COPY_HTOD"],
        src_mem=C["MEM_PINNED"],
        dst_mem=C["MEM_DEVICE"],
    )
    ev.append((1140, C["EV_RANGE_POP"], ATTN))
    ev.append((1145, C["EV_RANGE_PUSH"], MLP))
    launch(1150, 5, 7, 3000, 3100, name_id=1)
    ev.append((1160, C["EV_RANGE_POP"], MLP))
    ev.append((1165, C["EV_RANGE_PUSH"], IDLE))
    launch(1166, 6, 7, 3100, 3150, kind="GPU_SYNC", cbid=DEVSYNC, subkind=C["SYNC_STREAM"])
    ev.append((1170, C["EV_RANGE_POP"], IDLE))
    ev.append((1180, C["EV_RANGE_POP"], FORWARD))
    launch(1185, 7, 7, 3200, 3300, name_id=0)  # in the step, in no range
    ev.append((1300, C["EV_STEP_END"], 0))
    ev.append((1400, C["EV_STEP_BEGIN"], 1))
    ev.append((1500, C["EV_RANGE_PUSH"], FORWARD))
    launch(1510, 8, 7, 3300, 3400, name_id=1)  # starts where kernel 7 ends
    ev.append((1520, C["EV_RANGE_POP"], FORWARD))
    ev.append((1600, C["EV_STEP_END"], 1))
    raw = _gpuprof._test_aggregate(
        RANGE_OPS, [(1, 101, ev)], gpu, 0, 10_000, ["_Z6kernelv", "_Z4gemmPfS_"], 1
    )
    return Results([raw], cuda={"active": True, "mode": "callbacks", "error": None})


def gpu_ranges(trace):
    return [e for e in slices(trace) if e["cat"] == "gpu_user_annotation"]


def test_gpu_user_annotations_project_nested_ranges(tmp_path):
    export_chrome_trace(nested_ranges_results(), tmp_path / "t.json")
    trace, keys, text = read_trace(tmp_path / "t.json")
    check_schema(trace, keys, text)
    host = {}
    for e in slices(trace):
        if e["cat"] == "user_annotation":
            host.setdefault(e["name"], []).append(e["args"]["External id"])
    ext = {
        "step0": host["ProfilerStep#0"][0],
        "step1": host["ProfilerStep#1"][0],
        "fwd0": host["forward"][0],
        "fwd1": host["forward"][1],
        "attn": host["attn"][0],
        "mlp": host["mlp"][0],
    }
    assert len(set(ext.values())) == 6
    got = {
        (
            e["name"],
            e["args"]["External id"],
            e["pid"],
            e["tid"],
            ns(e["ts"]),
            ns(e["ts"] + e["dur"]),
        )
        for e in gpu_ranges(trace)
    }
    assert got == {
        # stream 7: 1 ns around the ops, except where a neighbour starts or ends right there
        ("forward", ext["fwd0"], 0, 7, 1999, 3101),  # kernels 1, 2 and 5
        ("attn", ext["attn"], 0, 7, 2200, 2401),  # kernel 1 ends at 2200
        ("mlp", ext["mlp"], 0, 7, 2999, 3101),
        ("forward", ext["fwd1"], 0, 7, 3300, 3401),  # kernel 7 ends at 3300
        # stream 20: the kernel and the copy of attn, in forward
        ("forward", ext["fwd0"], 0, 20, 2299, 2701),
        ("attn", ext["attn"], 0, 20, 2299, 2701),
    }
    # steps stay on the host, as torch.profiler draws them: a reader that takes every
    # ProfilerStep#N slice for a step (the TensorBoard plugin) sees each step once
    assert not any(e["name"].startswith("ProfilerStep#") for e in gpu_ranges(trace))
    # a kernel launched in a step outside any range carries the step's External id, as
    # its launch does
    k7 = [e for e in slices(trace) if e["cat"] == "kernel" and e["args"]["correlation"] == 7]
    assert k7[0]["args"]["External id"] == ext["step0"]
    # no stream arg, and nothing for the range that launched nothing (its sync has a lane
    # of its own and is no GPU op)
    assert all(list(e["args"]) == ["External id"] for e in gpu_ranges(trace))
    assert "idle" in host and not any(e["name"] == "idle" for e in gpu_ranges(trace))
    # the ops keep their bounds; outer ranges come first and contain the inner ones
    ops = {
        e["args"]["correlation"]: (ns(e["ts"]), ns(e["ts"] + e["dur"]))
        for e in slices(trace)
        if e["cat"] in ("kernel", "gpu_memcpy")
    }
    assert ops == {
        1: (2000, 2200),
        2: (2200, 2400),
        3: (2300, 2600),
        4: (2650, 2700),
        5: (3000, 3100),
        7: (3200, 3300),
        8: (3300, 3400),
    }
    lane7 = [e["name"] for e in slices(trace) if (e["pid"], e["tid"]) == (0, 7)]
    assert lane7[:3] == ["forward", "kernel()", "attn"]
    assert lane7[-2:] == ["forward", "gemm(float*, float*)"]


def test_gpu_user_annotations_keep_external_ids_unique_with_id_base(tmp_path):
    res = nested_ranges_results()
    meta = TraceMeta(
        trace_name="t",
        pid=1,
        process_name="p",
        names=list(res.windows[-1]["op_names"]),
        kernel_names=["kernel()", "gemm()"],
        thread_names=["main"],
        id_base=1000,
    )
    path = tmp_path / "t.json"
    _gpuprof._write_trace(str(path), res.windows[-1], meta)
    with open(path) as f:
        ev = json.load(f)["traceEvents"]
    host = {e["args"]["External id"]: e["name"] for e in ev if e.get("cat") == "user_annotation"}
    gpu = [e for e in ev if e.get("cat") == "gpu_user_annotation"]
    assert len(gpu) == 6 and min(host) > 1000
    assert all(host[e["args"]["External id"]] == e["name"] for e in gpu)


def random_launches(draw, n_threads):
    """Per thread, a random tree of ranges with launches at its leaves. The threads run at
    the same time; each stream runs its ops in launch order, with gaps and lengths of 0-2 ns
    among them so that the padding of neighbours collides."""
    ev_by_thread, launches, corr = [], [], [0]

    def body(ev, t, depth):
        for _ in range(draw(st.integers(0, 3))):
            if depth < 4 and draw(st.booleans()):
                label = draw(st.integers(2, 5))
                ev.append((t + 10 * len(ev), C["EV_RANGE_PUSH"], label))
                body(ev, t, depth + 1)
                ev.append((t + 10 * len(ev), C["EV_RANGE_POP"], label))
            else:
                corr[0] += 1
                launches.append(
                    (
                        t + 10 * len(ev),
                        corr[0],
                        draw(st.sampled_from([7, 20])),
                        draw(st.sampled_from([0, 1, 2, 50])),
                        draw(st.sampled_from([0, 1, 2, 100])),
                    )
                )
                ev.append((t + 10 * len(ev), C["EV_API_ENTER"], corr[0], api_key(LAUNCH)))
                ev.append((t + 10 * len(ev), C["EV_API_EXIT"], corr[0]))

    for th in range(n_threads):
        ev = [(1000, C["EV_STEP_BEGIN"], 0)] if th == 0 else []
        body(ev, 1005 + th * 10 * draw(st.integers(0, 8)), 0)  # the threads interleave
        if th == 0:
            ev.append((1000 + 10 * len(ev) + 10_000, C["EV_STEP_END"], 0))
        ev_by_thread.append(ev)
    gpu, cursor = [], {7: 100_000, 20: 100_000}
    for _, c, stream, gap, dur in sorted(launches):
        start = cursor[stream] + gap
        cursor[stream] = start + dur
        gpu.append(
            dict(
                kind=C["GPU_KERNEL"],
                correlation=c,
                start_ns=start,
                end_ns=start + dur,
                stream=stream,
                device=0,
                name_id=0,
            )
        )
    return ev_by_thread, gpu


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data(), n_threads=st.sampled_from([1, 2]))
def test_gpu_user_annotations_nest_on_every_lane(tmp_path, data, n_threads):
    ev_by_thread, gpu = random_launches(data.draw, n_threads)
    raw = _gpuprof._test_aggregate(
        RANGE_OPS,
        [(th + 1, 101 + th, ev) for th, ev in enumerate(ev_by_thread)],
        gpu,
        0,
        1_000_000,
        ["_Z6kernelv"],
        1,
    )
    path = tmp_path / "t.json"
    export_chrome_trace(
        Results([raw], cuda={"active": True, "mode": "callbacks", "error": None}), path
    )
    trace, keys, text = read_trace(path)
    check_schema(trace, keys, text)  # nesting on every lane included
    xs = slices(trace)
    kernels = {e["args"]["correlation"]: e for e in xs if e["cat"] == "kernel"}
    # the ops keep their bounds
    for g in gpu:
        k = kernels[g["correlation"]]
        assert (ns(k["ts"]), ns(k["ts"] + k["dur"])) == (g["start_ns"], g["end_ns"])
    # each (range, lane) with ops launched inside the range gets one slice, from 1 ns before
    # the first op to 1 ns after the last, less where a neighbour needs the room
    # (steps stay on the host: only record_function ranges are projected)
    host = {
        e["args"]["External id"]: e
        for e in xs
        if e["cat"] == "user_annotation" and not e["name"].startswith("ProfilerStep#")
    }
    runtime = {e["args"]["correlation"]: e for e in xs if e["cat"] == "cuda_runtime"}
    want = collections.defaultdict(list)
    for corr, k in kernels.items():
        api = runtime[corr]
        for ext, r in host.items():  # every range around the launch, on its thread
            if (
                r["tid"] == api["tid"]
                and ns(r["ts"]) <= ns(api["ts"])
                and ns(api["ts"] + api["dur"]) <= ns(r["ts"] + r["dur"])
            ):
                want[(ext, k["tid"])].append((ns(k["ts"]), ns(k["ts"] + k["dur"])))
    got = collections.defaultdict(list)
    for e in gpu_ranges(trace):
        got[(e["args"]["External id"], e["tid"])].append((ns(e["ts"]), ns(e["ts"] + e["dur"])))
    assert set(got) == set(want)
    for key, spans in got.items():
        assert len(spans) == 1
        (s, e), first, last = spans[0], min(a for a, _ in want[key]), max(b for _, b in want[key])
        assert first - 1 <= s <= first
        if n_threads == 1:  # one thread's ranges nest on every stream: nothing is cut
            assert last <= e <= last + 1


# ---- escaping (property) -------------------------------------------------------------------

# any code point, lone surrogates and JSON's special characters included
any_text = st.text(
    st.one_of(
        st.characters(),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
        st.sampled_from('"\\/\x00\x01\x1f\n\t\x7f\u2028\ufeff'),
    ),
    max_size=24,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(label=any_text, qualname=any_text, filename=any_text)
def test_arbitrary_names_stay_valid_json(tmp_path, label, qualname, filename):
    def victim():
        return 1

    names = {"co_name": qualname or "q", "co_filename": filename or "f"}
    if sys.version_info >= (3, 11):
        names["co_qualname"] = qualname or "q"
    victim.__code__ = victim.__code__.replace(**names)
    with gpuprof.profile() as prof:
        with record_function(label):
            victim()
    path = tmp_path / "u.json.gz"
    prof.export_chrome_trace(path)
    trace, keys, text = read_trace(path)
    check_schema(trace, keys, text)

    def clean(s):
        return s.encode("utf-8", "surrogatepass").decode("utf-8", "replace")

    names = {e["name"] for e in slices(trace)}
    assert clean(label) in names
    want = f"{filename or 'f'}({victim.__code__.co_firstlineno}): {qualname or 'q'}"
    assert clean(want) in names
    assert not re.search(r"[\x00-\x1f]", text.replace("\n", ""))


# ---- bad input ----------------------------------------------------------------------------------


def test_bad_paths_name_the_path(cpu_prof, tmp_path):
    with pytest.raises(IsADirectoryError, match=re.escape(repr(str(tmp_path)))):
        cpu_prof.export_chrome_trace(tmp_path)
    missing = tmp_path / "no" / "such" / "t.json"
    with pytest.raises(FileNotFoundError, match=re.escape(repr(str(missing)))):
        cpu_prof.export_chrome_trace(missing)
    afile = tmp_path / "file"
    afile.write_text("x")
    under_file = afile / "t.json"
    with pytest.raises(NotADirectoryError, match=re.escape(repr(str(under_file)))):
        cpu_prof.export_chrome_trace(under_file)
    for fn in (cpu_prof.export_stacks, cpu_prof.save):
        with pytest.raises(OSError, match="no"):
            fn(missing)
        with pytest.raises(IsADirectoryError):
            fn(tmp_path)
    with pytest.raises(TypeError, match="path"):
        cpu_prof.export_chrome_trace(3)
    assert sorted(os.listdir(tmp_path)) == ["file"]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root can write anywhere")
def test_read_only_folder(cpu_prof, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(PermissionError, match="ro"):
            cpu_prof.export_chrome_trace(ro / "t.json")
    finally:
        ro.chmod(0o700)


def test_write_errors_from_c_name_the_path(cpu_prof, tmp_path):
    # The folder disappears between the check and the write.
    res = cpu_prof.results
    window = res.windows[-1]
    from gpuprof.exporters.chrome import trace_meta

    with pytest.raises(FileNotFoundError) as info:
        _gpuprof._write_trace(
            str(tmp_path / "gone" / "t.json"), window, trace_meta(res, window, "t")
        )
    assert "gone" in str(info.value)


def test_bad_metric(cpu_prof, tmp_path):
    with pytest.raises(ValueError, match=r"metric.*self_cpu_time_total.*self_cuda_time_total"):
        cpu_prof.export_stacks(tmp_path / "s.txt", metric="cpu_time_total")
    assert os.listdir(tmp_path) == []


def test_writer_exceptions_propagate(cpu_prof):
    class Broken:
        def write(self, b):
            raise OSError(28, "No space left on device")

    res = cpu_prof.results
    from gpuprof.exporters.chrome import trace_meta

    with pytest.raises(OSError, match="No space"):
        _gpuprof._write_trace(Broken(), res.windows[-1], trace_meta(res, res.windows[-1], "t"))


# ---- TensorBoard handler ----------------------------------------------------------------------


@pytest.mark.parametrize("use_gzip", [False, True])
def test_tensorboard_handler(tmp_path, use_gzip):
    logdir = tmp_path / "log" / "run1"
    handler = gpuprof.tensorboard_trace_handler(logdir, use_gzip=use_gzip)
    with gpuprof.profile(
        schedule=gpuprof.schedule(wait=0, warmup=1, active=2, repeat=2), on_trace_ready=handler
    ) as prof:
        for _ in range(8):
            work(20)
            prof.step()
    files = sorted(os.listdir(logdir))
    assert len(files) == 2
    for name in files:
        m = TB_NAME.match(name)
        assert m, name
        assert m.group(1) == f"{socket.gethostname()}_{os.getpid()}"
        assert m.group(2) and (m.group(3) == ".gz") == use_gzip
        trace, keys, text = read_trace(logdir / name)
        check_schema(trace, keys, text)
        assert any(e["name"].startswith("ProfilerStep#") for e in slices(trace))


def test_tensorboard_plugin_reads_the_handler_output(tmp_path):
    """The TensorBoard profiler plugin (torch-tb-profiler) lists the handler's file as a
    worker and builds its views from it: three steps, each with its own GPU time."""
    data = pytest.importorskip(
        "torch_tb_profiler.profiler.data",
        reason="the TensorBoard profiler plugin is not installed (pip install torch-tb-profiler)",
    )
    from torch_tb_profiler import consts
    from torch_tb_profiler.profiler.event_parser import ProfileRole
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    res = synthetic_gpu_results(real_api_names=True)
    prof = type("P", (), {"export_chrome_trace": lambda self, p: export_chrome_trace(res, p)})()
    path = gpuprof.tensorboard_trace_handler(tmp_path, worker_name="node_7")(prof)
    match = consts.WORKER_PATTERN.match(os.path.basename(path))
    assert match and match.group(1) == "node_7"
    run = data.RunProfileData.parse("node_7", match.group(2), path, str(tmp_path))
    # one step per ProfilerStep#N (none counted twice from the GPU rows), with the host
    # step's length and the GPU work that ran inside it (synthetic_gpu_results' times)
    assert run.steps_names == ["0", "1", "2"]
    cost = lambda role: [c.costs[role] for c in run.steps_costs]  # noqa: E731
    assert cost(ProfileRole.Total) == [500.0, 190.0, 40.0]
    assert cost(ProfileRole.Kernel) == [100.0, 40.0, 13.0]
    assert cost(ProfileRole.Memcpy) == [30.0, 0, 0] and cost(ProfileRole.Memset) == [5.0, 0, 0]
    stats = run.kernel_stat
    assert dict(zip(stats.index, stats["count"], strict=True)) == {
        "kernel()": 2,
        "gemm(float*, float*)": 2,
    }
    assert run.used_devices == [0]
    views = {
        v.display_name
        for v in RunGenerator("node_7", match.group(2), run).generate_run_profile().views
    }
    assert {"Overview", "Kernel", "Trace"} <= views


def test_tensorboard_handler_worker_name_and_arguments(tmp_path):
    handler = gpuprof.tensorboard_trace_handler(str(tmp_path), worker_name="rank3")
    path = handler(_FakeProf(synthetic_gpu_results()))
    assert TB_NAME.match(os.path.basename(path)).group(1) == "rank3"
    with pytest.raises(TypeError, match="dir_name"):
        gpuprof.tensorboard_trace_handler(None)
    with pytest.raises(TypeError, match="use_gzip"):
        gpuprof.tensorboard_trace_handler(tmp_path, use_gzip="yes")
    with pytest.raises(ValueError, match="worker_name"):
        gpuprof.tensorboard_trace_handler(tmp_path, worker_name="a/b")


class _FakeProf:
    def __init__(self, results):
        self.results = results

    def export_chrome_trace(self, path):
        return export_chrome_trace(self.results, path)


# ---- stacks ------------------------------------------------------------------------------------


def parse_stacks(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            assert line.endswith("\n")
            stack, _, value = line[:-1].rpartition(" ")
            assert stack and value.isdigit() and int(value) > 0, line
            frames = stack.split(";")
            assert all(frames) and not any(c in stack for c in " \t"), line
            out.append((frames, int(value)))
    return out


def test_stacks_cpu(cpu_prof, tmp_path):
    path = tmp_path / "stacks.txt"
    cpu_prof.export_stacks(path)
    lines = parse_stacks(path)
    tree = cpu_prof.call_tree()
    total_us = tree["self_ns"].sum() / 1000
    assert abs(sum(v for _, v in lines) - total_us) <= 0.5 * len(tree) + 1e-9
    # root first: leaf() is called by work() or inside the "inner" range
    # (leaf's own self time can round to 0 us: look at every path through leaf, which
    # includes the lines of the C call sum() it makes)
    leafs = [f[: f.index(x) + 1] for f, _ in lines for x in f if x.endswith(":_leaf")]
    assert leafs and all(f[-2].endswith(":_work") or f[-2] == "inner" for f in leafs)
    assert any(f[-2] == "inner" and f[-3] == "forward" for f in leafs)
    assert len({tuple(f) for f, _ in lines}) == len(lines)  # one line per path


def test_stacks_cuda(tmp_path):
    res = synthetic_gpu_results()
    path = tmp_path / "cuda.txt"
    export_stacks(res, path, metric="self_cuda_time_total")
    lines = parse_stacks(path)
    tree = res.call_tree()
    assert sum(v for _, v in lines) == pytest.approx(
        tree["cuda_self_ns"].sum() / 1000, abs=0.5 * len(tree)
    )
    by_leaf = {f[-1]: v for f, v in lines}
    assert by_leaf["linear"] == 100 + 30 + 5  # kernel, copy, set launched in the range
    assert [f for f, _ in lines if f[-1] == "linear"][0][0] == "ProfilerStep*"
    assert collapsed_stacks(res, "self_device_time_total") == collapsed_stacks(
        res, "self_cuda_time_total"
    )


# ---- save / load --------------------------------------------------------------------------------


def assert_tables_equal(a, b):
    assert a.dtype == b.dtype and len(a) == len(b)
    for f in a.dtype.names:
        if a.dtype[f].kind == "O":
            assert list(a[f]) == list(b[f]), f
        else:  # NaN marks "unknown" (e.g. occupancy without device properties)
            assert np.array_equal(a[f], b[f], equal_nan=a.dtype[f].kind == "f"), f


@pytest.mark.parametrize("which", ["cpu", "synthetic_cuda"])
def test_save_load_round_trip(cpu_prof, tmp_path, which):
    res = cpu_prof.results if which == "cpu" else synthetic_gpu_results()
    path = tmp_path / "run.gpuprof"
    save(res, path)
    assert sorted(os.listdir(tmp_path)) == ["run.gpuprof"]
    loaded = gpuprof.load(path)
    assert "run.gpuprof" in repr(loaded)
    assert loaded.results.cuda == res.cuda
    for w0, w1 in zip(res.windows, loaded.results.windows, strict=True):
        assert set(w0) == set(w1)
        for k, v in w0.items():
            if isinstance(v, np.ndarray):
                assert v.dtype == w1[k].dtype, k
                for f in v.dtype.names:  # field by field: padding bytes are not data
                    assert np.array_equal(v[f], w1[k][f]), (k, f)
                assert not w1[k].flags.writeable
            else:
                assert v == w1[k], k
    for acc in ("ops", "kernels", "gpu_events", "call_tree"):
        assert_tables_equal(getattr(res, acc)(), getattr(loaded, acc)())
    assert_tables_equal(loaded.steps(), res.steps())
    assert loaded.key_averages().table() == gpuprof.KeyAverages(res).table()
    assert isinstance(str(loaded.diagnose()), str)
    # the same trace, from the file as from memory
    loaded.export_chrome_trace(tmp_path / "b.json")
    export_chrome_trace(loaded.results, tmp_path / "b2.json")
    t_loaded, _, _ = read_trace(tmp_path / "b.json")
    if which == "cpu":
        cpu_prof.export_chrome_trace(tmp_path / "a.json")
        t_orig, _, _ = read_trace(tmp_path / "a.json")
        assert t_orig["traceEvents"] == t_loaded["traceEvents"]
    loaded.export_stacks(tmp_path / "s.txt")
    assert collapsed_stacks(loaded.results) == collapsed_stacks(res)
    # numpy can read it without pickle
    with np.load(path, allow_pickle=False) as npz:
        assert np.array_equal(npz["w0/spans"], res.windows[0]["spans"])


def test_the_recording_meta_survives_a_saved_file(tmp_path):
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU], with_stack=True) as prof:
        work(5)
    prof.add_metadata("run", "A")
    live = prof.results.meta
    assert isinstance(live, RecordingMeta)
    assert live.with_stack and not live.profile_memory and live.pid is None
    prof.save(tmp_path / "m.gpuprof")
    saved = load(tmp_path / "m.gpuprof").results.meta
    # the settings come back; the process fields are the saving process's
    assert (saved.with_stack, saved.profile_memory) == (True, False)
    assert saved.trace_metadata == live.trace_metadata == {"run": '"A"'}
    assert (saved.pid, saved.ppid) == (os.getpid(), os.getppid())
    assert saved.thread_names and saved.device_properties == []


def test_results_meta_reads_a_mapping_and_refuses_other_types():
    meta = RecordingMeta.of({"profile_memory": 1, "from_a_later_version": 3, "pid": 7})
    assert meta == RecordingMeta(profile_memory=True, pid=7)
    assert RecordingMeta.of(None) == RecordingMeta()
    with pytest.raises(TypeError, match=r"Results\(meta=...\).*got list"):
        RecordingMeta.of([("pid", 1)])


def test_files_from_before_the_memory_totals_load_with_them(tmp_path):
    """A file written before C rolled device memory up the call tree (its nodes and ops
    without the totals) loads with the totals the aggregation gives: the same tables,
    the same trace."""
    res = synthetic_gpu_results()
    assert (res.windows[0]["nodes"]["cuda_mem_total_bytes"] != 0).any()
    new, old = tmp_path / "new.gpuprof", tmp_path / "old.gpuprof"
    save(res, new)
    dropped = {
        "nodes": ("cuda_mem_self_bytes", "cuda_mem_total_bytes"),
        "ops": ("cuda_mem_total_bytes",),
    }
    with zipfile.ZipFile(new) as src, zipfile.ZipFile(old, "w") as dst:
        for entry in src.namelist():
            data = src.read(entry)
            key = entry.rsplit("/", 1)[-1].removesuffix(".npy")
            if key in dropped:
                arr = np.load(io.BytesIO(data), allow_pickle=False)
                keep = [f for f in arr.dtype.names if f not in dropped[key]]
                packed = np.zeros(len(arr), dtype=[(f, arr.dtype[f]) for f in keep])
                for f in keep:
                    packed[f] = arr[f]
                buf = io.BytesIO()
                np.save(buf, packed, allow_pickle=False)
                data = buf.getvalue()
            dst.writestr(entry, data)
    before = load(old)
    w = before.results.windows[0]
    for key in dropped:
        assert w[key].dtype == res.windows[0][key].dtype
        assert np.array_equal(w[key], res.windows[0][key]), key
    assert before.key_averages().table() == gpuprof.KeyAverages(res).table()
    before.export_chrome_trace(tmp_path / "old.json")
    export_chrome_trace(res, tmp_path / "new.json")
    assert (
        read_trace(tmp_path / "old.json")[0]["traceEvents"]
        == read_trace(tmp_path / "new.json")[0]["traceEvents"]
    )


def test_save_keeps_every_window(tmp_path):
    with gpuprof.profile(
        schedule=gpuprof.schedule(wait=0, warmup=1, active=1, repeat=3), acc_events=True
    ) as prof:
        for _ in range(7):
            work(5)
            prof.step()
    n = len(prof.results.windows)
    assert n >= 2
    prof.save(tmp_path / "acc.gpuprof")
    loaded = load(tmp_path / "acc.gpuprof")
    assert len(loaded.results.windows) == n
    assert_tables_equal(prof.ops(), loaded.ops())


def test_load_rejects_other_files(tmp_path):
    p = tmp_path / "x.gpuprof"
    p.write_text("not a zip")
    with pytest.raises(ValueError, match="not a gpuprof file"):
        load(p)
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing.gpuprof")
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    with pytest.raises(ValueError, match="not a gpuprof file"):
        load(tmp_path / "other.npz")


def test_saved_strings_survive_surrogates(tmp_path):
    with gpuprof.profile() as prof:
        with record_function("bad \ud800 label \x00"):
            work(2)
    prof.save(tmp_path / "s.gpuprof")
    loaded = load(tmp_path / "s.gpuprof")
    assert "bad \ud800 label \x00" in set(loaded.ops()["name"])


# ---- Holistic Trace Analysis ------------------------------------------------------------------


def test_hta_reads_the_trace(tmp_path):
    hta = pytest.importorskip(
        "hta.trace_analysis",
        reason="Holistic Trace Analysis is not installed (pip install HolisticTraceAnalysis)",
    )
    res = synthetic_gpu_results(real_api_names=True)
    trace_dir = tmp_path / "hta"
    trace_dir.mkdir()
    export_chrome_trace(res, trace_dir / "worker_1.1.pt.trace.json")
    analyzer = hta.TraceAnalysis(trace_dir=str(trace_dir))
    temporal = analyzer.get_temporal_breakdown(visualize=False)
    assert temporal["rank"].tolist() == [0]  # found through distributedInfo
    assert temporal["compute_time(us)"].iloc[0] > 0
    by_type, by_kernel = analyzer.get_gpu_kernel_breakdown(visualize=False)
    assert set(by_type["kernel_type"]) == {"COMPUTATION", "MEMORY"}
    # HTA leaves out the last step: kernels of steps 0 and 1
    assert {
        "kernel()",
        "gemm(float*, float*)",
        "Memcpy HtoD (Pinned -> Device)",
        "Memset (Device)",
    } == set(by_kernel["name"])
    launches = analyzer.get_cuda_kernel_launch_stats(visualize=False)[0]
    assert set(launches["correlation"]) >= {7, 10}  # runtime call joined to its kernel
