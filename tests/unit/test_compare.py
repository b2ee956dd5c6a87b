"""gpuprof.compare on two CPU profiles: a slow input pipeline fixed."""

import time
import zlib

import gpuprof
import pytest

CPU = [gpuprof.ProfilerActivity.CPU]


def slow_loader(n, delay):
    for i in range(n):
        if delay:
            time.sleep(delay)  # a stand-in for per-sample decoding
        yield i


BLOCK = bytes(8 << 20)


def compute(x):
    # about 10 ms of C work per step that allocates nothing (the same under ASan), so
    # the host preempting the fast loop while it resumes its generator (a time slice
    # of a few ms on a loaded machine) stays under the 5% a finding needs
    for _ in range(3):
        x = zlib.crc32(BLOCK, x)
    return x


def run(delay):
    with gpuprof.profile(activities=CPU) as prof:
        for batch in slow_loader(12, delay):
            compute(batch)
            prof.step()
    return prof


def test_compare_reports_the_gain_and_the_finding_gone():
    slow, fast = run(0.02), run(None)
    assert "data_stall" in slow.diagnose().kinds()
    assert "data_stall" not in fast.diagnose().kinds()
    c = gpuprof.compare(slow, fast)
    assert c.speedup > 1.5
    assert "data_stall" in c.findings_gone
    sleep = [d for d in c.ops if d.name == "time.sleep"]
    assert sleep and sleep[0].after_ns == 0 and sleep[0].before_ns > 5e6
    text = str(c)
    assert "step time" in text and "findings gone: data_stall" in text


def test_compare_bad_input():
    with pytest.raises(TypeError, match="compare"):
        gpuprof.compare(1, 2)
    prof = run(None)
    with pytest.raises(ValueError, match="limit"):
        gpuprof.compare(prof, prof, limit=0)
