"""Memory curves and summary: host RSS sampler, CUPTI device curve from synthetic records,
allocator adapters with stand-in frameworks, bad input, and the sampler staying invisible."""

import functools
import itertools
import mmap
import os
import sys
import time
import types

import gpuprof
import numpy as np
import pytest
from gpuprof import _gpuprof
from gpuprof.analysis import memory
from gpuprof.record._allocators import TorchAdapter
from gpuprof.record._host_sampler import HOST_DTYPE, Series
from gpuprof.results._results import Results

C = _gpuprof._test_constants()
MiB = 1 << 20
SOURCE_LINES = open(__file__, encoding="utf-8").read().splitlines()
CPU = [gpuprof.ProfilerActivity.CPU]
PKG_DIR = os.path.dirname(os.path.abspath(gpuprof.__file__)) + os.sep
CUDA_MALLOC = 20  # CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020 (only its key is used)


def _tasks():
    try:
        return set(os.listdir("/proc/self/task"))
    except OSError:
        pytest.skip("no /proc/self/task to count threads")


# -- host curve -------------------------------------------------------------------------------
def _samples_taken(sampler):
    """Host samples the sampler has taken so far (its ring buffer's rows and drops)."""
    return len(sampler.host.data) // sampler.host.ncols + sampler.host.dropped


def _let_the_sampler_run(prof, samples=2):
    """Wait until the memory sampler's thread has taken ``samples`` more samples, so
    that what was set before is in the curves however slowly the machine runs (a
    count, not a sleep that the sampler must win). Fails, rather than hangs, if the
    thread never samples."""
    sampler = prof._memory_sampler
    target = _samples_taken(sampler) + samples
    for _ in range(120_000):
        if _samples_taken(sampler) >= target:
            return
        time.sleep(0.0005)  # WAIT LINE
    pytest.fail(f"the memory sampler took no {samples} samples in a minute")


def resident_block(nbytes):
    """``nbytes`` of memory that is resident while the returned object lives: an
    anonymous mapping of its own with every page written. Not a bytearray: malloc
    may serve that from freed heap pages that are already resident, and then the
    RSS does not move."""
    block = mmap.mmap(-1, nbytes)
    for offset in range(0, nbytes, mmap.PAGESIZE):
        block[offset] = 1
    return block


def _hold_200mb(prof):
    buf = resident_block(200 * MiB)
    _let_the_sampler_run(prof)
    return len(buf)


def test_host_curve_rises_with_a_200mb_allocation():
    with gpuprof.profile(activities=CPU, profile_memory=True) as prof:
        _hold_200mb(prof)
        _let_the_sampler_run(prof)
    curve = prof.memory_curve("cpu")
    assert curve.dtype == HOST_DTYPE
    assert curve.dtype.names == ("timestamp_ns", "rss_bytes")
    assert len(curve) >= 5  # the start's, 2 + 2 of the thread's, the stop's
    ts = curve["timestamp_ns"]
    assert np.all(np.diff(ts) > 0)
    start, end = prof.results.window_bounds()
    assert ts[0] >= start and ts[-1] <= end
    rss = curve["rss_bytes"]
    assert rss.min() > 1 * MiB
    assert rss.max() - rss[0] >= 150 * MiB
    s = prof.memory_summary()
    assert s.host["peak_bytes"] == rss.max()
    assert s.host["rss_source"] in ("statm", "getrusage")
    if s.host["rss_source"] == "statm":
        # the peak was sampled while the program waited, holding the buffer
        wait_line = SOURCE_LINES.index("        time.sleep(0.0005)  # WAIT LINE") + 1
        assert s.host["peak_location"].endswith(f"test_memory.py:{wait_line}")
    assert "host RSS" in str(s) or "host max RSS" in str(s)


