"""gpuprof.results._flops: NVTX messages parsed, FLOP formulas, and counts placed on op trees.

The counts are checked against torch.utils.flop_counter on the same run: a
TorchDispatchMode writes, for every dispatched op, the message
``emit_nvtx(record_shapes=True)`` would write (name, op_id, sizes, input_op_ids; that
writer needs a CUDA build, so its format is rebuilt here from torch's source rules),
gpuprof parses the messages and counts, and the totals, per op name too, must agree
with FlopCounterMode within 1%. torch.profiler's own nested op tree (the same
RecordFunction ranges NVTX sees) checks the once-only rule on a real model.
"""

import itertools
import math

import pytest
from gpuprof.results import _flops
from gpuprof.results._flops import (
    OpRecord,
    assign_flops,
    flops,
    has_formula,
    missing_reason,
    parse_input_op_ids,
    parse_message,
    parse_sizes,
)


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed (make frameworks)")


# ------------------------------------------------------------------------ parsing


def test_parse_message_reads_every_field():
    m = parse_message(
        "aten::addmm, seq = 12, op_id = 40, sizes = [[3], [4, 5], [5, 3], [], []], "
        "input_op_ids = [(0,-1), (38,0), (39,1), (0,-1), (0,-1)]"
    )
    assert m.name == "aten::addmm"
    assert (m.seq, m.op_id) == (12, 40)
    assert m.sizes == [[3], [4, 5], [5, 3], [], []]
    assert m.input_op_ids == [(0, -1), (38, 0), (39, 1), (0, -1), (0, -1)]


@pytest.mark.parametrize(
    "text, name, seq, op_id, sizes",
    [
        ("aten::mm", "aten::mm", None, None, []),
        ("aten::mm, op_id = 7", "aten::mm", None, 7, []),
        ("AddmmBackward0, seq = 1646, op_id = 168", "AddmmBackward0", 1646, 168, []),
        ("MmBackward0, stashed seq = 5", "MmBackward0", 5, None, []),
        ("aten::ones, sizes = [[], [], [], [], []]", "aten::ones", None, None, [[]] * 5),
        ("aten::sum, sizes = [[]]", "aten::sum", None, None, [[]]),
        (
            "autograd::engine::evaluate_function: MmBackward0, op_id = 3",
            "autograd::engine::evaluate_function: MmBackward0",
            None,
            3,
            [],
        ),
    ],
)
def test_parse_message_optional_fields(text, name, seq, op_id, sizes):
    m = parse_message(text)
    assert (m.name, m.seq, m.op_id, m.sizes) == (name, seq, op_id, sizes)


def test_parse_sizes_takes_the_message_or_the_brackets():
    assert parse_sizes("aten::cat, sizes = [[2, 3], [2, 4], []]") == [[2, 3], [2, 4], []]
    assert parse_sizes("[[2, 3], [2, 4], []]") == [[2, 3], [2, 4], []]
    assert parse_sizes("[]") == []
    # torch.profiler's input_shapes keep a tensor list nested; so does the parser
    assert parse_sizes("[[[2, 3], [2, 4]], []]") == [[[2, 3], [2, 4]], []]
    assert parse_input_op_ids("[(3,0), (0,-1)]") == [(3, 0), (0, -1)]


@pytest.mark.parametrize(
    "text", ["[[2, 3]", "[[2,, 3]]", "[[2 3]]", "[[2, 3]] x", "[[2, 3],]", "[[a]]"]
)
def test_bad_sizes_raise_naming_the_argument(text):
    with pytest.raises(ValueError, match=r"parse_sizes\(text\)"):
        parse_sizes(text)


def test_bad_message_fields_raise():
    with pytest.raises(ValueError, match="op_id is not a number"):
        parse_message("aten::mm, op_id = x")
    with pytest.raises(ValueError, match="input_op_ids"):
        parse_message("aten::mm, input_op_ids = [(1 2)]")
    with pytest.raises(TypeError, match="text"):
        parse_message(b"aten::mm")
    with pytest.raises(TypeError, match="text"):
        parse_sizes(None)


