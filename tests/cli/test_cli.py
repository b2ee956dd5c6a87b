"""python -m gpuprof in subprocesses: run, report, compare, demo, help and bad input."""

import glob
import gzip
import json
import os
import re
import subprocess
import sys

import gpuprof as gp
import pytest

SCRIPTS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "scripts"))
PYTHONPATH = os.pathsep.join(p for p in [os.environ.get("PYTHONPATH", ""), SCRIPTS] if p)
PACKAGE = os.path.dirname(os.path.abspath(gp.__file__)) + os.sep


def gpuprof(*args, cwd=None, timeout=180):
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    return subprocess.run(
        [sys.executable, "-m", "gpuprof", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


def script(name):
    return os.path.join(SCRIPTS, name)


def saved(out_dir):
    """The profile `run --output out_dir` saved, loaded."""
    (path,) = glob.glob(os.path.join(str(out_dir), "*.gpuprof"))
    return gp.load(path)


def trace(out_dir):
    (path,) = glob.glob(os.path.join(str(out_dir), "*.pt.trace.json.gz"))
    with gzip.open(path, "rt") as f:
        return json.load(f)


def error_line(r):
    """The one line a bad argument gets (asserts there is exactly one)."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


# -- run: output, exit codes, files ------------------------------------------------------------
def test_run_prints_table_and_diagnosis_on_stdout_after_the_program():
    r = gpuprof("run", "--no-cuda", script("cpu_train.py"), "5", "3")
    assert r.returncode == 3, r.stderr
    out = r.stdout
    # the program's own output first, then the report; stderr keeps only progress/warnings
    assert out.index("done") < out.index("Self CPU time total") < out.index("gpuprof diagnosis")
    # the hot rows (train_step's own self time is too small to be sure of a top-20 place)
    assert "<genexpr> (cpu_train.py:11)" in out
    assert "Self CPU time total" not in r.stderr and "gpuprof diagnosis" not in r.stderr


def test_run_report_can_be_redirected_to_a_file(tmp_path):
    with open(tmp_path / "out.txt", "w") as f:
        r = subprocess.run(
            [sys.executable, "-m", "gpuprof", "run", "--no-cuda", script("cpu_train.py"), "3"],
            stdout=f,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "out.txt").read_text()
    assert text.startswith("done") and "Self CPU time total" in text and "steps: " in text


def test_run_lets_exceptions_through():
    r = gpuprof("run", "--no-cuda", script("raises.py"))
    assert r.returncode == 1
    assert "ValueError: boom from the profiled program" in r.stderr
    assert 'File "' + script("raises.py") + '", line 9, in <module>' in r.stderr
    assert PACKAGE not in r.stderr  # no frame of gpuprof's in the traceback
    assert "(raises.py:" in r.stdout  # the profile is still reported


def test_run_passes_every_argument_after_the_target_to_the_program(tmp_path):
    marker = tmp_path / "ran"
    r = gpuprof(
        "run",
        "--no-cuda",
        "--limit",
        "3",
        script("leaves_marker.py"),
        str(marker),
        "--limit",
        "-5",
        "--",
        "-m",
        "x",
    )
    assert r.returncode == 0, r.stderr
    assert f"argv: ['{marker}', '--limit', '-5', '--', '-m', 'x']" in r.stdout


def test_run_writes_the_files_before_printing(tmp_path):
    """The program closes its stdout: printing the report fails, the files are there."""
    out = tmp_path / "out"
    r = gpuprof("run", "--no-cuda", "--output", str(out), script("closes_stdout.py"))
    assert r.returncode == 1
    assert "gpuprof: error: printing the report failed" in r.stderr
    loaded = saved(out)
    assert "work" in set(loaded.ops()["name"])
    assert trace(out)["traceEvents"]


def test_run_step_fn_of_an_imported_module_and_outputs(tmp_path):
    out = tmp_path / "out"
    r = gpuprof(
        "run",
        "--no-cuda",
        "--step-fn",
        "steps_module:train_step",
        "--output",
        str(out),
        script("uses_steps_module.py"),
    )
    assert r.returncode == 0, r.stderr
    assert "6 recorded after the start-up, 7 found (step boundaries: returns of " in r.stdout
    # the first step ends the start-up; the tail after the last step is no step
    assert saved(out).steps()["step"].tolist() == [1, 2, 3, 4, 5, 6]
    wrote = [ln for ln in r.stderr.splitlines() if ln.startswith("gpuprof: wrote ")]
    assert len(wrote) == 4  # trace, saved profile, stacks, report.html
    rep = gpuprof("report", glob.glob(str(out / "*.gpuprof"))[0], "--steps")
    assert rep.returncode == 0, rep.stderr
    assert len([ln for ln in rep.stdout.splitlines()[1:] if ln.strip()]) >= 7
    rep = gpuprof("report", glob.glob(str(out / "*.gpuprof"))[0], "--sort", "count", "--limit", "5")
    assert rep.returncode == 0 and "# of Calls" in rep.stdout


def test_run_module_with_schedule():
    r = gpuprof(
        "run",
        "--no-cuda",
        "--step-fn",
        "steps_module:train_step",
        "--wait",
        "1",
        "--warmup",
        "1",
        "--active",
        "3",
        "-m",
        "uses_steps_module",
    )
    assert r.returncode == 0, r.stderr
    assert "steps: 3 recorded, 7 found" in r.stdout


@pytest.mark.parametrize("spec", ["__main__:train_step", "cpu_train:train_step"])
def test_step_fn_of_the_script_itself(spec, tmp_path):
    out = tmp_path / "out"
    r = gpuprof(
        "run",
        "--no-cuda",
        "--step-fn",
        spec,
        "--active",
        "3",
        "--output",
        str(out),
        script("cpu_train.py"),
        "8",
    )
    assert r.returncode == 0, r.stderr
    assert f"steps: 3 recorded, 8 found (step boundaries: returns of {spec})" in r.stdout
    ops = saved(out).ops()
    assert len(saved(out).steps()) == 3
    assert ops["calls"][ops["name"] == "train_step"].sum() == 3  # one per recorded step
    assert "__gpuprof_step_fn__" not in r.stdout


@pytest.mark.parametrize("spec", ["__main__:Trainer.step", "class_loop:Trainer.load"])
def test_step_fn_of_a_method_or_staticmethod_of_the_script(spec):
    r = gpuprof(
        "run", "--no-cuda", "--step-fn", spec, "--active", "3", script("class_loop.py"), "8"
    )
    assert r.returncode == 0, r.stderr
    assert "class loop done" in r.stdout
    assert f"steps: 3 recorded, 8 found (step boundaries: returns of {spec})" in r.stdout


@pytest.mark.parametrize(
    "spec, target, why",
    [
        ("nosuchmodule:fn", "cpu_train.py", "the program never imported nosuchmodule"),
        ("steps_module:nope", "uses_steps_module.py", "module steps_module has no attribute nope"),
        ("__main__:nope", "cpu_train.py", "the script defines no nope at its top level"),
        ("__main__:main", "leaves_marker.py", "the script defines no main"),
        ("steps_module:run", "cpu_train.py", "the program never imported steps_module"),
    ],
)
def test_a_step_fn_that_never_ran_is_named_at_the_end(spec, target, why, tmp_path):
    args = [str(tmp_path / "m")] if target == "leaves_marker.py" else ["2"]
    r = gpuprof("run", "--no-cuda", "--step-fn", spec, script(target), *args)
    assert r.returncode == 0, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"gpuprof: --step-fn {spec} never ran: {why}"), r.stderr
    assert "--delay S --duration S" in last
    assert "prof.step()" not in r.stdout + r.stderr


def test_no_steps_under_active_names_the_flags_that_help():
    r = gpuprof("run", "--no-cuda", "--active", "3", script("cpu_train.py"), "3")
    assert r.returncode == 0, r.stderr
    assert "done" in r.stdout and "Self CPU" not in r.stdout
    line = error_line(r)
    assert line.startswith("gpuprof: nothing recorded: --active counts steps and none were found")
    assert "--step-fn module:function" in line and "--delay S --duration S" in line
    assert "prof.step()" not in line


def test_a_schedule_longer_than_the_program_says_so():
    r = gpuprof(
        "run",
        "--no-cuda",
        "--step-fn",
        "__main__:train_step",
        "--warmup",
        "5",
        "--active",
        "2",
        script("cpu_train.py"),
        "3",
    )
    assert r.returncode == 0, r.stderr
    assert error_line(r) == (
        "gpuprof: nothing recorded: the program ended after 3 step(s), and "
        "--wait/--warmup/--active start recording at step 6; lower --wait "
        "or --warmup"
    )


def test_fewer_steps_than_active_says_so():
    r = gpuprof(
        "run",
        "--no-cuda",
        "--step-fn",
        "__main__:train_step",
        "--active",
        "5",
        script("cpu_train.py"),
        "3",
    )
    assert r.returncode == 0, r.stderr
    line = error_line(r)
    assert re.fullmatch(
        r"gpuprof: recorded [1-4] of the 5 --active steps: the program ended "
        r"after 3 step\(s\)",
        line,
    ), line


# -- nothing of the CLI's own in the results -----------------------------------------------------
def _assert_no_frames_of_ours(loaded, doc):
    import runpy

    files = {str(f) for f in loaded.ops()["file"]}
    ours = {f for f in files if f.startswith(PACKAGE) or f == runpy.run_path.__code__.co_filename}
    assert not ours, ours
    names = set(loaded.ops()["name"])
    for name in (
        "exec",
        "Condition.wait",
        "Event.wait",
        "Timer.run",
        "_run_code",
        "__gpuprof_step_fn__",
    ):
        assert name not in names, name
    texts = [json.dumps(e) for e in doc["traceEvents"]]
    for needle in ("runpy", PACKAGE, "cli/", "_launch.py", "_steps.py"):
        assert not any(needle in t for t in texts), needle


@pytest.mark.parametrize("whole", [False, True], ids=["default", "whole-run"])
def test_no_frame_of_gpuprof_or_runpy_in_tables_or_trace(whole, tmp_path):
    out = tmp_path / "out"
    r = gpuprof(
        "run",
        "--no-cuda",
        *(["--whole-run"] if whole else []),
        "--step-fn",
        "__main__:train_step",
        "--output",
        str(out),
        script("cpu_train.py"),
        "4",
    )
    assert r.returncode == 0, r.stderr
    loaded = saved(out)
    _assert_no_frames_of_ours(loaded, trace(out))
    tree = loaded.call_tree()

    def children(node):
        return [str(n) for n in tree["name"][tree["parent"] == node]]

    def child(node, name):
        return int(tree["id"][(tree["parent"] == node) & (tree["name"] == name)][0])

    if whole:  # from the program's start: the first step, then the program in it
        assert children(-1)[0] == "ProfilerStep*"
        below = children(child(-1, "ProfilerStep*"))
        assert any(n.startswith("<module> (cpu_train.py:") for n in below), below
    else:  # from the first step on: the program's frames then running, then the steps
        assert children(-1) == ["<module> (cpu_train.py:1)"]
        main = child(child(-1, "<module> (cpu_train.py:1)"), "main (cpu_train.py:14)")
        assert "ProfilerStep*" in children(main)


# A program that runs until gpuprof's time window is over, however fast the machine:
# --delay and --duration are ITIMER_REAL timers whose handler runs on the main thread,
# so the timer reads 0 at two checks in a row (bytecodes run between them, and with
# them a pending handler, which arms the next timer) only once the window has ended.
UNTIL_THE_WINDOW_ENDS = """
import signal


def work():
    return sum(range(100_000))  # one C call: a short trace


def after_the_window():
    return sum(range(10))


unarmed = 0
while unarmed < 2:
    work()
    unarmed = unarmed + 1 if signal.getitimer(signal.ITIMER_REAL)[0] == 0 else 0
after_the_window()
print("done")
"""


def test_time_window_runs_no_thread_of_gpuprof(tmp_path):
    prog = tmp_path / "until_the_window_ends.py"
    prog.write_text(UNTIL_THE_WINDOW_ENDS)
    out = tmp_path / "out"
    r = gpuprof(
        "run",
        "--no-cuda",
        "--delay",
        "0.2",
        "--duration",
        "0.4",
        "--output",
        str(out),
        str(prog),
    )
    assert r.returncode == 0, r.stderr
    assert "done" in r.stdout
    assert "steps: 0 recorded in the --delay/--duration window" in r.stdout  # no step() ran
    loaded = saved(out)
    threads = loaded.results.threads()
    assert len(threads) == 1, threads  # the program's main thread only
    # the timer ended the window, not the program's end: the work in the window is
    # recorded, what the program did after it is not; and a timer never fires early
    ops = loaded.ops()
    assert int(ops["calls"][ops["name"] == "work"].sum()) > 0
    assert "after_the_window" not in set(ops["name"])
    start, end = loaded.results.window_bounds()
    assert end - start >= 0.4e9
    doc = trace(out)
    lanes = {e["tid"] for e in doc["traceEvents"] if e.get("cat") == "python_function"}
    assert lanes == {int(threads["os_tid"][0])}, lanes
    _assert_no_frames_of_ours(loaded, doc)


def test_delay_longer_than_the_program_says_so():
    r = gpuprof("run", "--no-cuda", "--delay", "30", script("cpu_train.py"), "2")
    assert r.returncode == 0, r.stderr
    assert "done" in r.stdout
    assert error_line(r) == (
        "gpuprof: nothing recorded: the program ended before --delay 30 s; give a shorter --delay"
    )


# -- bad arguments: one line, exit code 2, the program never starts ------------------------------
BAD_RUN = [
    (["--sort", "self_cpu"], "argument --sort: unknown sort key 'self_cpu'"),
    (["--limit", "-5"], "argument --limit: must be a positive integer, got '-5'"),
    (["--limit", "0"], "argument --limit: must be a positive integer"),
    (["--active", "0"], "argument --active: must be a positive integer, got '0'"),
    (["--wait", "-1", "--active", "2"], "argument --wait: must be an integer >= 0"),
    (["--warmup", "2"], "--warmup applies to the step schedule: give --active N too"),
    (["--delay", "-1"], "argument --delay: must be a number of seconds >= 0"),
    (["--duration", "0"], "argument --duration: must be a number of seconds > 0"),
    (["--delay", "1", "--active", "3"], "cannot be combined with --active"),
    (["--trace-min-us", "-1"], "argument --trace-min-us: must be a number of seconds >= 0"),
    (["--step-fn", "train_step"], "argument --step-fn: takes module:function"),
    (["--step-fn", "train:1x"], "argument --step-fn: '1x' is not a function name"),
    (["--capture-range", "bogus"], "--capture-range: profile(): capture='bogus' is not one of"),
    (["--capture-range", "nvtx:x", "--active", "2"], "--capture-range and --active cannot"),
    (["--whole-run", "--active", "2"], "--whole-run and --active cannot be combined"),
    (["--whole-run", "--duration", "2"], "--whole-run and --delay/--duration cannot be"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
]


def _run_with_marker(tmp_path, *args, target=None):
    marker = tmp_path / "marker"
    r = gpuprof("run", *args, target or script("leaves_marker.py"), str(marker))
    assert not marker.exists(), "the program ran"
    return r


@pytest.mark.parametrize("args, message", BAD_RUN, ids=[" ".join(a) for a, _ in BAD_RUN])
def test_bad_run_argument_is_one_line_and_exit_2_before_the_program(args, message, tmp_path):
    r = _run_with_marker(tmp_path, *args)
    assert r.returncode == 2
    line = error_line(r)
    assert line.startswith("gpuprof: error: ") and message in line, line
    assert r.stdout == ""


def test_output_that_is_a_file_is_refused_before_the_program(tmp_path):
    existing = tmp_path / "existing"
    existing.write_text("keep me")
    r = _run_with_marker(tmp_path, "--output", str(existing))
    assert r.returncode == 2
    assert error_line(r) == (
        f"gpuprof: error: --output: {str(existing)!r} is a file, not a "
        "folder; name a folder (created if missing)"
    )
    assert existing.read_text() == "keep me"


@pytest.mark.skipif(gp.cuda_status()["usable"], reason="GPU capture is usable here")
@pytest.mark.parametrize("args", [["--capture-range", "cudaProfilerApi"], ["--cuda"]])
def test_gpu_flags_without_a_gpu_are_refused_before_the_program(args, tmp_path):
    r = _run_with_marker(tmp_path, *args)
    assert r.returncode == 2
    line = error_line(r)
    assert line.startswith(f"gpuprof: error: {args[0]}") and "GPU capture" in line, line


def test_cuda_profiler_api_with_no_cuda_is_refused(tmp_path):
    r = _run_with_marker(tmp_path, "--no-cuda", "--capture-range", "cudaProfilerApi")
    assert r.returncode == 2
    assert "needs GPU capture: leave --no-cuda out" in error_line(r)


@pytest.mark.parametrize(
    "args, message",
    [
        (("run", "no_such_script.py"), "no such script: 'no_such_script.py'"),
        (("run", "-m", "no_such_module_xyz"), "no module named 'no_such_module_xyz'"),
        (("run",), "the following arguments are required: TARGET"),
        (("report", "/nonexistent/file.gpuprof"), "cannot read '/nonexistent/file.gpuprof'"),
        (("report",), "the following arguments are required: FILE"),
        (("compare", "/nonexistent/a.gpuprof"), "the following arguments are required: AFTER"),
        (("bogus",), "argument COMMAND: invalid choice: 'bogus'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = gpuprof(*args)
    assert r.returncode == 2
    assert message in error_line(r)


def test_a_syntax_error_in_the_program_is_reported_as_python_would(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n    pass\n")
    r = gpuprof("run", "--no-cuda", str(bad))
    assert r.returncode == 1
    assert "SyntaxError" in r.stderr and str(bad) in r.stderr
    assert r.stdout == ""


# -- report and compare --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_saved(tmp_path_factory):
    """Two saved profiles of cpu_train.py (with memory) and one exported trace."""
    paths = []
    for i in range(2):
        out = tmp_path_factory.mktemp(f"run{i}")
        r = gpuprof(
            "run", "--no-cuda", "--memory", "--output", str(out), script("cpu_train.py"), str(3 + i)
        )
        assert r.returncode == 0, r.stderr
        assert "gpuprof memory summary" in r.stdout and "host RSS" in r.stdout
        paths.append(glob.glob(str(out / "*.gpuprof"))[0])
    paths.append(glob.glob(str(out / "*.pt.trace.json.gz"))[0])
    return paths


def test_report_takes_several_files(two_saved):
    a, b, tr = two_saved
    r = gpuprof("report", a, b, "--kernels")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"== {a}\n") and f"\n== {b}\n" in r.stdout
    r = gpuprof("report", a, b, tr, "--limit", "3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("Self CPU time total") == 2 and "Host events" in r.stdout
    assert r.stdout.index(a) < r.stdout.index(b) < r.stdout.index(tr)


def test_report_memory_of_a_saved_profile(two_saved):
    r = gpuprof("report", "--memory", two_saved[0])
    assert r.returncode == 0, r.stderr
    assert "gpuprof memory summary" in r.stdout and "host RSS" in r.stdout
    summary = gp.load(two_saved[0]).memory_summary()
    assert summary.host["samples"] >= 1


def test_report_memory_of_a_profile_without_memory_says_so(tmp_path):
    out = tmp_path / "out"
    assert (
        gpuprof("run", "--no-cuda", "--output", str(out), script("cpu_train.py"), "2").returncode
        == 0
    )
    path = glob.glob(str(out / "*.gpuprof"))[0]
    r = gpuprof("report", "--memory", path)
    assert r.returncode == 2
    assert error_line(r).startswith(f"gpuprof: error: --memory: {path!r} has no memory data")


@pytest.mark.parametrize("flag", ["--steps", "--memory", "--sort"])
def test_report_flags_that_need_a_saved_profile_refuse_a_trace(flag, two_saved):
    args = [flag, "count"] if flag == "--sort" else [flag]
    r = gpuprof("report", two_saved[2], *args)
    assert r.returncode == 2
    assert f"{flag} needs a saved profile (.gpuprof)" in error_line(r)


def test_report_sort_is_checked_before_reading(two_saved):
    r = gpuprof("report", two_saved[0], "--sort", "bogus")
    assert r.returncode == 2
    assert "argument --sort: unknown sort key 'bogus'" in error_line(r)


def test_report_reads_an_exported_trace(two_saved, tmp_path):
    rep = gpuprof("report", two_saved[2])
    assert rep.returncode == 0, rep.stderr
    assert "train_step" in rep.stdout and "Host events" in rep.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    rep = gpuprof("report", str(bad))
    assert rep.returncode == 2 and "not a Chrome trace" in error_line(rep)


def test_compare(two_saved, tmp_path):
    a, b, tr = two_saved
    r = gpuprof("compare", a, b)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    missing = str(tmp_path / "X")
    r = gpuprof("compare", tr, missing)
    assert r.returncode == 2
    assert error_line(r) == f"gpuprof: error: AFTER: cannot read {missing!r}: no such file"
    r = gpuprof("compare", tr, a)
    assert r.returncode == 2
    assert f"BEFORE: {tr!r} is a Chrome trace; compare reads saved profiles" in error_line(r)


def test_run_trace_min_us_thins_the_trace(tmp_path):
    out = tmp_path / "out"
    r = gpuprof(
        "run", "--no-cuda", "--trace-min-us", "5", "--output", str(out), script("cpu_train.py"), "3"
    )
    assert r.returncode == 0, r.stderr
    doc = trace(out)
    assert doc["gpuprof_min_duration_us"] == 5.0 and doc["gpuprof_omitted_calls"] > 0
    assert all(e["dur"] >= 5 for e in doc["traceEvents"] if e.get("cat") == "python_function")


# -- help, version, usage ------------------------------------------------------------------------
def test_version():
    r = gpuprof("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"gpuprof {gp.__version__}"


def test_bare_command_prints_usage():
    r = gpuprof()
    assert r.returncode == 2
    assert r.stdout.startswith("usage: python -m gpuprof")
    for cmd in ("demo", "run", "report", "compare", "merge", "capture"):
        assert f"    {cmd} " in r.stdout


def test_every_option_has_help_with_its_default():
    from gpuprof.cli import _parser

    parser = _parser()
    subs = parser._subparsers._group_actions[0].choices
    assert set(subs) == {"demo", "run", "report", "compare", "merge", "capture", "dump", "top"}
    for name, sub in subs.items():
        for action in sub._actions:
            if action.option_strings == ["-h", "--help"]:
                continue
            assert action.help, (name, action.dest)
            if action.option_strings:
                assert "default: " in action.help, (name, action.option_strings)
    r = gpuprof("run", "--help")
    assert r.returncode == 0 and "--warmup N" in r.stdout and "(default: 1)" in r.stdout


def test_demo_runs():
    r = gpuprof("demo", timeout=300)
    assert r.returncode == 0, r.stderr
    assert "gpuprof diagnosis" in r.stdout
    assert "augment (training.py:" in r.stdout or "forward" in r.stdout


# -- subprocesses ------------------------------------------------------------------------------
def test_run_subprocesses_shows_the_pool_workers(tmp_path):
    """--subprocesses: the fork pool's workers are profiled; their rows are printed
    (one line per process, then the workers' ops summed) and kept in the outputs."""
    out = tmp_path / "out"
    r = gpuprof(
        "run",
        "--no-cuda",
        "--subprocesses",
        "--limit",
        "1000",
        "--output",
        str(out),
        script("pool_workers.py"),
        "20",
    )
    assert r.returncode == 0, r.stderr
    assert "done 2470" in r.stdout
    text = r.stdout
    assert "processes: main + 2 workers" in text
    lines = text.splitlines()
    workers = [ln for ln in lines if "ForkPoolWorker-" in ln and "worker, fork" in ln]
    assert len(workers) == 2, text
    assert "child processes (2), summed" in text
    # the workers' table: slow_item ran once per item, in the workers only
    table = text[text.index("child processes (2), summed") :]
    row = [ln for ln in table.splitlines() if ln.startswith("slow_item (pool_workers.py:")]
    assert row and row[0].split()[-1] == "20", table
    main_table = text[: text.index("processes: main")]
    assert "slow_item (pool_workers.py:" not in main_table
    # the saved profile keeps the workers; the trace has a lane per worker
    loaded = saved(out)
    w = loaded.processes()
    assert list(w["role"]).count("worker") == 2
    ops = loaded.ops(pid="workers")
    assert int(ops["calls"][ops["name"] == "slow_item"].sum()) == 20


def test_run_without_subprocesses_prints_no_process_lines():
    r = gpuprof("run", "--no-cuda", script("pool_workers.py"), "4")
    assert r.returncode == 0, r.stderr
    assert "processes: main" not in r.stdout
    assert "slow_item (pool_workers.py:" not in r.stdout


# -- html report (docs/report.md) --
def html_data(path):
    import json
    import re

    text = open(path, encoding="utf-8").read()
    m = re.search(r'<script type="application/json" id="gpuprof-data">(.*?)</script>', text, re.S)
    return json.loads(m.group(1))


def test_run_output_writes_report_html_beside_the_trace_and_report_and_compare_write_pages(
    tmp_path,
):
    out = tmp_path / "out"
    r = gpuprof(
        "run",
        "--no-cuda",
        "--step-fn",
        "steps_module:train_step",
        "--output",
        str(out),
        os.path.join(SCRIPTS, "uses_steps_module.py"),
    )
    assert r.returncode == 0, r.stderr
    assert f"gpuprof: wrote {out / 'report.html'}" in r.stderr
    data = html_data(out / "report.html")
    trace = [f for f in os.listdir(out) if f.endswith(".pt.trace.json.gz")][0]
    assert data["trace"] == {"href": trace, "name": trace, "exists": True}
    saved = str(out / [f for f in os.listdir(out) if f.endswith(".gpuprof")][0])
    import gpuprof as gp

    # 7 detected steps: the first ends the start-up, which is left out; the stretch
    # after the last step() is no step
    assert data["summary"]["steps"] == len(gp.load(saved).steps()) == 6
    (note,) = data["summary"]["notes"]
    assert note.startswith("Start-up not in these results: the ") and "--whole-run" in note

    rep = gpuprof("report", saved, "--html", str(tmp_path / "r.html"))
    assert rep.returncode == 0 and rep.stdout == "", rep.stderr
    assert html_data(tmp_path / "r.html")["ops"]["rows"] == data["ops"]["rows"]
    assert html_data(tmp_path / "r.html")["summary"]["notes"] == [note]  # from the header

    cmp = gpuprof("compare", saved, saved, "--html", str(tmp_path / "c.html"))
    assert cmp.returncode == 0 and cmp.stdout == "", cmp.stderr
    c = html_data(tmp_path / "c.html")
    assert c["page"] == "compare" and c["speedup"] == 1.0

    for args in (
        ("report", saved, "--html", str(tmp_path / "missing" / "r.html")),
        ("compare", saved, saved, "--html", str(tmp_path)),
    ):
        bad = gpuprof(*args)
        lines = [ln for ln in bad.stderr.splitlines() if ln.strip()]
        assert bad.returncode == 2 and len(lines) == 1 and "--html" in lines[0], bad.stderr
    bad = gpuprof("report", str(out / trace), "--html", str(tmp_path / "t.html"))
    assert bad.returncode == 2 and "needs a saved profile" in bad.stderr


# -- end html report --
