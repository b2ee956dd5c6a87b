"""A real notebook through a Jupyter kernel (issue 20): a PyTorch model profiled in a
cell, the table printed and the HTML form displayed; the user's rows come first and
no IPython or kernel frame is in the table."""

from __future__ import annotations

import html
import os
import re
import threading
import time

import gpuprof
import pytest
from gpuprof import ProfilerActivity

NOTEBOOK = os.path.join(os.path.dirname(__file__), "..", "notebooks", "profile_torch_model.ipynb")

# what a notebook kernel runs that is not the user's work
KERNEL_WORDS = (
    "ipykernel",
    "IPython",
    "interactiveshell",
    "run_cell",
    "run_code",
    "asyncio",
    "base_events",
    "selectors",
    "epoll",
    "zmq",
    "tornado",
    "<cell line",
    "dispatch_shell",
    "execute_request",
)


def _table_names(text: str) -> list[str]:
    lines = text.split("\n")
    rules = [i for i, line in enumerate(lines) if line and set(line) == {"-"}]
    return [line.split("  ")[0] for line in lines[rules[1] + 1 : rules[2]]]


def test_notebook_profiles_a_torch_model_with_user_rows_on_top():
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
    nbformat = pytest.importorskip(
        "nbformat", reason="nbformat is not installed (pip install nbclient ipykernel)"
    )
    nbclient = pytest.importorskip(
        "nbclient", reason="nbclient is not installed (pip install nbclient ipykernel)"
    )
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install ipykernel)")
    if os.environ.get("GPUPROF_UNDER_SANITIZER"):
        pytest.skip(
            "the Jupyter kernel is a process of third-party C extensions (pyzmq, "
            "tornado) whose own sanitizer reports would fail make asan"
        )
    # given the notebook, run in a fresh kernel of this interpreter
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    # then the printed table starts with the user's rows
    printed = "".join(
        o.get("text", "") for o in nb.cells[3].outputs if o.get("output_type") == "stream"
    )
    names = _table_names(printed)
    assert names[:2] == ["ProfilerStep*", "model_inference"], printed
    assert any(n.startswith("Linear.forward") for n in names), printed
    assert "torch._C._nn.linear" in names or "torch.relu" in names, printed
    bad = [n for n in names if any(w in n for w in KERNEL_WORDS)]
    assert not bad, printed
    assert "Not shown:" in printed  # the kernel's running frames, left out and counted
    # and the displayed object renders as an HTML table (sorted by self time): the
    # model's own work first, the same rows, no kernel frame
    shown = [o for o in nb.cells[4].outputs if o.get("output_type") == "execute_result"]
    page = shown[0]["data"]["text/html"]
    cells = [html.unescape(c) for c in re.findall(r"<td style='text-align:left'>(.*?)</td>", page)]
    assert cells[0] in ("torch._C._nn.linear", "torch.relu", "torch.addmm"), cells
    assert {"ProfilerStep*", "model_inference"} <= set(cells), cells
    assert not [c for c in cells if any(w in c for w in KERNEL_WORDS)], cells


def _kernel_loop(stop):
    while not stop.is_set():
        sorted(range(50))
        time.sleep(0.001)


def test_threads_of_a_notebook_kernel_are_left_out():
    # given a thread run by the kernel's machinery (its target lives in ipykernel), busy
    # while the cell profiles
    stop = threading.Event()
    _kernel_loop.__module__ = "ipykernel.iostream"
    try:
        t = threading.Thread(target=_kernel_loop, args=(stop,), name="IOPub")
        t.start()
        with gpuprof.profile(activities=[ProfilerActivity.CPU]) as prof:
            time.sleep(0.05)
            sum(range(10))
        stop.set()
        t.join()
    finally:
        _kernel_loop.__module__ = __name__
    # then nothing of that thread is in the results; the user's thread is
    names = set(prof.ops()["name"])
    assert "sorted" not in names and "_kernel_loop" not in names
    assert "sum" in names
    assert len(prof.results.threads()) == 1


WORD_CELLS = [
    "import random\nimport gpuprof\n\n"
    "rng = random.Random(0)\n"
    "corpus = [' '.join(rng.choice('abcdefgh') * 3 for _ in range(10)) for _ in range(3000)]",
    "with gpuprof.profile() as prof:\n"
    "    letters = sum(len(w) for line in corpus for w in line.split())\n"
    "    vowels = [sum(1 for ch in w if ch in 'aeiou') for w in corpus]",
    "print(prof.diagnose())",
]


def test_a_generator_expression_in_a_notebook_cell_is_no_data_stall():
    """Issue 32: a cell's generator expressions, profiled with no steps, got an input
    pipeline stall with a DataLoader fix; now they get the cell's hot lines."""
    nbformat = pytest.importorskip(
        "nbformat", reason="nbformat is not installed (pip install nbclient ipykernel)"
    )
    nbclient = pytest.importorskip(
        "nbclient", reason="nbclient is not installed (pip install nbclient ipykernel)"
    )
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install ipykernel)")
    if os.environ.get("GPUPROF_UNDER_SANITIZER"):
        pytest.skip("the Jupyter kernel's own C extensions would fail make asan")
    # given three cells run in a fresh kernel of this interpreter
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in WORD_CELLS])
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    printed = "".join(
        o.get("text", "") for o in nb.cells[2].outputs if o.get("output_type") == "stream"
    )
    # then the diagnosis has no data stall and no step figures, but the hot paths, at the
    # profiled cell's lines
    assert "gpuprof diagnosis" in printed, nb.cells[2].outputs
    assert "Input pipeline stall" not in printed and "per step" not in printed, printed
    assert "No steps recorded" in printed, printed
    hot = re.findall(r"CPU hot path: (\S+):(\d+) ", printed)
    assert hot, printed
    assert all("ipykernel_" in f for f, _ in hot), printed  # the cell's file
    assert {int(n) for _, n in hot} <= {2, 3}, printed
