"""FLOPs of ATen ops from what PyTorch's NVTX ranges say about them.

``torch.autograd.profiler.emit_nvtx(record_shapes=True)`` names every ATen op and its
input shapes, ``aten::addmm, seq = 12, op_id = 40, sizes = [[3], [4, 5], [5, 3]],
input_op_ids = [(0,-1), (38,0), (39,0)]``. This module turns such a message into the
op's floating-point operation count with the formulas of ``torch.utils.flop_counter``
(the same counts, computed from shapes alone), and places the counts on a tree of op
records so that each operation is counted once. docs/flops.md is the user's page.

The rules, in one place:

- ``flops()`` answers ``None`` for an op without a formula and for an op whose count
  needs a fact the shapes do not carry; ``missing_reason()`` says which. It never
  guesses a number.
- A count goes on the innermost op that has one (``assign_flops``): ``aten::conv2d``
  calls ``aten::convolution`` calls ``aten::_convolution`` calls
  ``aten::cudnn_convolution``, and only the last gets the count, as FlopCounterMode,
  which sees only dispatched ops, counts each convolution once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = [
    "EXTRA_OPS",
    "FORMULA_OPS",
    "TORCH_FORMULA_OPS",
    "NvtxOp",
    "OpRecord",
    "assign_flops",
    "flops",
    "has_formula",
    "missing_reason",
    "parse_input_op_ids",
    "parse_message",
    "parse_sizes",
]


# ---------------------------------------------------------------- parsing the message


class NvtxOp(NamedTuple):
    """One NVTX range message of PyTorch's profiler, split into its fields.

    ``seq`` and ``op_id`` are None when the message has none; ``sizes`` is [] without
    ``record_shapes``; ``input_op_ids`` pairs (producer op_id, output number) with the
    entries of ``sizes``, (0, -1) where no recorded op produced the input.
    """

    name: str
    seq: int | None
    op_id: int | None
    sizes: list
    input_op_ids: list[tuple[int, int]]


# The message is "NAME[, seq = N][, op_id = H][, sizes = [...]][, input_op_ids = [...]]"
# (torch/csrc/profiler/util.cpp getNvtxStr). emit_nvtx's docstring spells the backward
# field "stashed seq"; the code writes "seq" for both, so both are read.
_FIELD = re.compile(r", (?:stashed )?(seq|op_id|sizes|input_op_ids) ?= ?")


def parse_message(text: str) -> NvtxOp:
    """Split one NVTX message from ``emit_nvtx`` into name, seq, op_id, sizes and
    input_op_ids.

    Raises:
        TypeError: ``text`` is not a str.
        ValueError: a field is malformed (the message names it).
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_message(text): expected a str, got {type(text).__name__}")
    first = _FIELD.search(text)
    name = text if first is None else text[: first.start()]
    seq = op_id = None
    sizes: list = []
    input_op_ids: list[tuple[int, int]] = []
    pos = len(text) if first is None else first.start()
    while pos < len(text):
        m = _FIELD.match(text, pos)
        if m is None:
            raise ValueError(
                f"parse_message(text): unexpected text at offset {pos} of {text!r}; "
                "expected ', seq = N', ', op_id = N', ', sizes = [...]' or "
                "', input_op_ids = [...]'"
            )
        key, pos = m.group(1), m.end()
        if key in ("seq", "op_id"):
            num = re.compile(r"-?\d+").match(text, pos)
            if num is None:
                raise ValueError(f"parse_message(text): {key} is not a number in {text!r}")
            if key == "seq":
                seq = int(num.group())
            else:
                op_id = int(num.group())
            pos = num.end()
        elif key == "sizes":
            sizes, pos = _parse_list(text, pos, "parse_message(text)")
        else:
            input_op_ids, pos = _parse_op_ids(text, pos)
    return NvtxOp(name, seq, op_id, sizes, input_op_ids)


