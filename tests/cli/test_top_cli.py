"""`gpuprof top` on real armed processes: the lines it prints, the rates and functions
they name, leaving with Ctrl-C or q, and the processes it refuses.

Every program runs in its own process with a private runtime folder
(GPUPROF_RUNTIME_DIR), and ends when the test creates its stop file. Rates are
compared with the program's own count within a wide factor: this checks that they
are the program's, not how fast anything runs.
"""

import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

SCRIPTS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "scripts"))
LOOP = os.path.join(SCRIPTS, "top_loop.py")
TORCH_LOOP = os.path.join(SCRIPTS, "ondemand_torch.py")
SLOW_START = os.path.join(SCRIPTS, "top_slow_start.py")
LINE = re.compile(
    r"^\d\d:\d\d:\d\d (?:rank \d+ \()?pid (\d+)\)?: ([\d.]+) steps/s \(step [\d.]+ [mu]?s[;)]"
)


@pytest.fixture
def env(tmp_path):
    return dict(
        os.environ,
        GPUPROF_RUNTIME_DIR=str(tmp_path / "runtime"),
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
        stdin=subprocess.DEVNULL,
    )


class Armed:
    """A program started with `run --on-demand` (STOP in ``argv`` becomes its stop
    file); ``pid`` once it has said it is armed."""

    def __init__(self, env, tmp_path, *argv):
        self.stop = tmp_path / "stop"
        self.runtime = tmp_path / "runtime"
        argv = [str(self.stop) if a == "STOP" else a for a in argv]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuprof", "run", "--on-demand", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.first = self.proc.stderr.readline()
        m = re.search(r"`python -m gpuprof capture (\d+)`", self.first)
        if m is None:
            self.proc.kill()
            raise AssertionError(self.first + self.proc.stderr.read())
        self.pid = int(m.group(1))

    def end(self):
        self.stop.write_text("")
        out, err = self.proc.communicate(timeout=300)
        assert self.proc.returncode == 0, err
        return out, self.first + err

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()

    def leftovers(self):
        """Requests to it and answer folders left in the runtime folder."""
        return sorted(n for n in os.listdir(self.runtime) if ".req." in n or n.startswith("rep."))


@pytest.fixture
def armed(env, tmp_path):
    programs = []

    def start(*argv):
        p = Armed(env, tmp_path, *argv)
        programs.append(p)
        return p

    yield start
    for p in programs:
        p.kill()


