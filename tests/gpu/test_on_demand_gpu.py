"""On-demand capture on the GPU: a PyTorch training loop armed with `run --on-demand`
and captured twice, its kernels joined to the Python calls that launched them; and a
two-rank torchrun job (NCCL) whose ranks `capture --all-ranks` starts at the same step.

By hand:

    python -m gpuprof run --on-demand tests/scripts/ondemand_torch.py STOP --device cuda &
    python -m gpuprof capture $! --steps 5 --wait --output DIR

Marked `gpu`; the torchrun test also skips unless torch sees two CUDA devices.
"""

import glob
import os
import re
import subprocess
import sys

import gpuprof
import pytest

pytestmark = pytest.mark.gpu
SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "ondemand_torch.py")
ARMED = re.compile(r"`python -m gpuprof capture (\d+)`")


def _torch(gpus=1):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if torch.cuda.device_count() < gpus:
        pytest.skip(f"needs {gpus} CUDA device(s), torch sees {torch.cuda.device_count()}")
    return torch


def _env(tmp_path):
    env = dict(os.environ, GPUPROF_RUNTIME_DIR=str(tmp_path / "runtime"))
    env.setdefault("OMP_NUM_THREADS", "4")
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return env


def _capture(env, *args):
    r = subprocess.run(
        [sys.executable, "-m", "gpuprof", "capture", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    print(r.stdout[-6000:])
    print(r.stderr[-3000:], file=sys.stderr)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _armed_pids(proc, n):
    pids = []
    while len(pids) < n:
        line = proc.stderr.readline()
        assert line, "the program ended before it was armed"
        m = ARMED.search(line)
        if m:
            pids.append(int(m.group(1)))
    return pids


def _check_gpu_capture(saved, steps):
    prof = gpuprof.load(saved)
    assert prof.results.cuda["active"], prof.results.cuda
    s = prof.steps()
    assert len(s) == steps and (s["gpu_busy_ns"] > 0).all(), s
    kernels = prof.kernels()
    assert kernels["calls"].sum() >= steps * 20, kernels[["name", "calls"]]
    ops = prof.ops()
    linear = ops[ops["name"] == "torch._C._nn.linear"]
    assert len(linear) and linear["cuda_self_ns"].sum() > 0, "GEMMs not joined to linear()"
    return prof


def test_torch_loop_captured_twice_with_kernels_attributed(tmp_path):
    _torch()
    env = _env(tmp_path)
    stop = tmp_path / "stop"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuprof",
            "run",
            "--on-demand",
            SCRIPT,
            str(stop),
            "--device",
            "cuda",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        (pid,) = _armed_pids(proc, 1)
        lasts = []
        for name in ("one", "two"):
            out = _capture(
                env,
                str(pid),
                "--steps",
                "5",
                "--wait",
                "--timeout",
                "300",
                "--output",
                str(tmp_path / name),
            )
            m = re.search(rf"pid {pid}: recorded 5 steps, steps (\d+)-(\d+)", out)
            assert m, out
            lasts.append((int(m.group(1)), int(m.group(2))))
            (saved,) = glob.glob(str(tmp_path / name / "*.gpuprof"))
            _check_gpu_capture(saved, 5)
            (report,) = [
                f
                for f in glob.glob(str(tmp_path / name / "*.txt"))
                if not f.endswith(".stacks.txt")
            ]
            assert "Self CUDA" in open(report).read()
        assert lasts[1][0] > lasts[0][1]
    finally:
        stop.write_text("")
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert err.count("on-demand capture of pid") == 2


def test_two_rank_torchrun_job_captured_at_the_same_step(tmp_path):
    torch = _torch(gpus=2)
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available")
    env = _env(tmp_path)
    stop = tmp_path / "stop"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "gpuprof",
            "run",
            "--on-demand",
            SCRIPT,
            str(stop),
            "--device",
            "cuda",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        pids = _armed_pids(proc, 2)
        out_dir = tmp_path / "ranks"
        out = _capture(
            env,
            "--all-ranks",
            str(pids[0]),
            "--steps",
            "5",
            "--wait",
            "--timeout",
            "300",
            "--output",
            str(out_dir),
        )
        firsts = re.findall(r"records the next 5 steps from step (\d+)", out)
        assert len(firsts) == 2 and firsts[0] == firsts[1], out
        recorded = re.findall(r"recorded 5 steps, steps (\d+)-(\d+)", out)
        assert recorded == [(firsts[0], str(int(firsts[0]) + 4))] * 2, out
        for saved in glob.glob(str(out_dir / "*.gpuprof")):
            prof = _check_gpu_capture(saved, 5)
            k = prof.kernels()
            assert (k[k["category"] == "communication"]["calls"] >= 5).any(), (
                "no NCCL kernel in every step"
            )
        traces = sorted(glob.glob(str(out_dir / "*.pt.trace.json.gz")))
        assert len(traces) == 2
        run = gpuprof.merge(str(tmp_path / "merged.json"), traces)
        print(run)
        assert run.ranks == [0, 1] and len(run.common_steps) == 5
        assert (run.steps["comm_ns"] > 0).all()
    finally:
        stop.write_text("")
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
