"""PAD folding: an explicit PAD in front of a convolution becomes the convolution's own padding.

Models exported from PyTorch pad explicitly (PAD, then a VALID convolution); the padded copy and
its input are live together, and in those models the activation peak often sits right there. A
PAD whose value is what the convolution's kernel pads with (the input's zero point in int8, 0 in
float: a padded tap then contributes (zp - zp) * w = 0, which is what the kernels compute for a
tap outside the image) folds into the convolution, which then reads the unpadded input:

- where the padding equals what SAME or VALID gives on the unpadded input, the result is a builtin
  convolution with that padding: an identity in every runtime;
- otherwise (PyTorch's symmetric padding before a stride-2 convolution differs from TFLite's SAME,
  which puts the odd row after) only a harness kernel can hold it (`ir.kernels`, padding
  "EXPLICIT"): folded only when `harness` is allowed and the convolution is one it runs.

Pools are not folded: a max pool ignores padded taps where an explicit PAD feeds it real values,
and an average pool's divisor counts only valid taps.
"""

from __future__ import annotations

import dataclasses

from tpu_pipeline.toolchain.ir import Graph, kernels
from tpu_pipeline.toolchain.ir.geometry import PADS, leading_pads, pad_values
from tpu_pipeline.toolchain.rewrite.edit import GraphEditor

FOLDABLE = ("CONV_2D", "DEPTHWISE_CONV_2D")


def _pad_value_is_zero_point(graph: Graph, op) -> bool:
    y = graph.tensors[op.outputs[0]]
    if op.opcode == "PAD":
        return True  # PAD fills with the output's zero point (0 in float)
    value = graph.tensors[op.inputs[2]] if len(op.inputs) > 2 and op.inputs[2] >= 0 else None
    if value is None or not value.is_constant or value.num_elements != 1:
        return False
    v = value.values().reshape(-1)[0]
    zero = y.quant.zero_point[0] if y.quant is not None and y.quant.zero_point else 0
    return float(v) == float(zero)


def foldable(graph: Graph, pad_pos: int) -> int | None:
    """The convolution the PAD at `pad_pos` can fold into, or None."""
    pad = graph.ops[pad_pos]
    if pad.opcode not in PADS or not pad.outputs or len(pad.inputs) < 2:
        return None
    y = pad.outputs[0]
    readers = graph.consumers.get(y, ())
    if len(readers) != 1 or y in graph.outputs:
        return None
    conv = graph.ops[readers[0]]
    if conv.opcode not in FOLDABLE or conv.inputs[0] != y or conv.inputs.count(y) != 1:
        return None
    p = pad_values(graph, pad)
    if p.shape != (4, 2) or p[0].any() or p[3].any() or (p < 0).any() or not _pad_value_is_zero_point(graph, pad):
        return None
    x = graph.tensors[pad.inputs[0]]
    if x.quant != graph.tensors[y].quant or x.dtype != graph.tensors[y].dtype:
        return None
    return readers[0]


def fold_pads(graph: Graph, harness: bool = False) -> tuple[Graph, int]:
    """`graph` with every foldable PAD folded into its convolution; (graph, PADs folded)."""
    editor, folded, explicit_outputs = GraphEditor(graph), 0, []
    for pos, pad in enumerate(graph.ops):
        c = foldable(graph, pos)
        if c is None:
            continue
        conv = graph.ops[c]
        top, left = leading_pads(graph, conv)
        p = pad_values(graph, pad)
        explicit = dataclasses.replace(conv.options, padding="EXPLICIT", pad_top=int(p[1, 0]) + top,
                                       pad_left=int(p[2, 0]) + left)
        new = dataclasses.replace(conv, inputs=(pad.inputs[0], *conv.inputs[1:]), options=explicit, source=None)
        probe = Graph(graph.tensors, (new,), graph.inputs, graph.outputs)
        named = kernels.named_padding(probe, new)
        if named is not None:
            new = dataclasses.replace(new, options=dataclasses.replace(explicit, padding=named, pad_top=0, pad_left=0))
        elif not (harness and (kernels.is_harness(conv) or kernels.can_run_harness(probe, 0))):
            continue
        elif not kernels.is_harness(conv):
            explicit_outputs.append(conv.outputs[0])  # moves onto a harness kernel below
        editor.remove(pos)
        editor.replace(c, [new])
        folded += 1
    if not folded:
        return graph, 0
    out = editor.finish()
    moved = {editor.index_map[t] for t in explicit_outputs}
    # a convolution that now needs a harness kernel gets it, with its requantization input
    return kernels.with_kernel(out, [i for i, op in enumerate(out.ops) if op.outputs[0] in moved],
                               kernels.kernel_name()), folded