def wait_for_steps(env, pid, timeout=120):
    """Until `top` shows the program stepping (PyTorch takes a while to import)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r = gpuprof(env, "top", str(pid), "--iterations", "1", "--interval", "0.5")
        assert r.returncode == 0, r.stderr
        m = LINE.match(r.stdout)
        if m and float(m.group(2)) > 0 and "sampled 1 " in r.stdout:
            return
    raise AssertionError(f"pid {pid} did not step within {timeout} s: {r.stdout}")


def test_the_first_line_has_a_rate_when_the_first_sample_is_slow_to_start(armed, env):
    """The first sample's set-up (imports, CUPTI) keeps the program's on-demand thread
    from answering for seconds on a loaded machine: the first line waits for the step
    count instead of printing one without a rate."""
    prog = armed("--step-fn", "top_loop:crunch", SLOW_START, "STOP", "2.5")
    r = gpuprof(env, "top", str(prog.pid), "--iterations", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2, r.stdout
    for ln in lines:
        assert LINE.match(ln), r.stdout  # a rate, not "counting steps"
    prog.end()


def test_lines_of_a_plain_python_loop(armed, env):
    # Steps of about 25 ms (200,000 numbers): with the default 2 ms ones, one GIL
    # switch interval (5 ms) that the loop's os.path.exists() waits on a loaded
    # machine outweighs crunch() and pushes it off the three functions shown.
    prog = armed("--step-fn", "__main__:crunch", LOOP, "STOP", "200000")
    r = gpuprof(env, "top", str(prog.pid), "--iterations", "3")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3, r.stdout
    rates = []
    for ln in lines:
        m = LINE.match(ln)
        assert m and int(m.group(1)) == prog.pid, ln
        rates.append(float(m.group(2)))
    assert re.search(r"sampled \d+ of \d+ steps in the last [\d.]+ s", r.stdout)
    sampled = [ln for ln in lines if re.search(r"; step \d+ took [\d.]+ [mu]?s under the hook", ln)]
    assert sampled, r.stdout
    for ln in sampled:
        assert "GPU not recorded" in ln
        # batches() is a generator resumed by the loop: its time is the wait for data
        assert float(re.search(r"data wait ([\d.]+)%", ln).group(1)) > 5, ln
        hot = re.search(r"self CPU: ([^;]*)", ln).group(1)
        assert "crunch" in hot, ln  # the function the program runs
        assert re.search(r"peak RSS [\d.]+ MiB", ln), ln
    assert re.fullmatch(
        # a sample still in flight when top leaves is withdrawn, and top says so
        rf"(gpuprof: top: pid {prog.pid} dropped the step top had asked it to sample\n)?"
        rf"gpuprof: top: left pid {prog.pid} armed and idle after [\d.]+ s; \d+ steps? "
        r"sampled, which cost about [\d.]+% of the time\n",
        r.stderr,
    )
    assert prog.leftovers() == []
    out, err = prog.end()
    m = re.fullmatch(r"stopped after (\d+) steps in ([\d.]+) s\n", out)
    assert m, out
    real = int(m.group(1)) / float(m.group(2))
    for rate in rates:
        assert real / 3 < rate < real * 3, (rates, real)
    assert err.count("gpuprof:") == 1, err  # the armed line: samples say nothing here


def test_lines_of_a_torch_training_loop(armed, env):
    pytest.importorskip("torch", reason="PyTorch is not installed")
    prog = armed(TORCH_LOOP, "STOP")
    wait_for_steps(env, prog.pid)
    r = gpuprof(env, "top", str(prog.pid), "--iterations", "3")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and all(LINE.match(ln) for ln in lines), r.stdout
    hot = " ".join(re.findall(r"self CPU: ([^;]*)", r.stdout))
    # the forward's and the backward's C calls: where a small CPU model spends its step
    assert "torch._C._nn.linear" in hot or "run_backward" in hot, r.stdout
    assert "not sampled" not in r.stdout, r.stdout
    out, _ = prog.end()
    assert re.fullmatch(r"rank 0: stopped after \d+ steps\n", out)


def test_ctrl_c_cancels_the_sample_and_leaves_the_program_armed(armed, env, tmp_path):
    # each batch waits 0.4 s, so a step asked for is pending or recording nearly always;
    # --overhead 50 asks for the next one a refresh after the last
    prog = armed("--step-fn", "__main__:crunch", LOOP, "STOP", "2000", "0.4")
    top = subprocess.Popen(
        [sys.executable, "-m", "gpuprof", "top", str(prog.pid), "-n", "0.2", "--overhead", "50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        lines = []
        # a sample has come back, and a later one was asked for at most 0.2 s ago: it
        # waits for a step boundary and then records a 0.4 s step, so it is still in
        # flight when the signal lands (a sample that ends first is not dropped)
        while not any(" under the hook" in ln for ln in lines) or not re.search(
            r"sampling one step from .* \(asked 0\.[012] s ago\)", lines[-1]
        ):
            lines.append(top.stdout.readline())
            assert re.match(rf"\d\d:\d\d:\d\d pid {prog.pid}: ", lines[-1]), lines
        top.send_signal(signal.SIGINT)
        out, err = top.communicate(timeout=60)
    finally:
        if top.poll() is None:
            top.kill()
    assert top.returncode == 0, err
    assert f"gpuprof: top: pid {prog.pid} dropped the step top had asked it to sample" in err
    assert f"gpuprof: top: left pid {prog.pid} armed and idle" in err
    assert "Traceback" not in err
    assert prog.leftovers() == []
    # idle again, and still stepping: a capture is accepted and records its steps
    r = gpuprof(
        env, "capture", str(prog.pid), "--steps", "2", "--wait", "--output", str(tmp_path / "c")
    )
    assert r.returncode == 0, r.stderr
    assert f"pid {prog.pid}: recorded 2 steps" in r.stdout
    prog.end()


def test_q_leaves_the_terminal_view(armed, env):
    pty = pytest.importorskip("pty", reason="no pseudo-terminals here")
    prog = armed("--step-fn", "__main__:crunch", LOOP, "STOP")
    master, slave = pty.openpty()
    top = subprocess.Popen(
        [sys.executable, "-m", "gpuprof", "top", str(prog.pid)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=dict(env, TERM="xterm", LINES="40", COLUMNS="120"),
        start_new_session=True,  # the terminal becomes its own
    )
    os.close(slave)
    screen = b""

    def read(until):
        nonlocal screen
        while not until() and time.monotonic() < end:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    screen += os.read(master, 1 << 16)
                except OSError:  # the terminal closed with top
                    return

    end = time.monotonic() + 60
    try:
        read(lambda: b"crunch" in screen)
        assert b"crunch" in screen, screen[-2000:]  # the op table of a sample
        assert b"PROCESS" in screen and b"SELF CPU" in screen
        os.write(master, b"q")
        read(lambda: top.poll() is not None)
        assert top.wait(timeout=30) == 0, screen[-2000:]
    finally:
        if top.poll() is None:
            top.kill()
            top.wait()
        os.close(master)
    assert f"left pid {prog.pid} armed and idle".encode() in screen
    assert prog.leftovers() == []
    prog.end()


def test_a_process_that_is_not_armed_is_refused_and_nothing_is_sent(env, tmp_path):
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], env=env, stdin=subprocess.DEVNULL
    )
    try:
        r = gpuprof(env, "top", str(sleeper.pid), "--iterations", "1")
        assert r.returncode == 2
        assert r.stdout == ""
        assert re.fullmatch(
            rf"gpuprof: error: pid {sleeper.pid} \(.*\) is not armed for on-demand capture; "
            r"nothing was sent to it\. To capture it later, start it with .*\n",
            r.stderr,
        )
        time.sleep(0.5)
        assert sleeper.poll() is None  # SIGUSR2 would have ended it
    finally:
        sleeper.kill()
        sleeper.wait()
    r = gpuprof(env, "top", str(sleeper.pid))
    assert r.returncode == 2
    assert r.stderr == (
        f"gpuprof: error: no process with pid {sleeper.pid}; `python -m gpuprof capture "
        "--list` shows the armed processes\n"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "give the PID of an armed process"),
        (["1", "2"], "2 PIDs: add --all-ranks to watch the ranks of one job"),
        (["1", "1", "--all-ranks"], "a PID is given twice"),
        (["1", "--trigger-dir", "."], "give PIDs or --trigger-dir DIR, not both"),
        (["--trigger-dir", "/no/such/dir"], "--trigger-dir: '/no/such/dir' is not a folder"),
        (["1", "--interval", "0.01"], "argument --interval/-n: must be a number of seconds"),
        (["1", "--overhead", "0"], "argument --overhead: must be a percentage in (0, 50]"),
        (["1", "--iterations", "0"], "argument --iterations: must be a positive integer"),
        (["x"], "argument PID: must be a process id (a positive integer), got 'x'"),
    ],
)
def test_bad_arguments_get_one_line_and_code_2(env, args, message):
    r = gpuprof(env, "top", *args)
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuprof: error: ") and message in lines[0], (
        r.stderr
    )


def _torchrun(env, *script_args):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    env = {k: v for k, v in env.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        + ["-m", "gpuprof", "run", "--on-demand", *script_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _ranks_sampled(stdout: str) -> dict[int, set[int]]:
    """For each refresh (its time stamp), the step numbers the ranks' lines show sampled
    in it, by rank."""
    out: dict[int, dict] = {}
    for ln in stdout.splitlines():
        m = re.match(r"^(\d\d:\d\d:\d\d) rank (\d) \(pid \d+\): .*?; step (\d+) took ", ln)
        if m and "s ago" not in ln.split(" took ")[1].split(":")[0]:
            out.setdefault(m.group(1), {})[int(m.group(2))] = int(m.group(3))
    return out


def test_the_ranks_of_a_job_are_sampled_at_the_same_step(env, tmp_path):
    """torchrun, two CPU ranks (gloo): `top --all-ranks` with one rank's pid shows both
    and samples one step number on both; `top --trigger-dir` does the same."""
    trigger = tmp_path / "trigger"
    trigger.mkdir()
    stop = tmp_path / "stop"
    proc = _torchrun(env, "--trigger-dir", str(trigger), TORCH_LOOP, str(stop))
    try:
        pids = []
        while len(pids) < 2:
            line = proc.stderr.readline()
            assert line, "torchrun ended before its ranks were armed"
            pids += [int(p) for p in re.findall(r"`python -m gpuprof capture (\d+)`", line)]
        wait_for_steps(env, pids[0])
        for how in (["--all-ranks", str(pids[0])], ["--trigger-dir", str(trigger)]):
            r = gpuprof(env, "top", *how, "--iterations", "6", "--overhead", "50")
            assert r.returncode == 0, r.stderr
            lines = r.stdout.splitlines()
            # one line per rank per refresh
            assert len(lines) == 12, (r.stdout, os.listdir(tmp_path / "runtime"))
            assert sorted(int(p) for p in re.findall(r"rank \d \(pid (\d+)\)", r.stdout)) == sorted(
                pids * 6
            )
            both = [s for s in _ranks_sampled(r.stdout).values() if len(s) == 2]
            assert both, r.stdout
            for steps in both:
                assert steps[0] == steps[1], r.stdout
            assert "armed and idle" in r.stderr
        assert not [n for n in os.listdir(trigger) if n.startswith(("req.", "rep."))]
    finally:
        stop.write_text("")
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