@pytest.mark.parametrize("interval_s", [0.002, 0.02])
def test_interval_is_configurable(interval_s):
    """The thread waits the interval between samples: its samples are at least that
    far apart, so the window holds at most its length over the interval of them (a
    bound from the sampler's structure; how many it takes depends on the load)."""
    with gpuprof.profile(
        activities=CPU, profile_memory=True, memory_sample_interval_s=interval_s
    ) as prof:
        _let_the_sampler_run(prof, 5)
    ts = prof.memory_curve("cpu")["timestamp_ns"].astype(np.int64)
    # the start's sample, the thread's, the stop's (taken at once, however close)
    assert len(ts) >= 7
    assert np.diff(ts[:-1]).min() >= 0.99 * interval_s * 1e9
    start, end = prof.results.window_bounds()
    assert len(ts) <= (end - start) / (0.99 * interval_s * 1e9) + 2


def test_sampler_thread_stops_with_the_profile():
    before = _tasks()
    prof = gpuprof.profile(activities=CPU, profile_memory=True)
    prof.start()
    try:
        sampler = prof._memory_sampler
        assert sampler is not None and sampler.alive
        assert len(_tasks() - before) == 1
    finally:
        prof.stop()
    assert not sampler.alive
    deadline = time.monotonic() + 2
    while _tasks() - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not (_tasks() - before), "the memory sampler thread outlived the profile"
    # samples stay readable after the thread ended
    assert len(prof.memory_curve("cpu")) >= 2


def test_no_sampler_without_profile_memory():
    before = _tasks()
    with gpuprof.profile(activities=CPU) as prof:
        assert prof._memory_sampler is None
        assert not (_tasks() - before)
    with pytest.raises(RuntimeError, match=r"profile_memory=True"):
        prof.memory_curve("cpu")
    with pytest.raises(RuntimeError, match=r"profile_memory=True"):
        prof.memory_summary()


def _busy(n):
    total = 0
    for i in range(n):
        total += i
    return total


def test_sampler_frames_and_calls_are_hidden(monkeypatch, no_gc):
    # (the GC is off: a collection inside the loop runs gc.callbacks that other
    # tests' libraries installed, hypothesis' among them, as calls of this thread)
    # stand-in frameworks so the adapters' calls run too
    _fake_torch(monkeypatch, {0: _torch_stats(1 * MiB, 2 * MiB, 1 * MiB)})
    _fake_cupy(monkeypatch, used=3 * MiB, total=4 * MiB)
    with gpuprof.profile(
        activities=CPU, profile_memory=True, memory_sample_interval_s=0.001
    ) as prof:
        sampler = prof._memory_sampler
        for _ in range(10_000_000):  # until the sampler took 5 samples (a count)
            if _samples_taken(sampler) > 5:
                break
            _busy(1000)
    assert len(prof.memory_curve("cpu")) > 5  # the sampler ran while the loop held the GIL
    assert {a.name for a in prof._memory_sampler.adapters} == {"torch", "cupy"}
    ops = prof.ops()
    leaked = [
        (n, f) for n, f in zip(ops["name"], ops["file"], strict=True) if str(f).startswith(PKG_DIR)
    ]
    assert not leaked
    names = set(ops["name"][ops["calls"] > 0])  # frames open at start are there with 0 calls
    assert names <= {
        "test_sampler_frames_and_calls_are_hidden",
        "_busy",
        "_samples_taken",
        "len",
        "ProfilerStep*",
    }, names
    # the sampler thread never ran under the hook
    assert len(prof.results.threads()) == 1


def test_importing_nothing(monkeypatch):
    had_torch = "torch" in sys.modules
    with gpuprof.profile(activities=CPU, profile_memory=True) as prof:
        pass
    assert ("torch" in sys.modules) == had_torch
    assert ("cupy" in sys.modules) == ("cupy" in sys.modules)
    if not had_torch:
        assert prof._memory_sampler.adapters == []


# -- device curve from synthetic CUPTI records ---------------------------------------------------
def alloc_three():
    a = empty(256)  # noqa: F821 (never run: its code object is the synthetic caller)
    b = empty(256)  # noqa: F821
    c = empty(256)  # noqa: F821
    return a, b, c


