"""examples/slow_training.py has four planted problems: diagnose finds them, compare sees
them go."""

import os
import subprocess
import sys

import gpuprof
import pytest

pytestmark = pytest.mark.gpu
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def _run(script, out):
    pytest.importorskip("torch")
    r = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, script), "--save", out],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=EXAMPLES,
    )
    print(r.stdout[-6000:])
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_slow_and_fast_training(tmp_path):
    slow_out = _run("slow_training.py", str(tmp_path / "slow.gpuprof"))
    fast_out = _run("fast_training.py", str(tmp_path / "fast.gpuprof"))
    slow = gpuprof.load(str(tmp_path / "slow.gpuprof"))
    fast = gpuprof.load(str(tmp_path / "fast.gpuprof"))
    found = set(slow.diagnose().kinds())
    assert {"data_stall", "sync_point", "no_mixed_precision", "launch_bound"} <= found, slow_out
    c = gpuprof.compare(slow, fast)
    print(c)
    gone = set(c.findings_gone)
    assert {"data_stall", "sync_point", "no_mixed_precision", "launch_bound"} <= gone, (
        str(c),
        fast_out,
    )
    assert c.speedup > 1.0
