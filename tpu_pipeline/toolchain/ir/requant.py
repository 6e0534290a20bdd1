"""Requantization exactly as TFLite Micro's Prepare computes it: the per-channel multipliers and
shifts of an int8 convolution (computed here into flash for the harness's kernels) and the
activation range of an int8 output; and where the harness's 1x1 kernel may requantise the cheap
way (`pointwise_requant_proven`, `requant_within`)."""

from __future__ import annotations

import math

import numpy as np

from tpu_pipeline.toolchain.ir.graph import Graph, Op

# A fused activation's code in the harness's options on disk (every TPUP_* op and the patch stage's
# layers): the firmware maps it back (harness/tpup_conv.h and its kin).
ACTIVATION_CODE = {"NONE": 0, "RELU": 1, "RELU_N1_TO_1": 2, "RELU6": 3}


def _round_half_away(x: float) -> int:
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def quantize_multiplier(m: float) -> tuple[int, int]:
    """tflite::QuantizeMultiplier (double precision, round half away from zero)."""
    if m == 0.0:
        return 0, 0
    q, shift = math.frexp(m)
    q_fixed = _round_half_away(q * (1 << 31))
    if q_fixed == 1 << 31:
        q_fixed //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return q_fixed, shift


def requant(graph: Graph, op: Op) -> np.ndarray:
    """int32 [2, C]: the per-channel output multipliers and shifts TFLite Micro's
    PopulateConvolutionQuantizationParams computes for `op` (C = output channels)."""
    x, w, y = (graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]], graph.tensors[op.outputs[0]])
    channels = w.shape[0] if op.opcode == "CONV_2D" else w.shape[3]
    scales = w.quant.scale if len(w.quant.scale) > 1 else w.quant.scale * channels
    # float32 scales promoted to double, multiplied in this order, as the C++ does
    x_scale, y_scale = float(np.float32(x.quant.scale[0])), float(np.float32(y.quant.scale[0]))
    out = np.zeros((2, channels), dtype=np.int32)
    for c, s in enumerate(scales):
        out[0, c], out[1, c] = quantize_multiplier(x_scale * float(np.float32(s)) / y_scale)
    return out


def activation_range(graph: Graph, op: Op) -> tuple[int, int]:
    """TFLite's CalculateActivationRangeQuantized for an int8 output (float32 arithmetic)."""
    y = graph.tensors[op.outputs[0]]
    scale, zp = np.float32(y.quant.scale[0]), int(y.quant.zero_point[0])

    def q(f: float) -> int:
        return zp + _round_half_away(float(np.float32(f) / scale))

    act = op.options.fused_activation
    if act == "RELU":
        return max(-128, q(0.0)), 127
    if act == "RELU6":
        return max(-128, q(0.0)), min(127, q(6.0))
    if act == "RELU_N1_TO_1":
        return max(-128, q(-1.0)), min(127, q(1.0))
    return -128, 127


def weights_bias(graph: Graph, op: Op) -> tuple[np.ndarray, np.ndarray]:
    """A convolution's or fully connected op's weights (their own shape) and bias (zeros where it
    has none), as int64."""
    w = np.asarray(graph.tensors[op.inputs[1]].values(), dtype=np.int64)
    bias_i = op.inputs[2] if len(op.inputs) > 2 else -1
    b = (np.asarray(graph.tensors[bias_i].values(), dtype=np.int64).reshape(-1) if bias_i >= 0
         else np.zeros(w.shape[0], dtype=np.int64))
    return w, b


def pointwise_requant_proven(graph: Graph, op: Op) -> bool:
    """Whether the pointwise kernel's cheap requantisation is exact for every input (`requant_within`)."""
    w, bias = weights_bias(graph, op)
    w = w.reshape(w.shape[0], -1)
    return requant_within(requant(graph, op)[1], w, bias, int(graph.tensors[op.inputs[0]].quant.zero_point[0]))


def requant_within(shifts: np.ndarray, w: np.ndarray, bias: np.ndarray, zp: int) -> bool:
    """Whether the harness's cheap requantisation (SMMULR, then one nudged shift; the pointwise and
    fully connected kernels) is exact for every int8 input: every channel's shift in [-22, -1]
    (left shift 0; the output offset folds into the rounding nudge without overflow) and every
    accumulator bias + sum_k w[c, k] (x[k] - zp) within [-2^30, 2^30 - 1] (then
    SaturatingRoundingDoublingHighMul(acc, m) == SMMULR(2 acc, m)). `w` is [channels, taps]."""
    if shifts.min() < -22 or shifts.max() > -1:
        return False
    lo, hi = -128 - zp, 127 - zp  # the widened input's range
    top = bias + np.maximum(w * lo, w * hi).sum(axis=1)
    bottom = bias + np.minimum(w * lo, w * hi).sum(axis=1)
    return bool(bottom.min() >= -(1 << 30) and top.max() <= (1 << 30) - 1)
