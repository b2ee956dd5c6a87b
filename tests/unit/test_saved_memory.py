"""Saved profiles keep what profile_memory=True recorded: a loaded profile answers
memory_summary(), memory_curve() and plot_memory() as the live one did."""

import json
import zipfile

import gpuprof
import numpy as np
import pytest
from gpuprof.exporters.saved import FORMAT_VERSION
from test_memory import MiB, _fake_torch, _let_the_sampler_run, _set, _torch_stats, resident_block

CPU = [gpuprof.ProfilerActivity.CPU]


@pytest.fixture
def torch_memory_prof(monkeypatch):
    """A profile whose allocator samples come from a stand-in torch (device 0 peaks
    at 150 MiB allocated, 400 MiB reserved) and whose host RSS rises by 64 MiB."""
    stats = _torch_stats(1 * MiB, 2 * MiB, 1 * MiB)
    _fake_torch(monkeypatch, {0: stats})
    with gpuprof.profile(
        activities=CPU, profile_memory=True, memory_sample_interval_s=0.002
    ) as prof:
        _let_the_sampler_run(prof)
        _set(stats, 100 * MiB, 400 * MiB, 150 * MiB)
        held = resident_block(64 * MiB)
        _let_the_sampler_run(prof)
        _set(stats, 0, 400 * MiB, 150 * MiB)
        _let_the_sampler_run(prof)
    del held
    return prof


def test_memory_summary_and_curves_survive_save_and_load(torch_memory_prof, tmp_path):
    prof = torch_memory_prof
    path = tmp_path / "mem.gpuprof"
    prof.save(path)
    loaded = gpuprof.load(path)
    assert loaded.profile_memory
    live, back = prof.memory_summary(), loaded.memory_summary()
    assert back.to_dict() == live.to_dict()
    assert str(back) == str(live)
    d = back.devices["cuda:0"]
    assert d.peak_source == "torch" and d.peak_bytes == 150 * MiB
    assert d.allocator["peak_reserved_bytes"] == 400 * MiB
    assert back.host["peak_bytes"] - back.host["start_bytes"] >= 60 * MiB
    for device, source in (("cuda:0", "torch"), ("cuda:0", "auto"), ("cpu", "auto")):
        a, b = prof.memory_curve(device, source=source), loaded.memory_curve(device, source=source)
        assert len(a) > 5 and np.array_equal(a, b), (device, source)


def test_only_the_samples_inside_the_window_are_saved(torch_memory_prof, tmp_path):
    path = tmp_path / "mem.gpuprof"
    torch_memory_prof.save(path)
    start, end = torch_memory_prof.results.window_bounds()
    with zipfile.ZipFile(path) as zf:
        doc = json.loads(zf.read("meta.json"))
        names = set(zf.namelist())
    assert doc["version"] == FORMAT_VERSION == 3
    assert doc["memory"]["allocators"] == {"torch": [0]}
    assert {"memory/host.npy", "memory/torch.0.npy"} <= names
    loaded = gpuprof.load(path)
    ts = loaded.results.memory_samples.host_samples()["timestamp_ns"]
    assert len(ts) and ts.min() >= start and ts.max() <= end
    sampler_ts = torch_memory_prof.results.memory_samples.host_samples()["timestamp_ns"]
    assert len(ts) == int(((sampler_ts >= start) & (sampler_ts <= end)).sum())


def test_a_profile_without_memory_says_so_when_loaded(tmp_path):
    with gpuprof.profile(activities=CPU) as prof:
        sum(range(1000))
    path = tmp_path / "plain.gpuprof"
    prof.save(path)
    loaded = gpuprof.load(path)
    assert not loaded.profile_memory and loaded.results.memory_samples is None
    for call in (loaded.memory_summary, loaded.memory_curve, loaded.plot_memory):
        with pytest.raises(RuntimeError, match="has no memory data.*profile_memory=True"):
            call()


def test_a_version_2_file_with_memory_has_its_cupti_summary(torch_memory_prof, tmp_path):
    """Files saved before format 3 kept no samples: their summary has no allocator
    and no host part, but works."""
    path = tmp_path / "v2.gpuprof"
    torch_memory_prof.save(path)
    with zipfile.ZipFile(path) as zf:
        entries = {n: zf.read(n) for n in zf.namelist() if not n.startswith("memory/")}
    doc = json.loads(entries["meta.json"])
    doc["version"] = 2
    del doc["memory"]
    entries["meta.json"] = json.dumps(doc).encode()
    with zipfile.ZipFile(path, "w") as zf:
        for n, data in entries.items():
            zf.writestr(n, data)
    summary = gpuprof.load(path).memory_summary()
    assert summary.host is None and summary.devices == {}
