"""Property tests (hypothesis): schedules against a pure-Python reference,
table arguments, arbitrary names, and record_function misuse."""

import collections
import functools
import json
import os
import re
import tempfile
import threading
import time
import warnings

import gpuprof
import numpy as np
import pytest
from gpuprof import ProfilerAction as A
from gpuprof import _gpuprof, record_function
from gpuprof.results.tables import _UNPRINTABLE, SORT_KEYS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CPU = [gpuprof.ProfilerActivity.CPU]
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def leaf(x):
    return x + 1


def middle(n):
    total = 0
    for i in range(n):
        total += leaf(i)
    return total


def calls(prof, name):
    ops = prof.ops()
    return int(ops[ops["name"] == name]["calls"].sum())


def check_consistent(prof):
    ops = prof.ops()
    assert (ops["cpu_self_ns"] >= 0).all() and (ops["cpu_total_ns"] >= ops["cpu_self_ns"]).all()
    threads = prof.results.threads()
    assert (threads["self_sum_ns"] == threads["busy_ns"]).all()
    assert ops["cpu_self_ns"].sum() == threads["self_sum_ns"].sum()


# -- schedules ------------------------------------------------------------------------


def reference_action(wait, warmup, active, repeat, skip_first, skip_first_wait, step):
    """torch.profiler.schedule, restated: the action of one step."""
    if step < skip_first:
        return A.NONE
    k = step - skip_first + (wait if skip_first_wait else 0)
    period = wait + warmup + active
    if repeat and k // period >= repeat:
        return A.NONE
    pos = k % period
    if pos < wait:
        return A.NONE
    if pos < wait + warmup:
        return A.WARMUP
    return A.RECORD_AND_SAVE if pos == period - 1 else A.RECORD


def reference_windows(params, last_step):
    """Steps of each window handed to on_trace_ready when steps 0..last_step-1
    are closed by prof.step() and the profiler stops during last_step."""
    windows, cur = [], []
    for step in range(last_step):
        act = reference_action(*params, step)
        if act in (A.RECORD, A.RECORD_AND_SAVE):
            cur.append(step)
            if act == A.RECORD_AND_SAVE:
                windows.append(cur)
                cur = []
        else:
            assert not cur, "a standard schedule always closes a cycle with RECORD_AND_SAVE"
    if reference_action(*params, last_step) in (A.RECORD, A.RECORD_AND_SAVE):
        # stopped while recording: the step stop() ends is no step, and the cut-short
        # window is kept only when no complete window came before it
        if not windows:
            windows.append(cur)
    else:
        assert not cur
    return windows


schedule_params = st.tuples(
    st.integers(0, 4),  # wait
    st.integers(0, 4),  # warmup
    st.integers(1, 5),  # active
    st.integers(0, 4),  # repeat
    st.integers(0, 6),  # skip_first
    st.integers(0, 1),  # skip_first_wait
)


@settings(max_examples=100, deadline=None)
@given(params=schedule_params, steps=st.lists(st.integers(0, 10_000), max_size=50))
def test_schedule_actions_match_the_reference(params, steps):
    sched = gpuprof.Schedule(*params)
    for step in list(range(40)) + steps:
        assert sched(step) == reference_action(*params, step), (params, step)