def parse_sizes(text: str) -> list:
    """The input shapes of an NVTX message: a list with one entry per op input, each a
    list of ints (``[]`` for a non-tensor input, a 0-dim tensor or an absent optional
    tensor). Accepts the whole message or only its bracketed ``sizes`` value. PyTorch's
    NVTX writer flattens tensor lists into consecutive entries; a nested list (as
    torch.profiler's ``input_shapes`` gives for a tensor list) is kept nested.

    Raises:
        TypeError: ``text`` is not a str.
        ValueError: the brackets do not parse (the error says where).
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_sizes(text): expected a str, got {type(text).__name__}")
    stripped = text.strip()
    if stripped.startswith("["):
        out, end = _parse_list(stripped, 0, "parse_sizes(text)")
        if stripped[end:].strip():
            raise ValueError(
                f"parse_sizes(text): text after the closing bracket at offset {end}: {stripped!r}"
            )
        return out
    return parse_message(text).sizes


def parse_input_op_ids(text: str) -> list[tuple[int, int]]:
    """The ``input_op_ids`` of an NVTX message (whole message or the bracketed value)
    as (producer op_id, output number) pairs."""
    if not isinstance(text, str):
        raise TypeError(f"parse_input_op_ids(text): expected a str, got {type(text).__name__}")
    stripped = text.strip()
    if stripped.startswith("["):
        return _parse_op_ids(stripped, 0)[0]
    return parse_message(text).input_op_ids


_TOKEN = re.compile(r"\s*(\[|\]|,|-?\d+)")


def _parse_list(text: str, pos: int, who: str) -> tuple[list, int]:
    """A bracketed, possibly nested list of ints starting at ``pos``; returns it and the
    offset after its closing bracket."""
    stack: list[list] = []
    expect_item = True  # after '[' or ',' an item must come (or ']' right after '[')
    while True:
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"{who}: cannot read the shape list at offset {pos} of {text!r}")
        tok, pos = m.group(1), m.end()
        if tok == "[":
            if stack and not expect_item:
                raise ValueError(f"{who}: missing ',' before offset {m.start(1)} of {text!r}")
            new: list = []
            if stack:
                stack[-1].append(new)
            stack.append(new)
            expect_item = True
        elif tok == "]":
            if not stack or (expect_item and stack[-1]):
                raise ValueError(f"{who}: unbalanced ']' at offset {m.start(1)} of {text!r}")
            done = stack.pop()
            if not stack:
                return done, pos
            expect_item = False
        elif tok == ",":
            if not stack or expect_item:
                raise ValueError(f"{who}: stray ',' at offset {m.start(1)} of {text!r}")
            expect_item = True
        else:
            if not stack or not expect_item:
                raise ValueError(f"{who}: unexpected number at offset {m.start(1)} of {text!r}")
            stack[-1].append(int(tok))
            expect_item = False


_OP_ID = re.compile(r"\s*\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)\s*")


def _parse_op_ids(text: str, pos: int) -> tuple[list[tuple[int, int]], int]:
    if not text.startswith("[", pos):
        raise ValueError(f"parse_input_op_ids: expected '[' at offset {pos} of {text!r}")
    pos += 1
    out: list[tuple[int, int]] = []
    while True:
        if text.startswith("]", pos):
            return out, pos + 1
        m = _OP_ID.match(text, pos)
        if m is None:
            raise ValueError(
                f"parse_input_op_ids: expected '(op_id,output_nr)' at offset {pos} of {text!r}"
            )
        out.append((int(m.group(1)), int(m.group(2))))
        pos = m.end()
        if text.startswith(",", pos):
            pos += 1
        elif not text.startswith("]", pos):
            raise ValueError(f"parse_input_op_ids: expected ',' or ']' at offset {pos} of {text!r}")


# ------------------------------------------------------------------------- formulas


class _Missing(Exception):
    """A formula needs a fact the shapes do not carry; the message says which."""


def _shape(shapes: Sequence, i: int, ndim: int | tuple[int, ...], op: str, what: str) -> list:
    if i >= len(shapes):
        raise ValueError(
            f"{op}: needs the shape of input {i} ({what}); the message has {len(shapes)} "
            "inputs. Record with emit_nvtx(record_shapes=True)."
        )
    s = shapes[i]
    dims = (ndim,) if isinstance(ndim, int) else ndim
    if not isinstance(s, (list, tuple)) or not all(isinstance(d, int) for d in s):
        raise ValueError(f"{op}: input {i} ({what}) must be a list of ints, got {s!r}")
    if len(s) not in dims:
        want = " or ".join(f"{d}-D" for d in dims)
        raise ValueError(f"{op}: input {i} ({what}) must be {want}, got shape {list(s)}")
    return list(s)


def _matmul(m: int, k: int, k2: int, n: int, op: str) -> int:
    if k != k2:
        raise ValueError(f"{op}: inner dimensions differ ({k} and {k2})")
    # a multiply and an add per inner element: 2*M*K*N, as flop_counter counts
    return 2 * m * k * n


def _mm(op, shapes, hints, a=0, b=1):
    (m, k), (k2, n) = _shape(shapes, a, 2, op, "mat1"), _shape(shapes, b, 2, op, "mat2")
    return _matmul(m, k, k2, n, op)


def _bmm(op, shapes, hints, a=0, b=1):
    x, y = _shape(shapes, a, 3, op, "batch1"), _shape(shapes, b, 3, op, "batch2")
    if x[0] != y[0]:
        raise ValueError(f"{op}: batch dimensions differ ({x[0]} and {y[0]})")
    return x[0] * _matmul(x[1], x[2], y[1], y[2], op)


def _addmm(op, shapes, hints):
    return _mm(op, shapes, hints, 1, 2)


def _baddbmm(op, shapes, hints):
    return _bmm(op, shapes, hints, 1, 2)


# -- convolution
#
# Forward, for weight [w0, w1, k...] (w0*w1 channel pairs per output position): a
# regular convolution does prod(k)*w0*w1 multiply-adds at each output position of each
# batch item; a transposed one at each *input* position. flop_counter counts
# 2 * positions * prod(k) * N * w0 * w1, so the same here. The output spatial size of a
# regular convolution depends on stride, padding and dilation, which the message does
# not carry (non-tensor inputs are []): it comes from the output's shape, known when a
# later op consumed the output (see assign_flops), and is None otherwise.
#
# Backward: grad_input costs what the forward costs; grad_weight costs groups times the
# forward (flop_counter's two convolutions reduce to this: its grad_weight convolution
# runs over all input channels). Both sides of both hypotheses need only the three
# tensor shapes, so the backward never needs the output.


def _positions(shape: list, batch: int, channels: int) -> int | None:
    """Spatial positions of an activation ``shape`` with the given batch and channel
    count, from its element count (so a [N, C, L] output and the [N, C, 1, L] one the
    1-D convolution runs as internally give the same)."""
    total = math.prod(shape)
    per = batch * channels
    if per <= 0 or total % per:
        return None
    return total // per


def _conv_hypotheses(op, x, w, out):
    """{transposed: forward count or None (output unknown)} for the interpretations that
    fit the shapes."""
    n, c_in = x[0], x[1]
    w0, w1, ksize = w[0], w[1], math.prod(w[2:])
    per_position = 2 * ksize * n * w0 * w1
    # the output's channel count, where its rank says where it is (an enclosing op's
    # output may have another rank: conv1d runs as a 2-D convolution inside)
    out_c = out[1] if out is not None and len(out) == len(x) else None
    found: dict[bool, int | None] = {}
    # regular: w = [C_out, C_in/groups, k...]
    if w1 and c_in % w1 == 0 and w0 % (c_in // w1) == 0 and out_c in (None, w0):
        pos = None if out is None else _positions(out, n, w0)
        if out is None or pos is not None:
            found[False] = None if pos is None else pos * per_position
    # transposed: w = [C_in, C_out/groups, k...]
    if c_in == w0 and (out_c is None or (w1 and out_c % w1 == 0 and w0 % (out_c // w1) == 0)):
        found[True] = math.prod(x[2:]) * per_position
    if not found:
        raise ValueError(
            f"{op}: input {x} and weight {w}"
            + ("" if out is None else f" and output {out}")
            + " do not fit a convolution (regular or transposed)"
        )
    return found


def _choose(op: str, found: dict, transposed: bool | None):
    if transposed is not None:
        if transposed not in found:
            kind = "transposed" if transposed else "regular"
            raise ValueError(f"{op}: the shapes do not fit a {kind} convolution")
        return found[transposed]
    values = set(found.values())
    if len(values) == 1:
        return values.pop()
    if None in values and len(found) == 2:
        raise _Missing(
            "a regular convolution needs its output shape (stride and padding are not "
            "in the message) and a transposed one does not: pass transposed= and "
            "out_shapes="
        )
    raise _Missing(
        "the shapes fit both a regular and a transposed convolution with different "
        "counts: pass transposed="
    )


def _conv(op, shapes, hints, *, fixed_transposed: bool | None = None):
    x = _shape(shapes, 0, (3, 4, 5), op, "input")
    w = _shape(shapes, 1, len(x), op, "weight")
    out = None
    outs = hints.get("out_shapes")
    if outs and outs[0]:  # [None, shape]: output 0 was never consumed
        out = list(outs[0])
        if len(out) < 2:
            raise ValueError(f"{op}: out_shapes[0] must be an activation shape, got {out}")
    transposed = fixed_transposed if fixed_transposed is not None else hints.get("transposed")
    found = _conv_hypotheses(op, x, w, out)
    value = _choose(op, found, transposed)
    if value is None:
        raise _Missing(
            "a regular convolution needs its output shape (stride, padding and dilation "
            "are not in the message): pass out_shapes="
        )
    return value


def _conv_regular(op, shapes, hints):
    # cudnn_convolution and _slow_conv2d_forward have no transposed argument: they are
    # regular convolutions (their 7th input is not a transposed flag, whatever
    # flop_counter's shared signature reads there)
    return _conv(op, shapes, hints, fixed_transposed=False)


def _conv_backward(op, shapes, hints):
    g = _shape(shapes, 0, (3, 4, 5), op, "grad_output")
    x = _shape(shapes, 1, len(g), op, "input")
    w = _shape(shapes, 2, len(g), op, "weight")
    n, w0, w1, ksize = x[0], w[0], w[1], math.prod(w[2:])
    per_position = 2 * ksize * n * w0 * w1
    found: dict[bool, tuple[int, int]] = {}  # transposed -> (forward count, groups)
    if g[1] == w0 and w1 and x[1] % w1 == 0 and w0 % (x[1] // w1) == 0:
        pos = _positions(g, n, w0)
        if pos is not None:
            found[False] = (pos * per_position, x[1] // w1)
    if x[1] == w0 and w1 and g[1] % w1 == 0 and w0 % (g[1] // w1) == 0:
        found[True] = (math.prod(x[2:]) * per_position, g[1] // w1)
    if not found:
        raise ValueError(
            f"{op}: grad_output {g}, input {x} and weight {w} do not fit a convolution"
        )
    mask = hints.get("output_mask")
    if mask is None:
        raise _Missing(
            "which gradients were computed (output_mask) is not in the message: pass "
            "output_mask=, or give the records op_id and input_op_ids so that "
            "assign_flops reads it from the ops that consumed the gradients"
        )
    mask = tuple(bool(b) for b in mask)
    if len(mask) < 2:
        raise ValueError(f"{op}: output_mask needs at least 2 entries, got {mask}")
    counts = {t: fwd * (int(mask[0]) + groups * int(mask[1])) for t, (fwd, groups) in found.items()}
    return _choose(op, counts, hints.get("transposed"))


# -- attention
#
# Forward: scores = Q K^T and out = P V, two batched matmuls over B*H_q heads:
# 2*B*H*S_q*S_k*D + 2*B*H*S_q*S_k*D_v. Backward: the scores again, then four more
# matmuls (grad of V and of P, grad of Q and of K). Grouped-query attention (fewer K/V
# heads) counts the query's heads, as the kernel broadcasts K and V.
#
# The _scaled_dot_product_* ops take [B, H, S, D]; _flash_attention_* and
# _efficient_attention_* take [B, S, H, D] (or [total, H, D] with cumulative sequence
# lengths). A causal mask is not in the message (is_causal is a bool input): the count
# is that of the full S_q x S_k matrix, as flop_counter counts, unless causal=True says
# otherwise; then only the unmasked pairs count.


def _attn_dims(op, q, k, v, layout):
    if layout == "bhsd":
        (b, hq, sq, dq), (b2, hk, sk, dk), (b3, hv, sv, dv) = q, k, v
    else:
        (b, sq, hq, dq), (b2, sk, hk, dk), (b3, sv, hv, dv) = q, k, v
    if not (b == b2 == b3 and hk == hv and dq == dk and sk == sv):
        raise ValueError(f"{op}: query {q}, key {k} and value {v} do not fit attention")
    if hk <= 0 or hq % hk:
        raise ValueError(f"{op}: query heads ({hq}) are not a multiple of key heads ({hk})")
    return b, hq, sq, sk, dq, dv


def _pairs(sq: int, sk: int, causal: bool | None) -> int:
    """Query/key pairs that take part: all of them, or with a causal mask (query i sees
    keys 0..i, PyTorch's is_causal alignment) those on and below the diagonal."""
    if not causal:
        return sq * sk
    full = min(sq, sk)
    return full * (full + 1) // 2 + max(0, sq - sk) * sk


def _attn_forward(op, shapes, hints, layout="bhsd", varlen_at=None):
    if varlen_at is not None and len(shapes) > varlen_at and shapes[varlen_at]:
        raise _Missing(
            "variable-length attention (cumulative sequence lengths given): the per-"
            "sequence lengths are tensor values, not in the message"
        )
    q = _shape(shapes, 0, 4, op, "query")
    k = _shape(shapes, 1, 4, op, "key")
    v = _shape(shapes, 2, 4, op, "value")
    b, h, sq, sk, d, dv = _attn_dims(op, q, k, v, layout)
    return 2 * b * h * _pairs(sq, sk, hints.get("causal")) * (d + dv)


def _attn_backward(op, shapes, hints, layout="bhsd", varlen_at=None):
    if varlen_at is not None and len(shapes) > varlen_at and shapes[varlen_at]:
        raise _Missing(
            "variable-length attention (cumulative sequence lengths given): the per-"
            "sequence lengths are tensor values, not in the message"
        )
    go = _shape(shapes, 0, 4, op, "grad_out")
    q = _shape(shapes, 1, 4, op, "query")
    k = _shape(shapes, 2, 4, op, "key")
    v = _shape(shapes, 3, 4, op, "value")
    b, h, sq, sk, d, dv = _attn_dims(op, q, k, v, layout)
    if go != q[:-1] + [dv]:
        raise ValueError(f"{op}: grad_out {go} does not match query {q} and value {v}")
    pairs = _pairs(sq, sk, hints.get("causal"))
    # scores again (d), grad of P and of V (dv each), grad of Q and of K (d each)
    return 2 * b * h * pairs * (3 * d + 2 * dv)


def _flash_fwd(op, shapes, hints):
    return _attn_forward(op, shapes, hints, "bshd", varlen_at=3)


def _efficient_fwd(op, shapes, hints):
    return _attn_forward(op, shapes, hints, "bshd", varlen_at=4)


def _flash_bwd(op, shapes, hints):
    return _attn_backward(op, shapes, hints, "bshd", varlen_at=6)


def _efficient_bwd(op, shapes, hints):
    return _attn_backward(op, shapes, hints, "bshd", varlen_at=6)


_FORMULAS = {
    "aten::mm": _mm,
    "aten::addmm": _addmm,
    "aten::bmm": _bmm,
    "aten::baddbmm": _baddbmm,
    "aten::_scaled_mm": _mm,
    "aten::convolution": _conv,
    "aten::_convolution": _conv,
    "aten::convolution_overrideable": _conv,
    "aten::cudnn_convolution": _conv_regular,
    "aten::_slow_conv2d_forward": _conv_regular,
    "aten::convolution_backward": _conv_backward,
    "aten::_scaled_dot_product_efficient_attention": _attn_forward,
    "aten::_scaled_dot_product_flash_attention": _attn_forward,
    "aten::_scaled_dot_product_cudnn_attention": _attn_forward,
    "aten::_scaled_dot_product_efficient_attention_backward": _attn_backward,
    "aten::_scaled_dot_product_flash_attention_backward": _attn_backward,
    "aten::_scaled_dot_product_cudnn_attention_backward": _attn_backward,
    "aten::_flash_attention_forward": _flash_fwd,
    "aten::_efficient_attention_forward": _efficient_fwd,
    "aten::_flash_attention_backward": _flash_bwd,
    "aten::_efficient_attention_backward": _efficient_bwd,
    # not in flop_counter's registry: the CPU flash kernel SDPA picks on the CPU
    # (FlopCounterMode's dispatch makes SDPA decompose to matmuls instead)
    "aten::_scaled_dot_product_flash_attention_for_cpu": _attn_forward,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _attn_backward,
}

#: Ops whose count follows a formula of torch.utils.flop_counter (its registry, less
#: the flex-attention higher-order ops, which have no ATen range).
TORCH_FORMULA_OPS = frozenset(
    n for n in _FORMULAS if not n.endswith(("_for_cpu", "_for_cpu_backward"))
)
#: Ops gpuprof counts that flop_counter's registry does not list.
EXTRA_OPS = frozenset(_FORMULAS) - TORCH_FORMULA_OPS
#: Every op with a formula.
FORMULA_OPS = frozenset(_FORMULAS)

_CONV_FORWARD = frozenset(n for n, f in _FORMULAS.items() if f in (_conv, _conv_regular))
# the composite ops that call aten::convolution with a fixed transposed flag
_CONV_CALLERS = {
    "aten::conv1d": False,
    "aten::conv2d": False,
    "aten::conv3d": False,
    "aten::_convolution_mode": False,
    "aten::conv_transpose1d": True,
    "aten::conv_transpose2d": True,
    "aten::conv_transpose3d": True,
}
_HINTS = ("out_shapes", "transposed", "output_mask", "causal")


def _op_key(op_name: str) -> str:
    if not isinstance(op_name, str):
        raise TypeError(f"op_name: expected a str such as 'aten::mm', got {type(op_name).__name__}")
    name = op_name.strip()
    if name.startswith("aten."):  # torch.ops spelling, aten.mm.default
        name = "aten::" + name[5:]
    if name.startswith("aten::"):
        name = name.split(".", 1)[0]  # an overload name counts as its op
    return name


def has_formula(op_name: str) -> bool:
    """Whether gpuprof has a FLOP formula for ``op_name`` (``aten::mm``; an overload
    such as ``aten::mm.out`` counts as its op)."""
    return _op_key(op_name) in _FORMULAS


def _evaluate(op_name, shapes, hints) -> tuple[int | None, str | None]:
    key = _op_key(op_name)
    formula = _FORMULAS.get(key)
    if formula is None:
        return None, f"{key} has no FLOP formula"
    if not isinstance(shapes, (list, tuple)):
        raise TypeError(
            f"shapes: expected a list of shapes (parse_sizes of the message), got "
            f"{type(shapes).__name__}"
        )
    try:
        return formula(key, shapes, hints), None
    except _Missing as e:
        return None, f"{key}: {e}"


def _check_hints(out_shapes, transposed, output_mask, causal):
    if out_shapes is not None and not isinstance(out_shapes, (list, tuple)):
        raise TypeError("out_shapes: expected a list of output shapes or None")
    for name, v in (("transposed", transposed), ("causal", causal)):
        if v is not None and not isinstance(v, bool):
            raise TypeError(f"{name}: expected True, False or None, got {v!r}")
    if output_mask is not None and not isinstance(output_mask, (list, tuple)):
        raise TypeError("output_mask: expected a sequence of bools such as (True, True, False)")
    return {
        "out_shapes": out_shapes,
        "transposed": transposed,
        "output_mask": output_mask,
        "causal": causal,
    }


def flops(
    op_name: str,
    shapes: Sequence,
    *,
    out_shapes: Sequence | None = None,
    transposed: bool | None = None,
    output_mask: Sequence[bool] | None = None,
    causal: bool | None = None,
) -> int | None:
    """Floating-point operations of one call of an ATen op, from its input shapes.

    Args:
        op_name: the op as NVTX and torch.profiler name it, ``aten::addmm``.
        shapes: one entry per input, as ``parse_sizes`` returns them.
        out_shapes: the op's output shapes where known; a regular convolution needs
            the first (its output size depends on stride and padding, not in the
            message).
        transposed: the convolution's transposed flag, where known; needed only when
            the shapes fit both kinds with different counts.
        output_mask: which of grad_input, grad_weight (and grad_bias) a
            ``convolution_backward`` computed; needed for it.
        causal: True counts only the unmasked query/key pairs of an attention op;
            None or False counts them all, as flop_counter does.

    Returns:
        The count, or None when the op has no formula or the count needs a hint not
        given (``missing_reason`` says which).

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: the shapes cannot be this op's inputs (the error names them).
    """
    hints = _check_hints(out_shapes, transposed, output_mask, causal)
    return _evaluate(op_name, shapes, hints)[0]


def missing_reason(
    op_name: str,
    shapes: Sequence,
    *,
    out_shapes: Sequence | None = None,
    transposed: bool | None = None,
    output_mask: Sequence[bool] | None = None,
    causal: bool | None = None,
) -> str | None:
    """Why ``flops()`` with the same arguments answers None (no formula, or which fact
    is missing), or None when it answers a count."""
    hints = _check_hints(out_shapes, transposed, output_mask, causal)
    return _evaluate(op_name, shapes, hints)[1]


# ------------------------------------------------------------------ trees of records


_BACKWARD_NODE = re.compile(r"(?:^|\s)\w+Backward\d*$")


@dataclass
class OpRecord:
    """One op range: its name, input shapes, the ranges inside it, and what
    ``assign_flops`` fills in.

    ``seq``, ``op_id`` and ``input_op_ids`` come from the NVTX message when it has them
    and let ``assign_flops`` find what the shapes alone do not say. ``out_shapes``,
    ``transposed``, ``output_mask`` and ``causal`` are hints a caller may set (see
    ``flops``); ``assign_flops`` fills in those it can derive and leaves given ones.
    """

    name: str
    shapes: list = field(default_factory=list)
    children: list[OpRecord] = field(default_factory=list)
    seq: int | None = None
    op_id: int | None = None
    input_op_ids: list[tuple[int, int]] = field(default_factory=list)
    out_shapes: list | None = None
    transposed: bool | None = None
    output_mask: tuple[bool, ...] | None = None
    causal: bool | None = None
    flops: int | None = None
    flops_note: str | None = None

    @classmethod
    def from_message(cls, text: str, children: Iterable[OpRecord] = ()) -> OpRecord:
        """A record from one NVTX message (``parse_message``)."""
        m = parse_message(text)
        return cls(
            name=m.name,
            shapes=m.sizes,
            children=list(children),
            seq=m.seq,
            op_id=m.op_id,
            input_op_ids=m.input_op_ids,
        )


def _walk(roots: Iterable[Any], parents: tuple = ()):
    """(record, its ancestors nearest last) in pre-order, which is start order."""
    for r in roots:
        yield r, parents
        yield from _walk(getattr(r, "children", ()) or (), parents + (r,))


def assign_flops(roots: Iterable[Any]) -> int:
    """Put FLOP counts on a forest of op records, each operation counted once.

    The rule: a record gets ``flops`` when its op has a formula, the formula has what it
    needs, and no record inside it got a count (so the count sits on the innermost op
    that has one: ``aten::linear`` > ``aten::addmm`` counts at addmm, ``aten::conv2d`` >
    ``aten::convolution`` > ``aten::_convolution`` > ``aten::cudnn_convolution`` at
    cudnn_convolution). Every other record gets ``flops = None``; ``flops_note`` says
    why a record with a formula got none (a count inside it, or the missing fact).

    Records are ``OpRecord`` objects or any objects with the same attributes (at least
    ``name``, ``shapes`` and ``children``). Before counting, hints the shapes lack are
    derived, without overwriting any a caller set:

    - ``out_shapes``: from the records that consumed an output, matched through their
      ``input_op_ids`` to the producer's ``op_id``; an op inside a convolution that
      returns its result (``aten::conv2d`` > ``aten::convolution`` > ...) takes the
      enclosing one's output shape.
    - ``transposed``: True inside ``aten::conv_transpose{1,2,3}d``, False inside
      ``aten::conv{1,2,3}d``; a ``convolution_backward`` takes the flag of the forward
      convolution whose ``seq`` its autograd node (``ConvolutionBackward0``) carries.
    - ``output_mask`` of ``convolution_backward``: an output counts as computed when a
      later record consumed it (autograd hands every computed gradient on; one that
      was not computed is undefined and nothing can consume it). Derived only when the
      records carry ``op_id`` and ``input_op_ids``.

    Returns:
        The total of the counts placed.
    """
    items = list(_walk(roots))
    has_links = any(getattr(r, "input_op_ids", None) for r, _ in items)
    by_id: dict[int, Any] = {}
    for r, _ in items:
        op_id = getattr(r, "op_id", None)
        if op_id:
            by_id[op_id] = r
    derived: dict[int, dict[str, Any]] = {id(r): {} for r, _ in items}
    consumed: dict[int, set[int]] = {}
    outs: dict[int, dict[int, list]] = {}
    if has_links:
        for r, _ in items:
            shapes = getattr(r, "shapes", None) or []
            for i, (pid, nr) in enumerate(getattr(r, "input_op_ids", None) or ()):
                if pid and nr >= 0 and pid in by_id:
                    consumed.setdefault(pid, set()).add(nr)
                    if i < len(shapes):
                        outs.setdefault(pid, {}).setdefault(nr, shapes[i])

    def hint(r, name):
        given = getattr(r, name, None)
        return given if given is not None else derived[id(r)].get(name)

    forward_flag: dict[int, list[bool | None]] = {}
    for r, parents in items:
        d = derived[id(r)]
        op_id = getattr(r, "op_id", None)
        if op_id in outs:
            got = outs[op_id]
            d["out_shapes"] = [got.get(i, None) for i in range(max(got) + 1)]
        name = _op_key(r.name) if isinstance(r.name, str) else ""
        conv_fwd = name in _CONV_FORWARD
        if conv_fwd:
            for p in reversed(parents):
                pname = _op_key(p.name)
                if pname in _CONV_CALLERS:
                    d["transposed"] = _CONV_CALLERS[pname]
                    break
                if pname not in _CONV_FORWARD:
                    break
            if hint(r, "out_shapes") is None or not hint(r, "out_shapes")[0]:
                for p in reversed(parents):
                    pname = _op_key(p.name)
                    if pname not in _CONV_FORWARD and pname not in _CONV_CALLERS:
                        break
                    po = hint(p, "out_shapes")
                    if po and po[0]:
                        d["out_shapes"] = [po[0]]
                        break
            seq = getattr(r, "seq", None)
            if seq is not None:
                forward_flag.setdefault(seq, []).append(hint(r, "transposed"))
        elif name == "aten::convolution_backward":
            if has_links and op_id:
                used = consumed.get(op_id, set())
                d["output_mask"] = (0 in used, 1 in used, 2 in used)
            for p in reversed(parents):
                if _BACKWARD_NODE.search(p.name) and getattr(p, "seq", None) is not None:
                    d["backward_seq"] = p.seq
                    break

    total = 0

    def place(r) -> bool:
        """Count ``r``'s subtree; True when a count was placed in it."""
        nonlocal total
        inside = False
        for c in getattr(r, "children", ()) or ():
            inside = place(c) or inside
        d = derived[id(r)]
        if "backward_seq" in d and hint(r, "transposed") is None:
            flags = forward_flag.get(d["backward_seq"], [])
            if len(flags) >= 1 and len(set(flags)) == 1 and flags[0] is not None:
                d["transposed"] = flags[0]
        r.flops = None
        r.flops_note = None
        if not isinstance(r.name, str) or not has_formula(r.name):
            return inside
        if inside:
            r.flops_note = "counted in the ops inside it"
            return True
        hints = {h: hint(r, h) for h in _HINTS}
        value, note = _evaluate(r.name, getattr(r, "shapes", None) or [], hints)
        r.flops, r.flops_note = value, note
        if value is None:
            return False
        total += value
        return True

    for r in [r for r, p in items if not p]:
        place(r)
    return total
