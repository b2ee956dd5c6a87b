"""NVTX in and out, and capture ranges, without a GPU.

NVTX input is driven two ways, both through gpuprof's real injection entry point:
a tiny NVTX client compiled at test time against the real nvtx3 headers
(tests/helpers/nvtx_client.c, called through ctypes, so without the GIL), and the
`nvtx` PyPI package when it is installed. NVTX output is checked against a stand-in
tool library (tests/helpers/nvtx_fake_tool.c) in a subprocess.
"""

import ctypes
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import gpuprof
import pytest
from gpuprof import ProfilerActivity

HERE = os.path.dirname(os.path.abspath(__file__))
HELPERS = os.path.join(os.path.dirname(HERE), "helpers")
PYTHONPATH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
CPU = [ProfilerActivity.CPU]
MSG_ASCII, MSG_UNICODE, MSG_REGISTERED = 1, 2, 3


def _nvtx3_include():
    roots = [
        os.environ.get("GPUPROF_CUPTI_INCLUDE"),
        os.environ.get("CUDA_HOME"),
        os.environ.get("CUDA_PATH"),
        "/usr/local/cuda",
    ]
    cands = []
    for r in filter(None, roots):
        cands += [r, os.path.join(r, "include")]
    for p in sys.path:
        for sub in ("nvidia/nvtx/include", "nvidia/cu13/include", "nvidia/cuda_nvtx/include"):
            cands.append(os.path.join(p, sub))
    for c in cands:
        if os.path.isfile(os.path.join(c, "nvtx3", "nvToolsExt.h")):
            return c
    return None


def _cc(out_dir, name, extra=()):
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler to build the NVTX test helpers")
    out = os.path.join(out_dir, f"lib{name}.so")
    cmd = [
        cc,
        "-shared",
        "-fPIC",
        "-O1",
        "-o",
        out,
        os.path.join(HELPERS, f"{name}.c"),
        *extra,
        "-ldl",
        "-lpthread",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return out


@pytest.fixture(scope="session")
def client_path(tmp_path_factory):
    inc = _nvtx3_include()
    if inc is None:
        pytest.skip("nvtx3 headers not found (CUDA toolkit include dir or nvidia-nvtx wheel)")
    return _cc(str(tmp_path_factory.mktemp("nvtx")), "nvtx_client", [f"-I{inc}"])


@pytest.fixture(scope="session")
def tool_path(tmp_path_factory):
    return _cc(str(tmp_path_factory.mktemp("nvtx_tool")), "nvtx_fake_tool")


@pytest.fixture(scope="session")
def nv(client_path):
    """The NVTX client, attached to gpuprof (gpuprof was imported before its first call)."""
    lib = ctypes.CDLL(client_path)
    for name in ("c_push_a", "c_push_w", "c_pop", "c_push_ex", "c_dpush", "c_dpop", "c_threads"):
        getattr(lib, name).restype = ctypes.c_int
    for name in ("c_start_a", "c_start_w", "c_dstart"):
        getattr(lib, name).restype = ctypes.c_uint64
    lib.c_end.argtypes = [ctypes.c_uint64]
    lib.c_end_on_other_thread.argtypes = [ctypes.c_uint64]
    lib.c_dend.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    lib.c_spin.argtypes = [ctypes.c_uint64]
    lib.c_storm_stop.restype = ctypes.c_uint64
    lib.c_storm_pushes.restype = ctypes.c_uint64
    for name in ("c_domain", "c_domain_w", "c_register"):
        getattr(lib, name).restype = ctypes.c_void_p
    lib.c_register.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.c_dpush.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p]
    lib.c_push_ex.argtypes = [ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p]
    lib.c_dpop.argtypes = [ctypes.c_void_p]
    lib.c_dstart.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p]
    lib.c_domain_category.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_char_p]
    lib.c_mark(b"warm-up: the client attaches at its first call")
    return lib


def _rows(prof, name):
    ops = prof.ops()
    return ops[(ops["name"] == name) & (ops["kind"] == "user")]


def _node_of(prof, name, file=None):
    ops = prof.ops()
    tree = prof.call_tree()
    rows = [
        i
        for i in range(len(ops))
        if ops["name"][i] == name and (file is None or ops["file"][i] == file)
    ]
    return [j for j in range(len(tree)) if tree["op"][j] in rows]


def _parent_name(prof, node):
    ops = prof.ops()
    tree = prof.call_tree()
    p = tree["parent"][node]
    return None if p < 0 else ops["name"][tree["op"][p]]


def outer_python(nv):
    """A Python function the ranges are opened in."""
    nv.c_push_a(b"outer")
    nv.c_spin(200_000)
    inner_python(nv)
    nv.c_pop()


def inner_python(nv):
    nv.c_push_w("inner ✓ 日本")
    nv.c_spin(100_000)
    nv.c_pop()


# -- setup and status ----------------------------------------------------------------------


def test_import_makes_gpuprof_the_injection_library():
    path = os.environ.get("NVTX_INJECTION64_PATH")
    assert path and os.path.realpath(path) == os.path.realpath(gpuprof._gpuprof.__file__)
    st = gpuprof.cuda_status()["nvtx"]
    assert st["injection"] == "gpuprof" and st["reason"] == ""
    assert st["emit"] is False and "gpuprof itself" in st["emit_reason"]


def test_client_attaches_once(nv):
    assert gpuprof.cuda_status()["nvtx"]["clients"] >= 1


# -- ranges in -----------------------------------------------------------------------------


def test_push_pop_become_user_ranges_with_their_tree(nv):
    with gpuprof.profile(activities=CPU) as prof:
        outer_python(nv)
    outer, inner = _rows(prof, "outer"), _rows(prof, "inner ✓ 日本")
    assert len(outer) == 1 and len(inner) == 1, prof.ops()[["name", "kind"]]
    assert outer["calls"][0] == 1 and inner["calls"][0] == 1
    assert outer["file"][0] == "nvtx" and inner["file"][0] == "nvtx"
    # time: outer contains inner; the spin makes both measurable
    assert outer["cpu_total_ns"][0] > inner["cpu_total_ns"][0] > 0
    (n_inner,) = _node_of(prof, "inner ✓ 日本")
    assert _parent_name(prof, n_inner) == "inner_python"
    (n_ip,) = _node_of(prof, "inner_python")
    assert _parent_name(prof, n_ip) == "outer"
    (n_outer,) = _node_of(prof, "outer")
    assert _parent_name(prof, n_outer) == "outer_python"


