"""`gpuprof dump` of a PyTorch program blocked in cudaStreamSynchronize: a stream kept
busy for about 10 s by `torch.cuda._sleep`, then `Stream.synchronize()`.

By hand:

    python -m gpuprof run --on-demand tests/scripts/dump_hangs.py cuda_sync DIR &
    python -m gpuprof dump $!

The dump must come while the main thread waits, name the C call
(`torch._C._CudaStreamBase.synchronize`) and what it does on the device, without
touching CUDA from the dumping thread, and the program must finish its step and
go on afterwards. Marked `gpu`.
"""

import os
import re
import subprocess
import sys
import time

import pytest
from gpu_helpers import cuda_torch

pytestmark = pytest.mark.gpu
HANGS = os.path.join(os.path.dirname(__file__), "..", "scripts", "dump_hangs.py")


def test_a_thread_in_cuda_stream_synchronize_is_dumped(tmp_path):
    cuda_torch()
    env = dict(os.environ, GPUPROF_RUNTIME_DIR=str(tmp_path / "rt"))
    log = open(tmp_path / "log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuprof", "run", "--on-demand", HANGS, "cuda_sync", str(tmp_path)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 300
        state = tmp_path / "rt" / f"{proc.pid}.json"
        while not ((tmp_path / "syncing.0").exists() and state.exists()):
            assert proc.poll() is None, (tmp_path / "log").read_text()
            assert time.monotonic() < deadline, "the program did not reach its first sync"
            time.sleep(0.1)
        time.sleep(1.0)  # inside synchronize(): the stream has about 9 s of work left
        r = subprocess.run(
            [sys.executable, "-m", "gpuprof", "dump", str(proc.pid)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        print(r.stdout)
        assert r.returncode == 0, r.stderr
        main = re.search(r'^Thread "MainThread" .*?(?=\n\n|\Z)', r.stdout, re.S | re.M).group(0)
        assert "in C call torch._C._CudaStreamBase.synchronize" in main, main
        assert "on the device: cudaStreamSynchronize: waits for the stream's work" in main
        frames = [ln.strip() for ln in main.splitlines() if re.match(r"^    \w.* \(.*:\d+\)$", ln)]
        assert re.fullmatch(r"Stream\.synchronize \(.*/torch/cuda/streams\.py:\d+\)", frames[0])
        assert frames[1].startswith("cuda_sync (") and "dump_hangs.py" in frames[1]
        assert "Not known: gpuprof's" not in r.stdout  # synchronize() releases the GIL
        assert proc.poll() is None
        steps = tmp_path / "steps.0"
        deadline = time.monotonic() + 120
        while not steps.exists():
            assert proc.poll() is None, (tmp_path / "log").read_text()
            assert time.monotonic() < deadline, "the program did not finish its step"
            time.sleep(0.2)
    finally:
        (tmp_path / "stop").touch()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