def _site(code, line):
    for start, _end, ln in code.co_lines():
        if ln == line:
            return start + 1  # GpSpanRow.site is f_lasti + 1
    raise AssertionError(line)


def _synthetic(extra_gpu=(), free_bytes=256 * MiB):
    """alloc_three calls 'empty' three times; each makes a cudaMalloc of 256 MiB (correlation
    10, 11, 12); then the three blocks are freed, the last one by a record without size."""
    key = _gpuprof._test_api_key(C["API_RUNTIME"], CUDA_MALLOC)["key"]
    # a str op stands in for the C function (its call site is what matters)
    ops = [(C["OP_PYTHON"], alloc_three.__code__, 0), (C["OP_USER"], "empty", 0)]
    ALLOC, EMPTY = 2, 3
    first = alloc_three.__code__.co_firstlineno
    ev = [(50, C["EV_STEP_BEGIN"], 0), (100, C["EV_CALL"], ALLOC)]
    gpu = []
    for k in range(3):
        t = 200 + 100 * k
        ev += [
            (t, C["EV_CCALL"], EMPTY, _site(alloc_three.__code__, first + 1 + k)),
            (t + 10, C["EV_API_ENTER"], 10 + k, key),
            (t + 20, C["EV_API_EXIT"], 10 + k),
            (t + 30, C["EV_CRETURN"], 0),
        ]
        gpu.append(
            dict(
                kind=C["GPU_MALLOC"],
                correlation=10 + k,
                start_ns=t + 15,
                end_ns=t + 15,
                bytes=256 * MiB,
                address=0x10000 * (k + 1),
                device=0,
                dst_mem=C["MEM_DEVICE"],
            )
        )
    ev += [(900, C["EV_RETURN"], 0), (950, C["EV_STEP_END"], 0)]
    for k in range(3):
        gpu.append(
            dict(
                kind=C["GPU_FREE"],
                start_ns=600 + 10 * k,
                end_ns=600 + 10 * k,
                bytes=free_bytes if k < 2 else 0,
                address=0x10000 * (k + 1),
                device=0,
            )
        )
    gpu += list(extra_gpu)
    raw = _gpuprof._test_aggregate(ops, [(1, 101, ev)], gpu, 0, 1000, [], 1)
    return Results([raw], cuda={"active": True, "mode": "callbacks", "error": None})