def test_names_past_the_table_limit_share_one_overflow_name(nv):
    # given more distinct messages than the name table holds (65,536 per session)
    limit, extra = 65536, 10
    with gpuprof.profile(activities=CPU, max_events=1_000_000) as prof:
        for i in range(limit + extra):
            nv.c_push_a(b"n%d" % i)
            nv.c_pop()
        nv.c_push_a(b"n0")  # known before the table filled
        nv.c_pop()
        info = gpuprof._gpuprof.nvtx_info()
    # then the first 65,536 keep their names, the rest are counted and share one name
    assert info["names"] == limit + 1 and info["names_dropped"] == extra
    assert len(_rows(prof, "n0")) == 1 and len(_rows(prof, f"n{limit - 1}")) == 1
    assert len(_rows(prof, f"n{limit}")) == 0
    assert _rows(prof, "<nvtx: too many distinct range names>")["calls"][0] == extra
    # and a message known before the table filled is still found by its name
    assert _rows(prof, "n0")["calls"][0] == 2


def test_push_pop_return_levels_like_nvtx(nv):
    # recording or not, the injection answers with the zero-based nesting level
    for recording in (False, True):
        prof = gpuprof.profile(activities=CPU)
        if recording:
            prof.start()
        try:
            assert [nv.c_push_a(b"a"), nv.c_push_a(b"b"), nv.c_push_a(b"c")] == [0, 1, 2]
            assert [nv.c_pop(), nv.c_pop(), nv.c_pop()] == [2, 1, 0]
            assert nv.c_pop() < 0  # nothing left to pop
        finally:
            if recording:
                prof.stop()


def test_nothing_recorded_outside_a_window(nv):
    nv.c_push_a(b"before")
    nv.c_pop()
    with gpuprof.profile(activities=CPU) as prof:
        nv.c_push_a(b"during")
        nv.c_pop()
    nv.c_push_a(b"after")
    nv.c_pop()
    names = set(prof.ops()["name"])
    assert "during" in names and not {"before", "after"} & names


def test_domains_categories_registered_strings(nv):
    d = nv.c_domain(b"mylib")
    nv.c_domain_category(d, 7, b"io")
    reg = nv.c_register(d, b"load batch")
    nv.c_name_category(3, b"default-cat")
    wide = ctypes.create_unicode_buffer("décodé")
    with gpuprof.profile(activities=CPU) as prof:
        for _ in range(3):
            nv.c_dpush(d, 7, MSG_REGISTERED, reg)
            nv.c_spin(10_000)
            nv.c_dpop(d)
        nv.c_dpush(d, 0, MSG_UNICODE, ctypes.cast(wide, ctypes.c_void_p))
        nv.c_dpop(d)
        nv.c_push_ex(3, MSG_ASCII, ctypes.cast(ctypes.c_char_p(b"cat3"), ctypes.c_void_p))
        nv.c_pop()
        nv.c_push_ex(9, MSG_ASCII, ctypes.cast(ctypes.c_char_p(b"cat9"), ctypes.c_void_p))
        nv.c_pop()
        # the same message in another domain is another op
        nv.c_push_a(b"load batch")
        nv.c_pop()
    ops = prof.ops()
    load = ops[ops["name"] == "load batch"]
    assert sorted(load["file"]) == ["nvtx", "nvtx:mylib/io"]
    assert load[load["file"] == "nvtx:mylib/io"]["calls"][0] == 3
    assert _rows(prof, "décodé")["file"][0] == "nvtx:mylib"
    assert _rows(prof, "cat3")["file"][0] == "nvtx/default-cat"
    assert _rows(prof, "cat9")["file"][0] == "nvtx/9"
    # domain pops pop their own domain's stack only
    assert nv.c_dpush(d, 0, MSG_ASCII, ctypes.cast(ctypes.c_char_p(b"x"), ctypes.c_void_p)) == 0
    assert nv.c_push_a(b"y") == 0
    assert nv.c_dpop(d) == 0 and nv.c_pop() == 0


def test_interleaved_domains_close_the_right_range(nv):
    d = nv.c_domain(b"other")
    with gpuprof.profile(activities=CPU) as prof:
        nv.c_push_a(b"A")  # default domain
        nv.c_dpush(d, 0, MSG_ASCII, ctypes.cast(ctypes.c_char_p(b"B"), ctypes.c_void_p))
        nv.c_spin(50_000)
        nv.c_pop()  # closes A, not B
        nv.c_spin(200_000)
        nv.c_dpop(d)  # closes B
    a, b = _rows(prof, "A"), _rows(prof, "B")
    assert b["cpu_total_ns"][0] > a["cpu_total_ns"][0]


def test_start_end_ranges_same_and_other_thread(nv):
    with gpuprof.profile(activities=CPU) as prof:
        r1 = nv.c_start_a(b"same-thread")
        nv.c_spin(100_000)
        nv.c_end(r1)
        r2 = nv.c_start_w("ended elsewhere")
        nv.c_spin(100_000)
        nv.c_end_on_other_thread(r2)  # returns once the other thread ended it
        r3 = nv.c_start_a(b"after")
        nv.c_spin(100_000)
        nv.c_end(r3)
        nv.c_spin(1_000_000)  # the range must not run on to the window's end
    same, other = _rows(prof, "same-thread"), _rows(prof, "ended elsewhere")
    assert same["calls"][0] == 1 and other["calls"][0] == 1
    raw = prof.results.windows[-1]
    spans = {raw["op_names"][s["op_row"]]: s for s in raw["spans"]}
    # it ends where the other thread ended it: before the range opened after that
    assert spans["ended elsewhere"]["end_ns"] <= spans["after"]["start_ns"]


def test_ranges_from_threads_without_python(nv):
    with gpuprof.profile(activities=CPU) as prof:
        assert nv.c_threads(4, 25, b"worker range") == 4
    worker = _rows(prof, "worker range")
    assert worker["calls"][0] == 100
    assert len(prof.results.threads()) >= 5


def test_threads_writing_while_profiles_start_and_stop(nv):
    # Native threads push ranges without a pause while 60 profiles start and stop:
    # a thread may have read its buffer just as the session ended (the buffer must
    # still be there, and the write must go nowhere); each window still has
    # whole ranges from them.
    # Each window lasts until the threads made 100 more ranges (counted, not timed:
    # on a loaded machine they may not run for milliseconds).
    nv.c_storm_start(4)
    try:
        seen = []
        for _ in range(60):
            with gpuprof.profile(activities=CPU) as prof:
                until = nv.c_storm_pushes() + 100
                give_up = time.monotonic() + 10.0
                while nv.c_storm_pushes() < until and time.monotonic() < give_up:
                    nv.c_spin(10_000)
            storm = _rows(prof, "storm")
            seen.append(int(storm["calls"].sum()) if len(storm) else 0)
    finally:
        pushes = nv.c_storm_stop()
    assert pushes > 0
    assert all(n > 0 for n in seen), seen


