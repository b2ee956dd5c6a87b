"""Shared pytest setup: GPU tests skip without a usable GPU, with the reason."""

import gc
import os

import pytest


def _gpu_reason():
    import gpuprof

    st = gpuprof.cuda_status()
    return None if st["usable"] else st["reason"] or "no usable GPU"


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if "gpu" in it.keywords]
    if not gpu_items:
        return
    reason = _gpu_reason()
    if reason is None:
        return
    if os.environ.get("GPUPROF_REQUIRE_GPU") == "1":
        for it in gpu_items:
            it.add_marker(
                pytest.mark.xfail(
                    reason=f"GPUPROF_REQUIRE_GPU=1 but {reason}", strict=True, run=False
                )
            )
        return
    for it in gpu_items:
        it.add_marker(pytest.mark.skip(reason=f"GPU capture unavailable: {reason}"))


@pytest.fixture
def no_gc():
    """Hook tests assert exact call counts: keep the collector out of them."""
    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


@pytest.fixture(autouse=True)
def _no_leftover_profiler():
    import sys

    yield
    assert sys.getprofile() is None, "a test left a profile hook installed"