def test_device_curve_steps_exactly():
    res = _synthetic()
    c = memory.memory_curve(res, "cuda:0", source="cupti")
    assert c.dtype.names == ("timestamp_ns", "allocated_bytes", "reserved_bytes")
    assert c["timestamp_ns"].tolist() == [0, 215, 315, 415, 600, 610, 620, 1000]
    assert (c["allocated_bytes"] // MiB).tolist() == [0, 256, 512, 768, 512, 256, 0, 0]
    assert np.array_equal(c["reserved_bytes"], c["allocated_bytes"])
    # without an allocator adapter, auto is the CUPTI curve
    assert np.array_equal(memory.memory_curve(res, "cuda", source="auto"), c)


def test_device_curves_are_per_device():
    other = dict(
        kind=C["GPU_MALLOC"], start_ns=700, end_ns=700, bytes=64 * MiB, address=0x99, device=1
    )
    res = _synthetic([other])
    c0 = memory.memory_curve(res, "cuda:0", source="cupti")
    c1 = memory.memory_curve(res, "cuda:1", source="cupti")
    assert c0["allocated_bytes"].max() == 768 * MiB
    assert c1["allocated_bytes"].tolist() == [0, 64 * MiB, 64 * MiB]
    # a device with no records while CUDA capture was on: flat at 0
    assert memory.memory_curve(res, "cuda:5", source="cupti")["allocated_bytes"].tolist() == [0, 0]
    # CUDA capture off and nothing recorded: empty
    off = Results(res.windows, cuda={"active": False, "mode": "off", "error": "no GPU"})
    assert len(memory.memory_curve(off, "cuda:5")) == 0


def test_summary_peak_op_and_line():
    res = _synthetic()
    s = memory.memory_summary(res)
    assert list(s.devices) == ["cuda:0"]
    d = s.devices["cuda:0"]
    assert d.peak_bytes == 768 * MiB and d.peak_source == "cupti"
    r = d.driver
    assert r["peak_bytes"] == 768 * MiB and r["peak_ns"] == 415
    assert r["peak_op"] == "empty"
    third = alloc_three.__code__.co_firstlineno + 3
    assert r["peak_location"].endswith(f"test_memory.py:{third}")
    assert r["allocations"] == 3 and r["frees"] == 3
    # the last free came without its size: it is taken from the allocation at that address
    assert r["allocated_bytes_total"] == r["freed_bytes_total"] == 768 * MiB
    assert [x["bytes"] for x in r["largest"]] == [256 * MiB] * 3
    assert r["largest"][0]["location"].endswith(f"test_memory.py:{third - 2}")
    assert any("relative to the window start" in n for n in d.notes)
    text = str(s)
    assert "768.0 MiB" in text and f"test_memory.py:{third}" in text
    dd = s.to_dict()
    assert dd["devices"]["cuda:0"]["driver"]["peak_op"] == "empty"
    assert s._repr_html_().startswith("<pre>")
    assert "768.0 MiB" in repr(s)


def test_peak_op_found_by_time_without_correlation():
    # a record with no correlation is placed by time on the launching thread; here the
    # thread is unknown (-1), so only the op row could name it: nothing to name
    extra = dict(
        kind=C["GPU_MALLOC"], start_ns=800, end_ns=800, bytes=2048 * MiB, address=0x77, device=0
    )
    d = memory.memory_summary(_synthetic([extra])).devices["cuda:0"].driver
    assert d["peak_bytes"] == 2048 * MiB and d["peak_ns"] == 800
    assert d["peak_op"] == "" and d["peak_location"] == ""


# -- allocator adapters with stand-in frameworks --------------------------------------------------
def _torch_stats(allocated, reserved, peak):
    return {
        "allocated_bytes": {"all": {"current": allocated, "peak": peak}},
        "reserved_bytes": {"all": {"current": reserved, "peak": reserved}},
    }


def _set(stats, allocated, reserved, peak):
    stats["allocated_bytes"]["all"].update(current=allocated, peak=peak)
    stats["reserved_bytes"]["all"]["current"] = reserved


def _fake_torch(monkeypatch, stats_by_device, current=None):
    """A 'torch' module with the C entry points TorchAdapter reads (C callables only, so
    nothing of the stand-in shows up as an op either)."""
    torch = types.ModuleType("torch")
    torch._C = types.SimpleNamespace(
        _cuda_memoryStats=stats_by_device.__getitem__,
        _cuda_getDeviceCount=itertools.repeat(len(stats_by_device)).__next__,
        _cuda_getAllocatorBackend=itertools.repeat("native").__next__,
    )
    if current is not None:
        torch._C._cuda_getDevice = itertools.repeat(current).__next__
    torch.cuda = types.SimpleNamespace(_initialized=True)
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


def _fake_cupy(monkeypatch, used, total):
    state = {"used": used, "total": total}
    cupy = types.ModuleType("cupy")
    cupy._default_memory_pool = types.SimpleNamespace(  # C callables, like CuPy's cpdef methods
        used_bytes=functools.partial(state.__getitem__, "used"),
        total_bytes=functools.partial(state.__getitem__, "total"),
    )
    cupy.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDevice=itertools.repeat(0).__next__, setDevice=None)
    )
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    return state


