"""A Chrome trace of a real GPU run: written, read back, linked, and the same after save/load.

Marked `gpu`: skipped where GPU capture is unusable.
"""

import gzip
import json

import gpuprof
import pytest
from gpu_helpers import cuda_torch

pytestmark = pytest.mark.gpu
CUDA = [gpuprof.ProfilerActivity.CPU, gpuprof.ProfilerActivity.CUDA]
GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


def _profile(torch):
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256).pin_memory()

    def step():
        xb = x.cuda(non_blocking=True)
        with gpuprof.record_function("forward"):
            loss = model(xb).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    torch.cuda.synchronize()
    with gpuprof.profile(activities=CUDA) as prof:
        for _ in range(3):
            step()
            prof.step()
        torch.cuda.synchronize()
    return prof


def _slices(trace, cat):
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == cat]


def test_trace_of_a_gpu_run_links_every_kernel_to_its_launch(tmp_path):
    prof = _profile(cuda_torch())
    path = tmp_path / "run.pt.trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())

    kernels = _slices(trace, "kernel")
    assert len(kernels) >= 3 * 5
    assert len(kernels) == int((prof.gpu_events()["kind"] == "kernel").sum())
    runtime = {
        e["args"]["correlation"]: e
        for e in _slices(trace, "cuda_runtime") + _slices(trace, "cuda_driver")
    }
    flows = {}
    for e in trace["traceEvents"]:
        if e.get("cat") == "ac2g":
            flows.setdefault(e["id"], {})[e["ph"]] = e
    for k in kernels:
        corr = k["args"]["correlation"]
        api = runtime[corr]  # the launch is in the trace, with the same correlation
        assert api["ts"] <= k["ts"], (api, k)
        pair = flows[corr]
        assert (pair["s"]["tid"], pair["s"]["ts"]) == (api["tid"], api["ts"])
        assert (pair["f"]["pid"], pair["f"]["tid"], pair["f"]["ts"]) == (
            k["pid"],
            k["tid"],
            k["ts"],
        )
        assert "stream" in k["args"] and "device" in k["args"]

    # the record_function range, on the host and projected onto the GPU lanes of its work
    host = [e for e in _slices(trace, "user_annotation") if e["name"] == "forward"]
    assert len(host) == 3
    ids = {e["args"]["External id"] for e in host}
    gpu = [e for e in _slices(trace, "gpu_user_annotation") if e["name"] == "forward"]
    assert gpu and {e["args"]["External id"] for e in gpu} <= ids
    for g in gpu:
        assert "stream" not in g["args"]
        inside = [
            k
            for k in kernels
            if k["args"].get("External id") == g["args"]["External id"]
            and (k["pid"], k["tid"]) == (g["pid"], g["tid"])
        ]
        assert inside, g
        for k in inside:
            assert g["ts"] <= k["ts"] and k["ts"] + k["dur"] <= g["ts"] + g["dur"] + 1e-3
    steps = [e for e in _slices(trace, "user_annotation") if e["name"].startswith("ProfilerStep#")]
    assert len(steps) >= 3


def test_saved_gpu_profile_exports_the_same_trace(tmp_path):
    prof = _profile(cuda_torch())
    prof.save(str(tmp_path / "run.gpuprof"))
    loaded = gpuprof.load(str(tmp_path / "run.gpuprof"))
    prof.export_chrome_trace(str(tmp_path / "live.json"))
    loaded.export_chrome_trace(str(tmp_path / "loaded.json.gz"))
    live = json.loads((tmp_path / "live.json").read_text())
    with gzip.open(tmp_path / "loaded.json.gz", "rt") as f:
        again = json.load(f)

    def work(trace):
        return sorted(
            (e["name"], e["ts"], e["dur"], e["args"]["correlation"])
            for e in trace["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") in GPU_WORK
        )

    assert work(live) and work(live) == work(again)


def _launchers(trace):
    """correlation -> the names of the python_function slices around its runtime call."""
    py = _slices(trace, "python_function")
    out = {}
    for api in _slices(trace, "cuda_runtime") + _slices(trace, "cuda_driver"):
        t0, t1 = api["ts"], api["ts"] + api["dur"]
        out[api["args"]["correlation"]] = sorted(
            e["name"]
            for e in py
            if e["tid"] == api["tid"] and e["ts"] <= t0 and t1 <= e["ts"] + e["dur"]
        )
    return out


def test_thinned_trace_keeps_every_launch_and_its_python_calls(tmp_path):
    prof = _profile(cuda_torch())
    prof.export_chrome_trace(str(tmp_path / "all.json"))
    prof.export_chrome_trace(str(tmp_path / "thin.json"), min_duration_us=50)
    full = json.loads((tmp_path / "all.json").read_text())
    thin = json.loads((tmp_path / "thin.json").read_text())
    py_full, py_thin = _slices(full, "python_function"), _slices(thin, "python_function")
    assert thin["gpuprof_omitted_calls"] == len(py_full) - len(py_thin) > 0
    # the GPU work, the launches and their flows are all still there
    for cat in GPU_WORK + ("cuda_runtime", "cuda_driver", "user_annotation", "gpu_user_annotation"):
        assert len(_slices(thin, cat)) == len(_slices(full, cat)), cat
    assert sum(e.get("cat") == "ac2g" for e in thin["traceEvents"]) == sum(
        e.get("cat") == "ac2g" for e in full["traceEvents"]
    )
    # every launch sits in the same Python and C calls as in the full trace
    assert _launchers(thin) == _launchers(full)
    # and the calls left out are short ones that launched nothing
    assert all(
        e["dur"] >= 50
        for e in py_thin
        if not any(e["name"] in names for names in _launchers(thin).values())
    )
