"""The HTML report (gpuprof/exporters/html.py) without a browser: the page is one file that
fetches nothing, its figures are those of the text reports, bad input is refused.
tests/browser/test_report_browser.py opens the same pages in Chromium."""

import json
import os
import re

import gpuprof
import numpy as np
import pytest
from gpuprof.analysis.diagnose import diagnose, step_breakdown
from gpuprof.analysis.distributed import comm_overlap
from gpuprof.exporters.html import FLAME_MIN_SHARE, export_html
from gpuprof.results.views import kernel_table
from report_profiles import (
    US,
    forward,
    launch_bound_results,
    rows_of,
    training_results,
    where,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOSTILE = '</script><img src=x onerror="window.__pwned=1"> \u2028 <!-- \ud800'


def page_data(path):
    """The JSON document inside a written page."""
    with open(path, encoding="utf-8", errors="surrogatepass") as f:
        text = f.read()
    m = re.search(r'<script type="application/json" id="gpuprof-data">(.*?)</script>', text, re.S)
    assert m, "no data element"
    return json.loads(m.group(1)), text


@pytest.fixture(scope="module")
def training():
    return training_results(label=HOSTILE)


@pytest.fixture(scope="module")
def report(training, tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "report.html"
    assert export_html(training, path) == str(path)
    return page_data(path)


# ---- one file, no network --------------------------------------------------------------------


def test_the_page_carries_its_scripts_and_data_and_may_fetch_nothing(report):
    data, text = report
    assert text.startswith("<!DOCTYPE html>")
    assert not re.search(r"<(script|img|iframe)[^>]*\bsrc\s*=", text, re.I)
    assert not re.search(r"<link\b", text, re.I)
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', text).group(1)
    assert "default-src 'none'" in csp and "connect-src" not in csp
    # the only address in the file is Perfetto's, opened by its button (and the SVG
    # namespace's name, which is never fetched)
    assert set(re.findall(r"https?://[\w./-]+", text)) == {
        "https://ui.perfetto.dev",
        "http://www.w3.org/2000/svg",
    }
    assert text.count("<script") == 2  # the data and the page's own script


def test_names_from_the_profile_cannot_end_the_data_element(report):
    data, text = report
    assert "</script><img" not in text
    assert HOSTILE in data["op_names"]  # the label comes back exactly, lone surrogate too


# ---- the same figures as the text reports ---------------------------------------------------


def test_diagnosis_is_prof_diagnose(training, report):
    data, _ = report
    want = diagnose(training).to_dict()
    got = data["diagnosis"]
    assert got["summary"] == want["summary"]
    assert [
        {k: v for k, v in f.items() if k != "evidence_text"} for f in got["findings"]
    ] == json.loads(json.dumps(want["findings"]))
    kinds = [f["kind"] for f in got["findings"]]
    assert kinds[:4] == ["data_stall", "no_mixed_precision", "gpu_idle", "sync_point"]
    stall = got["findings"][0]
    assert stall["location"] == where(gpuprof_loader_next())
    assert ["wait_per_step_ns", "300.000us"] in stall["evidence_text"]
    assert got["text"] == str(diagnose(training))


def gpuprof_loader_next():
    from report_profiles import Loader

    return Loader.__next__


def test_op_table_has_the_rows_and_cells_of_key_averages_table(training, report):
    data, _ = report
    ops = data["ops"]
    ka = gpuprof.KeyAverages(training, show_memory=True)
    text_rows = rows_of(
        ka.table(sort_by="self_cuda_time_total", row_limit=-1, max_name_column_width=1000)
    )
    cols = [c["title"] for c in ops["columns"]]
    assert cols[ops["sort"]] == "Self CUDA"
    # the page's rows, in its default order (Self CUDA, most first; ties in row order)
    order = sorted(range(len(ops["rows"])), key=lambda i: (-ops["keys"][i][ops["sort"]], i))
    assert len(order) == len(text_rows) == len(ka)
    assert [ops["rows"][i] for i in order if HOSTILE not in ops["rows"][i][0]] == [
        r for r in text_rows if not r[0].startswith("</script>")
    ]
    assert ops["rows"][order[0]][0] == f"forward ({where(forward)})"
    # every numeric column sorts by the number it shows
    calls = cols.index("# of Calls")
    assert [k[calls] for k in ops["keys"]] == [float(c) for c in ka.rows["calls"]]


def test_kernel_table_is_kernel_table_with_every_row(training, report):
    data, _ = report
    want = kernel_table(training.kernels(), row_limit=-1, max_name_width=1 << 30)
    assert data["kernels"]["rows"] == want.rows
    assert [c["title"] for c in data["kernels"]["columns"]] == want.headers
    total = data["kernels"]["columns"].index({"title": "Total", "align": "r"})
    keys = [k[total] for k in data["kernels"]["keys"]]
    assert keys == sorted(keys, reverse=True) and keys[0] == 6 * 400 * US


def test_step_bars_are_step_breakdown_and_mark_the_window(training, report):
    data, _ = report
    b = step_breakdown(training)
    got = data["steps"]["breakdown"]
    for field in (
        "step",
        "step_ns",
        "gpu_busy_ns",
        "comm_ns",
        "data_wait_ns",
        "sync_wait_ns",
        "idle_ns",
    ):
        assert got[field] == b[field].tolist(), field
    assert got["data_wait_ns"] == [300 * US] * 6
    (w,) = data["steps"]["windows"]
    raw = training.windows[0]
    assert (w["first_step"], w["last_step"]) == (0, 5)
    assert (w["start_ns"], w["end_ns"]) == (raw["window_start_ns"], raw["window_end_ns"])
    assert len(data["steps"]["table"]["rows"]) == 6


def test_many_steps_draw_the_fastest_and_slowest_of_each_stretch_and_sum_them_all(
    tmp_path, monkeypatch
):
    """Past STEP_BARS steps the page does not grow with the steps: it draws the first,
    the last, and the extremes of each stretch; the sums count every step."""
    from gpuprof.exporters import html

    monkeypatch.setattr(html, "STEP_BARS", 20)
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        for i in range(300):
            sum(range(20_000 if i == 150 else 200))  # one slow step in the middle
            prof.step()
    data, _ = page_data(prof.export_html(tmp_path / "r.html"))
    st = data["steps"]
    b = step_breakdown(prof.results)
    drawn = st["breakdown"]["step"]
    assert len(drawn) <= 22 and drawn == sorted(drawn)
    assert drawn[0] == 0 and drawn[-1] == 299 and 150 in drawn
    assert max(st["breakdown"]["step_ns"]) == int(b["step_ns"].max())
    assert st["total_steps"] == 300
    assert st["totals"]["step_ns"] == int(b["step_ns"].sum())
    assert [r[0] for r in st["table"]["rows"]] == [str(n) for n in drawn]


def test_accumulated_windows_each_get_their_band_and_the_flame_graph_shows_the_last(tmp_path):
    a, b = training_results(steps=3), training_results(steps=5, loader_us=30)
    both = gpuprof.Results(a.windows + b.windows, cuda=a.cuda, meta=a.meta)
    data, _ = page_data(export_html(both, tmp_path / "r.html"))
    windows = data["steps"]["windows"]
    assert [(w["first_step"], w["last_step"]) for w in windows] == [(0, 2), (0, 4)]
    assert data["steps"]["breakdown"]["window"] == [0] * 3 + [1] * 5
    assert data["summary"]["windows"] == 2
    assert data["flame"]["total"] == b.call_tree()["total_ns"].tolist()


def test_flame_graph_is_the_call_tree(training, report):
    data, _ = report
    f = data["flame"]
    tree = training.call_tree()
    assert f["omitted"] == 0
    assert f["total"] == tree["total_ns"].tolist()
    assert f["cuda_total"] == tree["cuda_total_ns"].tolist()
    assert [data["op_names"][o] for o in f["op"]] == tree["name"].tolist()
    assert f["parent"] == tree["parent"].tolist()
    assert f["threads"] == ["thread 0"]


def test_flame_graph_leaves_out_paths_too_small_to_see_and_keeps_their_callers():
    res = launch_bound_results(steps=3, layers=4)
    tree = res.call_tree()
    cut = FLAME_MIN_SHARE * tree["total_ns"][tree["parent"] < 0].sum()
    small = (tree["total_ns"] < cut) & (
        (tree["cuda_total_ns"] == 0)
        | (
            tree["cuda_total_ns"]
            < FLAME_MIN_SHARE * tree["cuda_total_ns"][tree["parent"] < 0].sum()
        )
    )
    # given: a window of 750 us has call paths under 75 ns: make one
    raw = dict(res.windows[0])
    nodes = raw["nodes"].copy()
    leaf = int(np.flatnonzero(nodes["parent"] >= 0)[-1])
    nodes["total_ns"][leaf] = nodes["self_ns"][leaf] = 1
    nodes["cuda_total_ns"][leaf] = nodes["cuda_self_ns"][leaf] = 0
    raw["nodes"] = nodes
    res2 = gpuprof.Results([raw], cuda=res.cuda, meta=res.meta)
    from gpuprof.exporters.html import report_data

    f = report_data(res2)["flame"]
    assert f["omitted"] == int(small.sum()) + (0 if small[leaf] else 1)
    assert len(f["parent"]) == len(nodes) - f["omitted"]
    # every kept node's parent is kept, and comes before it
    assert all(p < i for i, p in enumerate(f["parent"]))


def test_memory_shows_the_peak_and_the_line_that_reached_it(training, report):
    data, _ = report
    (dev,) = data["memory"]["devices"]
    assert dev["device"] == "cuda:0" and dev["peak_source"] == "cupti"
    # mallocs of 1..6 MiB, each freed in its step but the last
    assert dev["peak"]["bytes"] == 6 << 20
    assert dev["peak"]["location"] == where(forward)
    assert dev["peak"]["op"] == "forward"
    (curve,) = dev["curves"]
    assert max(curve["allocated"]) == 6 << 20
    assert curve["t_ns"][curve["allocated"].index(6 << 20)] == dev["peak"]["t_ns"]
    assert [x["bytes"] for x in dev["largest"]] == [n << 20 for n in (6, 5, 4, 3, 2)]


def test_a_cpu_profile_reports_host_memory_and_says_there_is_no_gpu(tmp_path):
    with gpuprof.profile(
        activities=[gpuprof.ProfilerActivity.CPU],
        profile_memory=True,
        memory_sample_interval_s=0.001,
    ) as prof:
        for _ in range(4):
            data = [float(i) for i in range(200_000)]
            sum(data)
            prof.step()
    path = prof.export_html(tmp_path / "cpu.html")
    data, _ = page_data(path)
    assert data["memory"]["host"]["curve"]["rss"], "host RSS samples in the page"
    assert data["memory"]["host"]["peak"]["bytes"] == prof.memory_summary().host["peak_bytes"]
    assert data["kernels"]["rows"] == []
    assert not data["ops"]["cuda"]
    assert "Self CUDA" not in [c["title"] for c in data["ops"]["columns"]]
    assert len(data["ops"]["rows"]) == len(prof.key_averages())
    assert data["summary"]["cuda_capture"].startswith("off")


def test_memory_not_recorded_is_said(tmp_path):
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        sum(range(1000))
    data, _ = page_data(prof.export_html(tmp_path / "r.html"))
    assert data["memory"]["recorded"] is False


def test_a_loaded_profile_gives_the_same_report(training, tmp_path):
    from gpuprof.api._loaded import LoadedProfile
    from gpuprof.exporters.html import report_data

    saved = gpuprof.load(gpuprof.exporters.save(training, tmp_path / "run.gpuprof"))
    assert isinstance(saved, LoadedProfile)
    live, loaded = report_data(training), report_data(saved.results)
    for d in (live, loaded):
        d["summary"].pop("created")
    assert json.loads(json.dumps(live)) == json.loads(json.dumps(loaded))
    data, _ = page_data(saved.export_html(tmp_path / "loaded.html"))
    assert data["diagnosis"]["findings"][0]["kind"] == "data_stall"


def square_slowly(i):
    return sum(j * j for j in range(20_000)) + i


def test_per_process_section_with_subprocesses(tmp_path):
    import multiprocessing as mp

    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU], subprocesses=True) as prof:
        with mp.get_context("fork").Pool(2) as pool:
            pool.map(square_slowly, range(8), chunksize=1)
    data, _ = page_data(prof.export_html(tmp_path / "r.html"))
    procs = prof.processes()
    p = data["processes"]
    assert [int(k[0]) for k in p["table"]["keys"]] == procs["pid"].tolist()
    assert [r[2] for r in p["table"]["rows"]] == procs["role"].tolist()
    assert p["workers"] == 2
    workers = prof.key_averages(pid="workers")
    assert sorted(r[0] for r in p["workers_ops"]["rows"]) == sorted(workers.display)
    assert any(r[0].startswith("square_slowly") for r in p["workers_ops"]["rows"])
    # without subprocesses=True there is no such section
    assert page_data(export_html(training_results(), tmp_path / "one.html"))[0]["processes"] is None


