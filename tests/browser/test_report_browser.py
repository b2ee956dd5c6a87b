"""The HTML report in a real browser: headless Chromium (Debian's ``chromium`` package)
driven through Playwright's Python package.

The page is opened from disk as a user would open it; every request that leaves the
file is recorded and refused. The tests skip, saying why, when Playwright or Chromium is
missing or Chromium cannot start; ``GPUPROF_REQUIRE_BROWSER=1`` (set by CI when it
installed Chromium) turns those skips into failures. Screenshots of every section go to
the test's temporary folder; ``GPUPROF_UPDATE_DOCS_SCREENSHOTS=1`` also writes them to
docs/images/ for docs/report.md.
"""

import os
import shutil

import gpuprof
import pytest
from gpuprof.exporters.html import export_html
from report_profiles import launch_bound_results, training_results

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS_IMAGES = os.path.join(REPO, "docs", "images")
HOSTILE = '<img src=x onerror="window.__pwned=1"></script>'
WIDTH = 1100


def _unavailable(reason):
    if os.environ.get("GPUPROF_REQUIRE_BROWSER") == "1":
        pytest.fail(f"GPUPROF_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


def _chromium():
    names = [
        os.environ.get("GPUPROF_CHROMIUM"),
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ]
    for name in filter(None, names):
        path = shutil.which(name) or (name if os.path.isfile(name) else None)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    if os.environ.get("GPUPROF_UNDER_SANITIZER"):
        pytest.skip("not under the sanitizers: Chromium would inherit their preloaded runtime")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("Playwright is not installed (pip install playwright)")
    exe = _chromium()
    if exe is None:
        _unavailable(
            "Chromium not found: apt-get install chromium, or set GPUPROF_CHROMIUM to its path"
        )
    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=exe)
    except Exception as e:  # noqa: BLE001 - any launch failure is a reason to skip
        pw.stop()
        _unavailable(f"Chromium ({exe}) did not start: {str(e).splitlines()[0]}")
    yield b
    b.close()
    pw.stop()


class Page:
    """One opened page, with its console errors and every request it tried to make."""

    def __init__(self, browser, path, routes=None):
        self.errors, self.requests = [], []
        self.context = browser.new_context(viewport={"width": WIDTH, "height": 900})
        self.context.route("**/*", self._network)
        # (registered later, so tried first: Playwright runs the newest matching route)
        for pattern, handler in (routes or {}).items():
            self.context.route(pattern, handler)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto("file://" + os.path.abspath(path))
        self.page.wait_for_selector("html[data-ready]")

    def _network(self, route):
        url = route.request.url
        if url.startswith("file:"):
            route.continue_()
        else:
            self.requests.append(url)
            route.abort()

    def close(self):
        self.context.close()

    def first_cells(self, table):
        return self.page.eval_on_selector_all(
            f"#{table} tbody tr", "rows => rows.map(r => r.cells[0].textContent)"
        )

    def frames(self):
        return self.page.eval_on_selector_all(
            "svg.flame g.frame", "gs => gs.map(g => [g.dataset.name, parseFloat(g.dataset.width)])"
        )


@pytest.fixture(scope="module")
def report_path(tmp_path_factory):
    res = training_results(label=HOSTILE)
    return export_html(res, tmp_path_factory.mktemp("report") / "report.html"), res


@pytest.fixture
def opened(browser, report_path):
    p = Page(browser, report_path[0])
    yield p
    p.close()


def test_the_page_loads_without_errors_or_network_and_shows_the_diagnosis(opened, report_path):
    res = report_path[1]
    page = opened.page
    diagnosis = page.inner_text("#diagnosis")
    findings = res.diagnose() if hasattr(res, "diagnose") else gpuprof.diagnose.diagnose(res)
    assert len(findings) >= 3
    for f in findings:
        assert f.title in diagnosis
        if f.location:
            assert f.location in diagnosis
        assert f.fix in diagnosis
    assert page.locator("#diagnosis .finding").count() == len(findings)
    # the top op of key_averages().table(sort_by="self_cuda_time_total") heads the op table
    ka = gpuprof.KeyAverages(res)
    top = ka.display[int(ka._order("self_cuda_time_total")[0])]
    assert opened.first_cells("ops")[0] == top
    assert opened.errors == [] and opened.requests == []


def test_names_from_the_profile_are_shown_as_text(opened):
    assert HOSTILE in opened.first_cells("ops")
    assert opened.page.evaluate("window.__pwned") is None
    assert opened.page.locator("#ops img").count() == 0