# ---------------------------------------------------------------------- formulas


def test_matmul_family_by_hand():
    assert flops("aten::mm", [[4, 5], [5, 3]]) == 2 * 4 * 5 * 3
    assert flops("aten::addmm", [[3], [4, 5], [5, 3], [], []]) == 2 * 4 * 5 * 3
    assert flops("aten::bmm", [[6, 4, 5], [6, 5, 3]]) == 6 * 2 * 4 * 5 * 3
    assert flops("aten::baddbmm", [[6, 4, 3], [6, 4, 5], [6, 5, 3], [], []]) == 6 * 2 * 60
    assert flops("aten::_scaled_mm", [[16, 32], [32, 8], [], [], [], [], [], []]) == 2 * 16 * 32 * 8
    # an overload or the torch.ops spelling names the same op
    assert flops("aten::mm.out", [[4, 5], [5, 3], [4, 3]]) == 120
    assert flops("aten.mm.default", [[4, 5], [5, 3]]) == 120


def test_no_formula_is_none_never_a_guess():
    assert flops("aten::add", [[4, 5], [4, 5], []]) is None
    assert not has_formula("aten::add")
    assert "no FLOP formula" in missing_reason("aten::add", [[4, 5], [4, 5], []])
    assert flops("MmBackward0", []) is None
    assert has_formula("aten::mm") and has_formula("aten::convolution_backward")


def test_bad_shapes_raise_naming_the_op():
    with pytest.raises(ValueError, match="aten::mm: inner dimensions differ"):
        flops("aten::mm", [[4, 5], [6, 3]])
    with pytest.raises(ValueError, match=r"aten::mm: input 1 \(mat2\) must be 2-D"):
        flops("aten::mm", [[4, 5], [5, 3, 1]])
    with pytest.raises(ValueError, match="record_shapes=True"):
        flops("aten::mm", [])
    with pytest.raises(TypeError, match="shapes"):
        flops("aten::mm", "[[4, 5], [5, 3]]")
    with pytest.raises(TypeError, match="op_name"):
        flops(None, [[4, 5], [5, 3]])
    with pytest.raises(TypeError, match="transposed"):
        flops("aten::convolution", [[1, 2, 5, 5], [2, 2, 3, 3]], transposed=1)


def _meta(torch, shape, dtype=None):
    return torch.empty(shape, device="meta", dtype=dtype or torch.float32)


def _theirs(torch, op, *args, out=None):
    from torch.utils.flop_counter import flop_registry

    return flop_registry[getattr(torch.ops.aten, op)](*args, out_val=out)


MATMUL_SHAPES = [(1, 1, 1), (7, 13, 5), (64, 128, 384), (3, 1, 9)]


@pytest.mark.parametrize("m, k, n", MATMUL_SHAPES)
def test_matmul_counts_match_flop_counter(torch, m, k, n):
    a, b = _meta(torch, (m, k)), _meta(torch, (k, n))
    assert flops("aten::mm", [[m, k], [k, n]]) == _theirs(torch, "mm", a, b)
    bias = _meta(torch, (n,))
    assert flops("aten::addmm", [[n], [m, k], [k, n], [], []]) == _theirs(
        torch, "addmm", bias, a, b
    )
    x, y = _meta(torch, (4, m, k)), _meta(torch, (4, k, n))
    assert flops("aten::bmm", [[4, m, k], [4, k, n]]) == _theirs(torch, "bmm", x, y)
    assert flops("aten::baddbmm", [[4, m, n], [4, m, k], [4, k, n], [], []]) == _theirs(
        torch, "baddbmm", _meta(torch, (4, m, n)), x, y
    )
    s = _meta(torch, ())
    assert flops("aten::_scaled_mm", [[m, k], [k, n], [], []]) == _theirs(
        torch, "_scaled_mm", a, b, s, s
    )


