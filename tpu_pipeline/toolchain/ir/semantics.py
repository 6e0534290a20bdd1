"""What an op costs: multiply-accumulates and parameter bytes. Unknown ops cost None, never fail."""

from __future__ import annotations

from tpu_pipeline.toolchain.ir import stage
from tpu_pipeline.toolchain.ir.graph import Graph
from tpu_pipeline.toolchain.ir.options import Pool2DOptions

# Ops whose work is one multiply-accumulate (or one arithmetic step) per output element.
_ELEMENTWISE = {
    "ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "RELU", "RELU6",
    "RELU_N1_TO_1", "LEAKY_RELU", "PRELU", "LOGISTIC", "TANH", "HARD_SWISH", "QUANTIZE",
    "DEQUANTIZE", "SOFTMAX", "LOG_SOFTMAX", "ABS", "NEG", "EXP", "SQRT", "RSQRT", "ELU",
    "MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "GELU",
}
# Ops that only move data: no arithmetic.
_DATA_MOVEMENT = {
    "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "CONCATENATION", "PAD", "PADV2", "TRANSPOSE",
    "STRIDED_SLICE", "SLICE", "SPLIT", "SPLIT_V", "GATHER", "PACK", "UNPACK", "SHAPE",
    "RESIZE_NEAREST_NEIGHBOR", "SPACE_TO_DEPTH", "DEPTH_TO_SPACE", "TILE", "BROADCAST_TO",
}


def _numel(graph: Graph, t: int) -> int:
    return graph.tensors[t].num_elements if t >= 0 else 0


def macs(graph: Graph, i: int) -> int | None:
    """Multiply-accumulates of op `i`; None for custom and unknown ops."""
    op = graph.ops[i]
    name = op.opcode
    if name == stage.OPCODE:
        return stage.stage_macs(op)
    out = op.outputs[0] if op.outputs else -1
    out_n = _numel(graph, out)
    ins = op.inputs
    if name == "CONV_2D" and len(ins) >= 2:
        w = graph.tensors[ins[1]].shape  # [Cout, kh, kw, Cin]
        return out_n * w[1] * w[2] * w[3]
    if name == "DEPTHWISE_CONV_2D" and len(ins) >= 2:
        w = graph.tensors[ins[1]].shape  # [1, kh, kw, Cout]
        return out_n * w[1] * w[2]
    if name == "CONV_3D" and len(ins) >= 2:
        w = graph.tensors[ins[1]].shape  # [kd, kh, kw, Cin, Cout]
        return out_n * w[0] * w[1] * w[2] * w[3]
    if name == "TRANSPOSE_CONV" and len(ins) >= 3:
        w = graph.tensors[ins[1]].shape  # [Cout, kh, kw, Cin]
        return _numel(graph, ins[2]) * w[0] * w[1] * w[2]
    if name == "FULLY_CONNECTED" and len(ins) >= 2:
        w = graph.tensors[ins[1]].shape  # [units, in]
        return out_n * w[-1]
    if name == "BATCH_MATMUL" and len(ins) >= 2:
        a = graph.tensors[ins[0]].shape
        return out_n * (a[-1] if a else 1)
    if name in ("AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D"):
        opts = op.options
        k = opts.filter_height * opts.filter_width if isinstance(opts, Pool2DOptions) else 0
        return out_n * max(k, 1)
    if name in ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN") and ins:
        return _numel(graph, ins[0])
    if name in _ELEMENTWISE:
        return out_n
    if name in _DATA_MOVEMENT:
        return 0
    if op.is_custom:
        return None
    return out_n


def param_bytes(graph: Graph, i: int) -> int:
    """Bytes of constant tensors op `i` reads (weights, biases, lookup tables)."""
    seen = set()
    total = 0
    for t in graph.ops[i].inputs:
        if t >= 0 and t not in seen and graph.tensors[t].is_constant:
            seen.add(t)
            total += len(graph.tensors[t].data)
    return total


def total_param_bytes(graph: Graph) -> int:
    """Bytes of all constant tensors the ops read, each counted once."""
    used = {t for op in graph.ops for t in op.inputs if t >= 0 and graph.tensors[t].is_constant}
    return sum(len(graph.tensors[t].data) for t in used)
