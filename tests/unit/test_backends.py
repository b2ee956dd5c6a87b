"""Hook backends: sys.monitoring on 3.12+, the profile function before (GPUPROF_HOOK)."""

import subprocess
import sys
import textwrap

import pytest
from gpuprof.record import _monitoring

SCRIPT = textwrap.dedent("""
    import sys, threading, gpuprof
    def leaf(x):
        return x + 1
    def gen(n):
        yield from range(n)
    def work():
        data = []
        for i in range(10):
            data.append(leaf(i))
        return sum(gen(5))
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        work()
        t = threading.Thread(target=work)
        t.start(); t.join()
        try:
            raise ValueError
        except ValueError:
            pass
    ops = prof.ops()
    calls = {str(n): int(c) for n, c in zip(ops["name"], ops["calls"])}
    print(prof._rec.monitoring, calls["leaf"], calls["gen"], calls["work"], calls["list.append"])
    mon = getattr(sys, "monitoring", None)
    print(mon.get_tool(mon.PROFILER_ID) if mon else None)
""")


def _run(hook):
    env = dict(__import__("os").environ, GPUPROF_HOOK=hook)
    return subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.mark.parametrize("hook", ["setprofile", "monitoring"])
def test_both_backends_count_the_same(hook):
    if hook == "monitoring" and not _monitoring.available():
        r = _run(hook)
        assert r.returncode != 0 and "needs Python 3.12+" in r.stderr
        return
    r = _run(hook)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()
    assert first == f"{hook == 'monitoring'} 20 2 2 20"
    assert second == "None"  # the tool slot is given back after stop()


def test_bad_backend_name():
    r = _run("bogus")
    assert r.returncode != 0 and "GPUPROF_HOOK must be" in r.stderr


def test_torch_imports_after_gpuprof():
    # gpuprof's thread-local state must leave glibc's static TLS to libraries opened
    # later: torch's libgomp needs it (initial-exec TLS in gpuprof broke this import).
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", "import gpuprof, torch; print(torch.ones(2).sum())"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]


WAITING = textwrap.dedent("""
    import sys, threading, gpuprof
    def leaf(x):
        return x + 1
    def work():
        return sum(leaf(i) for i in range(10))
    seen = []  # per step: the hook set on this thread, on a thread started in it
    def hook_in_new_thread():
        box = []
        t = threading.Thread(target=lambda: box.append(sys.getprofile() is not None))
        t.start(); t.join()
        return box[0]
    sched = gpuprof.schedule(wait=2, warmup=1, active=2, repeat=2)
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU], schedule=sched) as prof:
        for _ in range(10):
            seen.append((sys.getprofile() is not None, hook_in_new_thread()))
            work()
            prof.step()
    ops = prof.ops()
    calls = {str(n): int(c) for n, c in zip(ops["name"], ops["calls"])}
    print(seen)
    print(calls["leaf"], calls["work"], len(prof.steps()))
""")


def test_the_profile_function_is_off_while_the_schedule_waits():
    # given: the profile-function backend and a schedule that waits 2 steps per cycle
    env = dict(__import__("os").environ, GPUPROF_HOOK="setprofile")
    # when: the loop runs 10 steps, two cycles of wait 2, warm-up 1, active 2
    r = subprocess.run(
        [sys.executable, "-c", WAITING], capture_output=True, text=True, timeout=120, env=env
    )
    # then: no thread pays for the hook while waiting, every thread has it while
    # recording, and the last window's two active steps have all their calls
    assert r.returncode == 0, r.stderr
    seen, counts = r.stdout.splitlines()
    on = (True, True)
    off = (False, False)
    assert seen == repr([off, off, on, on, on, off, off, on, on, on]), seen
    assert counts == "20 2 2", counts