# (input shape, weight shape, stride, padding, dilation, groups, transposed, output_padding)
CONVS = [
    ((2, 3, 32, 32), (8, 3, 3, 3), 1, 1, 1, 1, False, 0),
    ((2, 3, 32, 32), (8, 3, 7, 7), 2, 3, 1, 1, False, 0),
    ((1, 8, 15, 15), (8, 1, 3, 3), 2, 0, 1, 8, False, 0),  # depthwise, C_in == C_out
    ((2, 16, 9, 9), (32, 4, 3, 3), 1, 2, 2, 4, False, 0),  # grouped, dilated
    ((2, 8, 7, 7), (8, 4, 4, 4), 2, 1, 1, 1, True, 0),  # transposed
    ((2, 8, 7, 7), (8, 2, 3, 3), 2, 1, 1, 2, True, 1),  # grouped transposed
    ((3, 4, 50), (6, 4, 5), 2, 0, 1, 1, False, 0),  # 1-D
    ((1, 2, 6, 6, 6), (4, 2, 3, 3, 3), 1, 1, 1, 1, False, 0),  # 3-D
]


def _conv_out(torch, x, w, stride, padding, dilation, groups, transposed, output_padding):
    nd = len(x) - 2
    y = torch.ops.aten.convolution(
        _meta(torch, x),
        _meta(torch, w),
        None,
        [stride] * nd,
        [padding] * nd,
        [dilation] * nd,
        transposed,
        [output_padding] * nd,
        groups,
    )
    return y


@pytest.mark.parametrize("x, w, stride, padding, dilation, groups, transposed, opad", CONVS)
def test_convolution_counts_match_flop_counter(
    torch, x, w, stride, padding, dilation, groups, transposed, opad
):
    y = _conv_out(torch, x, w, stride, padding, dilation, groups, transposed, opad)
    nd = len(x) - 2
    want = _theirs(
        torch,
        "convolution",
        _meta(torch, x),
        _meta(torch, w),
        None,
        [stride] * nd,
        [padding] * nd,
        [dilation] * nd,
        transposed,
        [opad] * nd,
        groups,
        out=y,
    )
    shapes = [list(x), list(w), [], [], [], [], [], [], []]
    out = [list(y.shape)]
    for op in ("aten::convolution", "aten::_convolution", "aten::convolution_overrideable"):
        assert flops(op, shapes, out_shapes=out, transposed=transposed) == want, op
    if not transposed:
        assert flops("aten::cudnn_convolution", shapes, out_shapes=out) == want

    # backward: every mask, against flop_counter's formula
    g = list(y.shape)
    for mask in itertools.product([False, True], repeat=2):
        outs = (
            _meta(torch, x) if mask[0] else None,
            _meta(torch, w) if mask[1] else None,
            None,
        )
        want_b = _theirs(
            torch,
            "convolution_backward",
            _meta(torch, g),
            _meta(torch, x),
            _meta(torch, w),
            None,
            [stride] * nd,
            [padding] * nd,
            [dilation] * nd,
            transposed,
            [opad] * nd,
            groups,
            [mask[0], mask[1], False],
            out=outs,
        )
        got = flops(
            "aten::convolution_backward",
            [g, list(x), list(w)] + [[]] * 8,
            output_mask=(*mask, False),
            transposed=transposed,
        )
        assert got == want_b, mask