def test_torch_adapter_curve_peak_and_gap(monkeypatch):
    stats = _torch_stats(1 * MiB, 2 * MiB, 1 * MiB)
    _fake_torch(monkeypatch, {0: stats, 1: _torch_stats(0, 0, 0)})
    with gpuprof.profile(
        activities=CPU, profile_memory=True, memory_sample_interval_s=0.002
    ) as prof:
        _let_the_sampler_run(prof)
        _set(stats, 100 * MiB, 400 * MiB, 150 * MiB)  # 150 MiB was reached between samples
        _let_the_sampler_run(prof)
        _set(stats, 0, 400 * MiB, 150 * MiB)
        _let_the_sampler_run(prof)
    c = prof.memory_curve("cuda:0", source="torch")
    assert c.dtype.names == ("timestamp_ns", "allocated_bytes", "reserved_bytes")
    assert set(c["allocated_bytes"].tolist()) == {1 * MiB, 100 * MiB, 0}
    assert c["reserved_bytes"].max() == 400 * MiB
    assert np.all(np.diff(c["timestamp_ns"]) > 0)
    assert np.array_equal(prof.memory_curve("cuda:0"), c)  # auto prefers the allocator
    assert len(prof.memory_curve("cuda:1", source="torch")) == 0  # never used: not sampled
    s = prof.memory_summary()
    d = s.devices["cuda:0"]
    assert d.peak_source == "torch"
    assert d.peak_bytes == 150 * MiB  # from torch's running maximum, not the samples
    a = d.allocator
    assert a["peak_reserved_bytes"] == 400 * MiB and a["end_allocated_bytes"] == 0
    assert a["gap_bytes"] == 250 * MiB
    assert any("never used more than 150.0 MiB" in n for n in d.notes)
    assert "torch allocator" in str(s)
    assert "cuda:1" not in s.devices


def test_no_gap_note_when_reserved_is_close(monkeypatch):
    stats = _torch_stats(100 * MiB, 120 * MiB, 100 * MiB)
    _fake_torch(monkeypatch, {0: stats})
    with gpuprof.profile(
        activities=CPU, profile_memory=True, memory_sample_interval_s=0.002
    ) as prof:
        _let_the_sampler_run(prof)
    d = prof.memory_summary().devices["cuda:0"]
    assert d.peak_bytes == 100 * MiB and not d.notes


def test_torch_reads_the_current_device_from_the_start(monkeypatch):
    stats = _torch_stats(0, 0, 0)
    _fake_torch(monkeypatch, {0: _torch_stats(0, 0, 0), 1: stats}, current=1)
    with gpuprof.profile(
        activities=CPU, profile_memory=True, memory_sample_interval_s=0.002
    ) as prof:
        _let_the_sampler_run(prof)
        _set(stats, 256 * MiB, 256 * MiB, 256 * MiB)
        _let_the_sampler_run(prof)
    c = prof.memory_curve("cuda:1", source="torch")
    assert c["allocated_bytes"][0] == 0 and c["allocated_bytes"][-1] == 256 * MiB
    assert len(prof.memory_curve("cuda:0", source="torch")) == 0


def test_torch_adapter_waits_for_cuda_init(monkeypatch):
    torch = _fake_torch(monkeypatch, {0: _torch_stats(5 * MiB, 6 * MiB, 5 * MiB)})
    torch.cuda._initialized = False
    with gpuprof.profile(
        activities=CPU, profile_memory=True, memory_sample_interval_s=0.002
    ) as prof:
        _let_the_sampler_run(prof)
        torch.cuda._initialized = True
        _let_the_sampler_run(prof)
    c = prof.memory_curve("cuda:0", source="torch")
    assert len(c) >= 1 and c["allocated_bytes"][0] == 5 * MiB