def test_python_threads_and_gil(nv):
    def body():
        for _ in range(10):
            nv.c_push_a(b"py-thread")
            nv.c_pop()

    with gpuprof.profile(activities=CPU) as prof:
        ts = [threading.Thread(target=body) for _ in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert _rows(prof, "py-thread")["calls"][0] == 30


def test_range_left_open_closes_at_window_end(nv):
    with gpuprof.profile(activities=CPU) as prof:
        nv.c_push_a(b"left open")
        nv.c_spin(10_000)
    nv.c_pop()
    assert _rows(prof, "left open")["calls"][0] == 1


def test_nvtx_spans_are_user_annotations_in_the_trace(nv, tmp_path):
    import json

    with gpuprof.profile(activities=CPU) as prof:
        outer_python(nv)
    path = prof.export_chrome_trace(str(tmp_path / "t.json"))
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    ann = [e for e in events if e.get("cat") == "user_annotation"]
    assert {"outer", "inner ✓ 日本"} <= {e["name"] for e in ann}


def test_own_record_function_is_not_read_back(nv):
    with gpuprof.profile(activities=CPU) as prof:
        with gpuprof.record_function("labelled"):
            nv.c_push_a(b"nvtx-inside")
            nv.c_pop()
    ops = prof.ops()
    assert list(ops[ops["name"] == "labelled"]["file"]) == [""]
    (n,) = _node_of(prof, "nvtx-inside")
    assert _parent_name(prof, n) == "labelled"


# -- PyTorch's range messages (autograd nodes, emit_nvtx) ---------------------------------

C = gpuprof._gpuprof._test_constants()
AUTOGRAD, SEQ, ENGINE = C["NVTXT_AUTOGRAD"], C["NVTXT_SEQ"], C["NVTXT_ENGINE"]
SIZES = "[[64, 256], [256, 256], [], []]"


@pytest.mark.parametrize(
    "message, name, flags, seq",
    [
        ("AddmmBackward0, seq = 1646, op_id = 168", "AddmmBackward0", AUTOGRAD | SEQ, 1646),
        ("ReluBackward0, stashed seq = 3, op_id = 9", "ReluBackward0", AUTOGRAD | SEQ, 3),
        ("ReluBackward0, stashed seq=0, op_id = 9", "ReluBackward0", AUTOGRAD | SEQ, 0),
        (
            "torch::autograd::AccumulateGrad, op_id = 170",
            "torch::autograd::AccumulateGrad",
            AUTOGRAD,
            -1,
        ),
        ("MyFnBackward, seq = 12, op_id = 5", "MyFnBackward", AUTOGRAD | SEQ, 12),
        ("AccumulateGrad, op_id = 6", "AccumulateGrad", AUTOGRAD, -1),
        (
            "CompiledFunctionBackward, seq = 4, op_id = 2",
            "CompiledFunctionBackward",
            AUTOGRAD | SEQ,
            4,
        ),
        (
            "autograd::engine::evaluate_function: AddmmBackward0, op_id = 167",
            "AddmmBackward0",
            AUTOGRAD | ENGINE,
            -1,
        ),
        (f"aten::addmm, seq = 7, op_id = 3, sizes = {SIZES}", "aten::addmm", SEQ, 7),
        (
            f"aten::mm, op_id = 4, sizes = {SIZES}, input_op_ids = [(3,0), (2,1)]",
            "aten::mm",
            0,
            -1,
        ),
        ("aten::convolution_backward, op_id = 8", "aten::convolution_backward", 0, -1),
        (
            "torch::autograd::CppNode<F<A, B>>, seq = 2, op_id = 1",
            "torch::autograd::CppNode<F<A, B>>",
            AUTOGRAD | SEQ,
            2,
        ),
        (
            f"{2**40}Backward0, seq = {2**40 + 5}, op_id = 1",
            f"{2**40}Backward0",
            AUTOGRAD | SEQ,
            2**40 + 5,
        ),
    ],
)
def test_torch_messages_are_named_by_their_name(message, name, flags, seq):
    got = gpuprof._gpuprof._test_nvtx_name(message)
    assert got["torch"] and (got["name"], got["flags"], got["seq"]) == (name, flags, seq)
    # every call of one name is one name id, whatever its seq and op_id
    other = message.replace("op_id = ", "op_id = 99")
    assert gpuprof._gpuprof._test_nvtx_name(other)["id"] == got["id"]


@pytest.mark.parametrize(
    "message",
    [
        "forward",
        "plain, words",
        "epoch 3, batch 7",
        "x, seq = ",  # no number
        "x, op_id = 1, junk",  # an unknown field after a known one
        ", op_id = 1",  # no name
        "x, sizes = [[1, 2]",  # unclosed, in a message that was not cut
    ],
)
def test_other_messages_keep_their_whole_text(message):
    got = gpuprof._gpuprof._test_nvtx_name(message)
    assert not got["torch"] and got["name"] == message and got["flags"] == 0


def _script(nv, ops):
    """Run NVTX ops ("+msg" push, "-" pop, "~N" spin) on a new thread without Python,
    as autograd's device thread makes them."""
    arr = (ctypes.c_char_p * len(ops))(*[o.encode() for o in ops])
    nv.c_script_on_thread(arr, len(ops))


def _backward(i, engine=False):
    """One MLP backward pass as PyTorch's node callback pushes it (seq falls, op_id
    rises; with all scopes the engine wraps each node in evaluate_function)."""
    ops, op_id = [], 1000 * i
    for node, seq in (
        ("MseLossBackward0", 20),
        ("AddmmBackward0", 19),
        ("ReluBackward0", 18),
        ("AddmmBackward0", 17),
        ("torch::autograd::AccumulateGrad", None),
    ):
        op_id += 2
        body = [
            f"+{node}"
            + (f", seq = {seq + 100 * i}" if seq is not None else "")
            + f", op_id = {op_id}",
            "~3000",
            "-",
        ]
        if engine:
            body = [
                f"+autograd::engine::evaluate_function: {node}, op_id = {op_id - 1}",
                "~1000",
                *body,
                "~1000",
                "-",
            ]
        ops += body
    return ops


def test_autograd_node_ranges_become_one_row_per_node(nv, tmp_path):
    import json

    # given three backward passes pushed from a thread without Python, in PyTorch's format
    with gpuprof.profile(activities=CPU) as prof:
        before = gpuprof._gpuprof.nvtx_info()["names"]
        for i in range(3):
            _script(nv, _backward(i) + ["+user range", "-"])
        names = gpuprof._gpuprof.nvtx_info()["names"] - before
    ops = prof.ops()
    # then each node name is one row with its calls, from "autograd"; no op_id survives
    rows = {
        n: ops[ops["name"] == n]
        for n in (
            "MseLossBackward0",
            "AddmmBackward0",
            "ReluBackward0",
            "torch::autograd::AccumulateGrad",
        )
    }
    assert {n: int(r["calls"].sum()) for n, r in rows.items()} == {
        "MseLossBackward0": 3,
        "AddmmBackward0": 6,
        "ReluBackward0": 3,
        "torch::autograd::AccumulateGrad": 3,
    }
    assert all(len(r) == 1 and r["file"][0] == "autograd" for r in rows.values())
    assert not any("op_id" in str(n) or "seq =" in str(n) for n in ops["name"])
    assert names <= 5  # at most the four node names and the user range, for 48 pushes
    # and a user's own range stays a user NVTX range
    assert list(_rows(prof, "user range")["file"]) == ["nvtx"]
    # the rows carry the autograd flag; the user range does not
    raw = prof.results.windows[-1]
    flag = gpuprof.core._constants.OPF_AUTOGRAD
    by_name = dict(zip(raw["op_names"], raw["ops"]["flags"]))
    assert all(by_name[n] & flag for n in rows) and not by_name["user range"] & flag
    # each node's span has its sequence number; AccumulateGrad's and the user's none
    seqs = {}
    for sp in raw["spans"]:
        seqs.setdefault(raw["op_names"][sp["op_row"]], []).append(int(sp["seq"]))
    assert seqs["MseLossBackward0"] == [20, 120, 220]
    assert seqs["AddmmBackward0"] == [19, 17, 119, 117, 219, 217]
    assert seqs["torch::autograd::AccumulateGrad"] == [-1] * 3 and seqs["user range"] == [-1] * 3
    # the trace has the node slices on their own thread, named by the node, with the seq
    path = prof.export_chrome_trace(str(tmp_path / "t.json"))
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    slices = [e for e in events if e.get("name") == "AddmmBackward0" and e.get("ph") == "X"]
    assert len(slices) == 6 and len({e["tid"] for e in slices}) == 3  # one thread per pass
    assert sorted(e["args"]["Sequence number"] for e in slices) == sorted(seqs["AddmmBackward0"])
    assert all(e["cat"] == "user_annotation" for e in slices)


def test_engine_wrapper_is_merged_into_its_node(nv):
    # given emit_nvtx()'s form: evaluate_function around each node's own range
    with gpuprof.profile(activities=CPU) as prof:
        _script(nv, _backward(0, engine=True))
    ops = prof.ops()
    # then no second row for the wrapper, and one call per node run
    assert not any(str(n).startswith("autograd::engine") for n in ops["name"])
    add = _rows(prof, "AddmmBackward0")
    assert len(add) == 1 and add["calls"][0] == 2
    # the call spans the wrapper (its time includes the work around the node's range)
    raw = prof.results.windows[-1]
    spans = [s for s in raw["spans"] if raw["op_names"][s["op_row"]] == "AddmmBackward0"]
    assert [int(s["seq"]) for s in spans] == [19, 17]
    relu = _rows(prof, "ReluBackward0")
    assert relu["cpu_total_ns"][0] == relu["cpu_self_ns"][0] > 0
    # and no node is nested in itself in the call tree
    for n in _node_of(prof, "AddmmBackward0"):
        assert _parent_name(prof, n) is None


def test_unique_messages_do_not_fill_the_name_table(nv):
    # 70,000 node calls, each message unique by its op_id (past the 65,536 names)
    n = 70_000
    ops = []
    for i in range(n):
        ops += [f"+AddmmBackward0, seq = {n - i}, op_id = {i}", "-"]
    with gpuprof.profile(activities=CPU, max_events=1_000_000) as prof:
        before = gpuprof._gpuprof.nvtx_info()
        _script(nv, ops)
        info = gpuprof._gpuprof.nvtx_info()
    assert info["names"] - before["names"] <= 1 and info["names_dropped"] == 0
    assert _rows(prof, "AddmmBackward0")["calls"][0] == n


def test_message_cut_at_the_length_limit_keeps_its_name(nv):
    # record_shapes on a node with many inputs: the message passes gpuprof's 1023 bytes
    sizes = "[" + ", ".join("[4096, 4096]" for _ in range(200)) + "]"
    msg = f"CatBackward0, seq = 5, op_id = 77, sizes = {sizes}"
    assert len(msg) > 1100
    with gpuprof.profile(activities=CPU) as prof:
        _script(nv, ["+" + msg, "-"])
    assert _rows(prof, "CatBackward0")["calls"][0] == 1


def test_node_rows_get_their_kernels_self_cuda(nv):
    """Launches under a node's range on autograd's thread are the node's: Self CUDA and
    # of Kernels per node row, and gpu_events() names the node (synthetic records
    through the real aggregation)."""
    from gpuprof.results._results import Results

    launch = gpuprof._gpuprof._test_api_key(C["API_RUNTIME"], 211)["key"]  # cudaLaunchKernel
    add = gpuprof._gpuprof._test_nvtx_name("AddmmBackward0, seq = 9, op_id = 1")
    relu = gpuprof._gpuprof._test_nvtx_name("ReluBackward0, seq = 8, op_id = 2")
    wrap = gpuprof._gpuprof._test_nvtx_name(
        "autograd::engine::evaluate_function: ReluBackward0, op_id = 3"
    )
    assert wrap["id"] == relu["id"]
    torch_ev = C["EV_NVTX_TORCH"]
    events = [
        (100, C["EV_NVTX_PUSH"], add["id"], 0),
        (100, torch_ev, add["seq"], add["flags"]),
        (110, C["EV_API_ENTER"], 1, launch),
        (115, C["EV_API_EXIT"], 1),
        (120, C["EV_API_ENTER"], 2, launch),
        (125, C["EV_API_EXIT"], 2),
        (130, C["EV_NVTX_POP"], 0, 0),
        # the engine's wrapper with a launch of its own, around the node's range
        (200, C["EV_NVTX_PUSH"], wrap["id"], 0),
        (200, torch_ev, 0, wrap["flags"]),
        (205, C["EV_API_ENTER"], 3, launch),
        (208, C["EV_API_EXIT"], 3),
        (210, C["EV_NVTX_PUSH"], relu["id"], 0),
        (210, torch_ev, relu["seq"], relu["flags"]),
        (220, C["EV_API_ENTER"], 4, launch),
        (225, C["EV_API_EXIT"], 4),
        (230, C["EV_NVTX_POP"], 0, 0),
        (240, C["EV_NVTX_POP"], 0, 0),
    ]

    def k(corr, start, end):
        return dict(
            kind=C["GPU_KERNEL"],
            correlation=corr,
            start_ns=start,
            end_ns=end,
            name_id=0,
            stream=7,
            device=0,
        )

    gpu = [k(1, 300, 340), k(2, 340, 400), k(3, 400, 410), k(4, 410, 450)]
    raw = gpuprof._gpuprof._test_aggregate([], [(7, 107, events)], gpu, 0, 1000, ["_Z1kv"], 7)
    res = Results([raw], cuda={"active": True, "mode": "callbacks", "error": None})
    ops = res.ops()
    a, r = ops[ops["name"] == "AddmmBackward0"], ops[ops["name"] == "ReluBackward0"]
    assert len(a) == 1 and len(r) == 1
    assert (a["calls"][0], a["cuda_self_ns"][0], a["kernels"][0]) == (1, 100, 2)
    assert (r["calls"][0], r["cuda_self_ns"][0], r["kernels"][0]) == (1, 50, 2)
    assert set(ops["file"][ops["kind"] == "user"]) == {"autograd"}
    ev = res.gpu_events()
    assert list(ev["op_name"]) == ["AddmmBackward0"] * 2 + ["ReluBackward0"] * 2
    assert res.attributed_gpu_fraction == 1.0
    from gpuprof.results.tables import KeyAverages

    rows = {e.key: e for e in KeyAverages(res)}
    assert rows["AddmmBackward0"].self_cuda_time_total == 0.1  # us
    assert rows["ReluBackward0"].count == 1


def test_launches_right_after_a_node_are_the_nodes():
    """autograd's engine launches a node's tail (validate_outputs' sum_to of a broadcast
    bias, casts, post hooks, input-buffer adds) after the node's range pops: those
    launches belong to the node, up to the next event that is not a launch; the idle
    time until then does not."""
    from gpuprof.results._results import Results

    launch = gpuprof._gpuprof._test_api_key(C["API_RUNTIME"], 211)["key"]  # cudaLaunchKernel
    add = gpuprof._gpuprof._test_nvtx_name("AddmmBackward0, seq = 9, op_id = 1")
    acc = gpuprof._gpuprof._test_nvtx_name("torch::autograd::AccumulateGrad, op_id = 2")
    torch_ev = C["EV_NVTX_TORCH"]
    events = [
        (100, C["EV_NVTX_PUSH"], add["id"], 0),
        (100, torch_ev, add["seq"], add["flags"]),
        (110, C["EV_API_ENTER"], 1, launch),
        (115, C["EV_API_EXIT"], 1),
        (130, C["EV_NVTX_POP"], 0, 0),
        (135, C["EV_API_ENTER"], 2, launch),  # sum_to, after the range
        (138, C["EV_API_EXIT"], 2),
        (200, C["EV_NVTX_PUSH"], acc["id"], 0),
        (200, torch_ev, 0, acc["flags"]),
        (210, C["EV_NVTX_POP"], 0, 0),
        (220, C["EV_API_ENTER"], 3, launch),  # a post hook's launch
        (230, C["EV_API_EXIT"], 3),
        (500, C["EV_API_ENTER"], 4, launch),  # ... and the thread's end: still the node's
        (505, C["EV_API_EXIT"], 4),
    ]
    gpu = [
        dict(kind=C["GPU_KERNEL"], correlation=c, start_ns=s, end_ns=s + 10, name_id=0, stream=7)
        for c, s in ((1, 300), (2, 320), (3, 340), (4, 600))
    ]
    raw = gpuprof._gpuprof._test_aggregate([], [(7, 107, events)], gpu, 0, 1000, ["_Z1kv"], 1)
    res = Results([raw], cuda={"active": True, "mode": "callbacks", "error": None})
    ops = res.ops()
    a = ops[ops["name"] == "AddmmBackward0"][0]
    g = ops[ops["name"] == "torch::autograd::AccumulateGrad"][0]
    assert (a["calls"], a["kernels"], a["cuda_self_ns"]) == (1, 2, 20)
    assert (g["calls"], g["kernels"], g["cuda_self_ns"]) == (1, 2, 20)
    assert a["cpu_total_ns"] == 38  # 100 to the last launch's end; the wait for work is not its
    assert g["cpu_total_ns"] == 305
    assert (
        list(res.gpu_events()["op_name"])
        == ["AddmmBackward0"] * 2 + ["torch::autograd::AccumulateGrad"] * 2
    )
    assert not res.gpu_events()["blocked_thread"].any()
    spans = res.windows[-1]["spans"]
    node_spans = spans[spans["kind"] == C["OP_USER"]]
    assert sorted((int(s["start_ns"]), int(s["end_ns"])) for s in node_spans) == [
        (100, 138),
        (200, 505),
    ]


def test_spans_saved_before_seq_read_as_none(nv):
    import numpy as np
    from gpuprof.core import _window_file

    with gpuprof.profile(activities=CPU) as prof:
        _script(nv, ["+AddmmBackward0, seq = 4, op_id = 1", "-"])
    spans = prof.results.windows[-1]["spans"]
    # a file from before: the same rows, no seq field, zeros in its bytes
    d = spans.dtype
    names = [n for n in d.names if n != "seq"]
    old_dt = np.dtype(
        {
            "names": names,
            "formats": [d.fields[n][0] for n in names],
            "offsets": [d.fields[n][1] for n in names],
            "itemsize": d.itemsize,
        }
    )
    old = spans.copy()
    old["seq"] = 0
    old = old.view(old_dt)
    new = _window_file.spans_with_seq(old)
    assert new.dtype == d and (new["seq"] == -1).all()
    assert all((new[n] == spans[n]).all() for n in names)
    assert _window_file.spans_with_seq(spans) is spans


# -- the `nvtx` package ----------------------------------------------------------------------


def test_nvtx_package_ranges():
    nvtx = pytest.importorskip("nvtx")

    def step():
        with nvtx.annotate("forward", domain="model", category="fwd"):
            nvtx.push_range("layer")
            nvtx.pop_range()

    with gpuprof.profile(activities=CPU) as prof:
        for _ in range(2):
            step()
        rng = nvtx.start_range("loader")
        nvtx.end_range(rng)
    ops = prof.ops()
    fwd = ops[ops["name"] == "forward"]
    assert fwd["calls"][0] == 2 and fwd["file"][0] == "nvtx:model/fwd"
    assert _rows(prof, "layer")["calls"][0] == 2
    assert _rows(prof, "loader")["calls"][0] == 1
    # annotate.__enter__ returned while its range stayed open: the range moves up to
    # the function that used the annotation, not the helper that opened it
    for n in _node_of(prof, "forward"):
        assert _parent_name(prof, n).endswith("<locals>.step")


# -- capture ranges ------------------------------------------------------------------------


def work(i):
    return i


def test_capture_by_nvtx_range_name(nv):
    results = []
    prof = gpuprof.profile(
        activities=CPU,
        capture="nvtx:capture-me",
        acc_events=True,
        on_trace_ready=lambda p: results.append(len(p.ops())),
    )
    with prof:
        for i in range(6):
            if i in (2, 4):
                nv.c_push_a(b"capture-me")
            work(i)
            if i in (3, 4):
                nv.c_pop()
            prof.step()
    assert len(prof.results.windows) == 2 and len(results) == 2
    ops = prof.ops()
    assert ops[ops["name"] == "work"]["calls"][0] == 3  # steps 2, 3 and 4
    cap = _rows(prof, "capture-me")
    assert cap["calls"][0] == 2 and cap["file"][0] == "nvtx"
    steps = prof.steps()
    assert set(steps["step"]) <= {2, 3, 4}


def test_capture_nested_same_name_closes_at_outer_pop(nv):
    with gpuprof.profile(activities=CPU, capture="nvtx:cap") as prof:
        work(0)
        nv.c_push_a(b"cap")
        nv.c_push_a(b"cap")
        work(1)
        nv.c_pop()
        work(2)
        nv.c_pop()
        work(3)
    ops = prof.ops()
    assert ops[ops["name"] == "work"]["calls"][0] == 2


def test_capture_by_nvtx_domain(nv):
    d = nv.c_domain(b"capdom")
    name = ctypes.cast(ctypes.c_char_p(b"region"), ctypes.c_void_p)
    with gpuprof.profile(activities=CPU, capture="nvtx:region@capdom") as prof:
        nv.c_push_a(b"region")  # default domain: not the capture range
        work(0)
        nv.c_pop()
        nv.c_dpush(d, 0, MSG_ASCII, name)
        work(1)
        work(1)
        nv.c_dpop(d)
    ops = prof.ops()
    assert ops[ops["name"] == "work"]["calls"][0] == 2


def test_capture_by_start_end_range(nv):
    with gpuprof.profile(activities=CPU, capture="nvtx:se-cap") as prof:
        work(0)
        r = nv.c_start_a(b"se-cap")
        work(1)
        nv.c_end(r)
        work(2)
    ops = prof.ops()
    assert ops[ops["name"] == "work"]["calls"][0] == 1


def test_capture_never_opened_records_nothing(nv):
    with gpuprof.profile(activities=CPU, capture="nvtx:never") as prof:
        work(0)
    assert prof._rec.state.windows == 0


@pytest.mark.parametrize(
    "bad, exc",
    [
        (5, TypeError),
        ("nvtx:", ValueError),
        ("cuda", ValueError),
        ("nvtx:@dom", ValueError),
        ("nvtx:" + "x" * 300, ValueError),
    ],
)
def test_capture_argument_checked(bad, exc):
    with pytest.raises(exc, match="capture"):
        gpuprof.profile(activities=CPU, capture=bad)


def test_capture_with_schedule_refused():
    with pytest.raises(ValueError, match="capture= and schedule="):
        gpuprof.profile(
            activities=CPU, capture="nvtx:x", schedule=gpuprof.schedule(wait=0, warmup=1, active=1)
        )


def test_capture_profiler_api_needs_cuda():
    if gpuprof.cuda_status()["usable"]:
        pytest.skip("GPU present: covered by tests/gpu/test_nvtx_gpu.py")
    with pytest.raises(RuntimeError, match="cudaProfilerApi"):
        gpuprof.profile(activities=CPU, capture="cudaProfilerApi")


# -- subprocesses: late import, and ranges out -----------------------------------------------


def _run(code, env_extra, timeout=120):
    env = dict(os.environ)
    env.pop("NVTX_INJECTION64_PATH", None)
    env["PYTHONPATH"] = PYTHONPATH + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra)
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_nvtx_used_before_import_is_named():
    pytest.importorskip("nvtx")
    out = _run(
        """
        import nvtx
        nvtx.push_range("too early"); nvtx.pop_range()   # NVTX initializes, finds no tool
        import gpuprof
        st = gpuprof.cuda_status()["nvtx"]
        assert st["missed"] == ["nvtx"], st
        assert "before `import gpuprof`" in st["reason"], st
        with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
            nvtx.push_range("unseen"); nvtx.pop_range()
        assert "unseen" not in set(prof.ops()["name"])
        print("ok")
    """,
        {},
    )
    assert out.strip() == "ok"


