"""Module instances (gpuprof.record._modules, gpuprof.results._module_rows): each call of a
``torch.nn.Module`` is charged to its instance, named as in the model, on PyTorch's CPU
wheel (the GPU columns are checked in tests/gpu/test_backward_gpu.py)."""

import json

import gpuprof
import numpy as np
import pytest

torch = pytest.importorskip("torch")
CPU = [gpuprof.ProfilerActivity.CPU]


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.act = torch.nn.GELU()

    def forward(self, x):
        return self.act(self.fc(x))


class Net(torch.nn.Module):
    def __init__(self, n=12):
        super().__init__()
        self.h = torch.nn.ModuleList([Block() for _ in range(n)])
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        for block in self.h:  # one line, one call-tree path: twelve instances all the same
            x = block(x)
        return self.head(x)


def _run(**kw):
    net, x = Net(), torch.randn(8, 16)
    with gpuprof.profile(activities=CPU, **kw) as prof:
        for _ in range(3):
            net(x).sum().backward()
            prof.step()
    return prof


def test_each_instance_is_a_row_named_as_in_the_model():
    prof = _run()
    mods = prof.modules()
    names = list(mods["name"])
    assert names[0] == "Net" and mods["parent"][0] == -1
    blocks = mods[mods["cls"] == "Block"]
    assert list(blocks["name"]) == [f"h.{i}" for i in range(12)]  # twelve rows, not one
    assert (blocks["calls"] == 3).all() and (blocks["depth"] == 1).all()
    fc = mods[mods["name"] == "h.3.fc"][0]
    assert fc["cls"] == "Linear" and names[fc["parent"]] == "h.3" and fc["depth"] == 2
    # a block's time holds its Linear's and its GELU's
    for i in range(12):
        b = mods[mods["name"] == f"h.{i}"][0]
        inner = mods[np.isin(mods["name"], [f"h.{i}.fc", f"h.{i}.act"])]
        assert b["cpu_total_ns"] >= inner["cpu_total_ns"].sum() > 0
    assert mods[mods["name"] == "Net"][0]["cpu_total_ns"] >= blocks["cpu_total_ns"].sum()
    table = str(prof.module_table())
    assert "    h.11.act" in table and "GELU" in table  # nested by indentation
    assert "No GPU work recorded" in table and "Fwd CUDA" not in table


def test_trace_names_module_calls_by_instance(tmp_path):
    prof = _run()
    path = prof.export_chrome_trace(str(tmp_path / "t.json"))
    with open(path) as f:
        names = {e["name"] for e in json.load(f)["traceEvents"] if e.get("ph") == "X"}
    assert {
        "nn.Module: h.0 (Block)",
        "nn.Module: h.11.fc (Linear)",
        "nn.Module: Net (Net)",
    } <= names


def test_saved_profile_keeps_the_names(tmp_path):
    prof = _run()
    path = prof.save(str(tmp_path / "p.gpuprof"))
    loaded = gpuprof.load(path)
    assert list(loaded.modules()["name"]) == list(prof.modules()["name"])


def test_off_and_without_torch_calls():
    prof = _run(modules=False)
    assert len(prof.modules()) == 0
    with pytest.raises(TypeError, match="modules must be a bool"):
        gpuprof.profile(activities=CPU, modules="yes")


def test_instances_are_let_go_after_stop():
    import gc
    import weakref

    net = Net(2)
    with gpuprof.profile(activities=CPU) as prof:
        net(torch.randn(2, 16))
        assert len(gpuprof._gpuprof._module_instances()) == 8
    ref = weakref.ref(net)
    del net
    gc.collect()
    assert ref() is None  # the profile holds names, not modules
    assert len(prof.modules()) == 8


def test_html_report_has_the_module_tree(tmp_path):
    prof = _run()
    from gpuprof.exporters.html import report_data

    data = report_data(prof.results)
    rows = data["modules"]["rows"]
    assert [r["name"] for r in rows][:2] == ["Net", "h.0"]
    assert rows[1]["parent"] == 0 and data["modules"]["gpu"] is False
    path = prof.export_html(str(tmp_path / "r.html"))
    with open(path) as f:
        page = f.read()
    assert "modulesSection" in page and "h.11.fc" in page


def test_innermost_marked_looks_up_the_span_tree_and_stops_where_told():
    from gpuprof.core._spans import innermost_marked

    # 0 <- 1 <- 2 <- 3 <- 4 and 1 <- 5 <- 6; marked: 1 and 3; a stop at 5
    spans = np.zeros(7, dtype=[("parent", "i4")])
    spans["parent"] = [-1, 0, 1, 2, 3, 1, 5]
    marked = np.array([0, 1, 0, 1, 0, 0, 0], dtype=bool)
    assert list(innermost_marked(spans, marked)) == [-1, 1, 1, 3, 3, 1, 1]
    stop = np.array([0, 0, 0, 0, 0, 1, 0], dtype=bool)
    assert list(innermost_marked(spans, marked, stop)) == [-1, 1, 1, 3, 3, -1, -1]


def test_torch_imported_after_start_is_picked_up_at_a_step(monkeypatch):
    """`python -m gpuprof run` starts before the program imports PyTorch: the module
    calls are recorded from the first step after it did."""
    import sys

    net, x = Net(2), torch.randn(2, 16)
    monkeypatch.delitem(sys.modules, "torch")
    prof = gpuprof.profile(activities=CPU, schedule=gpuprof.schedule(wait=0, warmup=1, active=2))
    prof.start()
    monkeypatch.undo()  # "import torch"
    try:
        for _ in range(3):
            net(x)
            prof.step()
    finally:
        prof.stop()
    assert list(prof.modules()["name"])[:2] == ["Net", "h.0"]
