"""ATen op rows: the FLOPs of each call-tree node, from the input sizes PyTorch's
NVTX ranges carry with ``record_shapes=True`` (docs/aten.md, docs/flops.md).

The C core keeps an op's sizes in its range's name, so an op called with other shapes
is another op row and another call-tree node (``ops()["input_shapes"]``). Here each
node of such an op gets its count: the formula of ``_flops`` applied to the node's
shapes, times its calls, placed on the innermost op that has one (``assign_flops``),
so that ``aten::linear`` > ``aten::addmm`` is counted once, at ``aten::addmm``.

A convolution's count needs two facts its message leaves out; ``_conv_facts`` reads
them from the window's calls and kernels:

- a regular convolution's output shape (stride, padding and dilation are not in the
  message): its autograd node carries the forward op's sequence number, and the
  ``aten::convolution_backward`` inside that node takes the output's gradient, of the
  output's shape, as its first input. So a convolution that made a node has its
  output shape once the node ran; one under ``no_grad`` has none, and no count.
- which gradients a ``convolution_backward`` computed (its ``output_mask``): the
  first layer of a network computes no gradient for its input. cuDNN names its
  kernels by the gradient they compute (``dgrad`` for the input's, ``wgrad`` for the
  weight's): a call whose kernels name neither gets no count.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._flops import OpRecord, assign_flops, parse_sizes

_CONV_FORWARD = "aten::convolution"
_CONV_BACKWARD = "aten::convolution_backward"
_TRANSPOSED_CALLERS = ("aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d")

__all__ = ["node_flops"]


def node_flops(raw: dict[str, Any]) -> np.ndarray | None:
    """Per call-tree node of the window ``raw``: the FLOPs of its calls (0 where none
    were counted); None for a window whose ops carry no input sizes."""
    shapes_of = raw.get("op_shapes")
    if not shapes_of or not any(shapes_of):
        return None
    tree = raw["nodes"]
    names = raw["op_names"]
    op_rows = tree["op_row"].tolist()
    parents = tree["parent"].tolist()
    parsed: dict[int, list] = {}
    nodes = []
    for op in op_rows:
        shapes: list = []
        text = shapes_of[op]
        if text:
            if op not in parsed:
                try:
                    parsed[op] = parse_sizes(text)
                except ValueError:  # a message PyTorch wrote otherwise: no count
                    parsed[op] = []
            shapes = parsed[op]
        nodes.append(OpRecord(str(names[op]), shapes))
    spans = raw.get("spans")
    if spans is not None and len(spans):
        _conv_facts(raw, spans, nodes, parsed)
    roots: list[OpRecord] = []
    for i, p in enumerate(parents):
        (nodes[p].children if p >= 0 else roots).append(nodes[i])
    try:
        assign_flops(roots)
    except ValueError:  # sizes that cannot be their op's inputs: nothing is counted
        return np.zeros(len(nodes), dtype=np.int64)
    calls = tree["calls"].astype(np.int64)
    return np.array([n.flops or 0 for n in nodes], dtype=np.int64) * calls


def _conv_facts(raw: dict[str, Any], spans: np.ndarray, nodes: list[OpRecord], parsed) -> None:
    """Set ``out_shapes`` on forward convolution nodes and ``output_mask`` and
    ``transposed`` on ``convolution_backward`` nodes, where the window's calls say them
    (the module docstring); leave them unset where the calls disagree."""
    names = [str(n) for n in raw["op_names"]]
    fwd_rows = {i for i, n in enumerate(names) if n == _CONV_FORWARD}
    bwd_rows = {i for i, n in enumerate(names) if n == _CONV_BACKWARD}
    if not bwd_rows:
        return
    op_row = spans["op_row"].tolist()
    parent = spans["parent"].tolist()
    seq = spans["seq"].tolist()
    node = spans["node"].tolist()

    def shapes(row: int) -> list:
        return parsed.get(row, [])

    def node_seq(i: int) -> int:
        """The sequence number of the autograd node span above span ``i``, or -1."""
        p = parent[i]
        while p >= 0 and seq[p] < 0:
            p = parent[p]
        return seq[p] if p >= 0 else -1

    def caller(i: int) -> str:
        p = parent[i]
        return names[op_row[p]] if p >= 0 else ""

    def spans_of(rows: set[int]) -> list[int]:
        return np.flatnonzero(np.isin(spans["op_row"], sorted(rows))).tolist()

    forward: dict[int, list[int]] = {}  # seq -> forward convolution spans
    for i in spans_of(fwd_rows):
        if seq[i] >= 0:
            forward.setdefault(seq[i], []).append(i)
    out_of: dict[int, set] = {}  # forward node -> output shapes seen
    flag_of: dict[int, set] = {}  # backward node -> transposed flags seen
    for i in spans_of(bwd_rows):
        b = shapes(op_row[i])  # [grad_output, input, weight, ...]
        for f in forward.get(node_seq(i), ()):
            x = shapes(op_row[f])
            if len(b) >= 3 and len(x) >= 2 and b[1:3] == x[:2]:
                out_of.setdefault(node[f], set()).add(tuple(b[0]))
                flag_of.setdefault(node[i], set()).add(caller(f) in _TRANSPOSED_CALLERS)
    for n, outs in out_of.items():
        if len(outs) == 1 and n >= 0:
            nodes[n].out_shapes = [list(next(iter(outs)))]
    for n, flags in flag_of.items():
        if len(flags) == 1 and n >= 0:
            nodes[n].transposed = next(iter(flags))
    # the gradients each backward node computed, from its kernels' names
    gpu, kernels, kernel_names = raw.get("gpu"), raw.get("kernels"), raw.get("kernel_names")
    if gpu is None or kernels is None or kernel_names is None:
        return
    tree_rows = raw["nodes"]["op_row"]
    name_ids = kernels["name"].tolist()
    words: dict[int, set[str]] = {}
    for n, k in zip(gpu["node"].tolist(), gpu["kernel_row"].tolist()):
        if n < 0 or k >= len(name_ids) or int(tree_rows[n]) not in bwd_rows:
            continue
        text = str(kernel_names[name_ids[k]]).lower()
        found = words.setdefault(n, set())
        found.update(w for w in ("dgrad", "wgrad") if w in text)
    for n, found in words.items():
        if found:
            nodes[n].output_mask = ("dgrad" in found, "wgrad" in found, False)
