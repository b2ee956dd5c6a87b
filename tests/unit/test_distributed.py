"""Distributed training on CPU: rank awareness, output-name placeholders,
distributedInfo, communication/compute overlap, and merging per-rank traces.

Each rank's window is synthetic (host step markers, compute and NCCL kernels)
and goes through the real C aggregation and the real trace exporter; the
ranks' traces are then merged as `python -m gpuprof merge` would.
"""

import gzip
import json
import os
import re
import subprocess
import sys
import types

import gpuprof
import pytest
from gpuprof import _gpuprof
from gpuprof.analysis.diagnose import diagnose
from gpuprof.analysis.distributed import (
    collective_name,
    comm_overlap,
    distributed_info,
    expand_name,
    merge,
    rank_info,
)
from gpuprof.exporters import export_chrome_trace
from gpuprof.results._results import Results

C = _gpuprof._test_constants()
US = 1000
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNEL_NAMES = ["_Z7computev", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "_Z3sgdv"]
COMPUTE, NCCL, SGD = 0, 1, 2
STEP_US = 1000
EPOCH_NS = 1_750_000_000 * 10**9
LAUNCH_KEY = _gpuprof._test_api_key(C["API_RUNTIME"], 211)["key"]  # cudaLaunchKernel


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    """No torchrun variables or torch.distributed leak in from the environment."""
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)


def train_step():
    pass


# ---- synthetic ranks -------------------------------------------------------------------------


def rank_window(kernels_per_step, steps=4, epoch_shift_ns=0, first_step=0):
    """One rank's window: `steps` steps of STEP_US each; kernels_per_step(k) gives
    (name_id, start_us, end_us[, stream]) relative to the step's start."""
    ev, gpu = [], []
    corr = 100
    for i in range(steps):
        k = first_step + i
        t0 = 50 + i * STEP_US
        ev.append(((t0) * US, C["EV_STEP_BEGIN"], k))
        ev.append(((t0 + 1) * US, C["EV_CALL"], 2))
        for j, kern in enumerate(kernels_per_step(k)):
            name, a, b = kern[:3]
            stream = kern[3] if len(kern) > 3 else 7
            corr += 1
            launch = (t0 + 2 + 4 * j) * US  # the launch precedes the kernel
            ev.append((launch, C["EV_API_ENTER"], corr, LAUNCH_KEY))
            ev.append((launch + 2 * US, C["EV_API_EXIT"], corr))
            gpu.append(
                dict(
                    kind=C["GPU_KERNEL"],
                    correlation=corr,
                    start_ns=(t0 + a) * US,
                    end_ns=(t0 + b) * US,
                    name_id=name,
                    stream=stream,
                    device=0,
                )
            )
        ev.append(((t0 + STEP_US - 2) * US, C["EV_RETURN"], 0))
        ev.append(((t0 + STEP_US) * US, C["EV_STEP_END"], k))
    end = (100 + steps * STEP_US) * US
    ops = [(C["OP_PYTHON"], train_step.__code__, 0)]
    raw = _gpuprof._test_aggregate(ops, [(1, 101, ev)], gpu, 0, end, KERNEL_NAMES, 1)
    for i, kind in enumerate(raw["ops"]["kind"].tolist()):
        if kind == C["OP_CUDA_API"]:  # libcupti names it only where the driver is
            raw["op_names"][i] = "cudaLaunchKernel"
    # one wall clock for every rank (the real offset is measured per call: it jitters by ns)
    raw["epoch_offset_ns"] = EPOCH_NS + epoch_shift_ns
    return raw


def fast_rank(k):
    """Computes, then waits in the all-reduce for the slow rank."""
    return [(COMPUTE, 50, 250), (NCCL, 260, 900), (SGD, 910, 950)]


def slow_rank(k):
    """Starts computing late (a delay on the host), so its all-reduce is short."""
    return [(COMPUTE, 600, 800), (NCCL, 810, 900), (SGD, 910, 950)]


def results(raw, rank, world, pid=None):
    meta = {"distributed_info": {"rank": rank, "world_size": world}}
    if pid is not None:
        meta["pid"] = pid
    return Results([raw], cuda={"active": True, "mode": "callbacks", "error": None}, meta=meta)


