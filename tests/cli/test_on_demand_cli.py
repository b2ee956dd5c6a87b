"""`run --on-demand` and `capture` on real processes: armed, captured, refused.

Every program runs in its own process with a private runtime folder
(GPUPROF_RUNTIME_DIR), and ends when the test creates its stop file.
"""

import glob
import gzip
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

import gpuprof as gp
import pytest

SCRIPTS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "scripts"))
LOOP = os.path.join(SCRIPTS, "ondemand_loop.py")
# gpuprof's own files (a checkout's folder may well be named gpuprof too)
PKG_DIR = os.path.dirname(os.path.abspath(gp.__file__)) + os.sep
TORCH_LOOP = os.path.join(SCRIPTS, "ondemand_torch.py")


@pytest.fixture
def env(tmp_path):
    runtime = tmp_path / "runtime"
    return dict(
        os.environ,
        GPUPROF_RUNTIME_DIR=str(runtime),
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(p for p in [os.environ.get("PYTHONPATH", ""), SCRIPTS] if p),
    )


def gpuprof(env, *args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "gpuprof", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def error_line(r):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


class Program:
    """A program started armed; ``pid`` once it has said so (its first stderr line)."""

    def __init__(self, env, stop, *argv):
        self.stop_file = stop
        self.proc = subprocess.Popen(
            list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.first = self.proc.stderr.readline()
        m = re.search(r"`python -m gpuprof capture (\d+)`", self.first)
        if m is None:
            self.proc.kill()
            raise AssertionError(self.first + self.proc.stderr.read())
        self.pid = int(m.group(1))
        assert self.pid == self.proc.pid

    def end(self):
        open(self.stop_file, "w").close()
        out, err = self.proc.communicate(timeout=300)
        return self.proc.returncode, out, self.first + err

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def armed_loop(env, tmp_path):
    """The CPU loop of tests/scripts/ondemand_loop.py, armed, steps = train_step returns."""
    programs = []

    def start(*program_args):
        p = Program(
            env,
            tmp_path / "stop",
            sys.executable,
            "-m",
            "gpuprof",
            "run",
            "--on-demand",
            "--step-fn",
            "__main__:train_step",
            LOOP,
            str(tmp_path / "stop"),
            *program_args,
        )
        programs.append(p)
        return p

    yield start
    for p in programs:
        p.kill()


def report_of(folder):
    (path,) = [
        f for f in glob.glob(os.path.join(str(folder), "*.txt")) if not f.endswith(".stacks.txt")
    ]
    return open(path).read()


def files_of(folder):
    return sorted(os.path.basename(f) for f in glob.glob(os.path.join(str(folder), "*")))


def test_armed_program_is_captured_twice_and_runs_on(armed_loop, env, tmp_path):
    prog = armed_loop()
    state = json.loads((tmp_path / "runtime" / f"{prog.pid}.json").read_text())
    assert state["signal_name"] == "SIGUSR2" and state["steps"] == "returns of __main__:train_step"

    firsts, stems = [], []
    for n, name in ((5, "one"), (3, "two")):
        r = gpuprof(
            env,
            "capture",
            str(prog.pid),
            "--steps",
            str(n),
            "--wait",
            "--output",
            str(tmp_path / name),
        )
        assert r.returncode == 0, r.stderr
        assert (
            f"gpuprof: pid {prog.pid} records the next {n} steps from its next step "
            f"boundary" in r.stdout
        )
        m = re.search(
            rf"pid {prog.pid}: recorded {n} steps, steps (\d+)-(\d+) of the program", r.stdout
        )
        assert m and int(m.group(2)) - int(m.group(1)) == n - 1, r.stdout
        first = int(m.group(1))
        firsts.append(first)
        assert "gpuprof diagnosis" in r.stdout
        stem = f"{os.uname().nodename}_{prog.pid}_step{first}"
        stems.append(stem)
        assert files_of(tmp_path / name) == sorted(
            [stem + ext for ext in (".gpuprof", ".pt.trace.json.gz", ".stacks.txt", ".txt")]
            + ["report.html"]
        )
        assert r.stderr.count("gpuprof: wrote ") == 5
        loaded = gp.load(str(tmp_path / name / (stem + ".gpuprof")))
        assert len(loaded.steps()) == n
        names = set(loaded.ops()["name"])
        assert {"train_step", "load"} <= names
        hidden = [f for f in loaded.ops()["file"] if str(f).startswith(PKG_DIR)]
        assert not hidden  # gpuprof's own frames are not recorded
        with gzip.open(tmp_path / name / (stem + ".pt.trace.json.gz"), "rt") as f:
            trace = json.load(f)
        assert trace["gpuprof_on_demand"]["first_step"] == first
        report = (tmp_path / name / (stem + ".txt")).read_text()
        assert report.startswith(f"gpuprof on-demand capture of pid {prog.pid} on ")
        assert re.search(r"\ntrain_step \(ondemand_loop\.py:\d+\) ", report), report
        assert "gpuprof diagnosis" in report
        # the HTML report `run --output` writes, beside the trace it links
        page = (tmp_path / name / "report.html").read_text()
        data = json.loads(
            re.search(
                r'<script type="application/json" id="gpuprof-data">(.*?)</script>', page, re.S
            )[1]
        )
        assert data["trace"] == {
            "href": stem + ".pt.trace.json.gz",
            "name": stem + ".pt.trace.json.gz",
            "exists": True,
        }
        assert data["summary"]["steps"] == n
    assert firsts[1] > firsts[0] + 4
    # report and compare take the capture folders, and say which file they read
    rep = gpuprof(env, "report", str(tmp_path / "one"))
    assert rep.returncode == 0, rep.stderr
    assert rep.stderr == f"gpuprof: reading {tmp_path / 'one' / (stems[0] + '.gpuprof')}\n"
    assert "train_step (ondemand_loop.py:" in rep.stdout
    cmp = gpuprof(env, "compare", str(tmp_path / "one"), str(tmp_path / "two"))
    assert cmp.returncode == 0, cmp.stderr
    assert f"BEFORE: reading {tmp_path / 'one' / (stems[0] + '.gpuprof')}" in cmp.stderr
    assert f"AFTER: reading {tmp_path / 'two' / (stems[1] + '.gpuprof')}" in cmp.stderr
    assert "step time:" in cmp.stdout

    code, out, err = prog.end()
    assert code == 0, err
    assert re.fullmatch(r"stopped after \d+ steps\n", out)  # the program's stdout, nothing else
    assert err.count("on-demand capture of pid") == 2
    assert not (tmp_path / "runtime" / f"{prog.pid}.json").exists()


def test_capture_while_capturing_is_refused_and_the_end_writes_what_was_recorded(
    armed_loop, env, tmp_path
):
    # small steps: however many it records before the end, they fit in the event budget
    prog = armed_loop(str(1 << 62), "20")
    r = gpuprof(
        env, "capture", str(prog.pid), "--steps", "1000000", "--output", str(tmp_path / "long")
    )
    assert r.returncode == 0, r.stderr
    assert "records the next 1000000 steps" in r.stdout and str(tmp_path / "long") in r.stdout

    r2 = gpuprof(env, "capture", str(prog.pid), "--steps", "2", "--output", str(tmp_path / "no"))
    assert r2.returncode == 1
    line = error_line(r2)
    assert re.match(
        rf"gpuprof: error: pid {prog.pid} is already capturing \(asked for at "
        rf"[\d:]+ by pid \d+\): \d+ of 1000000 steps recorded, into "
        rf"{re.escape(str(tmp_path / 'long'))}; try again when its files are "
        "written$",
        line,
    ), line
    assert not (tmp_path / "no").exists()

    code, out, err = prog.end()
    assert code == 0, err
    text = report_of(tmp_path / "long")
    m = re.search(r"cut short: the program ended after (\d+) of the 1000000 steps", text)
    assert m, text
    (saved,) = glob.glob(str(tmp_path / "long" / "*.gpuprof"))
    loaded = gp.load(saved)
    assert loaded.results.dropped_events == 0 and len(loaded.steps()) == int(m.group(1))
    assert "cut short: the program ended after" in err


def test_capture_without_signal_and_a_time_window(armed_loop, env, tmp_path):
    """--signal none: nothing is sent, the program reads the request within a second.
    With --step-fn naming a function it never calls, it has no steps, and a
    --duration capture is a time window."""
    prog = Program(
        env,
        tmp_path / "stop",
        sys.executable,
        "-m",
        "gpuprof",
        "run",
        "--on-demand",
        "--signal",
        "none",
        "--step-fn",
        "__main__:load",
        LOOP,
        str(tmp_path / "stop"),
    )
    try:
        r = gpuprof(env, "capture", "--list")
        assert re.search(
            rf"^\s+{prog.pid}\s+-\s+[\d: -]+\s+poll 1 s\s+\S*python", r.stdout, re.M
        ), r.stdout
        r = gpuprof(
            env,
            "capture",
            str(prog.pid),
            "--steps",
            "2",
            "--wait",
            "--output",
            str(tmp_path / "steps"),
        )
        assert r.returncode == 0, r.stderr
        assert "recorded 2 steps" in r.stdout
        r = gpuprof(
            env,
            "capture",
            str(prog.pid),
            "--duration",
            "0.3",
            "--wait",
            "--output",
            str(tmp_path / "win"),
        )
        assert r.returncode == 0, r.stderr
        # load() ends steps there: the loop found steps, so the window holds whole steps
        assert re.search(r"recorded \d+ steps?, steps \d+-\d+ of the program", r.stdout)
    finally:
        code, _, err = prog.end()
    assert code == 0, err


def test_time_window_of_a_program_without_steps(env, tmp_path):
    prog = Program(
        env,
        tmp_path / "stop",
        sys.executable,
        "-m",
        "gpuprof",
        "run",
        "--on-demand",
        LOOP,
        str(tmp_path / "stop"),
    )  # optimizer steps: none
    try:
        r = gpuprof(
            env,
            "capture",
            str(prog.pid),
            "--duration",
            "0.5",
            "--wait",
            "--output",
            str(tmp_path / "win"),
        )
        assert r.returncode == 0, r.stderr
        assert f"pid {prog.pid} records 0.5 s from now: a time window" in r.stdout
        # 0.5 s asked; the window ends when gpuprof's thread gets the GIL back from a
        # stepping thread that never waits, later than that by as much as the machine's
        # load makes it: no upper bound. It never stops before its deadline.
        m = re.search(rf"pid {prog.pid}: recorded a (\d+\.\d) s time window", r.stdout)
        assert m and float(m.group(1)) >= 0.5, r.stdout
        (saved,) = glob.glob(str(tmp_path / "win" / "*.gpuprof"))
        loaded = gp.load(saved)
        assert "train_step" in set(loaded.ops()["name"]) and len(loaded.steps()) == 0
        r = gpuprof(
            env, "capture", str(prog.pid), "--steps", "3", "--output", str(tmp_path / "never")
        )
        assert r.returncode == 0, r.stderr
        assert "it has found none in the" in r.stdout
        assert "the program did not use PyTorch" in r.stdout
        assert "for a program without steps, ask for --duration S" in r.stdout
        # that request waits for a step that never comes: others are refused until it is
        # cancelled
        r = gpuprof(env, "capture", str(prog.pid), "--duration", "0.2")
        assert r.returncode == 1
        assert f"pid {prog.pid} has a capture waiting to start" in error_line(r)
        assert f"cancel it with `python -m gpuprof capture {prog.pid} --cancel`" in error_line(r)
        r = gpuprof(env, "capture", str(prog.pid), "--cancel")
        assert r.returncode == 0, r.stderr
        assert re.fullmatch(
            rf"gpuprof: pid {prog.pid}: cancelled the capture asked for at "
            r"[\d:]+, which had not started\n",
            r.stdout,
        ), r.stdout
        r = gpuprof(env, "capture", str(prog.pid), "--cancel")
        assert r.returncode == 1
        assert error_line(r) == f"gpuprof: pid {prog.pid} has no capture waiting to start"
        r = gpuprof(
            env,
            "capture",
            str(prog.pid),
            "--duration",
            "0.2",
            "--wait",
            "--output",
            str(tmp_path / "win2"),
        )
        assert r.returncode == 0, r.stderr
        assert not (tmp_path / "never").exists()
    finally:
        code, _, err = prog.end()
    assert code == 0, err


def test_bad_pids_are_refused_and_nothing_is_sent(env, tmp_path):
    # a pid with no process: one that has just exited
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone = int(done.stdout)
    r = gpuprof(env, "capture", str(gone))
    assert r.returncode == 2
    assert error_line(r) == (
        f"gpuprof: error: no process with pid {gone}; `python -m gpuprof "
        "capture --list` shows the armed processes"
    )

    # Python, not armed: SIGUSR2 would end it; it must live on
    py = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, env=env
    )
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        r = gpuprof(env, "capture", str(py.pid))
        assert r.returncode == 2
        line = error_line(r)
        assert line.startswith(f"gpuprof: error: pid {py.pid} (")
        assert (
            "is not armed for on-demand capture; nothing was sent to it. To capture it "
            "later, start it with `python -m gpuprof run --on-demand SCRIPT ...`" in line
        )
        r = gpuprof(env, "capture", str(sleeper.pid))
        assert r.returncode == 2
        assert (
            f"pid {sleeper.pid} (sleep 600) is not a Python program armed for on-demand "
            "capture; nothing was sent to it" in error_line(r)
        )
        assert py.poll() is None and sleeper.poll() is None
    finally:
        py.communicate(b"")
        sleeper.kill()
        sleeper.wait()
    assert py.returncode == 0  # it ended the way it wanted to, not by a signal


@pytest.mark.skipif(
    os.getuid() != 0 or shutil.which("sleep") is None,
    reason="needs root, to start a process of another user",
)
def test_a_process_of_another_user_is_refused(env):
    other = subprocess.Popen(["sleep", "600"], user="nobody")
    try:
        r = gpuprof(env, "capture", str(other.pid))
        assert r.returncode == 2
        assert f"pid {other.pid} (sleep 600) belongs to user 'nobody'" in error_line(r)
        assert "nothing was sent to it" in error_line(r)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_stale_state_file_of_a_reused_pid_is_not_trusted(env, tmp_path):
    py = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, env=env
    )
    try:
        runtime = tmp_path / "runtime"
        runtime.mkdir(mode=0o700)
        (runtime / f"{py.pid}.json").write_text(
            json.dumps({"pid": py.pid, "start_time": 1, "signal": 12, "host": "x"})
        )
        r = gpuprof(env, "capture", str(py.pid))
        assert r.returncode == 2
        assert (
            "is not armed for on-demand capture (the state file of an earlier process with "
            "the same pid was left behind; it is removed)" in error_line(r)
        )
        assert not (runtime / f"{py.pid}.json").exists() and py.poll() is None
    finally:
        py.communicate(b"")
    assert py.returncode == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["capture"], "give the PID of an armed process"),
        (["capture", "1", "2"], "2 PIDs: add --all-ranks to start them at the same step"),
        (["capture", "0"], "argument PID: must be a process id (a positive integer), got '0'"),
        (["capture", "1", "--steps", "0"], "argument --steps: must be a positive integer"),
        (["capture", "1", "--steps", "2", "--duration", "1"], "not allowed with argument"),
        (["capture", "--list", "1"], "--list lists the armed processes: give it alone"),
        (
            ["capture", "--trigger-dir", "/no/such/dir"],
            "--trigger-dir: '/no/such/dir' is not a folder",
        ),
        (
            ["run", "--on-demand", "--active", "3", LOOP],
            "--active cannot be combined with --on-demand",
        ),
        (
            ["run", "--on-demand", "--memory", LOOP],
            "ask for memory per capture: `capture --memory`",
        ),
        (
            ["run", "--on-demand", "--signal", "SIGTERM", LOOP],
            "argument --signal: must be SIGUSR1, SIGUSR2",
        ),
        (
            ["run", "--signal", "SIGUSR1", LOOP],
            "--signal applies to an armed program: add --on-demand",
        ),
        (
            ["run", "--on-demand", "--trigger-dir", "/no/such/dir", LOOP],
            "--trigger-dir: '/no/such/dir' is not a",
        ),
    ],
)
def test_bad_arguments_get_one_line_and_code_2(env, args, message):
    r = gpuprof(env, *args, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    line = error_line(r)
    assert line.startswith("gpuprof: error: ") and message in line, line


@pytest.mark.parametrize(
    "args, side",
    [(["run", "--cuda", LOOP], "profile"), (["run", "--on-demand", "--cuda", LOOP], "capture")],
)
def test_cuda_where_gpu_capture_cannot_work_gets_one_line(env, args, side):
    status = gp.cuda_status()
    if status["usable"]:
        pytest.skip("GPU capture works here")
    r = gpuprof(env, *args, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    line = error_line(r)
    assert line == (
        f"gpuprof: error: --cuda: GPU capture is not usable here: {status['reason']}; "
        f"leave --cuda out to {side} the CPU side"
    ), line


def test_capture_of_a_file_output_is_refused_before_asking(armed_loop, env, tmp_path):
    prog = armed_loop()
    (tmp_path / "afile").write_text("x")
    r = gpuprof(env, "capture", str(prog.pid), "--output", str(tmp_path / "afile"))
    assert r.returncode == 2
    assert "--output: " in error_line(r) and "is a file, not a folder" in error_line(r)
    code, _, err = prog.end()
    assert code == 0 and "on-demand capture" not in err


def _wait_for_state(runtime, pid, timeout=120):
    """The armed program's state file: armed at start-up, before its first line of code."""
    end = time.monotonic() + timeout
    path = runtime / f"{pid}.json"
    while not path.exists():
        assert time.monotonic() < end, f"pid {pid} was not armed within {timeout} s"
        time.sleep(0.05)
    return json.loads(path.read_text())


def test_environment_arms_a_program_started_by_something_else(env, tmp_path):
    """GPUPROF_ON_DEMAND=1 with gpuprof's start-up folder on PYTHONPATH: plain
    `python script.py` is armed; its PyTorch optimizer steps are the steps."""
    pytest.importorskip("torch", reason="PyTorch is not installed")
    from gpuprof.cli.boot import BOOT_DIR

    env = dict(
        env, GPUPROF_ON_DEMAND="1", PYTHONPATH=os.pathsep.join([BOOT_DIR, env["PYTHONPATH"]])
    )
    stop = tmp_path / "stop"
    proc = subprocess.Popen(
        [sys.executable, TORCH_LOOP, str(stop)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        state = _wait_for_state(tmp_path / "runtime", proc.pid)
        assert state["argv"][1:] == [TORCH_LOOP, str(stop)]
        r = gpuprof(
            env,
            "capture",
            str(proc.pid),
            "--steps",
            "3",
            "--wait",
            "--output",
            str(tmp_path / "out"),
        )
        assert r.returncode == 0, r.stderr
        assert re.search(rf"pid {proc.pid}: recorded 3 steps, steps \d+-\d+", r.stdout)
        (saved,) = glob.glob(str(tmp_path / "out" / "*.gpuprof"))
        loaded = gp.load(saved)
        assert len(loaded.steps()) == 3
        assert "torch._C._nn.linear" in set(loaded.ops()["name"])
        assert "step boundaries: torch optimizer steps: SGD" in report_of(tmp_path / "out")
    finally:
        stop.write_text("")
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert re.fullmatch(r"rank 0: stopped after \d+ steps\n", out)


def _torchrun(env, tmp_path, *script_args):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    env = dict(env)
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "gpuprof",
            "run",
            "--on-demand",
            *script_args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _armed_pids(proc, n):
    pids = []
    while len(pids) < n:
        line = proc.stderr.readline()
        assert line, "torchrun ended before its ranks were armed"
        # two ranks' messages can share a line: each rank's unbuffered print() writes
        # the text and its newline separately
        pids += [int(p) for p in re.findall(r"`python -m gpuprof capture (\d+)`", line)]
    return pids


def test_two_ranks_start_at_the_same_step(env, tmp_path):
    """torchrun, two CPU ranks (gloo), each `-m gpuprof run --on-demand`: --all-ranks with
    one rank's pid finds the other, both record the same steps, and the files merge; a
    --trigger-dir request does the same."""
    trigger = tmp_path / "trigger"
    trigger.mkdir()
    stop = tmp_path / "stop"
    proc = _torchrun(env, tmp_path, "--trigger-dir", str(trigger), TORCH_LOOP, str(stop))
    try:
        pids = _armed_pids(proc, 2)
        out = tmp_path / "ranks"
        # (--timeout: the ranks may still be starting; capture waits for their first step)
        r = gpuprof(
            env,
            "capture",
            "--all-ranks",
            str(pids[0]),
            "--steps",
            "3",
            "--wait",
            "--output",
            str(out),
            "--timeout",
            "120",
        )
        assert r.returncode == 0, r.stderr
        firsts = [int(m) for m in re.findall(r"records the next 3 steps from step (\d+)", r.stdout)]
        assert len(firsts) == 2 and firsts[0] == firsts[1], r.stdout
        assert sorted(int(p) for p in re.findall(r"== pid (\d+), rank \d", r.stdout)) == sorted(
            pids
        )
        recorded = re.findall(r"recorded 3 steps, steps (\d+)-(\d+)", r.stdout)
        assert recorded == [(str(firsts[0]), str(firsts[0] + 2))] * 2, r.stdout
        assert "python -m gpuprof merge" in r.stderr
        traces = sorted(glob.glob(str(out / "*.pt.trace.json.gz")))
        assert len(traces) == 2
        run = gp.merge(str(tmp_path / "merged.json"), traces)
        assert run.ranks == [0, 1] and len(run.common_steps) == 3

        r = gpuprof(
            env,
            "capture",
            "--trigger-dir",
            str(trigger),
            "--steps",
            "2",
            "--wait",
            "--output",
            str(tmp_path / "shared"),
        )
        assert r.returncode == 0, r.stderr
        firsts2 = [
            int(m) for m in re.findall(r"records the next 2 steps from step (\d+)", r.stdout)
        ]
        assert len(firsts2) == 2 and firsts2[0] == firsts2[1] > firsts[0] + 2, r.stdout
        assert len(glob.glob(str(tmp_path / "shared" / "*.gpuprof"))) == 2
        assert not [n for n in os.listdir(trigger) if n.startswith(("req.", "rep."))]
    finally:
        stop.write_text("")
        out_text, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert (
        sorted(re.findall(r"rank (\d): stopped after (\d+) steps", out_text))[0][1]
        == sorted(re.findall(r"rank (\d): stopped after (\d+) steps", out_text))[1][1]
    )


def test_the_benchmark_measures_armed_idle_processes(tmp_path):
    """benchmarks/bench_on_demand.py (a smoke run): its armed children were armed, found
    every step, ran without a profile hook and without CUPTI; after a capture, no hook."""
    bench = os.path.join(os.path.dirname(SCRIPTS), "..", "benchmarks", "bench_on_demand.py")
    out = tmp_path / "bench.json"
    r = subprocess.run(
        [
            sys.executable,
            bench,
            "--quick",
            "--workloads",
            "python",
            "--modes",
            "plain,armed,after",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    steps = doc["steps"] + 5  # timed steps plus the --quick warm-up
    for mode in ("armed", "after"):
        procs = doc["results"][f"python/{mode}"]["processes"]
        assert len(procs) == 2
        for p in procs:
            assert p["armed"] and not p["hook"], p
            assert p["found"] == steps if mode == "armed" else p["found"] > steps, p
        if mode == "armed":
            assert not any(p["cupti_loaded"] for p in procs)
    assert not any(p["armed"] for p in doc["results"]["python/plain"]["processes"])
    # the wrapper's cost is the benchmark's to report (docs/benchmarks.md), not this
    # test's to bound: here, that it found every step and reported a measurement
    cost = doc["per_step_cost"]["step_fn_wrapper"]
    assert cost["steps_found_per_block"] == 2000
    assert math.isfinite(cost["added_ns"]) and cost["armed_ns"] > 0 and cost["bare_ns"] > 0
    assert cost["added_ns"] == pytest.approx(cost["armed_ns"] - cost["bare_ns"])
    assert re.search(
        r"python\s+armed\s+[\d.]+us\s+[\d.]+\s+[\d.]+.*armed, steps found, no hook, "
        r"no CUPTI",
        r.stdout,
    ), r.stdout


def test_a_program_that_resets_the_signal_is_not_signalled_and_still_captured(env, tmp_path):
    """The program puts SIGUSR2 back to its default action (ending the process) after
    arming: capture must not send it, and the request still arrives by polling."""
    stop = tmp_path / "stop"
    proc = subprocess.Popen(
        [sys.executable, os.path.join(SCRIPTS, "ondemand_resets_signal.py"), str(stop)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout.readline() == f"ready {proc.pid}\n"
        r = gpuprof(
            env,
            "capture",
            str(proc.pid),
            "--steps",
            "2",
            "--wait",
            "--output",
            str(tmp_path / "out"),
        )
        assert r.returncode == 0, r.stderr
        assert re.search(rf"pid {proc.pid}: recorded 2 steps", r.stdout), r.stdout
        assert proc.poll() is None  # not ended by a signal
    finally:
        stop.write_text("")
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    # either it noticed first (and said so), or capture saw the handler gone (and said so)
    assert (
        "replaced gpuprof's SIGUSR2 handler" in err
        or "no longer catches SIGUSR2 (the program reset it)" in r.stderr
    ), (err, r.stderr)
