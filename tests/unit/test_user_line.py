"""One rule for "the user's line": the innermost code outside installed packages, the
standard library and gpuprof, with the library line it led to beside it."""

import os
import subprocess
import sys
import sysconfig
import textwrap

import gpuprof
import numpy as np
from gpuprof.core._paths import is_library, user_location

LIB = textwrap.dedent("""
    import time

    def helper():
        time.sleep(0)  # LIB LINE

    def work():
        helper()

    def batches():
        for i in range(2):
            time.sleep(0)  # GEN LINE
            yield i

    def key(x):
        time.sleep(0)  # KEY LINE
        return x

    def optimizer_step(prof):
        prof.step()  # as an optimizer-step hook ends a step: inside the library
""")

SCRIPT = textwrap.dedent("""
    import sys, gpuprof
    from gpuprof.core._spans import user_caller
    import fakelib

    def train_step():
        x = 1
        fakelib.work()  # STEP CALL

    def direct():
        import time
        time.sleep(0)  # DIRECT LINE

    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        train_step()
        direct()
        fakelib.work()  # TOP CALL
        for b in fakelib.batches():  # LOOP LINE
            fakelib.optimizer_step(prof)
        sorted([2, 1], key=fakelib.key)  # VIA C
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
    via_lib, direct, top_level, *resumed, key1, key2 = [
        line.split("|") for line in r.stdout.splitlines()
    ]
    lib = str(site / "fakelib" / "__init__.py")

    def line_of(text, marker):
        return next(i + 1 for i, ln in enumerate(text.splitlines()) if ln.endswith(marker))

    # then: the package's call is given to the user's function that called into it, at
    # the line that made the call, with the package's own line beside it
    lib_line = line_of(LIB, "# LIB LINE")
    assert via_lib == [
        str(script),
        str(line_of(SCRIPT, "# STEP CALL")),
        "train_step",
        lib,
        str(lib_line),
    ]
    # and the script's own call is its own line, with no library part
    direct_line = SCRIPT.splitlines().index("    time.sleep(0)  # DIRECT LINE") + 1
    assert direct == [str(script), str(direct_line), "direct", "", "0"]
    # and a call from the script's top level is at its line too
    assert top_level == [
        str(script),
        str(line_of(SCRIPT, "# TOP CALL")),
        "<module>",
        lib,
        str(lib_line),
    ]
    # and a library generator that the script's loop starts and resumes is at the loop,
    # also after a step range that a library frame opened and outlived
    loop = [str(script), str(line_of(SCRIPT, "# LOOP LINE")), "<module>", lib]
    assert resumed == [loop + [str(line_of(LIB, "# GEN LINE"))]] * 2
    # and library code that a C function called for the script is at that C call
    via_c = [str(script), str(line_of(SCRIPT, "# VIA C")), "<module>", lib]
    assert key1 == key2 == via_c + [str(line_of(LIB, "# KEY LINE"))]


def test_a_module_top_level_without_a_recorded_call_site_has_no_line():
    # given: spans of a module's top level with a library function below it, whose
    # call site was not recorded (site 0), as in windows saved by older versions
    from gpuprof.core._constants import OP_PYTHON
    from gpuprof.core._spans import user_caller

    fields = [("kind", "u1"), ("op_row", "i4"), ("line", "i4"), ("parent", "i4")]
    spans = np.zeros(2, dtype=fields + [("start_ns", "i8"), ("end_ns", "i8")])
    spans["kind"] = OP_PYTHON
    spans["op_row"] = [0, 1]
    spans["parent"] = [-1, 0]
    spans["start_ns"], spans["end_ns"] = [0, 10], [100, 20]
    ops = {
        "name": np.array(["<module>", "work"], dtype=object),
        "file": np.array(["/home/me/train.py", "/x/site-packages/lib.py"], dtype=object),
        "line": np.array([1, 5]),
    }
    # then: the script is named without a line (line 1 is not where a module runs)
    assert user_caller(spans, ops, 1) == (
        "/home/me/train.py",
        0,
        "<module>",
        "/x/site-packages/lib.py",
        5,
    )


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
