"""The dump's walk of this process's threads (csrc/dump/dump_walk.c) against what Python
itself says of them, the C call named from the bytecode, and the dump server's life
in an armed process (csrc/dump/dump.c, python/gpuprof/api/ondemand/_dump.py).

The walk reads the interpreter's memory without the GIL; `sys._current_frames()`,
read with it, is the reference for every frame and line.
"""

import json
import os
import queue
import select
import socket
import sys
import threading
import time

import gpuprof
import pytest
from gpuprof import _gpuprof
from gpuprof.api.ondemand import _dump
from gpuprof.cli.ondemand import _dump_client

WALKS = (3, 11) <= sys.version_info[:2] <= (3, 13)
pytestmark = pytest.mark.skipif(not WALKS, reason="the walk reads CPython 3.11-3.13 frames")


@pytest.fixture(scope="module", autouse=True)
def tables():
    _gpuprof._dump_tables(*_dump.tables())


def walk() -> dict:
    return json.loads(_gpuprof._dump_walk())


class Blocked:
    """Threads that wait, each in its own way, until released."""

    def __init__(self):
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.lock.acquire()
        self.sock_a, self.sock_b = socket.socketpair()
        self.sock_c, self.sock_d = socket.socketpair()
        self.pipe_r, self.pipe_w = os.pipe()
        self.q = queue.Queue()
        self.threads = []

    def start(self, name, fn):
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self.threads.append(t)

    def close(self):
        self.release.set()
        self.lock.release()
        self.sock_b.send(b"x")
        self.sock_d.send(b"x")
        os.write(self.pipe_w, b"x")
        self.q.put(None)
        for t in self.threads:
            t.join(10)
        for fd in (self.pipe_r, self.pipe_w):
            os.close(fd)
        for s in (self.sock_a, self.sock_b, self.sock_c, self.sock_d):
            s.close()


@pytest.fixture
def blocked():
    b = Blocked()
    yield b
    b.close()


def settle(threads, timeout=10.0):
    """Wait until every thread sits in a wait of the OS (state S in /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for t in threads:
            with open(f"/proc/self/task/{t.native_id}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(s == "S" for s in states):
            time.sleep(0.05)
            return
        time.sleep(0.01)
    raise AssertionError("the threads did not block")


def by_ident(doc) -> dict:
    return {t["ident"]: t for t in doc["threads"]}


def stable_walk(threads, tries=20):
    """A walk during which no thread of ``threads`` moved: Python's view of their
    frames was the same just before and just after it. (walk, frames by ident)."""
    for _ in range(tries):
        before = {t.ident: python_frames(t.ident) for t in threads}
        doc = walk()
        after = {t.ident: python_frames(t.ident) for t in threads}
        if before == after:
            return doc, after
        time.sleep(0.05)
    raise AssertionError("the threads kept moving")


def python_frames(ident) -> list[tuple]:
    """(file, line, qualname) of a thread's frames, innermost first, from Python."""
    frame = sys._current_frames()[ident]
    out = []
    while frame is not None:
        code = frame.f_code
        out.append((code.co_filename, frame.f_lineno, code.co_qualname))
        frame = frame.f_back
    return out


def test_every_blocked_threads_stack_is_the_one_python_sees(blocked):
    def in_lock():
        blocked.lock.acquire()
        blocked.lock.release()

    def in_recv():
        blocked.sock_a.recv(16)

    def in_event():
        blocked.release.wait()

    def deeper(n):
        if n == 0:
            return blocked.q.get()
        return deeper(n - 1)

    for name, fn in (
        ("in-lock", in_lock),
        ("in-recv", in_recv),
        ("in-event", in_event),
        ("in-queue", lambda: deeper(5)),
    ):
        blocked.start(name, fn)
    settle(blocked.threads)
    doc, frames = stable_walk(blocked.threads)
    assert doc["kind"] == "walk" and doc["pid"] == os.getpid() and doc["problems"] == []
    seen = by_ident(doc)
    for t in blocked.threads:
        got = seen[t.ident]
        assert got["native_id"] == t.native_id
        assert [(f["file"], f["line"], f["func"]) for f in got["frames"]] == frames[t.ident]
        assert got["state"] == "S"
    assert not any(t["holds_gil"] for t in doc["threads"])  # the walk released it
    assert doc["gil_locked"] is not None