def write_ranks(tmp_path, patterns, shifts=None, name="trace_rank{r}.json", **kw):
    d = tmp_path / "traces"
    d.mkdir(exist_ok=True)
    paths = []
    for r, pattern in enumerate(patterns):
        raw = rank_window(pattern, epoch_shift_ns=(shifts or {}).get(r, 0), **kw)
        paths.append(export_chrome_trace(results(raw, r, len(patterns)), d / name.format(r=r)))
    return paths


def read(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


# ---- rank awareness --------------------------------------------------------------------------


def test_single_process_is_rank_0_of_1():
    assert rank_info() == {"rank": 0, "local_rank": 0, "world_size": 1}
    assert distributed_info() == {"rank": 0, "world_size": 1}


def test_rank_from_torchrun_variables(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert rank_info() == {"rank": 5, "local_rank": 1, "world_size": 8}
    assert distributed_info() == {"rank": 5, "world_size": 8}
    monkeypatch.delenv("LOCAL_RANK")
    assert rank_info()["local_rank"] == 5  # one node assumed


@pytest.mark.parametrize(
    "env, match",
    [
        ({"RANK": "1"}, "RANK is set but WORLD_SIZE is not"),
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE is set but RANK is not"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, r"RANK='x' is not an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 is not inside a world of size 2"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1"}, "LOCAL_RANK=-1 is negative"),
    ],
)
def test_bad_torchrun_variables_are_named(monkeypatch, env, match):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=match):
        rank_info()


def fake_torch(monkeypatch, rank=3, world=4, backend="nccl", broken=False):
    """torch.distributed with an initialised process group, as sys.modules shows it."""
    dist = types.ModuleType("torch.distributed")
    dist.is_available = lambda: True
    dist.is_initialized = lambda: True

    def get_rank():
        if broken:
            raise RuntimeError("process group is being destroyed")
        return rank

    dist.get_rank = get_rank
    dist.get_world_size = lambda: world
    dist.get_backend = lambda: backend
    dist.get_pg_count = lambda: 2
    dist.distributed_c10d = types.SimpleNamespace(
        _get_all_pg_configs=lambda: [
            {
                "pg_name": "0",
                "pg_desc": "default_pg",
                "backend_config": "cuda:nccl",
                "pg_size": world,
                "ranks": list(range(world)),
            }
        ]
    )
    torch = types.ModuleType("torch")
    torch.distributed = dist
    torch.cuda = types.SimpleNamespace(nccl=types.SimpleNamespace(version=lambda: (2, 21, 5)))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    return torch


def test_distributed_info_from_an_initialised_process_group(monkeypatch):
    fake_torch(monkeypatch)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert rank_info() == {"rank": 3, "local_rank": 1, "world_size": 4}
    info = distributed_info()
    assert list(info) == ["backend", "rank", "world_size", "pg_count", "pg_config", "nccl_version"]
    assert info["backend"] == "nccl" and info["rank"] == 3 and info["world_size"] == 4
    assert info["pg_count"] == 2 and info["nccl_version"] == "2.21.5"
    assert info["pg_config"][0]["ranks"] == [0, 1, 2, 3]


def test_gloo_has_no_nccl_version_and_a_broken_group_falls_back(monkeypatch):
    fake_torch(monkeypatch, backend="gloo")
    assert "nccl_version" not in distributed_info()
    fake_torch(monkeypatch, broken=True)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert distributed_info() == {"rank": 1, "world_size": 2}


def test_trace_carries_distributed_info_as_hta_reads_it(monkeypatch, tmp_path):
    fake_torch(monkeypatch)
    raw = rank_window(fast_rank)
    res = Results([raw], cuda={"active": True, "mode": "callbacks", "error": None})
    path = export_chrome_trace(res, tmp_path / "t.json")
    text = open(path).read()
    head = text[: text.index('"traceEvents"')]
    # HTA finds the rank with a pattern that needs whitespace after the colon
    assert re.search(r'"rank":\s+(\d+)', head).group(1) == "3"
    assert '"rank":3' not in text
    info = json.loads(text)["distributedInfo"]
    assert info["backend"] == "nccl" and info["nccl_version"] == "2.21.5"
    assert info["pg_config"][0]["pg_size"] == 4


