"""The autograd-node part of a profile (gpuprof.record._autograd): when it asks PyTorch for its
NVTX range per autograd node, and what it says when it cannot.

CI has PyTorch's CPU wheel, which has no NVTX callback; the tests check what the part
makes of the real wheel, that the call it makes is one the real binding accepts, and,
with a stand-in for a CUDA build's four entry points, that it follows the schedule's
windows on the stepping thread. The node rows themselves are in test_nvtx.py (PyTorch's
messages through gpuprof's NVTX injection) and tests/gpu/test_backward_gpu.py.
"""

import sys
import threading
import types

import gpuprof
import pytest
from gpuprof import ProfilerActivity
from gpuprof.record import _autograd
from gpuprof.results import tables
from gpuprof.results._results import Results

CPU = [ProfilerActivity.CPU]


def test_argument_is_checked():
    with pytest.raises(TypeError, match="autograd_nodes must be a bool"):
        gpuprof.profile(activities=CPU, autograd_nodes="yes")
    with pytest.raises(TypeError, match="reuse_shapes must be a bool"):
        gpuprof.profile(activities=CPU, record_shapes=True, reuse_shapes=1)


def test_status_without_cuda_capture():
    for wanted, reason in ((True, "CUDA capture is off"), (False, "autograd_nodes=False")):
        with gpuprof.profile(activities=CPU, autograd_nodes=wanted) as prof:
            sum(range(10))
        assert prof.results.cuda["autograd_nodes"] == {
            "on": False,
            "reason": reason,
            "forward": False,
        }


def test_footer_says_whether_nodes_were_on():
    def footer(nodes):
        cuda = {"active": True, "mode": "callbacks", "error": None, "autograd_nodes": nodes}
        raw = gpuprof._gpuprof._test_aggregate([], [(1, 1, [])], [], 0, 10, [], 1)
        return "\n".join(tables._footer(Results([raw], cuda=cuda)))

    assert "Autograd nodes: on (backward kernels charged to their node)" in footer(
        {"on": True, "reason": ""}
    )
    assert "Autograd nodes: off (PyTorch is not imported)" in footer(
        {"on": False, "reason": "PyTorch is not imported"}
    )


def test_cpu_wheel_says_why():
    torch = pytest.importorskip("torch")
    if torch.version.cuda is not None:
        pytest.skip("a CUDA build of PyTorch: tests/gpu/test_backward_gpu.py covers it")
    reason = _autograd.torch_reason()
    assert "built without CUDA" in reason
    st = gpuprof.cuda_status()["autograd_nodes"]
    assert st == {"usable": False, "reason": reason}
    part = _autograd.AutogradNodes(True, True, False)
    part.start(None)
    assert part.status() == {"on": False, "reason": reason, "forward": False}


def test_the_call_is_one_the_real_binding_takes():
    # the wheel's _enable_profiler accepts the config and the scope set, and refuses
    # only because it has no CUDA: the call gpuprof makes has the right shape
    torch = pytest.importorskip("torch")
    if torch.version.cuda is not None:
        pytest.skip("a CUDA build would switch the ranges on here")
    on, off, enabled = _autograd._config(torch)
    with pytest.raises(RuntimeError, match="compiled without CUDA"):
        on()
    assert enabled() is False


def _stand_in_cuda_torch(profiler_enabled=False):
    """A module with the few names the part uses of a CUDA build of PyTorch; it
    records on which thread each enable and disable came."""
    calls = []
    state = {"on": profiler_enabled}

    def enable(config, activities, scopes):
        # (state, record_shapes, ...): shapes and ATen ops only where the part asks
        assert config[0] == "NVTX" and config[2:] == (False, False, False, False, "exp")
        assert activities == set() and scopes == {"BACKWARD_FUNCTION"} | (
            {"FUNCTION"} if config[1] else scopes & {"FUNCTION"}
        )
        state["on"], state["sized"] = True, config[1]
        calls.append(("on", threading.get_ident()))

    def disable():
        state["on"] = False
        calls.append(("off", threading.get_ident()))
        return object()  # torch returns a result object

    prof = types.SimpleNamespace(
        ProfilerConfig=lambda *a: tuple("exp" if i == 6 else x for i, x in enumerate(a)),
        ProfilerState=types.SimpleNamespace(NVTX="NVTX"),
        RecordScope=types.SimpleNamespace(
            BACKWARD_FUNCTION="BACKWARD_FUNCTION", FUNCTION="FUNCTION"
        ),
        _ExperimentalConfig=lambda: "exp",
    )
    torch = types.ModuleType("torch")
    torch.version = types.SimpleNamespace(cuda="12.8")
    torch._C = types.SimpleNamespace(_profiler=prof)
    torch.autograd = types.SimpleNamespace(
        _enable_profiler=enable, _disable_profiler=disable, _profiler_enabled=lambda: state["on"]
    )
    return torch, calls, state


