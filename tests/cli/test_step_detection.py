"""Steps found in unmodified training scripts: PyTorch optimizers, Lightning and Hugging
Face's Trainer, under ``python -m gpuprof run --active 3``; and what ``run`` records
by default (the steps after the start-up) and with ``--whole-run``.

A step is an optimizer step: each recorded step holds exactly one optimizer step
and, with gradient accumulation, that many backward passes (counted as calls of
autograd's ``run_backward`` in the saved profile).
"""

import pytest
from test_cli import gpuprof, saved, script, trace

torch = pytest.importorskip("torch", reason="PyTorch is not installed (CI installs it)")


def run_active_3(tmp_path, target, *args):
    out = tmp_path / "out"
    r = gpuprof(
        "run",
        "--no-cuda",
        "--active",
        "3",
        "--output",
        str(out),
        script(target),
        *args,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return r, saved(out)


def calls(loaded, name, kind="c", file=""):
    """Calls of the ops of ``kind`` whose name ends with ``name`` (and file with ``file``)."""
    ops = loaded.ops()
    return int(
        sum(
            o["calls"]
            for o in ops
            if o["kind"] == kind
            and str(o["name"]).endswith(name)
            and str(o["file"] or "").endswith(file)
        )
    )


@pytest.mark.parametrize(
    "kind, name",
    [
        ("sgd", "SGD"),
        ("adamw", "AdamW"),
        ("adamw-foreach", "AdamW"),
        ("adamw-fused", "AdamW"),
        ("lookahead", "Lookahead"),
    ],
)
def test_every_optimizer_step_is_a_step(kind, name, tmp_path):
    r, loaded = run_active_3(tmp_path, "torch_loop.py", kind, "12")
    assert "trained: 12 iterations, 12 optimizer steps" in r.stdout
    assert (
        f"steps: 3 recorded, 12 found (step boundaries: torch optimizer steps: {name})" in r.stdout
    )
    assert len(loaded.steps()) == 3
    assert calls(loaded, "run_backward") == 3


def test_gradient_accumulation_a_step_is_an_optimizer_step(tmp_path):
    r, loaded = run_active_3(tmp_path, "torch_loop.py", "adamw", "20", "4")
    assert "trained: 20 iterations, 5 optimizer steps" in r.stdout
    assert "steps: 3 recorded, 5 found" in r.stdout
    assert len(loaded.steps()) == 3
    assert calls(loaded, "run_backward") == 3 * 4


def test_two_optimizers_stepping_each_iteration_make_one_step(tmp_path):
    r, loaded = run_active_3(tmp_path, "torch_gan.py", "10")
    assert "gan done: 10 iterations" in r.stdout
    assert "steps: 3 recorded, 10 found (step boundaries: torch optimizer steps: SGD)" in r.stdout
    assert calls(loaded, "run_backward") == 3 * 2  # the discriminator's and the generator's


def test_lightning_fit(tmp_path):
    pytest.importorskip("lightning", reason="Lightning is not installed (CI installs it)")
    r, loaded = run_active_3(tmp_path, "lightning_fit.py", "--max-steps", "8", "--accumulate", "2")
    assert "fit done: 8 optimizer steps" in r.stdout
    assert "steps: 3 recorded, 8 found (step boundaries: torch optimizer steps: AdamW)" in r.stdout
    assert len(loaded.steps()) == 3
    assert calls(loaded, "run_backward") == 3 * 2
    assert calls(loaded, "training_step", "python", "lightning_fit.py") == 3 * 2


def test_hugging_face_trainer(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("accelerate", reason="accelerate (needed by Trainer) is not installed")
    r, loaded = run_active_3(tmp_path, "hf_trainer.py", "8", "2")
    assert "train done: 8 optimizer steps" in r.stdout
    assert "steps: 3 recorded, 8 found (step boundaries: torch optimizer steps: AdamW)" in r.stdout
    assert len(loaded.steps()) == 3
    assert calls(loaded, "run_backward") == 3 * 2


def test_run_by_default_leaves_the_start_up_out_and_says_so(tmp_path):
    """No flag: the imports, the model build and the first step are a window of their own,
    left out of the table, the steps and the files; the report's first line says so."""
    out = tmp_path / "out"
    r = gpuprof("run", "--no-cuda", "-o", str(out), script("torch_loop.py"), "adamw", "12")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    note = next(i for i, ln in enumerate(lines) if ln.startswith("gpuprof: start-up"))
    assert lines[note - 1].startswith("trained: 12 iterations")  # the report's first line
    assert lines[note].startswith("gpuprof: start-up not in these results: the ")
    assert lines[note].endswith(" of it imports; --whole-run includes it")
    assert "steps: 11 recorded after the start-up, 12 found" in r.stdout
    table = "\n".join(
        lines[note + 1 : next(i for i, ln in enumerate(lines) if ln.startswith("steps: "))]
    )
    for importing in ("marshal.loads", "_imp.create_dynamic", "_find_and_load"):
        assert importing not in table
    loaded = saved(out)
    assert loaded.steps()["step"].tolist() == list(range(1, 12))
    assert calls(loaded, "run_backward") == 11
    assert calls(loaded, "_find_and_load", "python") == 0  # torch was imported before
    startup = trace(out)["gpuprof_startup"]
    assert startup["in_results"] is False and startup["import_ns"] > 0
    assert startup["start_ns"] < startup["end_ns"] <= loaded.results.window_bounds()[0]
    assert loaded.steps()["start_ns"][0] >= startup["end_ns"]


@pytest.mark.slow  # 20 s: the whole of import torch is recorded and written out
def test_run_whole_run_records_the_start_up_too(tmp_path):
    out = tmp_path / "out"
    r = gpuprof(
        "run", "--no-cuda", "--whole-run", "-o", str(out), script("torch_loop.py"), "sgd", "5"
    )
    assert r.returncode == 0, r.stderr
    assert "start-up" not in r.stdout
    assert "steps: 5 recorded, 5 found" in r.stdout
    loaded = saved(out)
    assert loaded.steps()["step"].tolist() == list(range(5))
    assert calls(loaded, "_find_and_load", "python") > 0  # import torch is in the results
    assert "gpuprof_startup" not in trace(out)


def test_a_script_that_never_steps_an_optimizer(tmp_path):
    """PyTorch is used but nothing steps: the whole run is recorded, and the end says why
    there are no steps and which flags would find them."""
    prog = tmp_path / "infer.py"
    prog.write_text("import torch\nm = torch.nn.Linear(4, 4)\nprint(m(torch.ones(2, 4)).sum())\n")
    out = tmp_path / "out"
    r = gpuprof("run", "--no-cuda", "-o", str(out), str(prog))
    assert r.returncode == 0, r.stderr
    assert (
        "steps: 0 recorded, 0 found (step boundaries: torch optimizer steps: none ran)" in r.stdout
    )
    assert "start-up" not in r.stdout  # no step ended it: the results are the whole run
    assert calls(saved(out), "_find_and_load", "python") > 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("gpuprof: no steps found (no torch optimizer step ran)")
    assert "--step-fn module:function" in last and "--delay S --duration S" in last


def test_a_second_optimizer_takes_over_when_the_first_stops(tmp_path):
    """Fine-tuning in two phases, the first optimizer still alive: the second one's steps
    count once it has stepped twice without the first (its first two make one step)."""
    prog = tmp_path / "phases.py"
    prog.write_text(
        "import torch\n"
        "m = torch.nn.Linear(4, 1)\n"
        "first = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "second = torch.optim.AdamW(m.parameters(), lr=0.1)\n"
        "for opt, n in ((first, 5), (second, 6)):\n"
        "    for _ in range(n):\n"
        "        m(torch.ones(2, 4)).sum().backward()\n"
        "        opt.step()\n"
        "        opt.zero_grad()\n"
    )
    r = gpuprof("run", "--no-cuda", str(prog))
    assert r.returncode == 0, r.stderr
    assert "10 found (step boundaries: torch optimizer steps: SGD, AdamW)" in r.stdout