def test_nvtx_imported_but_unused_before_gpuprof_still_attaches():
    pytest.importorskip("nvtx")
    out = _run(
        """
        import nvtx
        import gpuprof
        assert gpuprof.cuda_status()["nvtx"]["missed"] == []
        with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
            nvtx.push_range("seen"); nvtx.pop_range()
        assert "seen" in set(prof.ops()["name"])
        print("ok")
    """,
        {},
    )
    assert out.strip() == "ok"


def test_opt_out_leaves_nvtx_alone():
    out = _run(
        """
        import os, gpuprof
        assert "NVTX_INJECTION64_PATH" not in os.environ
        st = gpuprof.cuda_status()["nvtx"]
        assert st["injection"] == "off" and "GPUPROF_NVTX=0" in st["reason"], st
        print("ok")
    """,
        {"GPUPROF_NVTX": "0"},
    )
    assert out.strip() == "ok"


def test_ranges_go_out_to_another_tool(tool_path):
    out = _run(
        f"""
        import ctypes, gpuprof
        st = gpuprof.cuda_status()["nvtx"]
        assert st["injection"] == {tool_path!r} and st["emit"], st
        assert "another NVTX tool" in st["reason"], st
        with gpuprof.record_function("outside"):
            pass
        with gpuprof.profile(activities=[gpuprof.ProfilerActivity.CPU]) as prof:
            for i in range(2):
                with gpuprof.record_function("fwd"):
                    pass
                prof.step()
        tool = ctypes.CDLL({tool_path!r})
        tool.fake_tool_log.restype = ctypes.c_char_p
        print(tool.fake_tool_log().decode(), end="")
        # the labels are still recorded by gpuprof itself, once each
        ops = prof.ops()
        assert list(ops[ops["name"] == "fwd"]["calls"]) == [2], ops
    """,
        {"NVTX_INJECTION64_PATH": tool_path},
    )
    assert out.splitlines() == [
        "push outside",
        "pop -",
        "push ProfilerStep#0",
        "push fwd",
        "pop -",
        "pop -",
        "push ProfilerStep#1",
        "push fwd",
        "pop -",
        "pop -",
        "push ProfilerStep#2",
        "pop -",
    ]