def test_convolution_says_what_it_lacks():
    # a regular convolution's output size is not in its inputs
    shapes = [[2, 3, 32, 32], [8, 3, 3, 3], [8], [], [], [], [], [], []]
    assert flops("aten::convolution", shapes) is None
    assert "out_shapes" in missing_reason("aten::convolution", shapes)
    assert flops("aten::convolution", shapes, out_shapes=[[2, 8, 16, 16]]) == (
        2 * 16 * 16 * 9 * 2 * 8 * 3
    )
    # a transposed one needs no output shape; the shapes alone say it is transposed
    # (input channels match the weight's first dimension and not its second)
    t = [[2, 8, 7, 7], [8, 4, 4, 4], [4], [], [], [], [], [], []]
    assert flops("aten::convolution", t, out_shapes=[[2, 4, 16, 16]]) == 2 * 49 * 16 * 2 * 8 * 4
    # depthwise stride 2: both kinds fit, with different counts: say so
    d = [[1, 8, 15, 15], [8, 1, 3, 3], [8], [], [], [], [], [], []]
    assert flops("aten::convolution", d, out_shapes=[[1, 8, 7, 7]]) is None
    assert "transposed=" in missing_reason("aten::convolution", d, out_shapes=[[1, 8, 7, 7]])
    assert flops("aten::convolution", d, out_shapes=[[1, 8, 7, 7]], transposed=False) == (
        2 * 49 * 9 * 8
    )
    # the backward needs to know which gradients were computed
    b = [[2, 8, 16, 16], [2, 3, 32, 32], [8, 3, 3, 3]] + [[]] * 8
    assert flops("aten::convolution_backward", b) is None
    assert "output_mask" in missing_reason("aten::convolution_backward", b)
    with pytest.raises(ValueError, match="do not fit a convolution"):
        flops("aten::convolution", [[2, 3, 8, 8], [8, 5, 3, 3]], out_shapes=[[2, 8, 6, 6]])
    with pytest.raises(ValueError, match="transposed convolution"):
        flops("aten::convolution", shapes, out_shapes=[[2, 8, 16, 16]], transposed=True)


# (B, H_q, H_kv, S_q, S_k, D, D_v)
ATTENTION = [
    (2, 4, 4, 32, 32, 16, 16),
    (1, 8, 2, 17, 40, 64, 64),  # grouped-query
    (3, 2, 2, 5, 9, 8, 24),  # D_v != D
]


@pytest.mark.parametrize("b, hq, hk, sq, sk, d, dv", ATTENTION)
def test_attention_counts_match_flop_counter(torch, b, hq, hk, sq, sk, d, dv):
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q, k, v, go = [b, hq, sq, d], [b, hk, sk, d], [b, hk, sk, dv], [b, hq, sq, dv]
    fwd, bwd = sdpa_flop_count(q, k, v), sdpa_backward_flop_count(go, q, k, v)
    for kind in ("efficient", "flash", "cudnn"):
        op = f"aten::_scaled_dot_product_{kind}_attention"
        assert flops(op, [q, k, v, [], [], [], [], []]) == fwd, op
        assert flops(op + "_backward", [go, q, k, v] + [[]] * 10) == bwd, op
        # against the registry entry itself, with tensors as FlopCounterMode passes them
        mq, mk, mv, mgo = (_meta(torch, s) for s in (q, k, v, go))
        assert _theirs(torch, f"_scaled_dot_product_{kind}_attention", mq, mk, mv) == fwd
        assert (
            _theirs(torch, f"_scaled_dot_product_{kind}_attention_backward", mgo, mq, mk, mv) == bwd
        )
    # the CPU flash kernel has no flop_counter entry; gpuprof counts it the same way
    assert flops("aten::_scaled_dot_product_flash_attention_for_cpu", [q, k, v, [], []]) == fwd
    assert (
        flops("aten::_scaled_dot_product_flash_attention_for_cpu_backward", [go, q, k, v, q, []])
        == bwd
    )

    # _flash_attention_* and _efficient_attention_* take [B, S, H, D] (PyTorch's meta
    # functions read batch, seqlen, heads, dim in that order); the count is the same work
    def bshd(s):
        return [s[0], s[2], s[1], s[3]]

    q2, k2, v2, go2 = bshd(q), bshd(k), bshd(v), bshd(go)
    assert flops("aten::_flash_attention_forward", [q2, k2, v2, [], [], [], []]) == fwd
    assert flops("aten::_efficient_attention_forward", [q2, k2, v2, [], [], [], [], []]) == fwd
    assert flops("aten::_flash_attention_backward", [go2, q2, k2, v2, q2, [], [], []]) == bwd
    assert (
        flops("aten::_efficient_attention_backward", [go2, q2, k2, v2, [], q2, [], [], []]) == bwd
    )