def test_per_rank_section_in_a_distributed_job(tmp_path):
    res = training_results(
        meta={"distributed_info": {"rank": 1, "world_size": 2, "backend": "nccl"}}
    )
    data, _ = page_data(export_html(res, tmp_path / "r.html"))
    r = data["ranks"]
    assert (r["rank"], r["world_size"], r["info"]["backend"]) == (1, 2, "nccl")
    ov = comm_overlap(res)
    assert [row[0] for row in r["table"]["keys"]] == ov["step"].tolist()
    assert [row[3] for row in r["table"]["keys"]] == ov["comm_ns"].tolist()
    # a single process with no communication has no rank section
    assert page_data(export_html(training_results(), tmp_path / "one.html"))[0]["ranks"] is None


def test_trace_is_linked_relative_to_the_page(training, tmp_path):
    trace = gpuprof.exporters.export_chrome_trace(training, tmp_path / "t.pt.trace.json.gz")
    os.makedirs(tmp_path / "sub")
    data, _ = page_data(export_html(training, tmp_path / "sub" / "r.html", trace=trace))
    assert data["trace"] == {
        "href": "../t.pt.trace.json.gz",
        "name": "t.pt.trace.json.gz",
        "exists": True,
    }


# ---- size --------------------------------------------------------------------------------------


