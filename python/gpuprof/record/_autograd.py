"""Autograd node ranges: the part of a profile that asks PyTorch for one NVTX range per
backward node, so that backward kernels are charged to ``AddmmBackward0`` and its kin.

autograd runs the backward pass on its own C++ threads, where no Python frame exists,
so the Python hook alone charges every backward kernel to ``loss.backward()``'s call.
PyTorch can push an NVTX range around each node it runs, on those threads too
(``torch.autograd._enable_profiler`` with the NVTX state and the BACKWARD_FUNCTION scope,
the node-only part of ``emit_nvtx()``); gpuprof is the process's NVTX injection
(``_nvtx``), and csrc/record/nvtx.c names each range by its node (docs/backward.md).

The callback is PyTorch's, per thread: it is switched on for the thread that starts the
profile or calls ``prof.step()``, and autograd carries it into its device threads for
each backward pass begun there. With a schedule it is on only while a window records
(from the step that opens WARMUP to the one that ends the window), so waiting steps pay
nothing; without one, from ``start()`` to ``stop()``. ``torch`` is never imported here:
the part reads ``sys.modules`` at ``start()``, so PyTorch must be imported by then.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings

from .. import _gpuprof
from . import _nvtx
from ._parts import Part
from ._recording import RecordingState

__all__ = ["AutogradNodes", "seq_peek_address", "torch_reason"]

_NO_TORCH = "PyTorch is not imported"


def torch_reason() -> str:
    """Why this process cannot have autograd node ranges now ("" when it can): PyTorch
    not imported, a build without CUDA, or NVTX ranges that do not reach gpuprof. Does
    not look at a profile's own state (another torch profiler on the thread)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "autograd"):
        return _NO_TORCH
    if getattr(getattr(torch, "version", None), "cuda", None) is None:
        return (
            "this PyTorch is built without CUDA (CPU wheel or ROCm): it has no NVTX "
            "ranges for autograd nodes, so the backward pass stays under loss.backward()"
        )
    nvtx = _nvtx.status()
    if nvtx["reason"]:
        return f"NVTX ranges do not reach gpuprof: {nvtx['reason']}"
    return ""


def seq_peek_address(torch) -> int:
    """The address of ``at::sequence_number::peek`` in the loaded libtorch, the C
    function that reads the calling thread's autograd sequence counter (the number
    the next node made there gets), or 0 where this PyTorch has none. The hook
    reads it at every event while a window records, to join each backward node to
    the forward call that made it (csrc/record/hook.c, docs/backward.md)."""
    import ctypes

    where = getattr(torch, "__file__", None)
    if not where:
        return 0
    lib = os.path.join(os.path.dirname(where), "lib", "libtorch_cpu.so")
    try:
        fn = ctypes.CDLL(lib)._ZN2at15sequence_number4peekEv
    except (OSError, AttributeError):
        return 0
    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)


def _config(torch, nodes: bool = True, aten: bool = False, shapes: bool = False):
    """(enable, disable, enabled) callables for the ranges of this PyTorch: one per
    autograd node (``nodes``), one per ATen op (``aten``; the RecordFunction scope
    FUNCTION, which covers every op the dispatcher runs), with their input sizes
    (``shapes``); raises AttributeError or ImportError when its private API moved."""
    prof = torch._C._profiler
    config = prof.ProfilerConfig(
        prof.ProfilerState.NVTX, shapes, False, False, False, False, prof._ExperimentalConfig()
    )
    scopes = set()
    if nodes:
        scopes.add(prof.RecordScope.BACKWARD_FUNCTION)
    if aten:
        scopes.add(prof.RecordScope.FUNCTION)
    autograd = torch.autograd
    enable, disable = autograd._enable_profiler, autograd._disable_profiler

    def on():
        enable(config, set(), scopes)

    def off():
        disable()  # returns a (here empty) result object: dropped

    return on, off, autograd._profiler_enabled


