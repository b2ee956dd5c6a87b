"""One rule for "the user's line": the innermost code outside installed packages, the
standard library and gpuprof, with the library line it led to beside it."""

import os
import subprocess
import sys
import sysconfig
import textwrap

import gpuprof
from gpuprof._paths import is_library, user_location

LIB = textwrap.dedent("""
    import time

    def helper():
        time.sleep(0)  # LIB LINE

    def work():
        helper()
""")

SCRIPT = textwrap.dedent("""
    import sys, gpuprof
    from gpuprof._spans import user_caller
    import fakelib

    def train_step():
        fakelib.work()

    def direct():
        import time
        time.sleep(0)  # DIRECT LINE

    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        train_step()
        direct()
        fakelib.work()
    w = prof.results._windows[-1]
    spans, ops = w.raw["spans"], w.ops()
    for i in range(len(spans)):
        if str(ops["name"][spans["op_row"][i]]) == "time.sleep":
            print(*user_caller(spans, ops, i), sep="|")
""")


def test_the_users_line_is_outside_installed_packages(tmp_path):
    # given: a package installed under a site-packages folder, called by a script
    site = tmp_path / "lib" / "site-packages"
    (site / "fakelib").mkdir(parents=True)
    (site / "fakelib" / "__init__.py").write_text(LIB)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    )
    # when: the script profiles a C call made inside the package, and one made by itself
    r = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert r.returncode == 0, r.stderr
    via_lib, direct, top_level = [line.split("|") for line in r.stdout.splitlines()]
    # then: the package's call is given to the user's function that called into it (its
    # definition line: Python-to-Python call sites are not recorded), with the
    # package's own line beside it
    lib_line = LIB.splitlines().index("    time.sleep(0)  # LIB LINE") + 1
    step_def = SCRIPT.splitlines().index("def train_step():") + 1
    assert via_lib == [
        str(script),
        str(step_def),
        "train_step",
        str(site / "fakelib" / "__init__.py"),
        str(lib_line),
    ]
    # and the script's own call is its own line, with no library part
    direct_line = SCRIPT.splitlines().index("    time.sleep(0)  # DIRECT LINE") + 1
    assert direct == [str(script), str(direct_line), "direct", "", "0"]
    # and a call from the script's top level names the script without a line: a
    # module's code has no definition line (its line 1 is not where the call was)
    assert top_level == [
        str(script),
        "0",
        "<module>",
        str(site / "fakelib" / "__init__.py"),
        str(lib_line),
    ]


def test_what_counts_as_library_code():
    stdlib = sysconfig.get_paths()["stdlib"]
    assert is_library(os.path.join(stdlib, "json", "decoder.py"))
    assert is_library("/opt/venv/lib/python3.12/site-packages/torch/nn/modules/module.py")
    assert is_library("/usr/lib/python3/dist-packages/numpy/core/numeric.py")
    assert is_library("<frozen importlib._bootstrap>")
    assert is_library(gpuprof.__file__)
    assert not is_library("/home/me/project/train.py")
    assert not is_library("<ipython-input-3-abc>")
    assert not is_library("")


def test_the_location_shows_the_library_line_beside_the_users():
    here = os.getcwd()
    # (a library outside the import roots keeps its absolute path)
    shown = user_location(os.path.join(here, "train.py"), 42, "/x/site-packages/torch/a.py", 7)
    assert shown == "train.py:42 (in /x/site-packages/torch/a.py:7)"
    assert user_location(os.path.join(here, "train.py"), 42) == "train.py:42"
    assert user_location("", 0, "/x/site-packages/torch/a.py", 7).endswith("a.py:7")