def test_sorting_a_column_reorders_the_table(opened, report_path):
    page = opened.page
    before = opened.first_cells("ops")
    page.click("#ops th:has-text('# of Calls') button")
    by_calls = opened.first_cells("ops")
    assert by_calls != before
    ops = report_path[1].ops()
    most = max(int(c) for c in ops["calls"])
    assert page.get_attribute("#ops th:has-text('# of Calls')", "aria-sort") == "descending"
    calls_col = page.eval_on_selector_all(
        "#ops tbody tr", "rows => rows.map(r => +r.cells[r.cells.length - 2].textContent)"
    )
    assert calls_col == sorted(calls_col, reverse=True) and calls_col[0] == most
    page.click("#ops th:has-text('# of Calls') button")  # again: fewest first
    assert page.get_attribute("#ops th:has-text('# of Calls')", "aria-sort") == "ascending"
    assert opened.first_cells("ops") != by_calls
    page.click("#ops th:has-text('Name') button")
    names = opened.first_cells("ops")
    assert names == sorted(names, key=str.lower)
    page.fill("#ops input[type=search]", "log_loss")
    assert opened.first_cells("ops") == ["log_loss (train.py:14)"]
    assert opened.errors == []


def test_flame_graph_zooms_switches_metric_and_searches(opened):
    page = opened.page
    full = float(page.get_attribute("svg.flame", "width"))
    before = dict(opened.frames())
    loader = "Loader.__next__ (train.py:2)"
    assert 0 < before[loader] < full and "train_step (train.py:18)" in before
    page.click(f"svg.flame g.frame[data-name='{loader}']")
    after = dict(opened.frames())
    # the clicked frame fills the width; what is not under it (or above it) is gone
    assert after[loader] == pytest.approx(full, abs=0.2)
    assert "train_step (train.py:18)" not in after and "decode (train.py:6)" in after
    assert "Loader.__next__ (train.py:2)" in page.inner_text("#flame .crumbs")
    page.click("#flame button:has-text('reset zoom')")
    assert dict(opened.frames()) == before
    # CUDA time: only the paths that launched GPU work keep a width
    page.check("#flame-metric-cuda")
    cuda = dict(opened.frames())
    assert "forward (train.py:10)" in cuda and loader not in cuda
    assert cuda["train_step (train.py:18)"] == pytest.approx(full, abs=0.2)
    page.check("#flame-metric-cpu")
    page.fill("#flame input[type=search]", "decode")
    assert page.locator("svg.flame g.frame.match").count() == 1
    # decode's share of all CPU time in the call tree: 260 us of each 980-us step
    assert "matches: 26.5% of all" in page.inner_text("#flame .search-result")
    assert opened.errors == []


def test_a_screenshot_of_each_section(browser, tmp_path):
    """Writes them under the test's folder (and with GPUPROF_UPDATE_DOCS_SCREENSHOTS=1 into
    docs/images/, for docs/report.md)."""
    res = training_results(steps=8)
    path = export_html(res, tmp_path / "report.html", title="gpuprof report: train.py")
    p = Page(browser, path)
    try:
        p.page.add_style_tag(content="header.top { position: static; }")  # not over sections
        ids = p.page.eval_on_selector_all("main > section", "ss => ss.map(s => s.id)")
        assert ids == [
            "summary",
            "diagnosis",
            "steps",
            "ops",
            "kernels",
            "flame",
            "memory",
            "trace",
        ]
        out = tmp_path / "screens"
        out.mkdir()
        for sid in ids:
            p.page.locator(f"#{sid}").screenshot(path=str(out / f"report-{sid}.png"))
            assert os.path.getsize(out / f"report-{sid}.png") > 2000
        assert p.errors == [] and p.requests == []
        if os.environ.get("GPUPROF_UPDATE_DOCS_SCREENSHOTS") == "1":
            os.makedirs(DOCS_IMAGES, exist_ok=True)
            for sid in ("diagnosis", "steps", "ops", "flame", "memory"):
                shutil.copy(out / f"report-{sid}.png", DOCS_IMAGES)
    finally:
        p.close()


PERFETTO_STAND_IN = """<!DOCTYPE html><title>stand-in</title><script>
// Perfetto's side of its postMessage protocol (docs/visualization/deep-linking-to-perfetto-ui):
// answer PING with PONG, then take {perfetto: {buffer, title}}.
window.received = null;
window.addEventListener("message", function (e) {
  if (e.data === "PING") { e.source.postMessage("PONG", "*"); return; }
  if (e.data && e.data.perfetto) {
    var b = new Uint8Array(e.data.perfetto.buffer);
    window.received = {bytes: b.length, head: Array.from(b.slice(0, 2)),
                       title: e.data.perfetto.title, origin: e.origin};
  }
});
</script>"""