def test_the_c_call_is_named_from_the_bytecode(blocked):
    def lock_method():
        blocked.lock.acquire()
        blocked.lock.release()

    def lock_with():
        lock = blocked.lock
        with lock:
            pass

    def list_args():
        select.select([blocked.pipe_r], [], [], 1e6)

    def keyword_and_arithmetic():
        wait_s = 1e6
        blocked.lock.acquire(blocking=True, timeout=wait_s * 2)
        blocked.lock.release()

    def nested_call():
        blocked.sock_a.recv(int("16"))

    class Socket(socket.socket):
        def recv_through_super(self):
            return super().recv(16)

    sub = Socket(fileno=os.dup(blocked.sock_c.fileno()))

    def through_super():
        with sub:
            sub.recv_through_super()

    cases = {
        "lock-method": (lock_method, "blocked.lock.acquire", "_thread.lock.acquire"),
        "lock-with": (lock_with, "lock.__enter__", "_thread.lock.__enter__"),
        "list-args": (list_args, "select.select", "select.select"),
        "nested-call": (nested_call, "blocked.sock_a.recv", "_socket.socket.recv"),
        "keyword": (keyword_and_arithmetic, "blocked.lock.acquire", "_thread.lock.acquire"),
        # what super() gives is no plain name: the attribute alone finds the callable
        "super": (
            through_super,
            "super().recv" if sys.version_info >= (3, 12) else "(...).recv",
            "_socket.socket.recv",
        ),
    }
    for name, (fn, _, _) in cases.items():
        blocked.start(name, fn)
    settle(blocked.threads)
    doc, _ = stable_walk(blocked.threads)
    seen = by_ident(doc)
    for t in blocked.threads:
        got = seen[t.ident]
        _, expr, callee = cases[t.name]
        assert got["call"]["expr"] == expr and got["call"]["callee"] == callee, (t.name, got)
        assert got["call"]["kind"] == ("with" if t.name == "lock-with" else "call")


def test_a_thread_running_python_is_in_no_call():
    done = [False]

    def spin():
        n = 0
        while not done[0]:
            n += 1

    t = threading.Thread(target=spin, name="spinner", daemon=True)
    t.start()
    try:
        time.sleep(0.05)
        calls = []
        for _ in range(20):
            got = by_ident(walk())[t.ident]
            assert got["frames"][0]["func"].endswith("<locals>.spin")
            calls.append(got.get("call"))
        assert calls == [None] * 20  # a loop of bytecode alone calls nothing
    finally:
        done[0] = True
        t.join()


def test_walks_survive_threads_that_come_and_go():
    """Thread states and frames freed while they are read give problems, never a
    crash: walk again and again while threads start, run and end."""
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            ts = [threading.Thread(target=lambda: sum(range(2000))) for _ in range(8)]
            for x in ts:
                x.start()
            for x in ts:
                x.join()

    c = threading.Thread(target=churn, daemon=True)
    c.start()
    try:
        for _ in range(150):
            doc = walk()
            assert doc["kind"] == "walk" and any(
                t["native_id"] == c.native_id for t in doc["threads"]
            )
    finally:
        stop.set()
        c.join()


def test_the_bytecode_tables_come_from_this_interpreter():
    import dis
    import opcode

    deopt, caches, ops = _dump.tables()
    assert len(deopt) == len(caches) == 256
    assert ops["CALL"] == opcode.opmap["CALL"]
    for spec, base in getattr(dis, "deoptmap", {}).items():
        num = dis._all_opmap[spec]
        if num < 256 and base in opcode.opmap:
            assert deopt[num] == opcode.opmap[base], spec
    if "INSTRUMENTED_LINE" in opcode.opmap:
        assert caches[opcode.opmap["INSTRUMENTED_LINE"]] == 0xFF
        assert deopt[opcode.opmap["INSTRUMENTED_CALL"]] == opcode.opmap["CALL"]