def test_attention_variable_length_and_causal():
    q = [100, 4, 16]  # packed sequences: [total, H, D] with cumulative lengths
    shapes = [q, q, q, [5], [5], [], []]
    assert flops("aten::_flash_attention_forward", shapes) is None
    assert "variable-length" in missing_reason("aten::_flash_attention_forward", shapes)
    # causal: only the pairs on and below the diagonal, when the caller knows it
    sdpa = "aten::_scaled_dot_product_flash_attention"
    full = flops(sdpa, [[1, 1, 4, 8], [1, 1, 4, 8], [1, 1, 4, 8]])
    causal = flops(sdpa, [[1, 1, 4, 8], [1, 1, 4, 8], [1, 1, 4, 8]], causal=True)
    assert full == 2 * 16 * 16 and causal == 2 * 10 * 16  # 4x4 matrix, 10 pairs on/below
    with pytest.raises(ValueError, match="not a multiple of key heads"):
        flops(sdpa, [[1, 3, 4, 8], [1, 2, 4, 8], [1, 2, 4, 8]])


def test_every_flop_counter_op_has_a_formula(torch):
    """The registry of torch.utils.flop_counter, ATen ops only, is covered."""
    from torch.utils.flop_counter import flop_registry

    theirs = {
        f"aten::{k.__name__}"
        for k in flop_registry
        if isinstance(k, torch._ops.OpOverloadPacket) and k._qualified_op_name.startswith("aten::")
    }
    assert theirs, "flop_counter's registry is empty: its layout changed"
    assert theirs <= _flops.FORMULA_OPS, sorted(theirs - _flops.FORMULA_OPS)
    assert _flops.TORCH_FORMULA_OPS == theirs


# ------------------------------------------------------------------ tree of records


def test_count_sits_on_the_innermost_op_once():
    conv = OpRecord(
        "aten::conv2d",
        [[2, 3, 32, 32], [8, 3, 3, 3], [8], [], [], [], []],
        op_id=10,
        children=[
            OpRecord(
                "aten::convolution",
                [[2, 3, 32, 32], [8, 3, 3, 3], [8], [], [], [], [], [], []],
                seq=4,
                op_id=11,
                children=[
                    OpRecord(
                        "aten::_convolution",
                        [[2, 3, 32, 32], [8, 3, 3, 3], [8]] + [[]] * 10,
                        op_id=12,
                        children=[
                            OpRecord(
                                "aten::cudnn_convolution",
                                [[2, 3, 32, 32], [8, 3, 3, 3]] + [[]] * 7,
                                op_id=13,
                            )
                        ],
                    )
                ],
            )
        ],
    )
    # batch_norm consumes conv2d's output (NVTX names the outermost producer)
    bn = OpRecord(
        "aten::batch_norm",
        [[2, 8, 16, 16], [8], [8], [8], [8], [], [], [], []],
        op_id=20,
        input_op_ids=[(10, 0)] + [(0, -1)] * 8,
    )
    linear = OpRecord(
        "aten::linear",
        [[4, 16], [32, 16], [32]],
        children=[
            OpRecord("aten::t", [[32, 16]]),
            OpRecord("aten::addmm", [[32], [4, 16], [16, 32], [], []]),
        ],
    )
    total = assign_flops([conv, bn, linear])
    inner = conv.children[0].children[0].children[0]
    assert inner.flops == 2 * 16 * 16 * 9 * 2 * 8 * 3
    assert conv.flops is None and conv.children[0].flops is None
    assert conv.children[0].flops_note == "counted in the ops inside it"
    assert linear.flops is None and linear.children[1].flops == 2 * 4 * 16 * 32
    assert total == inner.flops + linear.children[1].flops