def _with_part(prof, part):
    prof._parts.append(part)
    if part.steps:
        prof._step_parts.append(part)
        prof.step = prof._step_with_parts


def test_on_only_while_a_window_records(monkeypatch):
    torch, calls, state = _stand_in_cuda_torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    sched = gpuprof.schedule(wait=2, warmup=1, active=2, repeat=1)
    prof = gpuprof.profile(activities=CPU, schedule=sched)
    part = _autograd.AutogradNodes(True, True, True)
    assert part.steps
    _with_part(prof, part)
    seen = []
    with prof:
        for _ in range(8):
            seen.append(state["on"])
            prof.step()
        seen.append(state["on"])
    # steps 0-1 wait, 2 warms up, 3-4 record; then the window is closed
    assert seen == [False, False, True, True, True, False, False, False, False]
    assert [c for c, _ in calls] == ["on", "off"]
    assert {t for _, t in calls} == {threading.get_ident()}
    assert prof.results.cuda["autograd_nodes"] == {"on": True, "reason": "", "forward": False}


def _sized_per_step(monkeypatch, sched, steps, reuse=True):
    """What each step's ranges asked for with record_shapes: "sizes", "names" (ATen
    op names alone) or None (off)."""
    torch, calls, state = _stand_in_cuda_torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    prof = gpuprof.profile(activities=CPU, schedule=sched)
    part = _autograd.AutogradNodes(True, True, sched is not None, shapes=True, reuse_shapes=reuse)
    assert part.steps  # switching the sizes off after a window's first step needs the steps
    _with_part(prof, part)
    seen = []
    with prof:
        for _ in range(steps):
            seen.append(("sizes" if state["sized"] else "names") if state["on"] else None)
            prof.step()
    assert not state["on"] and {t for _, t in calls} == {threading.get_ident()}
    return seen


def test_shapes_are_asked_for_on_the_first_recorded_step_of_each_window(monkeypatch):
    # wait 1, warm up 1, record 3, twice: the sizes on steps 2 and 7, names elsewhere
    sched = gpuprof.schedule(wait=1, warmup=1, active=3, repeat=2)
    seen = _sized_per_step(monkeypatch, sched, 11)
    window = [None, "names", "sizes", "names", "names"]
    assert seen == window + window + [None]
    # windows back to back: each one's first step has the sizes
    with pytest.warns(UserWarning, match="warmup=0"):
        sched = gpuprof.schedule(wait=0, warmup=0, active=2, repeat=2)
    assert _sized_per_step(monkeypatch, sched, 4) == ["sizes", "names"] * 2
    # without a schedule: the first step
    assert _sized_per_step(monkeypatch, None, 3) == ["sizes", "names", "names"]
    # reuse_shapes=False: every recorded step
    with pytest.warns(UserWarning, match="warmup=0"):
        sched = gpuprof.schedule(wait=1, warmup=0, active=2, repeat=1)
    assert _sized_per_step(monkeypatch, sched, 3, reuse=False) == [None, "sizes", "sizes"]


def test_without_a_schedule_from_start_to_stop(monkeypatch):
    torch, calls, state = _stand_in_cuda_torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    prof = gpuprof.profile(activities=CPU)
    part = _autograd.AutogradNodes(True, True, False)
    assert not part.steps  # prof.step stays the C method
    _with_part(prof, part)
    with prof:
        assert state["on"]
    assert not state["on"] and [c for c, _ in calls] == ["on", "off"]


