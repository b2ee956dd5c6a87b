"""`gpuprof dump` on real armed processes that hang: a two-lock deadlock, a blocked
socket, a C loop that holds the GIL, a gloo all-reduce whose peer never joins.

Each program is tests/scripts/dump_hangs.py under `python -m gpuprof run --on-demand`,
in its own process with a private runtime folder (GPUPROF_RUNTIME_DIR). Each test
asserts that the dump returns, shows each thread's real innermost frame (the line is
found in the script's source, not written here) and the C call it is in, and that the
program is still alive afterwards and, where its main thread is not the one hung,
still stepping.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

SCRIPTS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "scripts"))
HANGS = os.path.join(SCRIPTS, "dump_hangs.py")
HELPERS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "helpers"))


def line_of(text: str, after: str | None = None) -> int:
    """The line number of the first line of dump_hangs.py holding ``text`` (after the
    first line holding ``after``)."""
    with open(HANGS) as f:
        lines = f.read().splitlines()
    start = 0
    if after is not None:
        start = next(i for i, ln in enumerate(lines) if after in ln)
    return next(i + 1 for i, ln in enumerate(lines) if i >= start and text in ln)


@pytest.fixture
def env(tmp_path):
    runtime = tmp_path / "rt"
    return dict(os.environ, GPUPROF_RUNTIME_DIR=str(runtime), OMP_NUM_THREADS="1")


def gpuprof(env, *args, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "gpuprof", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


class Hung:
    """dump_hangs.py MODE, armed; ``wait_ready()`` once its hang is in place."""

    def __init__(self, env, work, mode, *extra, rank=0):
        self.work, self.rank = work, rank
        self.log = open(work / f"log.{rank}", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuprof", "run", "--on-demand", HANGS, mode, str(work)]
            + list(extra),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.pid = self.proc.pid
        self.state = os.path.join(env["GPUPROF_RUNTIME_DIR"], f"{self.pid}.json")

    def wait_ready(self, timeout=120):
        deadline = time.monotonic() + timeout
        ready = self.work / f"ready.{self.rank}"
        while not (ready.exists() and os.path.exists(self.state)):
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, "the program did not get ready\n" + self.output()
            time.sleep(0.05)
        return self

    def steps(self) -> int:
        try:
            return int((self.work / f"steps.{self.rank}").read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def steps_go_on(self, timeout=60) -> bool:
        before = self.steps()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.steps() > before:
                return True
            time.sleep(0.05)
        return False

    def output(self) -> str:
        self.log.flush()
        return (self.work / f"log.{self.rank}").read_text()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def hung(env, tmp_path):
    started = []

    def start(mode, *extra, **kw):
        h = Hung(env, tmp_path, mode, *extra, **kw)
        started.append(h)
        return h

    yield start
    (tmp_path / "stop").touch()
    (tmp_path / "release").touch()
    for h in started:
        h.kill()


def thread_block(out: str, name: str) -> str:
    """The lines of one thread in a dump, from its "Thread NAME" line to the next
    blank line."""
    m = re.search(rf'^Thread "{re.escape(name)}" .*?(?=\n\n|\Z)', out, re.S | re.M)
    assert m, f"no thread {name!r} in:\n{out}"
    return m.group(0)


def innermost(block: str) -> str:
    """The first frame line of a thread block: `    FUNC (FILE:LINE)`."""
    frames = [ln.strip() for ln in block.splitlines()[1:] if re.match(r"^    \S.* \(.*\)$", ln)]
    frames = [f for f in frames if not f.startswith("in ")]
    assert frames, block
    return frames[0]


def test_a_two_lock_deadlock_is_dumped_and_the_program_steps_on(hung, env):
    prog = hung("deadlock").wait_ready()
    r = gpuprof(env, "dump", str(prog.pid))
    assert r.returncode == 0, r.stderr
    a, b = thread_block(r.stdout, "worker-a"), thread_block(r.stdout, "worker-b")
    assert innermost(a) == (
        f"deadlock.<locals>.take_a_then_b ({HANGS}:{line_of('with b:', 'def take_a_then_b')})"
    )
    assert innermost(b) == (
        f"deadlock.<locals>.take_b_then_a ({HANGS}:{line_of('with a:', 'def take_b_then_a')})"
    )
    for block, lock in ((a, "b"), (b, "a")):
        assert f"in C call _thread.lock.__enter__ (with {lock}:)" in block
        assert ", sleeping" in block.splitlines()[0]
    main = thread_block(r.stdout, "MainThread")
    assert "step_until_stopped" in main or "train_step" in main, main
    assert "Not known" not in r.stdout  # the on-demand thread answered
    assert prog.proc.poll() is None
    assert prog.steps_go_on(), "the program stopped stepping after the dump"


def test_a_thread_blocked_in_recv_is_dumped(hung, env):
    prog = hung("socket").wait_ready()
    r = gpuprof(env, "dump", str(prog.pid))
    assert r.returncode == 0, r.stderr
    reader = thread_block(r.stdout, "reader")
    assert innermost(reader) == (
        f"blocked_socket.<locals>.wait_for_data ({HANGS}:{line_of('quiet.recv(1024)')})"
    )
    assert "in C call _socket.socket.recv (quiet.recv())" in reader
    assert ", sleeping" in reader.splitlines()[0]
    r = gpuprof(env, "dump", "--json", str(prog.pid))
    assert r.returncode == 0, r.stderr
    (doc,) = json.loads(r.stdout)
    names = {int(k): v["name"] for k, v in doc["python"]["threads"].items()}
    (raw,) = [t for t in doc["walk"]["threads"] if names.get(t["ident"]) == "reader"]
    assert raw["call"] == {"kind": "call", "expr": "quiet.recv", "callee": "_socket.socket.recv"}
    assert raw["frames"][0]["line"] == line_of("quiet.recv(1024)")
    assert prog.proc.poll() is None
    assert prog.steps_go_on()


def _spin_lib(tmp_path) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build tests/helpers/gil_spin.c")
    out = str(tmp_path / "gil_spin.so")
    src = os.path.join(HELPERS, "gil_spin.c")
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", out, src], capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    return out


def test_a_c_loop_that_holds_the_gil_is_dumped_without_it(hung, env, tmp_path):
    """The main thread spins in C with the GIL held: no Python code of the process
    can run, yet the dump comes, says who holds the GIL and what could not be read,
    and once the loop ends the program steps on, having lost nothing."""
    prog = hung("spin", _spin_lib(tmp_path)).wait_ready()
    time.sleep(0.3)  # inside the loop by now (ready.0 is written just before it)
    r = gpuprof(env, "dump", str(prog.pid))
    assert r.returncode == 0, r.stderr
    main = thread_block(r.stdout, "MainThread")
    assert "holds the GIL" in main.splitlines()[0] and "running" in main.splitlines()[0]
    assert innermost(main) == f"spin ({HANGS}:{line_of('lib.gil_spin_until(release)')})"
    assert "in C call lib.gil_spin_until()" in main
    by = thread_block(r.stdout, "bystander")
    assert innermost(by) == f"spin.<locals>.bystander ({HANGS}:{line_of('time.sleep(0.01)')})"
    assert re.search(
        r"Not known: gpuprof's on-demand thread did not answer within [\d.]+ s \(thread "
        r'"MainThread" \(tid \d+\) holds the GIL\); thread names are those of',
        r.stdout,
    ), r.stdout
    assert prog.proc.poll() is None and prog.steps() == 0
    (tmp_path / "release").touch()
    assert prog.steps_go_on(), "the program did not go on after the C loop ended"
    again = gpuprof(env, "dump", str(prog.pid))
    assert again.returncode == 0 and "Not known: gpuprof's" not in again.stdout, again.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_gloo_all_reduce_whose_peer_never_joins(hung, env, tmp_path):
    """Two armed CPU ranks of a gloo job: rank 0 waits in all_reduce, rank 1 never
    calls it. `dump` of rank 0 names the collective and its flight-recorder entry;
    `dump --all-ranks` with rank 0's pid finds rank 1, shows both side by side and
    names rank 1 as the one that differs and never entered the collective."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    job = dict(env, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    for var in ("TORCHELASTIC_RUN_ID", "TORCH_FR_BUFFER_SIZE"):
        job.pop(var, None)
    ranks = []
    for rank in (0, 1):
        ranks.append(
            Hung(dict(job, RANK=str(rank), LOCAL_RANK=str(rank)), tmp_path, "gloo", rank=rank)
        )
    try:
        for h in ranks:
            h.wait_ready()
        time.sleep(0.5)  # rank 0 is inside all_reduce by now
        r = gpuprof(env, "dump", str(ranks[0].pid))
        assert r.returncode == 0, r.stderr
        main = thread_block(r.stdout, "MainThread")
        assert re.fullmatch(
            r"all_reduce \(.*/torch/distributed/distributed_c10d\.py:\d+\)", innermost(main)
        ), main
        assert "in C call torch._C._distributed_c10d.Work.wait (work.wait())" in main
        assert "in torch.distributed collective all_reduce" in main
        assert "torch.distributed: rank 0 of 2, backend gloo" in r.stdout
        assert re.search(
            r"in flight: #1 gloo:all_reduce \[\[4\]\] in group 0 \(default_pg\)", r.stdout
        ), r.stdout

        # rank 1 steps on: sample it until the dump finds it in its sleep, where
        # nearly all of its time goes (not in the bookkeeping between two sleeps)
        rank1_top = f"elsewhere ({HANGS}:{line_of('time.sleep(0.05)')})"
        differs = f"rank 1 differs from the others: its main thread is at {rank1_top}"
        for _ in range(5):
            r = gpuprof(env, "dump", "--all-ranks", str(ranks[0].pid))
            assert r.returncode == 0, r.stderr
            if differs in r.stdout:
                break
        assert differs in r.stdout, r.stdout
        assert r.stdout.startswith(
            f"== 2 processes: rank 0 (pid {ranks[0].pid}), rank 1 (pid {ranks[1].pid})"
        ), r.stdout
        assert "rank 0 waits in collective all_reduce" in r.stdout
        assert (
            "Group 0 (default_pg): rank 0 entered collective #1 (gloo:all_reduce); rank 1 is "
            "at #0: rank 1 never entered it." in r.stdout
        )
        # both full dumps follow, one per rank
        assert len(re.findall(r"^== pid \d+ .*rank [01] of 2\)", r.stdout, re.M)) == 2
        for h in ranks:
            assert h.proc.poll() is None, h.output()
        assert ranks[1].steps_go_on(), "rank 1 stopped stepping after the dumps"
    finally:
        for h in ranks:
            h.kill()


def test_a_process_that_is_not_armed_is_refused(env, tmp_path):
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    try:
        r = gpuprof(env, "dump", str(plain.pid))
        assert r.returncode == 2
        assert re.fullmatch(
            rf"gpuprof: error: pid {plain.pid} \(.*\) is not armed for on-demand capture; "
            r"nothing was sent to it\. .*\n",
            r.stderr,
        ), r.stderr
        assert plain.poll() is None
    finally:
        plain.send_signal(signal.SIGKILL)
        plain.wait()
    r = gpuprof(env, "dump", "999999999")
    assert r.returncode == 2 and "no process with pid 999999999" in r.stderr


def test_bad_arguments_are_one_line_errors(env):
    r = gpuprof(env, "dump")
    assert r.returncode == 2 and "give the PID of an armed process" in r.stderr
    r = gpuprof(env, "dump", "1", "2")
    assert r.returncode == 2 and "2 PIDs: add --all-ranks" in r.stderr
    r = gpuprof(env, "dump", "--timeout", "0", "1")
    assert r.returncode == 2 and "--timeout" in r.stderr