@FUZZ
@given(params=schedule_params, n_steps=st.integers(0, 30))
def test_recorded_windows_match_the_reference(params, n_steps):
    # given a profile over n_steps steps with this schedule
    seen = []

    def ready(p):
        check_consistent(p)
        seen.append((list(p.steps()["step"]), calls(p, "leaf")))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # warmup=0 warns at schedule()
        sched = gpuprof.schedule(
            wait=params[0],
            warmup=params[1],
            active=params[2],
            repeat=params[3],
            skip_first=params[4],
            skip_first_wait=params[5],
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a cut-short last cycle warns at stop()
        with gpuprof.profile(activities=CPU, schedule=sched, on_trace_ready=ready) as prof:
            for _ in range(n_steps):
                leaf(0)
                prof.step()
    # then on_trace_ready saw exactly the reference's windows, each with its steps'
    # work (one leaf() per step)
    want = reference_windows(params, n_steps)
    assert [w for w, _ in seen] == want
    assert [n for _, n in seen] == [len(w) for w in want]


# -- tables: sort keys and widths --------------------------------------------------------


@functools.lru_cache(maxsize=1)
def recorded():
    """One profile with Python, C, user-range, step and thread rows (built once)."""

    def worker():
        with record_function("worker range"):
            middle(30)

    with gpuprof.profile(activities=CPU) as prof:
        for i in range(4):
            with record_function(f"label {i} " + "x" * (10 * i)):
                middle(5 * (i + 1))
                sorted(range(i * 10))
            prof.step()
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    return prof


def data_lines(text):
    """Rows of a rendered table: the lines between the second and third rules."""
    lines = text.split("\n")
    rules = [i for i, line in enumerate(lines) if line and set(line) == {"-"}]
    assert len(rules) == 3, text
    return lines[rules[1] + 1 : rules[2]], lines[rules[0]]


@FUZZ
@given(
    sort_by=st.one_of(st.none(), st.sampled_from(sorted(SORT_KEYS))),
    row_limit=st.one_of(st.none(), st.integers(-1, 40)),
    name_w=st.integers(4, 120),
    src_w=st.integers(4, 120),
    stack_n=st.integers(0, 4),
    top_level=st.booleans(),
)
def test_valid_table_arguments_never_fail(sort_by, row_limit, name_w, src_w, stack_n, top_level):
    prof = recorded()
    ka = prof.key_averages(group_by_stack_n=stack_n)
    text = ka.table(
        sort_by=sort_by,
        row_limit=row_limit,
        max_name_column_width=name_w,
        max_src_column_width=src_w,
        top_level_events_only=top_level,
    )
    rows, rule = data_lines(text)
    n = len(ka)
    limit = n if row_limit is None or row_limit < 0 else min(row_limit, n)
    if stack_n == 0:
        assert len(rows) == (min(limit, n) if not top_level else len(rows))
        assert len(rows) <= limit
    for line in rows:
        assert len(line) <= len(rule)
    # every shown name is cut to the width
    names = [line.split("  ")[0] for line in rows if not line.startswith(" ")]
    assert all(len(nm) <= max(name_w, len("Name")) for nm in names)
    if sort_by is not None and stack_n == 0 and not top_level:
        field, avg = SORT_KEYS[sort_by]
        vals = ka.rows[field].astype(float)
        if avg:
            vals = vals / np.maximum(ka.rows["calls"], 1)
        order = np.argsort(-vals, kind="stable")[:limit]
        assert list(vals[order]) == sorted(vals[order], reverse=True)


def test_stack_continuation_lines_fit_the_table():
    # found by test_valid_table_arguments_never_fail (stack_n=2, src_w=25)
    prof = recorded()
    # leaf's innermost caller (middle) has a shorter name than the one above it
    text = prof.key_averages(group_by_stack_n=2).table(
        sort_by="count", row_limit=1, max_src_column_width=200
    )
    rows, rule = data_lines(text)
    assert all(len(line) <= len(rule) for line in rows)


@FUZZ
@given(sort_by=st.text(max_size=30).filter(lambda s: s not in SORT_KEYS))
def test_unknown_sort_keys_raise_listing_the_valid_ones(sort_by):
    with pytest.raises(ValueError) as info:
        recorded().key_averages().table(sort_by=sort_by)
    msg = str(info.value)
    assert "sort_by" in msg
    assert all(k in msg for k in SORT_KEYS)


bad_width = st.one_of(
    st.integers(max_value=3),
    st.booleans(),
    st.floats(allow_nan=True),
    st.text(max_size=3),
    st.just(None),
)


@FUZZ
@given(
    arg=st.sampled_from(["row_limit", "max_name_column_width", "max_src_column_width"]),
    value=bad_width,
)
def test_bad_widths_raise_naming_the_argument(arg, value):
    if arg == "row_limit" and (value is None or (type(value) is int and value >= -1)):
        return  # valid row limits
    with pytest.raises((ValueError, TypeError), match=arg):
        recorded().key_averages().table(**{arg: value})


# -- names: arbitrary Unicode and control characters -------------------------------------

any_name = st.text(
    st.one_of(
        st.characters(),  # every category, control characters included
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
        st.sampled_from("\n\r\t\x00\x1b\x7f\x85\u2028\u2029\ufeff\u0301"),
    ),
    max_size=40,
)


@FUZZ
@given(labels=st.lists(any_name, min_size=1, max_size=6, unique=True), width=st.integers(4, 80))
def test_arbitrary_labels_through_the_table(labels, width):
    with gpuprof.profile(activities=CPU) as prof:
        for label in labels:
            with record_function(label):
                leaf(0)
    # each label is its own op row with one call
    ops = prof.ops()
    user = ops[ops["kind"] == "user"]
    assert sorted(user["name"]) == sorted(labels)
    assert (user["calls"] == 1).all()
    text = prof.key_averages().table(row_limit=-1, max_name_column_width=width)
    rows, _ = data_lines(text)
    shown = len(ops) - prof.results.context_rows().sum()  # this test's frame is context
    assert len(rows) == shown  # no label adds or removes a "\n"-separated line
    for label in labels:
        shown = _UNPRINTABLE.sub("?", label)  # what tables.py shows for unprintable characters
        shown = shown if len(shown) <= width else shown[: width - 3] + "..."
        assert any(line.startswith(shown) for line in rows), (label, shown)
    check_consistent(prof)


@FUZZ
@given(labels=st.lists(any_name, min_size=1, max_size=4, unique=True))
def test_arbitrary_labels_through_the_chrome_trace(labels):
    chrome = pytest.importorskip("gpuprof.exporters.chrome")
    with gpuprof.profile(activities=CPU) as prof:
        for label in labels:
            with record_function(label):
                leaf(0)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.json")
        chrome.export_chrome_trace(prof.results, path)
        with open(path, encoding="utf-8") as f:
            trace = json.loads(f.read())
    names = {e.get("name") for e in trace["traceEvents"]}
    for label in labels:  # lone surrogates cannot be UTF-8: they come out as U+FFFD
        assert label.encode("utf-8", "surrogatepass").decode("utf-8", "replace") in names


@pytest.mark.parametrize(
    "label",
    ["carriage\rreturn", "esc\x1b[2Jclear", "line\u2028sep", "lone\ud800surrogate", "nul\x00byte"],
)
def test_control_characters_do_not_reach_the_printed_table(label):
    with gpuprof.profile(activities=CPU) as prof:
        with record_function(label):
            leaf(0)
    text = prof.key_averages().table(row_limit=-1)
    assert text.splitlines() == text.split("\n")[:-1]
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", text)
    text.encode("utf-8")


# -- record_function misuse ------------------------------------------------------------------

LABELS = ["a", "b", "c", "a"]  # "a" twice: same-label nesting

step_ops = st.one_of(
    st.tuples(st.just("enter"), st.sampled_from(LABELS)),
    st.tuples(st.just("exit"), st.integers(0, 40)),  # any opened one, again or out of order
    st.tuples(st.just("call"), st.just(0)),
    st.tuples(st.just("raise"), st.sampled_from(LABELS)),  # decorated function raising
    st.tuples(st.just("pop_token"), st.integers(0, 2**64 - 1)),  # forged tokens
    st.tuples(st.just("step"), st.just(0)),
)


@FUZZ
@given(program=st.lists(step_ops, max_size=60))
def test_random_record_function_interleavings(program):
    opened = []
    entered = collections.Counter()
    n_leaf = 0

    def run(op, arg):
        nonlocal n_leaf
        if op == "enter":
            r = record_function(arg)
            r.__enter__()
            opened.append(r)
            entered[arg] += 1
        elif op == "exit" and opened:
            opened[arg % len(opened)].__exit__(None, None, None)
        elif op == "call":
            leaf(0)
            n_leaf += 1
        elif op == "raise":

            @record_function(arg)
            def boom():
                raise ValueError(arg)

            entered[arg] += 1
            with pytest.raises(ValueError):
                boom()
        elif op == "pop_token":
            _gpuprof.range_pop(arg)
        elif op == "step":
            prof.step()

    with gpuprof.profile(activities=CPU) as prof:
        for op, arg in program:
            run(op, arg)
        # later ops are still counted right, and nest where they should
        with record_function("canary"):
            leaf(0)
    for label in ("a", "b", "c"):
        assert calls(prof, label) == entered[label], label
    assert calls(prof, "canary") == 1
    assert calls(prof, "leaf") == n_leaf + 1
    tree = prof.call_tree()
    canary = np.flatnonzero(tree["name"] == "canary")
    under = tree[np.isin(tree["parent"], canary)]
    assert [str(n).split(" (")[0] for n in under["name"]] == ["leaf"]
    check_consistent(prof)


def test_forged_and_stale_tokens_are_ignored():
    with pytest.raises(OverflowError):
        _gpuprof.range_pop(-1)
    with pytest.raises(TypeError):
        _gpuprof.range_pop("a")
    _gpuprof.range_pop(0)  # the "not recording" token
    _gpuprof.range_pop(2**64 - 1)


def test_a_range_left_open_across_sessions_does_not_close_another():
    # given a range opened in one session and left open
    with gpuprof.profile(activities=CPU):
        left_open = record_function("A")
        left_open.__enter__()
    # when it is closed inside another session's range
    with gpuprof.profile(activities=CPU) as prof:
        with record_function("B"):
            left_open.__exit__(None, None, None)
            time.sleep(0.002)
            middle(20)
    # then B is untouched: it still contains the work done after
    ops = prof.ops()
    b = ops[ops["name"] == "B"][0]
    mid = ops[ops["name"] == "middle"][0]
    assert b["cpu_total_ns"] >= mid["cpu_total_ns"] + 2_000_000
    tree = prof.call_tree()
    mid_nodes = tree[np.array([str(n).startswith("middle (") for n in tree["name"]])]
    assert {str(tree["name"][p]) for p in mid_nodes["parent"]} == {"B"}