class AutogradNodes(Part):
    """``autograd_nodes=True``: PyTorch's NVTX range per autograd node while recording.

    ``status()`` says whether the ranges were on in the recorded windows, or why not;
    the profile's results carry it as ``results.cuda["autograd_nodes"]``.
    """

    def __init__(
        self,
        wanted: bool,
        cuda: bool,
        scheduled: bool,
        aten: bool = False,
        shapes: bool = False,
        reuse_shapes: bool = False,
    ):
        self.nodes = wanted
        self.aten = aten or shapes  # ATen op ranges (docs/aten.md), with input sizes
        self.shapes = shapes
        # sizes on each window's first recorded step only; the C aggregation gives
        # them to the later steps that ran the same (csrc/aggregate/shapes.c)
        self.reuse = bool(shapes and reuse_shapes)
        wanted = wanted or self.aten
        self.wanted = wanted
        self.cuda = cuda
        # with a schedule, or to switch the sizes off after a window's first step,
        # follow the windows step by step
        self.steps = bool(wanted and cuda and (scheduled or self.reuse))
        self._scheduled = scheduled
        self._on_thread: int | None = None  # the thread the callback is on for
        self._fns = None  # (on, off, enabled) when this PyTorch can, from start()
        self._names_fns = None  # the same without the sizes, with reuse
        self._sized = False  # the callback that is on asks for the sizes
        self._last_records = False  # the step before recorded (reuse)
        self._last_windows = 0  # windows closed when the sizes were last asked for
        self._reason = "" if wanted else "autograd_nodes=False"
        self._was_on = False
        self._peek = 0  # at::sequence_number::peek, read by the hook while recording

    # -- state --------------------------------------------------------------
    def status(self) -> dict:
        """``on`` (node ranges were on while recording), ``reason`` (why not, or why
        only part of the time; "" when all is well) and ``forward`` (the nodes were
        joined to the forward calls that made them: PyTorch's sequence counter was
        read)."""
        if not self.nodes:
            return {"on": False, "reason": "autograd_nodes=False", "forward": False}
        if not self.cuda:
            return {"on": False, "reason": "CUDA capture is off", "forward": False}
        forward = self._was_on and bool(self._peek)
        return {"on": self._was_on, "reason": self._reason, "forward": forward}

    def aten_status(self) -> dict:
        """``wanted`` ("names" for ``aten_ops=True``, "shapes" for ``record_shapes``),
        ``on`` (ATen op ranges were on while recording) and ``reason`` (why not)."""
        wanted = "shapes" if self.shapes else "names"
        reason = "CUDA capture is off" if not self.cuda else self._reason
        return {"wanted": wanted, "on": self.cuda and self._was_on, "reason": reason}

    def _sizes_wanted(self, state: RecordingState) -> bool:
        """Whether the current step's ranges ask for input sizes: every step
        without reuse; with it, the first recorded step of each window only."""
        if not self.reuse:
            return self.shapes
        records, windows = state.records, state.windows
        first = records and (not self._last_records or windows != self._last_windows)
        self._last_records = records
        if first:
            self._last_windows = windows
        return first

    # -- switching ----------------------------------------------------------
    def _on(self, sized: bool) -> None:
        if self._fns is None and self._reason == _NO_TORCH and "torch" in sys.modules:
            self._resolve()  # imported since start(): gpuprof's frames are hidden here
        fns = self._fns if sized or self._names_fns is None else self._names_fns
        if self._on_thread == threading.get_ident() and self._sized != sized and fns is not None:
            self._off()  # the other one (reuse of the sizes)
        if self._on_thread is not None or fns is None:
            return
        on, _, enabled = fns
        if enabled():
            self._reason = (
                "another PyTorch profiler is active on this thread (torch.profiler or "
                "emit_nvtx): gpuprof adds no node ranges, and names those it emits"
            )
            return
        try:
            on()
        except RuntimeError as e:
            self._reason = f"torch.autograd._enable_profiler failed: {e}"
            return
        self._on_thread = threading.get_ident()
        self._sized = sized
        self._was_on = True
        self._reason = ""

    def _off(self) -> None:
        if self._on_thread is None:
            return
        thread, self._on_thread = self._on_thread, None
        if threading.get_ident() != thread:
            # PyTorch's callback is per thread: only its own thread can take it off.
            # It records nothing while no window is open.
            self._reason = (
                "the node ranges were switched on by another thread than the one that "
                "stopped the profile, and stay on there"
            )
            return
        if self._fns is None:
            return
        try:
            self._fns[1]()
        except RuntimeError as e:  # someone else took PyTorch's profiler state off
            self._reason = f"torch.autograd._disable_profiler failed: {e}"

    # -- Part ---------------------------------------------------------------
    def start(self, state: RecordingState) -> None:
        """Before the hook goes on: whether this PyTorch can. (Looked at again at a
        step where PyTorch was not imported at start: ``python -m gpuprof run``
        starts before the program imports it.)"""
        self._on_thread = None
        self._was_on = False
        self._fns = self._names_fns = None
        self._last_records, self._last_windows = False, 0
        if self.wanted and self.cuda:
            self._resolve()
        if self.aten and (not self.cuda or self._reason not in ("", _NO_TORCH)):
            asked = "record_shapes" if self.shapes else "aten_ops"
            why = self.aten_status()["reason"]
            warnings.warn(
                f"gpuprof.profile({asked}=True): no ATen op rows or input shapes: {why} "
                "(they come from PyTorch's NVTX ranges on a CUDA build; docs/aten.md)",
                UserWarning,
                stacklevel=4,
            )

    def _resolve(self) -> None:
        self._reason = torch_reason()
        if self._reason:
            return
        torch = sys.modules["torch"]
        try:
            self._fns = _config(torch, self.nodes, self.aten, self.shapes)
            if self.reuse:
                self._names_fns = _config(torch, self.nodes, self.aten, False)
        except (AttributeError, ImportError, TypeError) as e:
            self._reason = f"this PyTorch has no NVTX callback for autograd nodes ({e!r})"
            return
        self._peek = seq_peek_address(torch) if self.nodes else 0
        _gpuprof._set_seq_peek(self._peek)

    def started(self, state: RecordingState) -> None:
        if not self._scheduled or state.hooked:
            self._on(self._sizes_wanted(state))

    def after_step(self, state: RecordingState) -> None:
        if state.hooked:
            self._on(self._sizes_wanted(state))
        else:
            self._last_records = False
            self._off()

    def stopped(self, state: RecordingState) -> None:
        self._off()
        if self._peek:
            _gpuprof._set_seq_peek(0)

    def contribute(self, results) -> None:
        results.cuda = {**results.cuda, "autograd_nodes": self.status()}
        if self.aten:  # docs/aten.md
            status = self.aten_status()
            if self.shapes and status["on"]:
                status["shapes"] = self._shapes_steps(results)
            results.cuda = {**results.cuda, "aten_ops": status}

    def _shapes_steps(self, results) -> dict:
        """``reuse`` (sizes asked for on each window's first step only) and, over
        the windows, the steps whose ops carried their sizes (``sampled``), those
        given the sizes of such a step they matched (``reused``) and those that
        matched none, so their ATen rows have no shapes (``unmatched``)."""
        counts = {"reuse": self.reuse, "sampled": 0, "reused": 0, "unmatched": 0}
        for raw in results.raw_windows():
            for key, n in raw.get("shapes_steps", {}).items():
                counts[key] += int(n)
        return counts
