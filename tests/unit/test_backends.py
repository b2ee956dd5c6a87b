"""Hook backends: sys.monitoring on 3.12+, the profile function before (GPUPROF_HOOK)."""

import subprocess
import sys
import textwrap

import pytest
from gpuprof import _monitoring

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
    print(prof._monitoring, calls["leaf"], calls["gen"], calls["work"], calls["list.append"])
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