def test_conv_transpose_caller_and_backward_seq_give_the_flag():
    # depthwise stride 2, C_in == C_out: the shapes alone fit both kinds
    fwd = OpRecord(
        "aten::conv2d",
        [[1, 8, 15, 15], [8, 1, 3, 3], [8], [], [], [], []],
        op_id=1,
        children=[
            OpRecord(
                "aten::convolution",
                [[1, 8, 15, 15], [8, 1, 3, 3], [8]] + [[]] * 6,
                seq=7,
                op_id=2,
                out_shapes=[[1, 8, 7, 7]],
            )
        ],
    )
    bwd = OpRecord(
        "autograd::engine::evaluate_function: ConvolutionBackward0",
        [],
        children=[
            OpRecord(
                "ConvolutionBackward0",
                [],
                seq=7,
                children=[
                    OpRecord(
                        "aten::convolution_backward",
                        [[1, 8, 7, 7], [1, 8, 15, 15], [8, 1, 3, 3]] + [[]] * 8,
                        output_mask=(True, True, True),
                    )
                ],
            )
        ],
    )
    assign_flops([fwd, bwd])
    one = 2 * 49 * 9 * 8
    assert fwd.children[0].flops == one
    # grad_input = forward, grad_weight = groups (8) x forward
    assert bwd.children[0].children[0].flops == one + 8 * one
    # without the callers nothing says which kind it was: no count, and the reason
    bare = OpRecord("aten::convolution", fwd.children[0].shapes, out_shapes=[[1, 8, 7, 7]])
    assign_flops([bare])
    assert bare.flops is None and "transposed=" in bare.flops_note


def test_output_mask_from_consumers():
    g, x, w = [2, 8, 16, 16], [2, 3, 32, 32], [8, 3, 3, 3]
    back = OpRecord("aten::convolution_backward", [g, x, w] + [[]] * 8, op_id=5)
    # only the weight gradient (output 1) is consumed: the input needed none
    acc = OpRecord("aten::detach", [w], op_id=6, input_op_ids=[(5, 1)])
    assign_flops([back, acc])
    assert back.flops == 2 * 256 * 9 * 2 * 8 * 3  # grad_weight only (groups 1)


def test_hints_a_caller_sets_are_kept_and_none_are_guessed():
    back = OpRecord(
        "aten::convolution_backward",
        [[2, 8, 16, 16], [2, 3, 32, 32], [8, 3, 3, 3]] + [[]] * 8,
    )
    assign_flops([back])
    assert back.flops is None and "output_mask" in back.flops_note
    back.output_mask = (True, False, False)
    assign_flops([back])
    assert back.flops == 2 * 256 * 9 * 2 * 8 * 3


def test_records_from_messages():
    rec = OpRecord.from_message(
        "aten::mm, seq = 3, op_id = 9, sizes = [[4, 5], [5, 3]], input_op_ids = [(1,0), (2,0)]"
    )
    assert (rec.name, rec.seq, rec.op_id) == ("aten::mm", 3, 9)
    assert assign_flops([rec]) == 120 and rec.flops == 120


# ------------------------------------------------ real models against FlopCounterMode


def _nvtx_recorder(torch):
    from torch.utils._python_dispatch import TorchDispatchMode

    class NvtxLikeRecorder(TorchDispatchMode):
        """For every dispatched op, the message emit_nvtx(record_shapes=True) writes:
        one sizes entry per schema input (a tensor's sizes; [] for a non-tensor or an
        absent tensor; a tensor list flattened), and per entry the (op_id, output
        number) of the op that produced it, (0,-1) for none."""

        def __init__(self):
            super().__init__()
            self.messages = []
            self._producer = {}
            self._alive = []  # keeps ids unique while the producer map refers to them
            self._next = 1

        def _inputs(self, func, args, kwargs):
            for i, a in enumerate(func._schema.arguments):
                if not a.kwarg_only and i < len(args):
                    yield args[i]
                elif a.name in kwargs:
                    yield kwargs[a.name]
                else:
                    yield a.default_value if a.has_default_value() else None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            op_id, self._next = self._next, self._next + 1
            sizes, ids = [], []
            for value in self._inputs(func, args, kwargs):
                tensors = None
                if isinstance(value, torch.Tensor):
                    tensors = [value]
                elif isinstance(value, (list, tuple)):
                    tensors = [v for v in value if isinstance(v, torch.Tensor)] or None
                if tensors is None:
                    sizes.append([])
                    ids.append((0, -1))
                    continue
                for t in tensors:
                    sizes.append(list(t.shape))
                    ids.append(self._producer.get(id(t), (0, -1)))
            text_sizes = (
                "[" + ", ".join("[" + ", ".join(str(d) for d in s) + "]" for s in sizes) + "]"
            )
            text_ids = "[" + ", ".join(f"({a},{b})" for a, b in ids) + "]"
            self.messages.append(
                f"aten::{func._overloadpacket.__name__}, op_id = {op_id}, "
                f"sizes = {text_sizes}, input_op_ids = {text_ids}"
            )
            out = func(*args, **kwargs)
            for nr, t in enumerate(out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):
                    self._producer[id(t)] = (op_id, nr)
                    self._alive.append(t)
            return out

    return NvtxLikeRecorder


