"""The shapes and requantisation of the harness's MEAN and MUL (TPUP_MEAN / TPUP_MUL; their options,
refusals and writing are tpu_pipeline.toolchain.ir.kernels' "means and products"): which run of
axes a MEAN reduces, the multipliers TFLite Micro's Prepare derives, which operand a MUL
broadcasts."""

from __future__ import annotations

import numpy as np

from tpu_pipeline.toolchain.ir.graph import Graph, Op, Tensor
from tpu_pipeline.toolchain.ir.kernel_variants.record import HarnessOp
from tpu_pipeline.toolchain.ir.requant import quantize_multiplier

# Their registrations (tpu_pipeline.toolchain.ir.harness_ops): one loop source, their own cost rows.
MEAN_OP = HarnessOp("TPUP_MEAN", "MEAN", "tpup::Register_MEAN", ("tpup_mean_mul.cc",), "tpup_mean", "mean")
MUL_OP = HarnessOp("TPUP_MUL", "MUL", "tpup::Register_MUL", ("tpup_mean_mul.cc",), "tpup_mul", "mul")


def per_tensor_int8(t: Tensor) -> bool:
    return (t.dtype == "int8" and t.quant is not None and len(t.quant.scale) == 1 and len(t.quant.zero_point) == 1
            and float(t.quant.scale[0]) > 0)


def mean_axes(graph: Graph, op: Op) -> tuple[int, int, int] | None:
    """(outer, reduced, inner) element counts of a MEAN over one run of adjacent axes; None else."""
    x = graph.tensors[op.inputs[0]]
    axis = graph.tensors[op.inputs[1]]
    if not axis.is_constant or axis.dtype != "int32" or not x.shape:
        return None
    axes = sorted({int(a) % len(x.shape) for a in np.asarray(axis.values()).reshape(-1)})
    if not axes or axes != list(range(axes[0], axes[-1] + 1)):
        return None
    outer, reduced, inner = (int(np.prod(x.shape[:axes[0]], dtype=np.int64)),
                             int(np.prod(x.shape[axes[0]:axes[-1] + 1], dtype=np.int64)),
                             int(np.prod(x.shape[axes[-1] + 1:], dtype=np.int64)))
    return outer, reduced, inner


def mean_requant(graph: Graph, op: Op) -> tuple[int, int]:
    """The (multiplier, shift) TFLite's QuantizedMeanOrSum applies to a MEAN's shifted sums: the
    input/output scale ratio's, with 1/count folded in (shift clamped as it clamps it)."""
    x, y = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
    m, s = quantize_multiplier(float(np.float32(x.quant.scale[0])) / float(np.float32(y.quant.scale[0])))
    n = mean_axes(graph, op)[1]
    shift = min(n.bit_length() - 1, 32, 31 + s)
    return int((m << shift) // n), s - shift


def mul_requant(graph: Graph, op: Op) -> tuple[int, int]:
    """CalculateOpDataMul's multiplier: double(s1) * double(s2) / double(s_out)."""
    a, b, y = (float(np.float32(graph.tensors[t].quant.scale[0])) for t in (*op.inputs[:2], op.outputs[0]))
    return quantize_multiplier(a * b / y)


def mul_broadcast(graph: Graph, op: Op) -> int | None:
    """0: equal shapes; 1: input 2 broadcast (a scalar, or one value per channel of input 1's last
    axis); 2: input 1 so; None: another broadcast."""
    a, b, y = (graph.tensors[t].shape for t in (*op.inputs[:2], op.outputs[0]))
    if a == b == y:
        return 0
    for mode, big, small in ((1, a, b), (2, b, a)):
        n = int(np.prod(small, dtype=np.int64))
        if big == y and big and len(small) <= len(big) and all(d == 1 for d in small[:-1]) \
                and (n == 1 or (small and small[-1] == big[-1] == n)):
            return mode
    return None
