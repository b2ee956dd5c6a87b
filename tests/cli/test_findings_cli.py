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