def _train_step(model, x):
    out = model(x)
    out = getattr(out, "logits", out)
    out.float().sum().backward()


def _compare_with_flop_counter(torch, make_model, make_input):
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model, x = make_model(), make_input()
    recorder = _nvtx_recorder(torch)()
    with recorder:
        _train_step(model, x)
    model.zero_grad(set_to_none=True)
    counter = FlopCounterMode(display=False)
    with counter:
        _train_step(model, x)

    records = [OpRecord.from_message(m) for m in recorder.messages]
    total = assign_flops(records)
    ours: dict[str, int] = {}
    for r in records:
        if r.flops is not None:
            ours[r.name] = ours.get(r.name, 0) + r.flops
    missing = [(r.name, r.flops_note) for r in records if has_formula(r.name) and r.flops is None]
    theirs = {f"aten::{k.__name__}": v for k, v in counter.get_flop_counts()["Global"].items() if v}
    assert not missing, missing
    assert theirs, "FlopCounterMode counted nothing: the model ran no counted op"
    assert set(ours) == set(theirs)
    for name, want in theirs.items():
        assert ours[name] == pytest.approx(want, rel=0.01), name
    assert total == pytest.approx(counter.get_total_flops(), rel=0.01)
    return ours, theirs


def test_gpt2_forward_backward_matches_flop_counter(torch):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")

    def make():
        cfg = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4)
        return transformers.GPT2LMHeadModel(cfg)

    ours, _ = _compare_with_flop_counter(
        torch,
        make,
        lambda: torch.randint(0, 50257, (2, 32), generator=torch.Generator().manual_seed(1)),
    )
    assert {"aten::addmm", "aten::mm", "aten::bmm"} <= set(ours)


def _small_resnet(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.a = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn_a = nn.BatchNorm2d(cout)
            self.b = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn_b = nn.BatchNorm2d(cout)
            self.skip = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else nn.Identity()
            )

        def forward(self, x):
            y = torch.relu(self.bn_a(self.a(x)))
            return torch.relu(self.bn_b(self.b(y)) + self.skip(x))

    return nn.Sequential(
        nn.Conv2d(3, 16, 7, 2, 3, bias=False),  # its input needs no gradient
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
        Block(16, 16, 1),
        Block(16, 32, 2),
        nn.Conv2d(32, 32, 3, 1, 1, groups=4),  # grouped, with bias
        nn.ConvTranspose2d(32, 8, 4, 2, 1),  # transposed
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )


def test_conv_net_forward_backward_matches_flop_counter(torch):
    ours, theirs = _compare_with_flop_counter(
        torch, lambda: _small_resnet(torch), lambda: torch.randn(2, 3, 64, 64)
    )
    assert {"aten::convolution", "aten::convolution_backward"} <= set(theirs)


def test_torchvision_resnet18_matches_flop_counter(torch):
    try:
        import torchvision
    except (ImportError, RuntimeError) as e:  # a CUDA torchvision beside a CPU torch
        pytest.skip(f"torchvision is not usable here: {e}")
    _compare_with_flop_counter(
        torch, lambda: torchvision.models.resnet18(), lambda: torch.randn(2, 3, 64, 64)
    )