# ---- output names ----------------------------------------------------------------------------


def test_expand_name(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert expand_name("out/r{rank}-l{local_rank}-of{world_size}.json") == "out/r2-l0-of4.json"
    assert expand_name("keep {other} {} {{rank}}") == "keep {other} {} {2}"
    import pathlib

    assert expand_name(pathlib.Path("a/{rank}")) == "a/2"
    with pytest.raises(TypeError, match="name must be a str"):
        expand_name(3)


def test_expand_name_without_placeholders_needs_no_rank(monkeypatch):
    monkeypatch.setenv("RANK", "garbage")
    assert expand_name("plain.json") == "plain.json"


def test_tensorboard_handler_expands_placeholders(monkeypatch, tmp_path):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    prof = types.SimpleNamespace()
    res = Results(
        [rank_window(slow_rank)], cuda={"active": True, "mode": "callbacks", "error": None}
    )
    prof.export_chrome_trace = lambda p: export_chrome_trace(res, p)
    handler = gpuprof.tensorboard_trace_handler(
        str(tmp_path / "run_{world_size}"), worker_name="rank{rank}"
    )
    path = handler(prof)
    assert os.path.dirname(path) == str(tmp_path / "run_2")
    assert os.path.basename(path).startswith("rank1.")
    assert read(path)["distributedInfo"] == {"rank": 1, "world_size": 2}


# ---- communication overlap -------------------------------------------------------------------


def test_comm_overlap_per_step():
    # compute on stream 7 while an all-reduce runs on stream 20: 100 us of overlap
    def pattern(k):
        return [(COMPUTE, 100, 300), (NCCL, 200, 500, 20), (SGD, 600, 650)]

    res = results(rank_window(pattern, steps=3), 0, 1)
    ov = comm_overlap(res)
    steps = res.steps()
    assert ov["step"].tolist() == [0, 1, 2]
    assert (ov["compute_ns"] == 250 * US).all()
    assert (ov["comm_ns"] == 300 * US).all()
    assert (ov["overlap_ns"] == 100 * US).all()
    assert (ov["exposed_comm_ns"] == 200 * US).all()
    assert (ov["busy_ns"] == 450 * US).all()
    # the same figures as the C step table
    assert ov["comm_ns"].tolist() == steps["comm_ns"].tolist()
    assert ov["busy_ns"].tolist() == steps["gpu_busy_ns"].tolist()
    assert ov["idle_ns"].tolist() == steps["gpu_idle_ns"].tolist()
    assert ov["step_ns"].tolist() == steps["cpu_ns"].tolist()


def test_comm_overlap_clips_to_the_step_and_counts_streams_once():
    # two compute kernels on two streams at once, an all-reduce running past the step end
    def pattern(k):
        return [(COMPUTE, 100, 300), (SGD, 150, 350, 30), (NCCL, 340, 1200, 20)]

    ov = comm_overlap(results(rank_window(pattern, steps=1), 0, 1))[0]
    assert ov["compute_ns"] == 250 * US
    assert ov["comm_ns"] == (STEP_US - 340) * US
    assert ov["overlap_ns"] == 10 * US


def test_comm_overlap_and_the_communication_wait_finding_agree():
    # two all-reduces on two streams overlap each other (counted once) and, for 100 us,
    # the compute kernel: both answers come from _intervals.cover_split
    def pattern(k):
        return [(COMPUTE, 100, 300), (NCCL, 200, 500, 20), (NCCL, 400, 600, 21)]

    res = results(rank_window(pattern, steps=3), 0, 1)
    ov = comm_overlap(res)
    assert (ov["comm_ns"] == 400 * US).all() and (ov["exposed_comm_ns"] == 300 * US).all()
    assert ov["comm_ns"].tolist() == res.steps()["comm_ns"].tolist()
    (f,) = [f for f in diagnose(res) if f.kind == "communication_wait"]
    assert f.evidence == {
        "comm_ns": int(ov["comm_ns"].sum()),
        "exposed_comm_ns": int(ov["exposed_comm_ns"].sum()),
    }
    assert f.severity == pytest.approx(ov["exposed_comm_ns"].sum() / ov["step_ns"].sum())


def test_comm_overlap_rejects_other_objects():
    with pytest.raises(TypeError, match="comm_overlap"):
        comm_overlap([1, 2])


def test_comm_overlap_on_a_cpu_profile():
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            sum(range(1000))
            prof.step()
    ov = comm_overlap(prof)
    assert len(ov) >= 3
    assert (ov["comm_ns"] == 0).all() and (ov["idle_ns"] == ov["step_ns"]).all()


# ---- merge -----------------------------------------------------------------------------------


def test_merge_names_the_slow_rank(tmp_path):
    paths = write_ranks(tmp_path, [fast_rank, slow_rank])
    out = tmp_path / "merged.json"
    run = merge(out, paths)
    assert run.ranks == [0, 1] and run.common_steps == [0, 1, 2, 3]
    assert run.alignment == "clock"
    assert run.slowest["rank"].tolist() == [1, 1, 1, 1]
    # others' exposed all-reduce beyond the slow rank's own: 640 - 90 us per step
    assert (run.slowest["others_wait_ns"] == 550 * US).all()
    s = run.rank_summary()
    assert s["slowest_steps"].tolist() == [0, 4]
    assert s["comm_ns"].tolist() == [640 * US, 90 * US]
    assert s["compute_ns"].tolist() == [240 * US, 240 * US]
    assert s["idle_ns"].tolist() == [(STEP_US - 880) * US, (STEP_US - 330) * US]
    assert s["step_ns"].tolist() == [STEP_US * US] * 2
    text = str(run)
    assert "2 ranks, 4 steps recorded by every rank" in text
    assert re.search(r"^\s+0\s+1\*", text, re.M), text
    assert "(rank 1 in 4 of 4)" in text

    diag = run.diagnose()
    assert diag.kinds() == ["straggler"]
    f = diag[0]
    assert f.evidence["straggler_rank"] == 1
    assert f.evidence["slowest_steps"] == 4 and f.evidence["steps"] == 4
    assert f.evidence["wait_per_step_ns"] == 550 * US
    assert f.evidence["waited_per_step"] == "rank 0: 550.000us"
    assert f.severity == pytest.approx(0.55)
    assert "Rank 1 is a straggler" in str(diag)


def test_collectives_from_nccl_kernel_names(tmp_path):
    assert (
        collective_name("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgs)") == "AllReduce"
    )
    assert collective_name("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)") == "AllGather"
    assert collective_name("ncclDevKernel_SendRecv(ncclDevKernelArgs)") == "SendRecv"
    assert collective_name("ncclSomethingNew") == "other"
    assert collective_name("gemm") == ""
    run = merge(None, write_ranks(tmp_path, [fast_rank, slow_rank]))
    assert run.collectives.tolist() == [
        (0, "AllReduce", 4, 4 * 640 * US),
        (1, "AllReduce", 4, 4 * 90 * US),
    ]
    assert "NCCL kernels per rank" in run.table()


def test_balanced_ranks_have_no_straggler(tmp_path):
    paths = write_ranks(tmp_path, [fast_rank, fast_rank, fast_rank])
    run = merge(None, paths)
    assert run.path is None
    assert run.diagnose().kinds() == []
    assert (run.slowest["others_wait_ns"] == 0).all()


def test_merged_trace_has_one_process_per_rank(tmp_path):
    paths = write_ranks(tmp_path, [fast_rank, slow_rank])
    out = tmp_path / "merged.json"
    merge(out, paths)
    doc = read(out)
    inputs = [read(p) for p in paths]
    assert "distributedInfo" not in doc  # not one rank: HTA must not take it for rank 0
    assert [r["rank"] for r in doc["gpuprofMerged"]["ranks"]] == [0, 1]
    ev = doc["traceEvents"]
    names = {
        e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert names == {0: "rank 0", 1: "rank 1"}
    assert {e["pid"] for e in ev} == {0, 1}
    # every slice of every rank is there, on its rank's process
    for r, d in enumerate(inputs):
        want = sorted(
            (e["name"], e["cat"])
            for e in d["traceEvents"]
            if e["ph"] == "X" and e["pid"] not in ("Spans", "Traces", "")
        )
        got = sorted((e["name"], e["cat"]) for e in ev if e["ph"] == "X" and e["pid"] == r)
        assert got == want
    # NCCL kernels: rank 0's are long (waiting), rank 1's short
    nccl = {
        r: [
            e["dur"]
            for e in ev
            if e["ph"] == "X" and e["pid"] == r and e["name"].startswith("nccl")
        ]
        for r in (0, 1)
    }
    assert nccl == {0: [640.0] * 4, 1: [90.0] * 4}
    # GPU streams and host threads are separate lanes, named
    lanes = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in ev
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    kern_lanes = {(e["pid"], e["tid"]) for e in ev if e.get("cat") == "kernel"}
    step_lanes = {
        (e["pid"], e["tid"])
        for e in ev
        if e["name"].startswith("ProfilerStep#") and e.get("cat") == "user_annotation"
    }
    gpu_step_lanes = {
        (e["pid"], e["tid"])
        for e in ev
        if e["name"].startswith("ProfilerStep#") and e.get("cat") == "gpu_user_annotation"
    }
    assert kern_lanes.isdisjoint(step_lanes)
    assert gpu_step_lanes == set()  # steps stay on the host rows, as torch.profiler has them
    assert all(lanes[la] == "GPU 0 stream 7" for la in kern_lanes)
    assert all(la in lanes for la in step_lanes)
    # same clock: step k starts at the same time on both ranks
    starts = {}
    for e in ev:
        if e["name"].startswith("ProfilerStep#") and e.get("cat") == "user_annotation":
            starts.setdefault(e["name"], set()).add(e["ts"])
    assert all(len(v) == 1 for v in starts.values()), starts
    assert min(e["ts"] for e in ev if "ts" in e and e["ph"] != "M") == 0


def test_merged_flows_stay_paired_and_unique(tmp_path):
    from test_exporters import synthetic_gpu_results

    paths = []
    for r in range(2):
        res = synthetic_gpu_results()
        res.meta.distributed_info = {"rank": r, "world_size": 2}
        paths.append(export_chrome_trace(res, tmp_path / f"r{r}.json"))
    out = tmp_path / "m.json"
    merge(out, paths)
    ev = read(out)["traceEvents"]
    flows = [e for e in ev if e["ph"] in ("s", "f")]
    n_in = sum(1 for p in paths for e in read(p)["traceEvents"] if e["ph"] in ("s", "f"))
    assert len(flows) == n_in > 0
    by_id = {}
    for e in flows:
        by_id.setdefault((e["cat"], e["id"]), []).append(e)
    for pair in by_id.values():
        assert sorted(e["ph"] for e in pair) == ["f", "s"]
        assert pair[0]["pid"] == pair[1]["pid"]  # within one rank
        # each end binds to a slice starting at its ts on its lane
        for e in pair:
            assert any(
                x["ph"] == "X"
                and x["pid"] == e["pid"]
                and x["tid"] == e["tid"]
                and x["ts"] == e["ts"]
                for x in ev
            ), e


def test_clock_skew_is_aligned_on_the_first_step(tmp_path):
    hour = 3600 * 10**9
    paths = write_ranks(tmp_path, [fast_rank, slow_rank], shifts={1: hour})
    out = tmp_path / "m.json.gz"
    run = merge(out, paths)
    assert run.alignment == "step" and run.aligned_step == 0
    assert run.shifts_ns[0] == 0 and abs(run.shifts_ns[1] + hour) < 10 * US
    ev = read(out)["traceEvents"]
    step0 = [
        e["ts"] for e in ev if e["name"] == "ProfilerStep#0" and e.get("cat") == "user_annotation"
    ]
    assert len(step0) == 2 and step0[0] == step0[1]
    assert max(e["ts"] for e in ev if "ts" in e) < 10 * STEP_US  # no hour-long gap
    # the analysis is per rank and does not depend on the alignment
    assert run.slowest["rank"].tolist() == [1, 1, 1, 1]
    # forced: keep the clocks
    kept = merge(None, paths, align="clock")
    assert kept.alignment == "clock" and kept.shifts_ns == {0: 0, 1: 0}


def test_align_step_on_synchronised_clocks_and_no_common_step(tmp_path):
    paths = write_ranks(tmp_path, [fast_rank, slow_rank])
    run = merge(None, paths, align="step")
    assert run.alignment == "step" and run.aligned_step == 0
    assert abs(run.shifts_ns[1]) < 10 * US
    d = tmp_path / "apart"
    d.mkdir()
    a = export_chrome_trace(results(rank_window(fast_rank), 0, 2), d / "a.json")
    b = export_chrome_trace(results(rank_window(slow_rank, first_step=10), 1, 2), d / "b.json")
    with pytest.raises(ValueError, match="share none"):
        merge(None, [a, b], align="step")
    run = merge(None, [a, b])
    assert run.common_steps == [] and run.alignment == "clock"
    assert run.diagnose().kinds() == []


def test_windows_of_one_rank_are_combined(tmp_path):
    d = tmp_path / "w"
    d.mkdir()
    paths = []
    for r, pattern in ((0, fast_rank), (1, slow_rank)):
        for w, first in enumerate((0, 4)):
            raw = rank_window(pattern, first_step=first)
            raw["epoch_offset_ns"] += w * 5 * STEP_US * US
            paths.append(
                export_chrome_trace(results(raw, r, 2, pid=4000 + r), d / f"r{r}w{w}.pt.trace.json")
            )
    run = merge(None, str(d))  # a folder
    assert run.files[0] == sorted(p for p in paths if "r0" in os.path.basename(p))
    assert run.common_steps == list(range(8))
    assert run.slowest["rank"].tolist() == [1] * 8


def test_ranks_given_by_hand(tmp_path):
    d = tmp_path / "nr"
    d.mkdir()
    paths = []
    for r, pattern in enumerate((slow_rank, fast_rank)):
        res = results(rank_window(pattern), 0, 1, pid=5000 + r)  # both claim rank 0
        paths.append(export_chrome_trace(res, d / f"p{r}.json"))
    with pytest.raises(ValueError, match="several processes claim rank 0"):
        merge(None, paths)
    run = merge(None, paths, ranks=[1, 0])
    assert run.slowest["rank"].tolist() == [1] * 4


def test_trace_without_rank_needs_ranks(tmp_path):
    p = tmp_path / "torch.json"
    p.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {
                        "ph": "X",
                        "cat": "user_annotation",
                        "name": "ProfilerStep#0",
                        "pid": 9,
                        "tid": 9,
                        "ts": 0.0,
                        "dur": 10.0,
                    }
                ]
            }
        )
    )
    with pytest.raises(ValueError, match=r"no distributedInfo rank; pass ranks="):
        merge(None, [p])
    run = merge(None, [p], ranks=[0])
    assert run.ranks == [0] and run.common_steps == [0] and not run.gpu
    assert "no GPU activity" in run.table()