# -- the server in an armed process -------------------------------------------------------------
@pytest.fixture
def armed(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPROF_RUNTIME_DIR", str(tmp_path / "rt"))
    od = gpuprof.arm(signal=None, poll_interval_s=0.2)
    yield od
    gpuprof.disarm()


def test_an_armed_process_answers_its_own_dump_with_names(armed, blocked):
    blocked.start("named-waiter", lambda: blocked.release.wait())
    settle(blocked.threads)
    target = _dump_client.find_dump_target(os.getpid())
    path = target.state["dump"]
    assert os.path.exists(path) and (os.stat(path).st_mode & 0o777) == 0o600
    d = _dump_client.dump(target, timeout=10, python_wait=5)
    assert d.ok and d.error is None, d.error
    assert d.python is not None and d.python_missing_ms is None  # the on-demand thread answered
    names = {t.name: t for t in d.threads()}
    waiter = names["named-waiter"]
    assert waiter.frames[0]["func"] in ("Event.wait", "Condition.wait")
    assert "gpuprof-on-demand" in names and names["gpuprof-on-demand"].ours
    main = d.main_thread()
    assert main is not None and main.native_id == os.getpid()
    # the dump thread itself is no Python thread and not listed as a native one
    assert not any(n.get("name") == "gpuprof-dump" for n in d.walk["native"])
    gpuprof.disarm()
    assert not os.path.exists(path)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_has_no_dump_thread_and_the_parent_keeps_its(armed):
    pid = os.fork()
    if pid == 0:  # the child: not armed, no server; it must not touch the parent's socket
        code = 0 if gpuprof.api.ondemand.armed() is None else 1
        _gpuprof._dump_stop()  # nothing to stop here
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    d = _dump_client.dump(_dump_client.find_dump_target(os.getpid()), timeout=10)
    assert d.ok, d.error


def test_a_socket_path_too_long_arms_without_the_dump_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPROF_RUNTIME_DIR", str(tmp_path / ("d" * 100)))
    gpuprof.arm(signal=None)
    try:
        with pytest.raises(_dump_client.CaptureError) as e:
            _dump_client.find_dump_target(os.getpid())
        assert e.value.code == 2
        assert "is armed, but cannot be dumped: _dump_start: the socket path" in str(e.value)
        assert "set GPUPROF_RUNTIME_DIR to a shorter folder" in str(e.value)
    finally:
        gpuprof.disarm()


def test_the_dump_answers_requests_it_does_not_know_with_an_error(armed):
    path = _dump_client.find_dump_target(os.getpid()).state["dump"]
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(b"hello\n")
        doc = json.loads(s.makefile("rb").readline())
    assert doc == {"kind": "error", "message": 'expected "dump WAIT_MS"'}


# -- the flight recorder -------------------------------------------------------------------------
def test_completed_collectives_are_not_in_flight(tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    dist = torch.distributed
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        t = torch.ones(3)
        dist.all_reduce(t)
        dist.barrier()
        # PyTorch retires a finished collective's entry after wait() returns, on a
        # thread of its own: read until both are retired
        deadline = time.monotonic() + 30
        while True:
            side = _dump._distributed()
            fr = side["flight_recorder"]
            if fr.get("missing"):
                pytest.skip(f"no flight recorder here: {fr['missing']}")
            (group,) = fr["groups"].values()
            if group["last_completed_collective"] == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        dist.destroy_process_group()
    assert side["rank"] == 0 and side["world_size"] == 1 and side["backend"] == "gloo"
    assert group["last_enqueued_collective"] == group["last_completed_collective"] == 2
    assert fr["in_flight"] == []
    assert any(c.get("desc") == "default_pg" for c in fr["configs"].values())


def test_the_calling_thread_is_in_its_call_to_the_walk():
    """The calling thread (this one) as the walk sees it: its innermost frame is this
    test, in the C call to _dump_walk."""
    raw, line = _gpuprof._dump_walk(), sys._getframe().f_lineno
    me = by_ident(json.loads(raw))[threading.get_ident()]
    assert me["frames"][0] == {
        "file": __file__,
        "line": line,
        "func": "test_the_calling_thread_is_in_its_call_to_the_walk",
    }
    assert me["call"] == {
        "kind": "call",
        "expr": "_gpuprof._dump_walk",
        "callee": "gpuprof._gpuprof._dump_walk",
    }