def _profiler_tree(torch, fn):
    """torch.profiler's nested CPU op tree (the RecordFunction ranges NVTX also sees)
    as OpRecords."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()

    def rec(e):
        return OpRecord(
            e.name,
            [list(s) if isinstance(s, (list, tuple)) else [] for s in e.input_shapes],
            children=[rec(c) for c in e.cpu_children],
            seq=e.sequence_nr if e.sequence_nr >= 0 else None,
        )

    return [rec(e) for e in prof.events() if e.cpu_parent is None]


def _names(records):
    for r in records:
        yield r
        yield from _names(r.children)


def test_profiler_tree_of_gpt2_counts_each_op_once(torch):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    from torch.utils.flop_counter import FlopCounterMode

    cfg = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4)
    cfg._attn_implementation = "eager"  # matmul attention: the same ops on both paths
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    x = torch.randint(0, 50257, (2, 32), generator=torch.Generator().manual_seed(1))
    roots = _profiler_tree(torch, lambda: _train_step(model, x))
    model.zero_grad(set_to_none=True)
    counter = FlopCounterMode(display=False)
    with counter:
        _train_step(model, x)
    total = assign_flops(roots)
    counted = [r for r in _names(roots) if r.flops is not None]
    # composites (aten::linear, aten::matmul) carry no count of their own, the ops
    # inside them do; and no counted op sits inside another counted op
    assert {r.name for r in counted} <= {"aten::mm", "aten::addmm", "aten::bmm"}
    for r in counted:
        assert all(c.flops is None for c in _names(r.children))
    assert total == pytest.approx(counter.get_total_flops(), rel=0.01)


def test_sdpa_on_the_cpu(torch):
    """F.scaled_dot_product_attention's real CPU path (no dispatch mode in the way):
    the flash CPU kernel and its backward, counted as flop_counter counts SDPA."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q = torch.randn(2, 4, 24, 16, requires_grad=True)
    k = torch.randn(2, 4, 40, 16, requires_grad=True)
    v = torch.randn(2, 4, 40, 16, requires_grad=True)

    def run():
        torch.nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()

    roots = _profiler_tree(torch, run)
    total = assign_flops(roots)
    counted = {r.name: r.flops for r in _names(roots) if r.flops is not None}
    fwd = sdpa_flop_count(q.shape, k.shape, v.shape)
    bwd = sdpa_backward_flop_count(q.shape, q.shape, k.shape, v.shape)
    assert counted == {
        "aten::_scaled_dot_product_flash_attention_for_cpu": fwd,
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward": bwd,
    }
    assert total == fwd + bwd
    assert math.isclose(bwd / fwd, 2.5)


def test_conv1d_runs_as_2d_inside_and_takes_the_outer_output():
    """On a GPU, aten::_convolution runs a 1-D convolution as a 2-D one ([N, C, 1, L]):
    the enclosing op's [N, C_out, L_out] output still gives the positions."""
    x, w = [4, 6, 100], [12, 6, 5]
    conv = OpRecord(
        "aten::conv1d",
        [x, w, [12], [], [], [], []],
        op_id=1,
        children=[
            OpRecord(
                "aten::convolution",
                [x, w, [12]] + [[]] * 6,
                op_id=2,
                children=[
                    OpRecord(
                        "aten::_convolution",
                        [x, w, [12]] + [[]] * 10,
                        op_id=3,
                        children=[
                            OpRecord(
                                "aten::cudnn_convolution",
                                [[4, 6, 1, 100], [12, 6, 1, 5]] + [[]] * 7,
                                op_id=4,
                            )
                        ],
                    )
                ],
            )
        ],
    )
    relu = OpRecord("aten::relu", [[4, 12, 48]], op_id=5, input_op_ids=[(1, 0)])
    assert assign_flops([conv, relu]) == 2 * 48 * 5 * 4 * 12 * 6
    inner = conv.children[0].children[0].children[0]
    assert inner.flops == 2 * 48 * 5 * 4 * 12 * 6


def test_an_unconsumed_first_output_leaves_the_shape_unknown():
    conv = OpRecord("aten::convolution", [[2, 3, 32, 32], [8, 3, 3, 3], [8]] + [[]] * 6, op_id=1)
    other = OpRecord("aten::relu", [[2, 8, 16, 16]], op_id=2, input_op_ids=[(1, 1)])
    assign_flops([conv, other])
    assert conv.flops is None and "out_shapes" in conv.flops_note