def test_steps_on_the_gpu_rows_are_not_host_steps(tmp_path):
    # a trace that also has ProfilerStep#<n> on a stream row (a gpu_user_annotation on the
    # device pid): not a second process claiming the rank
    p = tmp_path / "torch.json"
    p.write_text(
        json.dumps(
            {
                "distributedInfo": {"rank": 0, "world_size": 1},
                "traceEvents": [
                    {
                        "ph": "X",
                        "cat": "user_annotation",
                        "name": "ProfilerStep#0",
                        "pid": 9,
                        "tid": 9,
                        "ts": 0.0,
                        "dur": 10.0,
                    },
                    {
                        "ph": "X",
                        "cat": "gpu_user_annotation",
                        "name": "ProfilerStep#0",
                        "pid": 0,
                        "tid": 7,
                        "ts": 4.999,
                        "dur": 20.002,
                    },
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": "k",
                        "pid": 0,
                        "tid": 7,
                        "ts": 5.0,
                        "dur": 20.0,
                        "args": {"stream": 7, "device": 0},
                    },
                ],
            }
        )
    )
    run = merge(None, [p])
    assert run.ranks == [0] and run.common_steps == [0] and run.gpu


def test_merge_input_errors(tmp_path):
    paths = write_ranks(tmp_path, [fast_rank, slow_rank])
    with pytest.raises(ValueError, match="paths is empty"):
        merge(None, [])
    with pytest.raises(FileNotFoundError, match="no such trace file"):
        merge(None, [tmp_path / "missing.json"])
    with pytest.raises(FileNotFoundError, match="no file matches"):
        merge(None, str(tmp_path / "nothing*.json"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="holds no .json"):
        merge(None, empty)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="is not a JSON trace"):
        merge(None, [bad])
    bad.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="has no traceEvents list"):
        merge(None, [bad])
    with pytest.raises(ValueError, match="align must be"):
        merge(None, paths, align="nearest")
    with pytest.raises(ValueError, match="one non-negative int per path"):
        merge(None, paths, ranks=[0])
    with pytest.raises(TypeError, match="paths must be trace files"):
        merge(None, 5)
    with pytest.raises(ValueError, match="is one of the input traces"):
        merge(paths[0], paths)
    with pytest.raises(IsADirectoryError):
        merge(tmp_path, paths)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        merge(tmp_path / "no" / "dir.json", paths)


