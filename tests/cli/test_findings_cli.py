"""`python -m gpuprof run` on programs that are not GPU training loops (issue 32): no
data-stall finding and no "0 recorded steps, N per step" line in the printed report or
the HTML report; the CPU's hot paths with the script's lines instead."""

import os

import pytest
from test_cli import gpuprof, html_data, script


def line_no(name, marker):
    """The line of the script `name` that holds `marker`."""
    with open(script(name), encoding="utf-8") as f:
        (n,) = [i for i, s in enumerate(f, 1) if marker in s]
    return n


def diagnosis(stdout):
    return stdout[stdout.index("gpuprof diagnosis") :]


def assert_no_step_figures(text):
    assert "Input pipeline stall" not in text and "DataLoader" not in text, text
    assert "recorded steps" not in text and "per step" not in text, text
    assert "of step time" not in text, text


@pytest.mark.parametrize(
    "name, marker",
    [("word_count.py", "# corpus"), ("hash_pool.py", "def digest"), ("cpu_sum.py", "# sum line")],
)
def test_run_on_a_program_without_steps_names_its_hot_lines(name, marker, tmp_path):
    # given a program that is no training loop, run as it is
    out = tmp_path / "out"
    r = gpuprof("run", "--no-cuda", "--output", str(out), script(name))
    assert r.returncode == 0, r.stderr
    text = diagnosis(r.stdout)
    # then no data stall and no step figures
    assert_no_step_figures(text)
    assert "No steps recorded: " in text and "No bottleneck found" not in text
    assert "GPU training loops" in text
    # but the CPU's hot paths, with the script's own line among them
    assert "% of CPU time] CPU hot path: " in text, text
    assert f"{name}:{line_no(name, marker)}" in text, text
    # and the HTML report says the same
    data = html_data(out / "report.html")["diagnosis"]
    assert_no_step_figures(" ".join(data["headline"]))
    kinds = [f["kind"] for f in data["findings"]]
    assert "data_stall" not in kinds and "cpu_hot_path" in kinds
    assert {f["share_of"] for f in data["findings"]} <= {"CPU time", "recorded time"}
    assert data["text"] in r.stdout


def test_the_page_builds_the_diagnosis_header_from_the_headline():
    # the page's script prints Diagnosis.headline(), not a step line of its own
    import gpuprof as gp

    js = os.path.join(os.path.dirname(gp.__file__), "exporters", "html_assets", "report.js")
    page = open(js, encoding="utf-8").read()
    assert "d.headline" in page and '" recorded steps, "' not in page


# -- waiting is not CPU time ------------------------------------------------------------------

WAITS = ("time.sleep", "_thread.lock.acquire", "_thread.lock.__enter__", "select.", "posix.read")


def table_names(stdout):
    lines = stdout.split("\n")
    rules = [i for i, line in enumerate(lines) if line and set(line) == {"-"}]
    return [line.split("  ")[0] for line in lines[rules[1] + 1 : rules[2]]]


def idle_line(stdout):
    (line,) = [ln for ln in stdout.splitlines() if ln.startswith("Idle: ")]
    return line


def test_run_leaves_a_sleeping_thread_out_of_the_table_and_idle_shows_it():
    r = gpuprof("run", "--no-cuda", script("sleepy_poller.py"))
    assert r.returncode == 0, r.stderr
    names = table_names(r.stdout)
    assert names[0].startswith(("crunch.<locals>.<genexpr>", "sum")), r.stdout
    assert not [n for n in names if n.startswith(WAITS)], r.stdout
    line = idle_line(r.stdout)
    assert "time.sleep" in line and line.endswith("key_averages(idle=True) shows it"), line
    # the hot path is the work line, not the sleep
    text = diagnosis(r.stdout)
    assert f"sleepy_poller.py:{line_no('sleepy_poller.py', '# work line')}" in text, text
    assert "time.sleep" not in text, text
    # --idle: the waits are rows again
    r = gpuprof("run", "--no-cuda", "--idle", script("sleepy_poller.py"))
    assert r.returncode == 0, r.stderr
    assert "time.sleep" in table_names(r.stdout), r.stdout
    assert "(idle=True)" in idle_line(r.stdout)


def test_run_dataloader_workers_top_row_is_work_not_the_feeders_waiting():
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
    r = gpuprof("run", "--no-cuda", "--limit", "40", script("torch_workers.py"), "2", timeout=300)
    assert r.returncode == 0, r.stderr
    names = table_names(r.stdout)
    assert not [n for n in names if n.startswith(WAITS)], r.stdout
    assert not names[0].startswith(("Condition.wait", "Thread.join", "Event.wait")), r.stdout
    assert "_thread.lock.acquire" in idle_line(r.stdout), r.stdout
    r = gpuprof(
        "run", "--no-cuda", "--idle", "--limit", "40", script("torch_workers.py"), "2", timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert "_thread.lock.acquire" in table_names(r.stdout), r.stdout


def test_idle_with_on_demand_is_refused():
    r = gpuprof("run", "--on-demand", "--idle", script("sleepy_poller.py"))
    assert r.returncode == 2
    assert "--idle cannot be combined with --on-demand" in r.stderr
