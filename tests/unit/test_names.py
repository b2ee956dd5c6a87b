"""C functions are named as their user writes them (issue 20): ``torch.relu``, not
``type.relu``; ``numpy.array``, not the extension module that defines it; methods
as ``Type.method`` with the type spelled from the package that exports it."""

from __future__ import annotations

import collections

import gpuprof
import numpy as np
import pytest

CPU = [gpuprof.ProfilerActivity.CPU]


def c_names(prof) -> dict[str, int]:
    ops = prof.ops()
    c = ops[ops["kind"] == "c"]
    return {str(n): int(k) for n, k in zip(c["name"], c["calls"])}


def test_builtins_static_and_class_methods_are_named_after_their_class():
    with gpuprof.profile(activities=CPU) as prof:
        len([1])
        [].append(1)
        dict.fromkeys([1])  # classmethod, called on its class
        collections.OrderedDict.fromkeys([1])  # the same classmethod, through a subclass
        int.from_bytes(b"\x01", "little")
        bytes.maketrans(b"a", b"b")  # staticmethod
    names = c_names(prof)
    for want in (
        "len",
        "list.append",
        "dict.fromkeys",
        "collections.OrderedDict.fromkeys",
        "int.from_bytes",
        "bytes.maketrans",
    ):
        assert names.get(want) == 1, (want, names)
    assert not [n for n in names if n.startswith("type.")]


def test_numpy_functions_take_their_public_module_and_methods_their_class():
    a = np.arange(4)
    with gpuprof.profile(activities=CPU) as prof:
        np.array([1, 2])
        np.zeros(3)
        np.arange(3)
        a.sum()
        np.ndarray.sum(a)  # through the method descriptor: the same op
    names = c_names(prof)
    # np.array is numpy._core._multiarray_umath.array, exported (and __module__'d) as numpy
    assert names.get("numpy.array") == 1, names
    assert names.get("numpy.zeros") == 1, names
    assert names.get("numpy.arange") == 1, names
    assert names.get("numpy.ndarray.sum") == 2, names
    assert not [n for n in names if "_multiarray_umath" in n]


def test_a_binding_record_function_is_named_after_its_module():
    # pybind11's free functions: self is a private record, __module__ a str (see
    # test_hook.test_binding_library_functions_take_their_module_name); a module
    # that is not loaded keeps that name
    from gpuprof import _gpuprof

    fn = _gpuprof._test_binding_function("not_a_loaded_module")
    with gpuprof.profile(activities=CPU) as prof:
        fn(1)
    assert c_names(prof) == {"not_a_loaded_module.bound_identity": 1}


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")


def test_torch_functions_are_named_as_written(torch):
    x = torch.ones(4, 4)
    p = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    with gpuprof.profile(activities=CPU) as prof:
        torch.relu(x)
        torch.addmm(x, x, x)
        torch.stack([x, x])
        torch._foreach_add_([x], [x])
        torch.empty(3)
        torch.conv2d(torch.ones(1, 1, 4, 4), torch.ones(1, 1, 2, 2))
        x.relu()
        torch.Tensor.relu(x)
        p.add_(1)
        torch.nn.functional.linear(x, x)
    names = c_names(prof)
    for want in (
        "torch.relu",
        "torch.addmm",
        "torch.stack",
        "torch._foreach_add_",
        "torch.empty",
        "torch.conv2d",
    ):
        assert names.get(want) == 1, (want, names)
    assert names.get("torch.Tensor.relu") == 2, names  # a method, bound or not
    assert names.get("torch.nn.Parameter.add_") == 1, names
    assert names.get("torch._C._nn.linear") == 1, names  # not re-exported under its name
    assert not [n for n in names if n.startswith("type.") or "VariableFunctions" in n]


def test_torch_pybind11_functions_and_methods(torch):
    # torch._C's pybind11 functions: a free function, and methods of a bound class
    # (pybind11 wraps them in instancemethod; the class is found in their module)
    store = torch._C._distributed_c10d.HashStore()
    with gpuprof.profile(activities=CPU) as prof:
        torch._C._get_tracing_state()
        store.set("key", "value")
        store.get("key")
    names = c_names(prof)
    assert names.get("torch._C._get_tracing_state") == 1, names
    # Store is bound in torch._C._distributed_c10d and exported as torch.distributed.Store
    assert names.get("torch.distributed.Store.set") == 1, names
    assert names.get("torch.distributed.Store.get") == 1, names
    assert not [n for n in names if "pybind11" in n or "capsule" in n.lower()]


def test_names_in_tables_and_traces(torch, tmp_path):
    import json

    x = torch.ones(8)
    with gpuprof.profile(activities=CPU) as prof:
        for _ in range(3):
            torch.relu(x)
            prof.step()
    table = prof.key_averages().table(sort_by="count")
    assert "torch.relu" in table and "type.relu" not in table
    path = prof.export_chrome_trace(str(tmp_path / "t.json"))
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    # named as Kineto names Python's C functions, around gpuprof's name
    assert sum(e.get("name") == "<built-in function torch.relu>" for e in events) == 3
