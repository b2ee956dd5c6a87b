"""The files `python -m gpuprof run --output DIR` writes stay bounded: the trace keeps a
budget of events (the first and the last steps) and says what it left out, the stacks
hold one line per call path, report.html draws a bounded number of steps; and Ctrl-C
during the program still writes every file, readable, within seconds."""

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import gpuprof as gp
from test_cli import PYTHONPATH, gpuprof, saved, script, trace

STEP_FN = ["--step-fn", "__main__:train_step"]


def wrote(stderr):
    return [ln.removeprefix("gpuprof: wrote ") for ln in stderr.splitlines() if "wrote " in ln]


def html_steps(out_dir):
    text = open(os.path.join(out_dir, "report.html"), encoding="utf-8").read()
    m = re.search(r'<script type="application/json" id="gpuprof-data">(.*?)</script>', text, re.S)
    return json.loads(m.group(1))["steps"]


def test_a_long_run_writes_files_within_the_budget_and_says_what_it_left_out(tmp_path):
    out = tmp_path / "out"
    r = gpuprof(
        "run",
        "--no-cuda",
        *STEP_FN,
        "--trace-max-events",
        "20000",
        "-o",
        str(out),
        script("long_loop.py"),
        "6000",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert len(wrote(r.stderr)) == 4
    (line,) = [ln for ln in r.stderr.splitlines() if "the trace keeps" in ln]
    assert "(--trace-max-events 20,000): it leaves out steps " in line
    assert line.endswith("--trace-max-events 0 writes every event")
    # the trace: within the budget, the first and the last steps, the rest counted
    doc = trace(out)
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(events) <= 20_000 + 50
    first, last = doc["gpuprof_omitted_steps"]
    assert 1 < first < last < 5999 and doc["gpuprof_omitted_events"] > 20_000
    steps = {int(e["name"][13:]) for e in events if e["name"].startswith("ProfilerStep#")}
    assert min(steps) == 1 and max(steps) == 5999 and not steps & set(range(first, last + 1))
    # the saved profile and the tables count every step (the first one is the start-up)
    loaded = saved(out)
    assert len(loaded.steps()) == 5999
    assert "5999 recorded after the start-up, 6000 found" in r.stdout
    # the stacks: one line per call path, whatever the number of steps
    stacks = open(glob.glob(str(out / "*.stacks.txt"))[0], encoding="utf-8").read().splitlines()
    paths = [ln.rsplit(" ", 1)[0] for ln in stacks]
    assert len(paths) == len(set(paths)) <= len(loaded.call_tree())
    assert len(stacks) < 50
    # the page draws at most STEP_BARS (+ the first and last) steps, and sums them all
    st = html_steps(out)
    assert len(st["breakdown"]["step"]) <= gp.exporters.html.STEP_BARS + 2
    assert st["total_steps"] == 5999
    rep = gpuprof("report", glob.glob(str(out / "*.gpuprof"))[0], "--steps")
    assert rep.returncode == 0 and "5999 steps, mean" in rep.stdout


def test_trace_max_events_0_writes_every_event(tmp_path):
    out = tmp_path / "out"
    r = gpuprof(
        "run",
        "--no-cuda",
        *STEP_FN,
        "--trace-max-events",
        "0",
        "-o",
        str(out),
        script("long_loop.py"),
        "300",
    )
    assert r.returncode == 0, r.stderr
    assert "the trace keeps" not in r.stderr
    doc = trace(out)
    assert "gpuprof_max_events" not in doc
    steps = {e["name"] for e in doc["traceEvents"] if e["name"].startswith("ProfilerStep#")}
    assert len(steps) == 299


def test_ctrl_c_during_the_program_writes_every_file_readable(tmp_path):
    """SIGINT once the loop runs: the program gets KeyboardInterrupt, gpuprof writes the
    four files and exits 130; `report` reads the saved profile."""
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuprof", "run", "--no-cuda", *STEP_FN, "-o", str(out)]
        + [script("long_loop.py"), "1000000000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=PYTHONPATH),
        # the default disposition, even where this test runs with SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout.readline() == "stepping\n"
        time.sleep(3)  # tens of thousands of steps recorded
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=240)  # generous: the files take seconds
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "KeyboardInterrupt" in err and "done" not in rest
    files = wrote(err)
    assert len(files) == 4 and all(os.path.getsize(f) > 0 for f in files), err
    assert not glob.glob(str(out / "*.tmp"))
    assert "Self CPU time total" in rest  # the report is printed too
    assert trace(out)["traceEvents"]
    rep = gpuprof("report", glob.glob(str(out / "*.gpuprof"))[0])
    assert rep.returncode == 0 and "train_step" in rep.stdout, rep.stderr