def test_cli_run_capture_range(tmp_path):
    pytest.importorskip("nvtx")
    script = tmp_path / "loop.py"
    script.write_text(
        textwrap.dedent("""
        import nvtx

        def inside(i):
            return i

        for i in range(5):
            if i == 2:
                nvtx.push_range("region")
            inside(i)
            if i == 3:
                nvtx.pop_range()
    """)
    )
    env = dict(os.environ)
    env.pop("NVTX_INJECTION64_PATH", None)
    env["PYTHONPATH"] = PYTHONPATH + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuprof",
            "run",
            "--no-cuda",
            "--capture-range",
            "nvtx:region",
            str(script),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    row = [ln for ln in r.stderr.splitlines() if ln.startswith("inside (")]
    assert row and row[0].split()[-1] == "2", r.stderr  # calls: steps 2 and 3 only
    bad = subprocess.run(
        [sys.executable, "-m", "gpuprof", "run", "--capture-range", "nvtx:", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode != 0 and "--capture-range" in bad.stderr


# -- the backward pass joined to the forward (gpuprof.results._backward) ------------------------


def linear(x):  # the forward calls of the synthetic window below, by their code objects
    return x


def relu(x):
    return x


def _join_window():
    """A forward thread whose counter moved by 2 in `linear` (nodes 5 and 6) and by 1 in
    `relu` (node 7), and autograd's thread running nodes 6 and 7 and an AccumulateGrad."""
    from gpuprof.results._results import Results

    launch = gpuprof._gpuprof._test_api_key(C["API_RUNTIME"], 211)["key"]  # cudaLaunchKernel
    add = gpuprof._gpuprof._test_nvtx_name("AddmmBackward0, seq = 6, op_id = 1")
    rel = gpuprof._gpuprof._test_nvtx_name("ReluBackward0, seq = 7, op_id = 2")
    acc = gpuprof._gpuprof._test_nvtx_name("torch::autograd::AccumulateGrad, op_id = 3")
    ops = [(C["OP_PYTHON"], linear.__code__, 0), (C["OP_PYTHON"], relu.__code__, 0)]
    lin_op, relu_op = 2, 3
    seq, call, ret = C["EV_SEQ"], C["EV_CALL"], C["EV_RETURN"]
    forward = [
        (10, seq, 5, 0),  # the window's first reading: a baseline
        (10, call, lin_op),
        (20, seq, 7, 2),
        (20, ret, 0),
        (30, call, relu_op),
        (40, seq, 8, 1),
        (40, ret, 0),
    ]
    torch_ev = C["EV_NVTX_TORCH"]

    def node(t, r, corr):
        return [
            (t, C["EV_NVTX_PUSH"], r["id"], 0),
            (t, torch_ev, r["seq"], r["flags"]),
            (t + 5, C["EV_API_ENTER"], corr, launch),
            (t + 8, C["EV_API_EXIT"], corr),
            (t + 30, C["EV_NVTX_POP"], 0, 0),
        ]

    backward = node(100, rel, 1) + node(200, add, 2) + node(300, acc, 3)
    gpu = [
        dict(kind=C["GPU_KERNEL"], correlation=c, start_ns=s, end_ns=s + d, name_id=0, stream=7)
        for c, s, d in ((1, 500, 20), (2, 520, 50), (3, 600, 5))
    ]
    raw = gpuprof._gpuprof._test_aggregate(
        ops, [(1, 101, forward), (2, 102, backward)], gpu, 0, 1000, ["_Z1kv"], 1
    )
    return Results([raw], cuda={"active": True, "mode": "callbacks", "error": None})


def test_backward_nodes_join_the_forward_calls_that_made_them(tmp_path):
    """The forward thread's counter moved by 2 in `linear` (nodes 5 and 6) and by 1 in
    `relu` (node 7); autograd's thread ran nodes 6 and 7 and an AccumulateGrad, which has
    no number: each backward kernel goes to the forward call that made its node."""
    res = _join_window()
    raw = res.windows[-1]
    assert [(int(r["lo"]), int(r["hi"])) for r in raw["seqs"]] == [(5, 7), (7, 8)]
    ev = res.gpu_events()
    assert [str(n).split(" (")[0] for n in ev["fwd_op_name"]] == ["relu", "linear", "None"]
    assert list(ev["op_name"]) == [
        "ReluBackward0",
        "AddmmBackward0",
        "torch::autograd::AccumulateGrad",
    ]
    tree = res.call_tree()
    by_name = {str(n).split(" (")[0]: r for n, r in zip(tree["name"], tree)}
    assert by_name["linear"]["bwd_cuda_self_ns"] == 50
    assert by_name["relu"]["bwd_cuda_total_ns"] == 20
    assert by_name["ReluBackward0"]["bwd_cuda_self_ns"] == 0
    o = res.ops()
    row = {str(n): r for n, r in zip(o["name"], o)}
    assert (row["linear"]["bwd_cuda_self_ns"], row["linear"]["bwd_cuda_total_ns"]) == (50, 50)
    b = res.window().backward()
    summary = b.summary(raw["gpu"], raw["op_names"], res.window().raw["spans"])
    assert summary == {
        "node_ns": 75,
        "joined_ns": 70,
        "unjoined_ns": {"torch::autograd::AccumulateGrad": 5},
    }
    from gpuprof.results.tables import KeyAverages

    ka = KeyAverages(res)
    rows = {e.key.split(" (")[0]: e for e in ka}
    assert rows["linear"].backward_cuda_time_total == 0.05  # us
    assert rows["relu"].forward_backward_cuda_time_total == 0.02
    table = ka.table(sort_by="forward_backward_cuda_time_total")
    assert "Bwd CUDA" in table and "Fwd+Bwd CUDA" in table
    assert (
        "Backward joined to the forward: 93.3% of backward GPU time (Bwd CUDA, Fwd+Bwd CUDA "
        "columns); not joined: torch::autograd::AccumulateGrad 6.7%"
    ) in table
    assert table.index("linear") < table.index("relu")  # sorted forward and backward together
    # the trace: a fwdbwd arrow from each forward call to the node it made
    import json

    from gpuprof.exporters.chrome import export_chrome_trace

    path = export_chrome_trace(res, str(tmp_path / "t.json"))
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    slices = {(e["tid"], e["ts"]): e["name"] for e in events if e.get("ph") == "X"}
    flows = [e for e in events if e.get("cat") == "fwdbwd"]
    assert len(flows) == 4 and all(e["name"] == "fwdbwd" for e in flows)
    pairs = {}
    for e in flows:
        pairs.setdefault(e["id"], {})[e["ph"]] = slices[(e["tid"], e["ts"])]
    assert sorted((p["s"].split(": ")[-1], p["f"]) for p in pairs.values()) == [
        ("linear", "AddmmBackward0"),
        ("relu", "ReluBackward0"),
    ]
    assert all(e["bp"] == "e" for e in flows if e["ph"] == "f")


class _EngineBase:  # a stand-in with the name of torch's C method, for the window below
    def run_backward(self):
        pass


def other_linear(x):
    return x


def test_the_thread_waiting_in_backward_owns_its_node_numbers():
    """Each thread numbers its nodes from its own counter: a second thread that made
    nodes 5 and 6 after the main thread did must not take the main thread's backward,
    which the main thread waits for in run_backward."""
    from gpuprof.results._results import Results

    launch = gpuprof._gpuprof._test_api_key(C["API_RUNTIME"], 211)["key"]
    add = gpuprof._gpuprof._test_nvtx_name("AddmmBackward0, seq = 6, op_id = 1")
    ops = [
        (C["OP_PYTHON"], linear.__code__, 0),
        (C["OP_PYTHON"], other_linear.__code__, 0),
        (C["OP_PYTHON"], _EngineBase.run_backward.__code__, 0),
    ]
    seq, call, ret = C["EV_SEQ"], C["EV_CALL"], C["EV_RETURN"]
    main = [(10, seq, 5, 0), (10, call, 2), (20, seq, 7, 2), (20, ret, 0)]
    main += [(100, call, 4), (400, ret, 0)]
    other = [(50, seq, 5, 0), (50, call, 3), (60, seq, 7, 2), (60, ret, 0)]
    autograd = [
        (200, C["EV_NVTX_PUSH"], add["id"], 0),
        (200, C["EV_NVTX_TORCH"], add["seq"], add["flags"]),
        (205, C["EV_API_ENTER"], 1, launch),
        (208, C["EV_API_EXIT"], 1),
        (230, C["EV_NVTX_POP"], 0, 0),
    ]
    gpu = [dict(kind=C["GPU_KERNEL"], correlation=1, start_ns=500, end_ns=520, name_id=0)]
    raw = gpuprof._gpuprof._test_aggregate(
        ops, [(1, 101, main), (2, 102, autograd), (3, 103, other)], gpu, 0, 1000, ["_Z1kv"], 1
    )
    res = Results([raw], cuda={"active": True, "mode": "callbacks", "error": None})
    (name,) = res.gpu_events()["fwd_op_name"]
    assert name.startswith("linear ("), name


def test_diagnosis_names_the_forward_line_of_a_heavy_backward(tmp_path):
    # the window of the join test above: all of its GPU work is backward
    import gpuprof.diagnose as dg

    res = _join_window()
    (f,) = [f for f in dg.diagnose(res) if f.kind == "backward_heavy"]
    assert f.evidence["backward_ns"] == 75 and f.evidence["op_backward_ns"] == 50
    assert f.title.startswith("The backward pass is 100% of GPU time; 67% of it is the backward")
    assert "of linear (tests/unit/test_nvtx.py:" in f.title and "test_nvtx.py" in f.location


# -- ATen op ranges with input sizes (record_shapes=True; docs/aten.md) -------------------


def _linear(batch, op_id):
    """aten::linear and the aten::addmm inside it, as emit_nvtx(record_shapes=True)
    writes them for a Linear(256, 512) on a batch of ``batch``."""
    return [
        f"+aten::linear, seq = 5, op_id = {op_id}, sizes = [[{batch}, 256], [512, 256], [512]]",
        f"+aten::addmm, op_id = {op_id + 1}, sizes = [[512], [{batch}, 256], [256, 512], [], []]"
        f", input_op_ids = [(0,-1), (0,-1), ({op_id + 2},0), (0,-1), (0,-1)]",
        "~200",
        "-",
        "-",
    ]


def test_aten_ops_are_a_row_per_op_and_a_row_per_shape_when_grouped(nv):
    # given three calls of a Linear on a batch of 64 and one on 32, in PyTorch's format
    with gpuprof.profile(activities=CPU) as prof:
        for i, batch in enumerate((64, 64, 32, 64)):
            _script(nv, _linear(batch, 10 * i + 1))
    ops = prof.ops()
    # then ops() has a row per op and shapes, the name alone in "name"
    addmm = ops[ops["name"] == "aten::addmm"]
    assert sorted(addmm["calls"].tolist()) == [1, 3]
    assert set(addmm["input_shapes"]) == {
        "[[512], [64, 256], [256, 512], [], []]",
        "[[512], [32, 256], [256, 512], [], []]",
    }
    assert not any("\x1f" in str(n) or "sizes" in str(n) for n in ops["name"])
    # the FLOPs sit on the addmm (2*M*K*N a call), none on the linear that calls it
    per_call = {64: 2 * 64 * 256 * 512, 32: 2 * 32 * 256 * 512}
    by_shape = dict(zip(addmm["input_shapes"], addmm["flops"].tolist()))
    assert by_shape["[[512], [64, 256], [256, 512], [], []]"] == 3 * per_call[64]
    assert by_shape["[[512], [32, 256], [256, 512], [], []]"] == per_call[32]
    assert (ops[ops["name"] == "aten::linear"]["flops"] == 0).all()
    # key_averages() has one row per op, as torch.profiler without group_by_input_shape
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["aten::addmm"].count == 4 and rows["aten::linear"].count == 4
    assert rows["aten::addmm"].flops == 3 * per_call[64] + per_call[32]
    assert rows["aten::addmm"].input_shapes == []  # two shapes: none to show
    # grouped by input shape: a row per shape, with torch's input_shapes lists
    grouped = [r for r in prof.key_averages(group_by_input_shape=True) if r.key == "aten::addmm"]
    assert sorted((r.count, r.input_shapes[1]) for r in grouped) == [(1, [32, 256]), (3, [64, 256])]
    assert all(r.input_shapes[0] == [512] and r.input_shapes[3] == [] for r in grouped)
    # and the tables: Input Shapes only when grouped by them; FLOPs in torch's unit form
    plain = prof.key_averages().table()
    shaped = prof.key_averages(group_by_input_shape=True).table(max_shapes_column_width=40)
    assert "Input Shapes" not in plain and "Input Shapes" in shaped
    assert "[[512], [64, 256], [256, 512], [], []]" in shaped
    assert "Total MFLOPs" in plain
    (line,) = [ln for ln in plain.splitlines() if ln.startswith("aten::addmm")]
    assert f"{(3 * per_call[64] + per_call[32]) / 1e6:.3f}" in line


def test_a_saved_profile_keeps_the_input_shapes(nv, tmp_path):
    with gpuprof.profile(activities=CPU) as prof:
        _script(nv, _linear(64, 1) + _linear(32, 5))
    path = prof.save(str(tmp_path / "p.gpuprof"))
    loaded = gpuprof.load(path)
    assert loaded.key_averages(group_by_input_shape=True).table() == (
        prof.key_averages(group_by_input_shape=True).table()
    )
    a, b = prof.ops(), loaded.ops()
    assert list(a["input_shapes"]) == list(b["input_shapes"]) and list(a["flops"]) == list(
        b["flops"]
    )
