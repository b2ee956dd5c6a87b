"""The examples, run as users run them: examples/slow_training.py's four planted problems
are found and compare sees them go; real models (Hugging Face GPT-2, torchvision's
ResNet-18 lab) get the findings docs/diagnosis.md shows, and lose them when fixed."""

import os
import subprocess
import sys

import gpuprof
import pytest
from gpu_helpers import share_under

pytestmark = pytest.mark.gpu
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def _run(script, out, *args):
    """Run an example with --save out; its printed output (and the diagnosis in it)."""
    pytest.importorskip("torch")
    r = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, script), "--save", out, *args],
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


def _gpt2(tmp_path, *args):
    pytest.importorskip("transformers")
    path = str(tmp_path / "gpt2.gpuprof")
    _run("gpt2_train.py", path, *args)
    prof = gpuprof.load(path)
    _attributed_unless_launched_before(prof)
    return prof


def _attributed_unless_launched_before(prof):
    """Every kernel launched in the window has its Python op. Kernels the GPU still ran
    from before the window (it runs behind the host when it is the bottleneck) have no
    launch in it: they all come before the window's own (CUPTI's correlation ids grow)."""
    ev = prof.gpu_events()
    k = ev[ev["kind"] == "kernel"]
    lost = k[k["op"] < 0]
    print(f"{len(lost)} of {len(k)} kernels unattributed: {prof.results.attributed_gpu_fraction}")
    if len(lost):
        first_own = int(k[k["op"] >= 0]["correlation"].min())
        late = lost[lost["correlation"] > first_own]
        assert not len(late), (first_own, late[["name", "correlation", "thread", "stream"]][:20])


def test_gpt2_at_batch_8_is_launch_bound(tmp_path):
    prof = _gpt2(tmp_path)
    assert "launch_bound" in prof.diagnose().kinds()
    assert "no_mixed_precision" not in prof.diagnose().kinds()  # bf16 autocast


def test_gpt2_with_32x_the_work_per_launch_is_not(tmp_path):
    prof = _gpt2(tmp_path, "--batch", "64", "--seq", "512", "--steps", "12")
    assert "launch_bound" not in prof.diagnose().kinds()


def test_gpt2_compiled_with_cuda_graphs_is_not_and_stays_the_users(tmp_path):
    prof = _gpt2(tmp_path, "--compile", "reduce-overhead")
    assert "launch_bound" not in prof.diagnose().kinds()
    share, kernels = share_under(prof, "train_step")
    assert (kernels["graph_id"] != 0).mean() > 0.5, "the step's kernels ran outside CUDA graphs"
    assert share >= 0.95, share


@pytest.mark.parametrize("fixed", [False, True], ids=["lab", "fixed"])
def test_resnet18_lab(tmp_path, fixed):
    pytest.importorskip("torchvision")
    path = str(tmp_path / "resnet.gpuprof")
    _run("resnet_lab.py", path, *(["--fixed"] if fixed else []))
    d = gpuprof.load(path).diagnose()
    if fixed:
        assert not {"no_mixed_precision", "sync_point"} & set(d.kinds()), str(d)
        return
    assert {"data_stall", "sync_point", "no_mixed_precision"} <= set(d.kinds()), str(d)
    precision = d[d.kinds().index("no_mixed_precision")]
    assert precision.evidence["convolution_ns"] > 0.5 * precision.evidence["matrix_ns"]
    for f in d:  # the user's own line, with the library's beside it where there is one
        if f.location:
            user_line = f.location.split(" (in ")[0]
            assert os.path.basename(user_line).startswith("resnet_lab.py:"), (f.kind, f.location)