def test_a_200_step_launch_bound_window_stays_small(tmp_path):
    res = launch_bound_results(steps=200, layers=48)
    assert len(res.gpu_events()) == 200 * 48
    size = os.path.getsize(export_html(res, tmp_path / "r.html"))
    assert size < 1_000_000, size  # the page holds aggregates, never per-event rows


# ---- bad input ----------------------------------------------------------------------------------


def test_bad_arguments_are_refused_naming_them(training, tmp_path):
    with pytest.raises(OSError, match="export_html.*is a directory|export_html.*folder"):
        export_html(training, tmp_path)
    with pytest.raises(OSError, match="does not exist"):
        export_html(training, tmp_path / "missing" / "r.html")
    with pytest.raises(TypeError, match="title must be a str"):
        export_html(training, tmp_path / "r.html", title=3)
    with pytest.raises(TypeError, match="expected a gpuprof.Results"):
        export_html("run.gpuprof", tmp_path / "r.html")
    with pytest.raises(TypeError, match="trace must be a path"):
        export_html(training, tmp_path / "r.html", trace=3)
    assert not os.path.exists(tmp_path / "r.html")  # nothing half-written


# ---- comparison page ----------------------------------------------------------------------------


def test_compare_page_shows_the_comparison(tmp_path):
    before = gpuprof.exporters.save(training_results(), tmp_path / "before.gpuprof")
    after = gpuprof.exporters.save(
        training_results(gemm_us=100, loader_us=30), tmp_path / "after.gpuprof"
    )
    c = gpuprof.compare(before, after)
    assert c.speedup > 1.3
    data, text = page_data(c.export_html(tmp_path / "cmp.html"))
    assert data["page"] == "compare"
    assert data["labels"] == ["before (before.gpuprof)", "after (after.gpuprof)"]
    assert data["step_before_ns"] == c.step_before_ns and data["speedup"] == c.speedup
    assert [r[0] for r in data["kernels"]["rows"]] == [d.name for d in c.kernels]
    gemm = data["kernels"]["rows"][0]
    assert gemm[:4] == ["ampere_sgemm_128x64_nn", "400.000us", "100.000us", "-300.000us"]
    assert data["findings"] == {
        "gone": c.findings_gone,
        "new": c.findings_new,
        "kept": c.findings_kept,
    }
    assert data["breakdown"][0]["data_wait_ns"] == 300 * US
    assert data["diagnoses"][1] == json.loads(
        json.dumps(diagnose(gpuprof.load(after).results).to_dict())
    )
    with pytest.raises(TypeError, match="compare"):
        gpuprof.exporters.export_compare_html(object(), tmp_path / "x.html")


# ---- packaging --------------------------------------------------------------------------------


def test_the_page_assets_ship_with_the_package():
    from pathlib import PurePosixPath

    tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with Python 3.11+")
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        globs = tomllib.load(f)["tool"]["setuptools"]["package-data"]["gpuprof"]
    assets = os.path.join(REPO, "python", "gpuprof", "exporters", "html_assets")
    files = sorted(os.listdir(assets))
    assert files == ["report.css", "report.js"]
    for name in files:
        rel = PurePosixPath("exporters", "html_assets", name)
        assert any(rel.match(g) for g in globs), f"{rel} is not in package-data"