def test_open_in_perfetto_hands_the_trace_over(browser, tmp_path):
    res = training_results()
    trace = gpuprof.exporters.export_chrome_trace(res, tmp_path / "run.pt.trace.json.gz")
    path = export_html(res, tmp_path / "report.html", trace=trace)
    stand_in = {
        "https://ui.perfetto.dev/**": lambda route: route.fulfill(
            status=200, content_type="text/html", body=PERFETTO_STAND_IN
        )
    }
    p = Page(browser, path, routes=stand_in)
    try:
        page = p.page
        assert page.get_attribute("#trace a.trace-link", "href") == "run.pt.trace.json.gz"
        page.set_input_files("#trace-file", trace)
        with page.expect_popup() as popup_info:
            page.click("#open-perfetto")
        popup = popup_info.value
        popup.wait_for_function("!!window.received", timeout=10_000)
        got = popup.evaluate("window.received")
        assert got["bytes"] == os.path.getsize(trace) and got["head"] == [0x1F, 0x8B]  # gzip
        assert got["title"] == "run.pt.trace.json.gz" and got["origin"] == "null"  # file://
        from playwright.sync_api import expect

        expect(page.locator(".perfetto-status")).to_have_text(
            "Sent run.pt.trace.json.gz to Perfetto."
        )
        assert p.requests == [] and p.errors == []
    finally:
        p.close()


def test_a_long_window_draws_every_step(browser, tmp_path):
    path = export_html(launch_bound_results(steps=200), tmp_path / "report.html")
    p = Page(browser, path)
    try:
        assert p.page.locator("svg.steps-chart g.bar").count() == 200
        label = p.page.text_content("svg.steps-chart .window-label")
        assert label.startswith("recorded window: steps 0\u2013199")
        assert "Launch-bound" in p.page.inner_text("#diagnosis")
        assert p.errors == []
    finally:
        p.close()


def test_compare_page(browser, tmp_path):
    before = gpuprof.exporters.save(training_results(), tmp_path / "before.gpuprof")
    after = gpuprof.exporters.save(
        training_results(gemm_us=100, loader_us=30), tmp_path / "after.gpuprof"
    )
    c = gpuprof.compare(before, after)
    p = Page(browser, c.export_html(tmp_path / "compare.html"))
    try:
        page = p.page
        if os.environ.get("GPUPROF_UPDATE_DOCS_SCREENSHOTS") == "1":
            os.makedirs(DOCS_IMAGES, exist_ok=True)
            page.screenshot(path=os.path.join(DOCS_IMAGES, "compare.png"))  # the first screen
        summary = page.inner_text("#compare-summary")
        assert f"({c.speedup:.2f}x)" in summary and "before.gpuprof" in summary
        first = p.first_cells("compare-kernels")
        assert first == [d.name for d in c.kernels]  # compare()'s order: largest change first
        assert first[0] == "ampere_sgemm_128x64_nn"
        page.click("#compare-kernels th:has-text('Name') button")
        assert p.first_cells("compare-kernels") == sorted(first, key=str.lower)
        assert page.locator("#compare-findings .finding").count() == (
            len(c.diagnosis_before["findings"]) + len(c.diagnosis_after["findings"])
        )
        for sid in ("compare-summary", "compare-steps", "compare-findings", "compare-ops"):
            page.locator(f"#{sid}").screenshot(path=str(tmp_path / f"{sid}.png"))
        assert p.errors == [] and p.requests == []
    finally:
        p.close()


def square_slowly(i):
    return sum(j * j for j in range(20_000)) + i


def test_process_and_rank_sections(browser, tmp_path):
    import multiprocessing as mp

    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU], subprocesses=True) as prof:
        with mp.get_context("fork").Pool(2) as pool:
            pool.map(square_slowly, range(8), chunksize=1)
    p = Page(browser, prof.export_html(tmp_path / "procs.html"))
    try:
        assert p.page.locator("#processes-table tbody tr").count() == len(prof.processes())
        assert any(n.startswith("square_slowly") for n in p.first_cells("workers-ops-table"))
        assert p.errors == [] and p.requests == []
    finally:
        p.close()
    res = training_results(meta={"distributed_info": {"rank": 1, "world_size": 4}})
    p = Page(browser, export_html(res, tmp_path / "rank.html"))
    try:
        assert p.page.inner_text("#ranks h2") == "Rank 1 of 4"
        assert p.page.locator("#ranks-table tbody tr").count() == len(res.steps())
        assert "Rank" in p.page.inner_text("header.top nav")
        assert p.errors == [] and p.requests == []
    finally:
        p.close()


def test_module_tree_opens_and_closes(browser, tmp_path):
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()) for _ in range(3)]
    )
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            net(torch.randn(4, 8)).sum().backward()
            prof.step()
    p = Page(browser, prof.export_html(str(tmp_path / "report.html")))
    try:
        page = p.page
        assert "could not be drawn" not in page.inner_text("main")
        summaries = page.locator("#modules details.module > summary")
        assert summaries.count() == 4  # the top Sequential and its three blocks
        assert page.locator("#modules .module-leaf").count() == 6  # Linear and ReLU each
        block = page.locator("#modules details.module details.module").first
        assert block.get_attribute("open") is None  # blocks start closed
        block.locator("summary").click()
        assert block.get_attribute("open") is not None
        assert "0.0 (Linear) 2 calls" in block.inner_text()
        assert p.errors == [] and p.requests == []
    finally:
        p.close()
