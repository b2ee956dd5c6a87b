"""ATen op rows: the FLOPs of each call-tree node, from the input sizes PyTorch's
NVTX ranges carry with ``record_shapes=True`` (docs/aten.md, docs/flops.md).

The C core keeps an op's sizes in its range's name, so an op called with other shapes
is another op row and another call-tree node (``ops()["input_shapes"]``). Here each
node of such an op gets its count: the formula of ``_flops`` applied to the node's
shapes, times its calls, placed on the innermost op that has one (``assign_flops``),
so that ``aten::linear`` > ``aten::addmm`` is counted once, at ``aten::addmm``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._flops import OpRecord, assign_flops, parse_sizes

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
    roots: list[OpRecord] = []
    for i, p in enumerate(parents):
        (nodes[p].children if p >= 0 else roots).append(nodes[i])
    try:
        assign_flops(roots)
    except ValueError:  # sizes that cannot be their op's inputs: nothing is counted
        return np.zeros(len(nodes), dtype=np.int64)
    calls = tree["calls"].astype(np.int64)
    return np.array([n.flops or 0 for n in nodes], dtype=np.int64) * calls