def test_another_torch_profiler_is_left_alone(monkeypatch):
    torch, calls, state = _stand_in_cuda_torch(profiler_enabled=True)
    monkeypatch.setitem(sys.modules, "torch", torch)
    prof = gpuprof.profile(activities=CPU)
    part = _autograd.AutogradNodes(True, True, False)
    _with_part(prof, part)
    with prof:
        pass
    assert calls == [] and state["on"]  # neither switched on nor taken off
    st = prof.results.cuda["autograd_nodes"]
    assert st["on"] is False and "another PyTorch profiler" in st["reason"]


def test_torch_not_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    part = _autograd.AutogradNodes(True, True, False)
    part.start(None)
    part.started(None)
    assert part.status() == {"on": False, "reason": "PyTorch is not imported", "forward": False}


def test_forward_calls_record_the_nodes_they_make():
    """The hook's side of the forward join, on the real CPU wheel: with PyTorch's
    sequence counter read (what the part does on a CUDA build), each forward call
    that made autograd nodes has the numbers of those nodes, and each node of the
    graph is found under the call that made it."""
    torch = pytest.importorskip("torch")
    peek = _autograd.seq_peek_address(torch)
    assert peek, "libtorch_cpu has at::sequence_number::peek"
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)

    def block(x):
        h = lin(x)  # torch._C._nn.linear: AddmmBackward0 (and TBackward0 of the weight)
        h = h * 2.0  # Tensor.__mul__ from bytecode, no C call event: block itself
        return torch.relu(h)  # ReluBackward0

    gpuprof._gpuprof._set_seq_peek(peek)
    try:
        with gpuprof.profile(activities=CPU) as prof:
            y = block(x)
    finally:
        gpuprof._gpuprof._set_seq_peek(0)
    w = prof.results.window()
    seqs, tree = w.raw["seqs"], w.call_tree()

    def maker(seq):
        hit = (seqs["lo"] <= seq) & (seq < seqs["hi"])
        assert hit.sum() == 1, (seq, seqs)
        return str(tree["name"][seqs["node"][hit][0]]).split(" (")[0].split(".<locals>.")[-1]

    made = {}
    fn = y.grad_fn
    while fn is not None and fn.name() != "torch::autograd::AccumulateGrad":
        made[fn.name()] = maker(fn._sequence_nr())
        fn = fn.next_functions[0][0]
    assert made == {
        "ReluBackward0": "torch.relu",
        "MulBackward0": "block",
        "AddmmBackward0": "torch._C._nn.linear",
    }
    # nothing is read once the profile stopped
    with gpuprof.profile(activities=CPU) as prof:
        block(x)
    assert len(prof.results.window().raw["seqs"]) == 0


def test_torch_imported_after_start_gets_the_ranges_at_the_next_window(monkeypatch):
    # `python -m gpuprof run` starts before the program imports PyTorch
    torch, calls, state = _stand_in_cuda_torch()
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    sched = gpuprof.schedule(wait=1, warmup=1, active=1, repeat=1)
    prof = gpuprof.profile(activities=CPU, schedule=sched)
    part = _autograd.AutogradNodes(True, True, True)
    _with_part(prof, part)
    with prof:
        assert part.status()["reason"] == "PyTorch is not imported"
        monkeypatch.setitem(sys.modules, "torch", torch)  # the program imports it
        seen = []
        for _ in range(4):
            prof.step()
            seen.append(state["on"])
    assert seen == [True, True, False, False]
    assert prof.results.cuda["autograd_nodes"] == {"on": True, "reason": "", "forward": False}


def test_record_shapes_without_a_cuda_build_says_why():
    """On the CPU wheel (or without CUDA capture) there are no ATen op ranges: the
    profile says so once, naming the argument, instead of recording nothing silently."""
    with pytest.warns(UserWarning, match=r"record_shapes=True\): no ATen op rows"):
        with gpuprof.profile(activities=CPU, record_shapes=True) as prof:
            sum(range(10))
    assert prof.results.cuda["aten_ops"] == {
        "wanted": "shapes",
        "on": False,
        "reason": "CUDA capture is off",
    }
    with pytest.warns(UserWarning, match=r"aten_ops=True\)"):
        with gpuprof.profile(activities=CPU, aten_ops=True):
            pass
