"""A convolution's FLOPs in a recorded window (docs/flops.md): its output shape from
the autograd node that carries its sequence number, and the gradients its backward
computed from the names of cuDNN's kernels.

The windows are built by the real C aggregation from synthetic records, as PyTorch's
emit_nvtx(record_shapes=True) and CUPTI write them; the expected counts are
torch.utils.flop_counter's on the same convolution (PyTorch's CPU wheel)."""

import gpuprof
import pytest
from gpuprof import _gpuprof
from gpuprof.results._results import Results

C = _gpuprof._test_constants()
gpuprof.cuda_status()  # loads libcupti when present: API names come from it
LAUNCH = _gpuprof._test_api_key(C["API_RUNTIME"], 211)["key"]  # cudaLaunchKernel
X, W, OUT = [2, 3, 8, 8], [4, 3, 3, 3], [2, 4, 4, 4]  # stride 2, padding 1
FPROP = "sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x64x32"
DGRAD = "sm90_xmma_dgrad_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x64x32"
WGRAD = "sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tile64x64"
LAYOUT = "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true>"


def train_step():
    pass


def _sizes(*tensors, blanks):
    return "[" + ", ".join([str(t) for t in tensors] + ["[]"] * blanks) + "]"


def _range(text, t0, t1, inner=(), launches=()):
    """Events of one NVTX range from t0 to t1: its push (and seq), the kernel launches
    (correlation ids) and ranges inside it, its pop."""
    name = _gpuprof._test_nvtx_name(text)
    ev = [(t0, C["EV_NVTX_PUSH"], name["id"], 0)]
    if name["seq"] or "seq = " in text:
        ev.append((t0, C["EV_NVTX_TORCH"], name["seq"], name["flags"]))
    for i, corr in enumerate(launches):
        ev += [
            (t0 + 2 + 4 * i, C["EV_API_ENTER"], corr, LAUNCH),
            (t0 + 4 + 4 * i, C["EV_API_EXIT"], corr),
        ]
    return ev + list(inner) + [(t1, C["EV_NVTX_POP"], 0, 0)]


def _window(backward_kernels, *, seq=7, backward_seq=None, out=OUT, backward_input=X):
    """A forward conv2d (op seq ``seq``) on the main thread, and on autograd's thread
    ConvolutionBackward0 (seq ``backward_seq``, default ``seq``) whose
    convolution_backward takes a gradient of shape ``out`` and launches
    ``backward_kernels`` (its input: ``backward_input``)."""
    backward_seq = seq if backward_seq is None else backward_seq
    fwd = _range(
        f"aten::conv2d, seq = {seq}, op_id = 10, sizes = {_sizes(X, W, blanks=5)}",
        100,
        200,
        inner=_range(
            f"aten::convolution, seq = {seq}, op_id = 11, sizes = {_sizes(X, W, blanks=7)}",
            110,
            190,
            inner=_range(
                f"aten::cudnn_convolution, op_id = 12, sizes = {_sizes(X, W, blanks=7)}",
                120,
                180,
                launches=[1, 2],
            ),
        ),
    )
    bwd_corr = list(range(3, 3 + len(backward_kernels)))
    bwd = _range(
        f"ConvolutionBackward0, seq = {backward_seq}, op_id = 20",
        300,
        500,
        inner=_range(
            "aten::convolution_backward, op_id = 21, sizes = "
            + _sizes(out, backward_input, W, blanks=8),
            310,
            490,
            launches=bwd_corr,
        ),
    )
    main = [(0, C["EV_STEP_BEGIN"], 0), (10, C["EV_CALL"], 2), *fwd]
    main += [(900, C["EV_RETURN"], 0), (1000, C["EV_STEP_END"], 0)]
    names = [LAYOUT, FPROP, *backward_kernels]
    gpu = [
        dict(
            kind=C["GPU_KERNEL"],
            correlation=c,
            start_ns=2000 + 100 * c,
            end_ns=2050 + 100 * c,
            name_id=c - 1,
        )
        for c in range(1, 3 + len(backward_kernels))
    ]
    ops = [(C["OP_PYTHON"], train_step.__code__, 0)]
    raw = _gpuprof._test_aggregate(ops, [(1, 101, main), (2, 102, bwd)], gpu, 0, 3000, names, 1)
    return Results([raw], cuda={"active": True, "mode": "callbacks", "error": None})


def _flops_by_op(res):
    ops = res.ops()
    out: dict[str, int] = {}
    for name, flops in zip(ops["name"], ops["flops"].tolist()):
        out[name] = out.get(name, 0) + flops
    return out


def _flop_counter(input_grad: bool):
    """torch.utils.flop_counter's counts for the convolution of the windows above:
    forward, and backward with or without the input's gradient."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (make frameworks)")
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.randn(X, requires_grad=input_grad)
    w = torch.randn(W, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        y = torch.nn.functional.conv2d(x, w, stride=2, padding=1)
        assert list(y.shape) == OUT
        y.sum().backward()
    counts = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    return counts["aten.convolution"], counts["aten.convolution_backward"]


@pytest.mark.parametrize("input_grad", [False, True], ids=["first_layer", "inner_layer"])
def test_a_convolution_and_its_backward_count_as_flop_counter_does(input_grad):
    forward, backward = _flop_counter(input_grad)
    kernels = [LAYOUT, DGRAD, WGRAD] if input_grad else [LAYOUT, WGRAD]
    got = _flops_by_op(_window(kernels))
    # the forward's count sits on the innermost convolution op, once
    assert got["aten::cudnn_convolution"] == forward
    assert got["aten::conv2d"] == got["aten::convolution"] == 0
    assert got["aten::convolution_backward"] == backward


def test_without_its_node_a_convolution_has_no_output_shape_and_no_count():
    # the node carries another op's number (no_grad forward, or another thread's node)
    got = _flops_by_op(_window([LAYOUT, DGRAD, WGRAD], backward_seq=99))
    assert got["aten::cudnn_convolution"] == 0
    # the backward needs no output shape: its own count stands
    assert got["aten::convolution_backward"] == 2 * _flop_counter(True)[0]


def test_the_output_shape_is_the_gradients_of_the_same_convolution_only():
    # a stride-1 convolution of X: the gradient, 8x8, says so
    res = _window([LAYOUT, DGRAD, WGRAD], out=[2, 4, 8, 8])
    assert _flops_by_op(res)["aten::cudnn_convolution"] == 2 * (8 * 8) * 9 * 2 * 4 * 3
    # the same number on a backward of another input is not this convolution's
    res = _window([LAYOUT, DGRAD, WGRAD], backward_input=[2, 3, 16, 16], out=[2, 4, 8, 8])
    assert _flops_by_op(res)["aten::cudnn_convolution"] == 0


def test_backward_kernels_that_name_no_gradient_give_no_backward_count():
    got = _flops_by_op(_window([LAYOUT, "implicit_convolve_sgemm"]))
    assert got["aten::convolution_backward"] == 0
    assert got["aten::cudnn_convolution"] == _flop_counter(True)[0]