def test_cupy_adapter(monkeypatch):
    state = _fake_cupy(monkeypatch, used=0, total=0)
    with gpuprof.profile(
        activities=CPU, profile_memory=True, memory_sample_interval_s=0.002
    ) as prof:
        _let_the_sampler_run(prof)
        state.update(used=256 * MiB, total=256 * MiB)
        _let_the_sampler_run(prof)
    c = prof.memory_curve("cuda:0", source="cupy")
    assert c["allocated_bytes"][0] == 0 and c["allocated_bytes"].max() == 256 * MiB
    assert prof.memory_summary().devices["cuda:0"].peak_source == "cupy"


def test_failing_adapter_is_dropped_with_a_note(monkeypatch):
    torch = _fake_torch(monkeypatch, {0: _torch_stats(1, 1, 1)})
    torch._C._cuda_memoryStats = {}.__getitem__  # KeyError on every read
    with gpuprof.profile(
        activities=CPU, profile_memory=True, memory_sample_interval_s=0.002
    ) as prof:
        _let_the_sampler_run(prof)
    s = prof.memory_summary()
    assert any("torch allocator adapter disabled" in n for n in s.notes)
    assert len(prof.memory_curve("cpu")) >= 2


def test_torch_rescans_idle_devices(monkeypatch):
    stats = _torch_stats(0, 0, 0)
    _fake_torch(monkeypatch, {0: stats})
    monkeypatch.setattr(TorchAdapter, "RESCAN", 3)
    with gpuprof.profile(
        activities=CPU, profile_memory=True, memory_sample_interval_s=0.002
    ) as prof:
        _let_the_sampler_run(prof)
        _set(stats, 8 * MiB, 8 * MiB, 8 * MiB)
        # a rescan comes within RESCAN polls; from then on every poll reads the device
        _let_the_sampler_run(prof, samples=TorchAdapter.RESCAN + 2)
    c = prof.memory_curve("cuda:0", source="torch")
    assert len(c) >= 2 and c["allocated_bytes"].min() == 8 * MiB


# -- bad input --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mem_prof():
    with gpuprof.profile(activities=CPU, profile_memory=True) as prof:
        time.sleep(0.02)
    return prof


@pytest.mark.parametrize("device", ["gpu:0", "cuda:x", "cuda:-1", "cuda0", "", 0, None, "cuda:0:1"])
def test_bad_device(mem_prof, device):
    with pytest.raises(ValueError, match=r"device must be .*'cuda:N'.*'cpu'"):
        mem_prof.memory_curve(device)


def test_device_spellings(mem_prof):
    assert memory.parse_device("cuda") == 0
    assert memory.parse_device("CUDA:3") == 3
    assert memory.parse_device("cpu") is None
    assert mem_prof.memory_curve("cuda:0", source="cupti").dtype == memory.CUDA_CURVE_DTYPE


def test_bad_source(mem_prof):
    with pytest.raises(ValueError, match=r"source must be one of .*'cupti'"):
        mem_prof.memory_curve("cuda:0", source="nvml")
    with pytest.raises(ValueError, match=r"host"):
        mem_prof.memory_curve("cpu", source="torch")


@pytest.mark.parametrize("value", [0, -1, "0.01", True, float("nan"), float("inf"), None])
def test_bad_interval(value):
    with pytest.raises(ValueError, match=r"memory_sample_interval_s must be a positive number"):
        gpuprof.profile(activities=CPU, profile_memory=True, memory_sample_interval_s=value)


def test_series_keeps_the_newest_rows():
    s = Series(2, capacity=4)
    for i in range(6):
        s.append((i, 10 * i))
    a = s.array(HOST_DTYPE)
    assert a["timestamp_ns"].tolist() == [2, 3, 4, 5]
    assert a["rss_bytes"].tolist() == [20, 30, 40, 50]
    assert s.dropped == 2


def test_format_bytes():
    assert memory.format_bytes(512) == "512 B"
    assert memory.format_bytes(256 * MiB) == "256.0 MiB"
    assert memory.format_bytes(3 << 30) == "3.00 GiB"
    assert memory.format_bytes(-2 * MiB) == "-2.0 MiB"


