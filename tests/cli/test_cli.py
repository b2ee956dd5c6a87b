"""python -m gpuprof in subprocesses: run, report, demo, errors."""

import os
import subprocess
import sys

import pytest

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "scripts")
PYTHONPATH = os.pathsep.join(p for p in [os.environ.get("PYTHONPATH", ""), SCRIPTS] if p)


def gpuprof(*args, cwd=None, timeout=120):
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    return subprocess.run([sys.executable, "-m", "gpuprof", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=env)


def test_run_prints_table_and_diagnosis_and_keeps_exit_code():
    r = gpuprof("run", "--no-cuda", os.path.join(SCRIPTS, "cpu_train.py"), "5", "3")
    assert r.returncode == 3, r.stderr
    assert "done" in r.stdout  # the program's own output is untouched
    # the hot rows (train_step's own self time is too small to be sure of a top-20 place)
    assert "<genexpr> (cpu_train.py:11)" in r.stderr
    assert "Self CPU time total" in r.stderr
    assert "gpuprof diagnosis" in r.stderr


def test_run_lets_exceptions_through():
    r = gpuprof("run", "--no-cuda", os.path.join(SCRIPTS, "raises.py"))
    assert r.returncode == 1
    assert "ValueError: boom from the profiled program" in r.stderr
    assert "(raises.py:" in r.stderr  # the profile is still reported


def test_run_step_fn_detects_steps_and_writes_outputs(tmp_path):
    out = tmp_path / "out"
    r = gpuprof("run", "--no-cuda", "--step-fn", "steps_module:train_step", "--output", str(out),
                os.path.join(SCRIPTS, "uses_steps_module.py"))
    assert r.returncode == 0, r.stderr
    assert "steps detected: 7 (step boundaries: steps_module:train_step)" in r.stderr
    files = sorted(os.listdir(out))
    assert any(f.endswith(".pt.trace.json.gz") for f in files), files
    saved = [f for f in files if f.endswith(".gpuprof")]
    assert saved
    rep = gpuprof("report", str(out / saved[0]), "--steps")
    assert rep.returncode == 0, rep.stderr
    assert len([ln for ln in rep.stdout.splitlines()[1:] if ln.strip()]) >= 7
    rep = gpuprof("report", str(out / saved[0]), "--sort", "count", "--limit", "5")
    assert rep.returncode == 0 and "# of Calls" in rep.stdout


def test_run_module_with_schedule():
    r = gpuprof("run", "--no-cuda", "--step-fn", "steps_module:train_step", "--wait", "1",
                "--warmup", "1", "--active", "3", "-m", "uses_steps_module")
    assert r.returncode == 0, r.stderr
    assert "steps detected: 7" in r.stderr


@pytest.mark.parametrize("args, message", [
    (("run", "no_such_script.py"), "no such script"),
    (("run", "-m", "no_such_module_xyz"), "no module named"),
    (("report", "/nonexistent/file.gpuprof"), "cannot read"),
    (("run", "--delay", "1", "x.py"), "--delay and --duration go together"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = gpuprof(*args)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], r.stderr


def test_unknown_option_exits_2():
    r = gpuprof("run", "--frobnicate", "x.py")
    assert r.returncode == 2


def test_demo_runs():
    r = gpuprof("demo", timeout=300)
    assert r.returncode == 0, r.stderr
    assert "gpuprof diagnosis" in r.stdout
    assert "augment (training.py:" in r.stdout or "forward" in r.stdout


def test_report_reads_an_exported_trace(tmp_path):
    out = tmp_path / "out"
    r = gpuprof("run", "--no-cuda", "--output", str(out), os.path.join(SCRIPTS, "cpu_train.py"),
                "3")
    assert r.returncode == 0, r.stderr
    trace = [f for f in os.listdir(out) if f.endswith(".pt.trace.json.gz")][0]
    rep = gpuprof("report", str(out / trace))
    assert rep.returncode == 0, rep.stderr
    assert "train_step" in rep.stdout and "Host events" in rep.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    rep = gpuprof("report", str(bad))
    assert rep.returncode == 2 and "not a Chrome trace" in rep.stderr


def test_run_trace_min_us_thins_the_trace(tmp_path):
    import gzip
    import json

    out = tmp_path / "out"
    r = gpuprof("run", "--no-cuda", "--trace-min-us", "5", "--output", str(out),
                os.path.join(SCRIPTS, "cpu_train.py"), "3")
    assert r.returncode == 0, r.stderr
    trace = [f for f in os.listdir(out) if f.endswith(".pt.trace.json.gz")][0]
    with gzip.open(out / trace, "rt") as f:
        doc = json.load(f)
    assert doc["gpuprof_min_duration_us"] == 5.0 and doc["gpuprof_omitted_calls"] > 0
    assert all(e["dur"] >= 5 for e in doc["traceEvents"] if e.get("cat") == "python_function")
    bad = gpuprof("run", "--no-cuda", "--trace-min-us", "-1", os.path.join(SCRIPTS, "cpu_train.py"))
    assert bad.returncode == 2 and "--trace-min-us must be >= 0" in bad.stderr


def test_run_subprocesses_shows_the_pool_workers(tmp_path):
    """--subprocesses: the fork pool's workers are profiled; their rows are printed
    (one line per process, then the workers' ops summed) and kept in the outputs."""
    out = tmp_path / "out"
    script = os.path.join(SCRIPTS, "pool_workers.py")
    r = gpuprof("run", "--no-cuda", "--subprocesses", "--limit", "1000", "--output", str(out),
                script, "20")
    assert r.returncode == 0, r.stderr
    assert "done 2470" in r.stdout
    err = r.stderr
    assert "processes: main + 2 workers" in err
    lines = err.splitlines()
    workers = [ln for ln in lines if "ForkPoolWorker-" in ln and "worker, fork" in ln]
    assert len(workers) == 2, err
    assert "child processes (2), summed" in err
    # the workers' table: slow_item ran once per item, in the workers only
    table = err[err.index("child processes (2), summed"):]
    row = [ln for ln in table.splitlines() if ln.startswith("slow_item (pool_workers.py:")]
    assert row and row[0].split()[-1] == "20", table
    main_table = err[:err.index("processes: main")]
    assert "slow_item (pool_workers.py:" not in main_table
    # the saved profile keeps the workers; the trace has a lane per worker
    saved = [f for f in os.listdir(out) if f.endswith(".gpuprof")]
    import gpuprof as gp

    loaded = gp.load(out / saved[0])
    w = loaded.processes()
    assert list(w["role"]).count("worker") == 2
    ops = loaded.ops(pid="workers")
    assert int(ops["calls"][ops["name"] == "slow_item"].sum()) == 20


def test_run_without_subprocesses_prints_no_process_lines():
    r = gpuprof("run", "--no-cuda", os.path.join(SCRIPTS, "pool_workers.py"), "4")
    assert r.returncode == 0, r.stderr
    assert "processes: main" not in r.stderr
    assert "slow_item (pool_workers.py:" not in r.stderr


# -- html report (docs/report.md) --
def html_data(path):
    import json
    import re

    text = open(path, encoding="utf-8").read()
    m = re.search(r'<script type="application/json" id="gpuprof-data">(.*?)</script>', text, re.S)
    return json.loads(m.group(1))


def test_run_output_writes_report_html_beside_the_trace_and_report_and_compare_write_pages(
        tmp_path):
    out = tmp_path / "out"
    r = gpuprof("run", "--no-cuda", "--step-fn", "steps_module:train_step", "--output", str(out),
                os.path.join(SCRIPTS, "uses_steps_module.py"))
    assert r.returncode == 0, r.stderr
    assert f"gpuprof: wrote {out / 'report.html'}" in r.stderr
    data = html_data(out / "report.html")
    trace = [f for f in os.listdir(out) if f.endswith(".pt.trace.json.gz")][0]
    assert data["trace"] == {"href": trace, "name": trace, "exists": True}
    saved = str(out / [f for f in os.listdir(out) if f.endswith(".gpuprof")][0])
    import gpuprof as gp

    # 7 detected steps, and the last one: from the last step() to the end of the program
    assert data["summary"]["steps"] == len(gp.load(saved).steps()) == 8

    rep = gpuprof("report", saved, "--html", str(tmp_path / "r.html"))
    assert rep.returncode == 0 and rep.stdout == "", rep.stderr
    assert html_data(tmp_path / "r.html")["ops"]["rows"] == data["ops"]["rows"]

    cmp = gpuprof("compare", saved, saved, "--html", str(tmp_path / "c.html"))
    assert cmp.returncode == 0 and cmp.stdout == "", cmp.stderr
    c = html_data(tmp_path / "c.html")
    assert c["page"] == "compare" and c["speedup"] == 1.0

    for args in (("report", saved, "--html", str(tmp_path / "missing" / "r.html")),
                 ("compare", saved, saved, "--html", str(tmp_path))):
        bad = gpuprof(*args)
        lines = [ln for ln in bad.stderr.splitlines() if ln.strip()]
        assert bad.returncode == 2 and len(lines) == 1 and "--html" in lines[0], bad.stderr
    bad = gpuprof("report", str(out / trace), "--html", str(tmp_path / "t.html"))
    assert bad.returncode == 2 and "needs a saved profile" in bad.stderr
# -- end html report --