def test_glob_and_gzip_inputs(tmp_path):
    paths = write_ranks(tmp_path, [fast_rank, slow_rank], name="rank{r}.pt.trace.json.gz")
    run = merge(tmp_path / "m.json", str(tmp_path / "traces" / "rank*.pt.trace.json.gz"))
    assert sorted(p for fs in run.files.values() for p in fs) == sorted(paths)
    assert run.slowest["rank"].tolist() == [1] * 4
    assert json.loads(json.dumps(run.to_dict()))["rank_summary"][1]["slowest_steps"] == 4


# ---- the command line ------------------------------------------------------------------------


def cli(*args):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(var, None)
    return subprocess.run(
        [sys.executable, "-m", "gpuprof", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_cli_merge_prints_the_table_and_the_straggler(tmp_path):
    write_ranks(tmp_path, [fast_rank, slow_rank])
    out = tmp_path / "merged.json"
    traces = sorted(str(p) for p in (tmp_path / "traces").iterdir())
    p = cli("merge", str(out), *traces)
    assert p.returncode == 0, p.stderr
    assert "Per rank, mean per step" in p.stdout
    assert "Rank 1 is a straggler: slowest in 4 of 4 steps" in p.stdout
    assert f"wrote {out}" in p.stderr
    assert {e["pid"] for e in read(out)["traceEvents"]} == {0, 1}


def test_cli_merge_errors_are_one_line(tmp_path):
    p = cli("merge", str(tmp_path / "m.json"), str(tmp_path / "missing.json"))
    assert p.returncode == 2
    assert "gpuprof: error: merge(): no such trace file" in p.stderr
    write_ranks(tmp_path, [fast_rank])
    p = cli("merge", str(tmp_path / "m.json"), str(tmp_path / "traces"), "--ranks", "a")
    assert p.returncode == 2 and "--ranks takes comma-separated ints" in p.stderr


# ---- Holistic Trace Analysis reads the per-rank folder ---------------------------------------


def test_hta_finds_every_rank(tmp_path):
    hta = pytest.importorskip(
        "hta.trace_analysis",
        reason="Holistic Trace Analysis is not installed (pip install HolisticTraceAnalysis)",
    )
    write_ranks(tmp_path, [fast_rank, slow_rank], name="worker{r}_1.1.pt.trace.json")
    analyzer = hta.TraceAnalysis(trace_dir=str(tmp_path / "traces"))
    temporal = analyzer.get_temporal_breakdown(visualize=False)
    assert sorted(temporal["rank"].tolist()) == [0, 1]
    by_type, _ = analyzer.get_gpu_kernel_breakdown(visualize=False)
    assert "COMMUNICATION" in set(by_type["kernel_type"])


def test_rank_placeholders_in_export_and_save_paths(tmp_path, monkeypatch):
    import gpuprof

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        sum(range(10))
    prof.export_chrome_trace(str(tmp_path / "trace_rank{rank}_of_{world_size}.json"))
    prof.save(str(tmp_path / "prof_{rank}.gpuprof"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prof_3.gpuprof", "trace_rank3_of_4.json"]
