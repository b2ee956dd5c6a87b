"""DDP under torchrun on two GPUs: examples/ddp_train.py, once as is and once with
rank 1 delayed every step; the merged report must name rank 1 as the straggler.

Marked `gpu`; also skipped unless torch sees at least two CUDA devices.
"""

import glob
import json
import os
import re
import subprocess
import sys

import gpuprof
import pytest

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "ddp_train.py")
DELAY_MS = 20.0
STEPS = 12


def _gpus(n=2):
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} CUDA devices, torch sees {torch.cuda.device_count()}")
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available")


def _torchrun(out_dir, *extra, nproc=2) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.setdefault("OMP_NUM_THREADS", "4")
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        EXAMPLE,
        "--out",
        str(out_dir),
        "--steps",
        str(STEPS),
        *extra,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=540, env=env, cwd=ROOT)
    print(r.stdout[-8000:])
    assert r.returncode == 0, r.stderr[-5000:]
    return r.stdout


def _rank_traces(out_dir, world=2):
    files = sorted(glob.glob(os.path.join(out_dir, "rank*.pt.trace.json")))
    assert [os.path.basename(f).split(".")[0] for f in files] == [
        f"rank{r}" for r in range(world)
    ], files
    for rank, f in enumerate(files):
        with open(f) as fh:
            text = fh.read()
        head = text[: text.index('"traceEvents"')]
        # HTA's rank lookup needs whitespace after the colon
        assert re.search(r'"rank":\s+(\d+)', head).group(1) == str(rank)
        info = json.loads(text)["distributedInfo"]
        assert info["world_size"] == world and info["backend"] == "nccl", info
        assert re.fullmatch(r"\d+\.\d+\.\d+", info.get("nccl_version", "")), info
    return files


def test_ddp_single_rank(tmp_path):
    """World size 1 on one GPU: the trace says so and merging one rank works."""
    _gpus(1)
    out = _torchrun(tmp_path / "one", "--steps", "6", nproc=1)
    assert "rank 0/1:" in out
    run = gpuprof.merge(tmp_path / "one.json", _rank_traces(tmp_path / "one", world=1))
    assert run.ranks == [0] and len(run.common_steps) == 6
    assert run.rank_summary()["compute_ns"][0] > 0
    assert "straggler" not in run.diagnose().kinds()


def test_ddp_straggler_is_named(tmp_path):
    _gpus(2)
    normal_dir, slow_dir = tmp_path / "normal", tmp_path / "slow"
    _torchrun(normal_dir)
    slow_out = _torchrun(slow_dir, "--inject-delay-rank", "1", "--delay-ms", str(DELAY_MS))

    # the example's own report (rank 0 merges after training)
    assert "Rank 1 is a straggler" in slow_out, slow_out
    assert os.path.isfile(str(slow_dir) + "-merged.json")

    delay_ns = DELAY_MS * 1e6
    slow = gpuprof.merge(tmp_path / "slow.json", _rank_traces(slow_dir))
    print(slow)
    assert slow.ranks == [0, 1] and len(slow.common_steps) == STEPS
    summary = slow.rank_summary()
    # NCCL kernels are recorded as communication on both ranks
    assert (summary["comm_ns"] > 0).all(), summary
    # rank 0 waits for rank 1 inside the all-reduce; rank 1 does not wait
    assert summary["exposed_comm_ns"][0] > 0.5 * delay_ns > summary["exposed_comm_ns"][1]
    assert summary["slowest_steps"][1] >= 0.75 * STEPS, summary
    diag = slow.diagnose()
    print(diag)
    found = [f for f in diag if f.kind == "straggler"]
    assert found and found[0].evidence["straggler_rank"] == 1, str(diag)
    assert found[0].evidence["wait_per_step_ns"] > 0.5 * delay_ns, str(diag)
    merged = json.load(open(tmp_path / "slow.json"))["traceEvents"]
    names = {
        e["pid"]: e["args"]["name"]
        for e in merged
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert names == {0: "rank 0", 1: "rank 1"}
    assert {
        e["pid"] for e in merged if e.get("cat") == "kernel" and e["name"].startswith("nccl")
    } == {0, 1}

    normal = gpuprof.merge(None, _rank_traces(normal_dir))
    print(normal)
    assert (normal.rank_summary()["comm_ns"] > 0).all()
    for f in normal.diagnose():
        if f.kind == "straggler":  # jitter between symmetric ranks: small, not the delay
            assert f.evidence["wait_per_step_ns"] < 0.25 * delay_ns, str(f)

    hta = None
    try:
        import hta.trace_analysis as hta
    except ImportError:
        pass
    if hta is not None:  # the per-rank folder is one HTA run
        temporal = hta.TraceAnalysis(trace_dir=str(slow_dir)).get_temporal_breakdown(
            visualize=False
        )
        assert sorted(temporal["rank"].tolist()) == [0, 1]
