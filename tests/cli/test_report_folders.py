"""`report` and `compare` on the folder `run --output` wrote, and on the other files in
it: the folder gives its saved profile (said on stderr); the HTML report, the stacks
and the trace given for a profile name the file to pass instead. (Capture folders:
tests/cli/test_on_demand_cli.py.)"""

import glob
import os
import time

import pytest
from test_cli import error_line, gpuprof, script


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """The folder of one `run --output` of cpu_train.py, and its saved profile."""
    folder = tmp_path_factory.mktemp("run") / "out"
    r = gpuprof("run", "--no-cuda", "--output", str(folder), script("cpu_train.py"), "3")
    assert r.returncode == 0, r.stderr
    (profile,) = glob.glob(str(folder / "*.gpuprof"))
    return folder, profile


def test_report_of_the_folder_reads_its_saved_profile_and_says_so(out):
    folder, profile = out
    r = gpuprof("report", str(folder))
    assert r.returncode == 0, r.stderr
    assert r.stderr == f"gpuprof: reading {profile}\n"
    direct = gpuprof("report", profile)
    assert direct.returncode == 0 and direct.stderr == ""
    assert r.stdout == direct.stdout and "train_step (cpu_train.py:" in r.stdout
    # the other report forms take the folder too
    r = gpuprof("report", str(folder), "--steps")
    assert r.returncode == 0 and r.stdout == gpuprof("report", profile, "--steps").stdout


def test_compare_of_two_folders(out):
    folder, profile = out
    r = gpuprof("compare", str(folder), str(folder))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        f"gpuprof: BEFORE: reading {profile}",
        f"gpuprof: AFTER: reading {profile}",
    ]
    # the same lines as comparing the files (rows that tie come in either order)
    assert sorted(r.stdout.splitlines()) == sorted(
        gpuprof("compare", profile, profile).stdout.splitlines()
    )
    assert "(+0.0%, 1.00x)" in r.stdout


def test_the_html_report_and_the_stacks_name_the_file_to_pass(out):
    folder, profile = out
    html = str(folder / "report.html")
    r = gpuprof("report", html)
    assert r.returncode == 2
    assert error_line(r) == (
        f"gpuprof: error: {html!r} is the HTML report: open it in a browser; `report` "
        f"reads saved profiles (.gpuprof); pass the saved profile beside it instead: "
        f"{profile!r}"
    )
    r = gpuprof("compare", profile, html)
    assert r.returncode == 2
    assert error_line(r).startswith(f"gpuprof: error: AFTER: {html!r} is the HTML report")
    assert error_line(r).endswith(f"instead: {profile!r}")
    (stacks,) = glob.glob(str(folder / "*.stacks.txt"))
    r = gpuprof("report", stacks)
    assert r.returncode == 2
    assert "holds collapsed stacks for flame graphs" in error_line(r)
    assert error_line(r).endswith(f"instead: {profile!r}")


def test_a_trace_beside_its_profile(out):
    folder, profile = out
    (trace,) = glob.glob(str(folder / "*.pt.trace.json.gz"))
    r = gpuprof("report", trace)  # a trace's own report: totals by name
    assert r.returncode == 0 and "Host events" in r.stdout
    assert r.stderr == (
        f"gpuprof: {trace} is a Chrome trace: its report is totals by name; the saved "
        f"profile beside it has the full tables: report {profile}\n"
    )
    r = gpuprof("compare", trace, profile)
    assert r.returncode == 2
    assert error_line(r).endswith(
        "compare reads saved profiles (.gpuprof, written by `run --output` or "
        f"prof.save()); pass the saved profile beside it instead: {profile!r}"
    )
    r = gpuprof("report", trace, "--steps")
    assert r.returncode == 2 and error_line(r).endswith(f"instead: {profile!r}")


def test_a_folder_with_several_profiles_gives_the_newest(out, tmp_path):
    folder, first = out
    shared = tmp_path / "shared"
    shared.mkdir()
    older = shared / "a_1.gpuprof"
    newer = shared / "b_2.gpuprof"
    for path, age in ((older, 0), (newer, 60)):  # 'a' is the older, whatever the names
        with open(first, "rb") as src, open(path, "wb") as dst:
            dst.write(src.read())
        now = time.time()
        os.utime(path, (now - 100 + age, now - 100 + age))
    r = gpuprof("report", str(shared))
    assert r.returncode == 0, r.stderr
    assert r.stderr == (
        f"gpuprof: reading {newer} (the newest of the 2 saved profiles in {shared}; "
        "name a file to read another)\n"
    )
    os.utime(older)  # now 'a' is the newest
    r = gpuprof("report", str(shared))
    assert r.stderr.startswith(f"gpuprof: reading {older} (the newest of the 2")


def test_a_folder_without_a_saved_profile(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = gpuprof("report", str(empty))
    assert r.returncode == 2
    assert error_line(r) == (
        f"gpuprof: error: {str(empty)!r} is a folder without a saved profile (.gpuprof) "
        "in it; `run --output DIR` and `capture --output DIR` write one there"
    )
    tb = tmp_path / "tb"  # a TensorBoard log folder: report reads one of its traces
    tb.mkdir()
    (tb / "node_7.123.pt.trace.json").write_text('{"traceEvents": []}')
    r = gpuprof("report", str(tb))
    assert r.returncode == 2
    assert f"it holds 1 trace(s): pass one, e.g. {str(tb / 'node_7.123.pt.trace.json')!r}" in (
        error_line(r)
    )
    r = gpuprof("compare", str(tb), str(tb))
    assert r.returncode == 2
    assert error_line(r).startswith(f"gpuprof: error: BEFORE: {str(tb)!r} is a folder without")
    assert "trace(s)" not in error_line(r)  # compare cannot read traces
