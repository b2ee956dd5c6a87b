"""Text and HTML views of kernels, steps, tables and diagnoses (notebook output)."""

from html.parser import HTMLParser

import gpuprof
import pytest
from gpuprof import _gpuprof
from gpuprof.results._results import Results
from gpuprof.results.views import kernel_table, step_table

C = _gpuprof._test_constants()


class _Counter(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = {}

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1


def _count(html):
    p = _Counter()
    p.feed(html)
    return p.tags


def _synthetic():
    def f():
        pass

    ops = [(C["OP_PYTHON"], f.__code__, 0)]
    ev = [
        (10, C["EV_STEP_BEGIN"], 0),
        (20, C["EV_CALL"], 2),
        (30, C["EV_API_ENTER"], 5, _gpuprof._test_api_key(C["API_RUNTIME"], 211)["key"]),
        (35, C["EV_API_EXIT"], 5),
        (90, C["EV_RETURN"], 0),
        (100, C["EV_STEP_END"], 0),
    ]
    gpu = [
        dict(
            kind=C["GPU_KERNEL"],
            correlation=5,
            start_ns=40,
            end_ns=70,
            name_id=0,
            stream=7,
            block_x=128,
            grid_x=4,
        )
    ]
    raw = _gpuprof._test_aggregate(ops, [(1, 1, ev)], gpu, 0, 200, ["_Z3addPfi"], 1)
    return Results([raw], cuda={"active": True, "mode": "callbacks", "error": None})


def test_kernel_table_text_and_html():
    res = _synthetic()
    t = kernel_table(res.kernels())
    text = str(t)
    assert "add(float*, int)" in text and "30.000ns" not in text and "0.030us" in text
    tags = _count(t._repr_html_())
    assert tags["table"] == 1 and tags["tr"] == 2 and tags["th"] == len(t.headers)
    with pytest.raises(ValueError, match="sort_by"):
        kernel_table(res.kernels(), sort_by="nope")


def test_step_table():
    res = _synthetic()
    t = step_table(res.steps())
    assert len(t) == 1
    assert "33.3%" in str(t)  # 30 ns of GPU work in a 90 ns step
    assert _count(t._repr_html_())["tr"] == 2


def test_profile_views_and_notebook_reprs():
    with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            sum(range(100))
            prof.step()
    assert len(prof.step_table()) == 3  # the steps prof.step() closed
    ka = prof.key_averages()
    assert "<pre>" in ka._repr_html_() or "<table" in ka._repr_html_()
    assert "gpuprof diagnosis" in prof.diagnose()._repr_html_()
    assert "Kernel" in str(prof.kernel_table())
