"""`python -m gpuprof run` on an unmodified Lightning script training on one GPU.

By hand, the same check:

    python -m gpuprof run --active 5 --output DIR tests/scripts/lightning_fit.py --accelerator gpu

prints a table with CUDA columns and "steps: 5 recorded, 8 found (step boundaries:
torch optimizer steps: AdamW)", and writes DIR/*.pt.trace.json.gz, *.gpuprof and
*.stacks.txt.
"""

import glob
import gzip
import json
import os
import subprocess
import sys

import gpuprof
import pytest

pytestmark = pytest.mark.gpu
SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "scripts")


def test_lightning_fit_on_one_gpu_records_5_steps_with_cuda(tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    pytest.importorskip("lightning", reason="Lightning is not installed")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device (CPU-only build?)")
    out = tmp_path / "out"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuprof",
            "run",
            "--active",
            "5",
            "--output",
            str(out),
            os.path.join(SCRIPTS, "lightning_fit.py"),
            "--accelerator",
            "gpu",
            "--max-steps",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(r.stdout[-8000:])
    print(r.stderr[-4000:], file=sys.stderr)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "fit done: 8 optimizer steps" in r.stdout
    assert "steps: 5 recorded, 8 found (step boundaries: torch optimizer steps: AdamW)" in r.stdout
    table = r.stdout[r.stdout.index("fit done") : r.stdout.index("steps: 5 recorded")]
    assert "Self CUDA" in table and "CUDA total" in table and "Self CUDA time total" in table

    (saved,) = glob.glob(str(out / "*.gpuprof"))
    prof = gpuprof.load(saved)
    assert prof.results.cuda["active"], prof.results.cuda
    steps = prof.steps()
    assert len(steps) == 5
    assert (steps["gpu_busy_ns"] > 0).all(), steps  # every step ran kernels
    kernels = prof.kernels()
    assert len(kernels) and kernels["calls"].sum() > 0
    ops = prof.ops()
    assert ops["cuda_total_ns"].max() > 0  # kernels joined to the Python calls that launched them

    (path,) = glob.glob(str(out / "*.pt.trace.json.gz"))
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    cats = {e.get("cat") for e in doc["traceEvents"]}
    assert {"kernel", "python_function"} <= cats, cats
    assert len(glob.glob(str(out / "*.stacks.txt"))) == 1