# -- plot -------------------------------------------------------------------------------------
def test_plot_needs_matplotlib(mem_prof, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install matplotlib"):
        mem_prof.plot_memory()


def test_plot_bad_target(mem_prof):
    with pytest.raises(TypeError, match=r"path_or_ax"):
        mem_prof.plot_memory(42)


def test_plot_figure_path_and_ax(mem_prof, tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    fig = mem_prof.plot_memory()
    assert isinstance(fig, Figure) and fig.axes
    out = tmp_path / "mem.png"
    mem_prof.plot_memory(str(out))
    assert out.stat().st_size > 1000
    ax = Figure().add_subplot()
    assert mem_prof.plot_memory(ax) is ax
    assert ax.lines


def test_plot_device_curves(tmp_path):
    pytest.importorskip("matplotlib")
    fig = memory.plot_memory(_synthetic(), tmp_path / "dev.svg")
    assert (tmp_path / "dev.svg").exists()
    labels = [ln.get_label() for ax in fig.axes for ln in ax.lines]
    assert any("cuda:0" in lb for lb in labels)


def test_default_device_curve_sums_every_allocator(monkeypatch):
    """PyTorch and CuPy on one device: the default curve and the summary's peak follow
    both, and say so; each allocator's own curve stays one source= away."""
    stats = _torch_stats(10 * MiB, 20 * MiB, 10 * MiB)
    _fake_torch(monkeypatch, {0: stats})
    cupy = _fake_cupy(monkeypatch, used=0, total=0)
    with gpuprof.profile(
        activities=CPU, profile_memory=True, memory_sample_interval_s=0.002
    ) as prof:
        _let_the_sampler_run(prof)
        cupy.update(used=96 * MiB, total=96 * MiB)  # a 96 MiB CuPy array
        _let_the_sampler_run(prof)
        _set(stats, 50 * MiB, 60 * MiB, 50 * MiB)
        _let_the_sampler_run(prof)
        cupy.update(used=0)
        _let_the_sampler_run(prof)
    c = prof.memory_curve("cuda:0")
    torch_c = prof.memory_curve("cuda:0", source="torch")
    cupy_c = prof.memory_curve("cuda:0", source="cupy")
    assert cupy_c["allocated_bytes"].max() == 96 * MiB
    assert c["allocated_bytes"].max() == 146 * MiB  # 50 MiB of tensors + the CuPy array
    assert c["reserved_bytes"].max() == 156 * MiB
    assert c["allocated_bytes"][-1] == 50 * MiB
    assert np.all(np.diff(c["timestamp_ns"]) > 0)
    assert set(torch_c["timestamp_ns"]) | set(cupy_c["timestamp_ns"]) == set(c["timestamp_ns"])
    d = prof.memory_summary().devices["cuda:0"]
    assert d.peak_bytes == 146 * MiB
    assert d.peak_source == "torch + cupy"
    assert any("sums 2 allocators (torch, cupy)" in n for n in d.notes)


def test_an_allocator_that_holds_nothing_leaves_the_curve_alone(monkeypatch):
    """CuPy imported but never allocating: the default curve is PyTorch's, exact peak
    (its running maximum) included."""
    stats = _torch_stats(1 * MiB, 2 * MiB, 1 * MiB)
    _fake_torch(monkeypatch, {0: stats})
    _fake_cupy(monkeypatch, used=0, total=0)
    with gpuprof.profile(
        activities=CPU, profile_memory=True, memory_sample_interval_s=0.002
    ) as prof:
        _let_the_sampler_run(prof)
        _set(stats, 100 * MiB, 400 * MiB, 150 * MiB)  # 150 MiB between two samples
        _let_the_sampler_run(prof)
    assert np.array_equal(prof.memory_curve("cuda:0"), prof.memory_curve("cuda:0", "torch"))
    d = prof.memory_summary().devices["cuda:0"]
    assert d.peak_source == "torch" and d.peak_bytes == 150 * MiB
