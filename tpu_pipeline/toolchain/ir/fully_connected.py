"""The harness's int8 FULLY_CONNECTED: custom op TPUP_FULLY_CONNECTED (harness/tpup_fully_connected.cc).

It computes what TFLite Micro's FULLY_CONNECTED computes (both kernel sets: the reference
kernel's integers, which CMSIS-NN's reproduces), bit-identical, with fewer instructions: four
output rows per pass share each word of input, widened once to int16 pairs by two SXTB16s; their
weights are laid out offline as int16 pairs in the order the pass reads them (one LDM loads one
input pair's weights of all four rows) and each pair of products is one SMLAD; the input offset
is folded into the bias offline. Its requantisation is SMMULR plus one nudged shift where
`requant_proven` shows that exact for every accumulator the op can produce (option bit
FAST_REQUANT), else tflite::MultiplyByQuantizedMultiplier's integers.

What it costs: flash, its constant input 3 (`packed_constant`): per output row the folded bias,
multiplier and shift (12 bytes), then the int16 weights of the first M - M % 4 rows over the first
N - N % 4 inputs (2 bytes a weight: twice the int8 weights, which stay as input 1 for the rows and
inputs left over and for the builtin view), and its 16-byte tensor entry in TFLite Micro's tail.
Arena: none (no scratch, no persistent data: the builtin's OpData and builtin data go). The
requantisation is computed here, as TFLite Micro's FullyConnected Prepare computes it (per
tensor: the float32 product of the input and weight scales, not the convolution's double one).

Options on disk (little-endian int32): [format 1, builtin version, flags (FAST_REQUANT; ONE_SCALE: every
row has the same multiplier and shift, as per-tensor weights give),
input_offset, output_offset, activation_min, activation_max, activation, keep_num_dims].
"""

from __future__ import annotations

import struct

import numpy as np

from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.ir.graph import Graph, Op, Tensor
from tpu_pipeline.toolchain.ir.kernel_variants.record import HarnessOp
from tpu_pipeline.toolchain.ir.options import FullyConnectedOptions
from tpu_pipeline.toolchain.ir.requant import ACTIVATION_CODE, activation_range, quantize_multiplier, requant_within, weights_bias

OPCODE = "FULLY_CONNECTED"
CUSTOM_CODE = "TPUP_FULLY_CONNECTED"
HARNESS_OP = HarnessOp(CUSTOM_CODE, OPCODE, "tpup::Register_FULLY_CONNECTED", ("tpup_fully_connected.cc",),
                       "tpup_fully_connected", "fully_connected")  # (tpu_pipeline.toolchain.ir.harness_ops)
BUILTIN = 9  # BuiltinOperator FULLY_CONNECTED
FORMAT = 1
FAST_REQUANT, ONE_SCALE = 1, 2  # (harness/tpup_fully_connected.cc kFcFastRequant, kFcOneScale)
ROWS, INPUTS = 4, 4  # a pass's output rows; the inputs one word widens to two int16 pairs
_WORDS = 9


def _per_tensor(t) -> bool:
    return t.dtype == "int8" and t.quant is not None and len(t.quant.scale) == 1 and float(t.quant.scale[0]) > 0


def refusal(graph: Graph, op: Op) -> str | None:
    """Why TPUP_FULLY_CONNECTED cannot run `op` (None when it can)."""
    o = op.options
    if not isinstance(o, FullyConnectedOptions) or o.fused_activation not in ACTIVATION_CODE \
            or o.weights_format != "DEFAULT" or o.asymmetric_quantize_inputs:
        return "not a plain FULLY_CONNECTED (its weights format, activation or hybrid quantization)"
    if len(op.outputs) != 1 or len(op.inputs) not in (2, 3) or min(op.inputs[:2]) < 0:
        return "not one input, weights (and a bias) and one output"
    x, w_t, y = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]], graph.tensors[op.outputs[0]]
    if not (_per_tensor(x) and _per_tensor(y)) or w_t.dtype != "int8" or not w_t.is_constant \
            or len(w_t.shape) != 2 or w_t.quant is None or any(int(z) for z in w_t.quant.zero_point) \
            or len(w_t.quant.scale) not in (1, w_t.shape[0]):
        return "not int8 with per-tensor activations and constant symmetric int8 weights"
    bias_i = op.inputs[2] if len(op.inputs) > 2 else -1
    if bias_i >= 0 and not (graph.tensors[bias_i].dtype == "int32" and graph.tensors[bias_i].is_constant
                            and graph.tensors[bias_i].num_elements == w_t.shape[0]):
        return "its bias is not a constant int32 per output"
    m, n = w_t.shape
    if n < 1 or x.num_elements % n or y.num_elements != x.num_elements // n * m:
        return "its input and output do not flatten to [batches, inputs] and [batches, outputs]"
    w, b = weights_bias(graph, op)
    folded = b - int(x.quant.zero_point[0]) * w.sum(axis=1)
    if np.abs(folded).max(initial=0) >= 1 << 31:
        return "its bias with the input offset folded in does not fit int32"
    return None


def fc_requant(graph: Graph, op: Op) -> tuple[np.ndarray, np.ndarray]:
    """Per output row (multiplier, shift) as TFLite Micro's CalculateOpDataFullyConnected computes
    them: per channel input_scale x filter_scale / output_scale in double; per tensor the float32
    product of the two scales, then divided in double (GetQuantizedConvolutionMultipler)."""
    x, w, y = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]], graph.tensors[op.outputs[0]]
    xs, ys = np.float32(x.quant.scale[0]), float(np.float32(y.quant.scale[0]))
    if len(w.quant.scale) > 1:
        pairs = [quantize_multiplier(float(xs) * float(np.float32(s)) / ys) for s in w.quant.scale]
    else:
        pairs = [quantize_multiplier(float(np.float32(xs * np.float32(w.quant.scale[0]))) / ys)] * w.shape[0]
    return np.array([p[0] for p in pairs], dtype=np.int64), np.array([p[1] for p in pairs], dtype=np.int64)


def packed_constant(graph: Graph, op: Op) -> np.ndarray:
    """Input 3, int32 [3 M + (M - M % 4) (N - N % 4) / 2]: per output row the bias plus input offset x
    its weights' sum, the multiplier, the shift; then the weights' int16 pairs (`packed_pairs`: the
    pairs SXTB16 makes of an input word, low half first)."""
    x = graph.tensors[op.inputs[0]]
    w, b = weights_bias(graph, op)
    m, n = w.shape
    folded = b - int(x.quant.zero_point[0]) * w.sum(axis=1)
    mult, shift = fc_requant(graph, op)
    out = np.concatenate([folded & 0xFFFFFFFF, mult, shift & 0xFFFFFFFF, packed_pairs(w)])
    return out.astype("<u4").view("<i4")


def packed_pairs(w: np.ndarray) -> np.ndarray:
    """The int16 pairs of weights `w` [M, N] as the four-row pass reads them (uint32 words): per group
    of four rows, per four inputs (x0..x3), the words (w[r][x0], w[r][x2]) of rows r = 0..3, then
    (w[r][x1], w[r][x3]); the rows and inputs left over from the fours are not in it."""
    m, n = w.shape
    m4, n4 = m - m % ROWS, n - n % INPUTS
    blocks = w[:m4, :n4].astype(np.int64).reshape(m4 // ROWS, ROWS, n4 // INPUTS, INPUTS)  # [g, row, k, lane]
    words = (blocks[..., [0, 1]] & 0xFFFF) | (blocks[..., [2, 3]] & 0xFFFF) << 16  # [g, r, k, (x0 x2 | x1 x3)]
    return words.transpose(0, 2, 3, 1).reshape(-1)


def requant_proven(graph: Graph, op: Op) -> bool:
    """Whether the cheap requantisation is exact for every input (ir.requant.requant_within)."""
    w, b = weights_bias(graph, op)
    return requant_within(fc_requant(graph, op)[1], w, b, int(graph.tensors[op.inputs[0]].quant.zero_point[0]))


def encode(graph: Graph, op: Op) -> bytes:
    x, y = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
    lo, hi = activation_range(graph, op)
    mult, shift = fc_requant(graph, op)
    one = len(set(mult.tolist())) == 1 and len(set(shift.tolist())) == 1
    flags = (FAST_REQUANT if requant_proven(graph, op) else 0) | (ONE_SCALE if one else 0)
    return struct.pack(f"<{_WORDS}i", FORMAT, op.version, flags, -int(x.quant.zero_point[0]),
                       int(y.quant.zero_point[0]), lo, hi, ACTIVATION_CODE[op.options.fused_activation],
                       int(op.options.keep_num_dims))


def decode(raw: bytes, where: str) -> tuple[FullyConnectedOptions, int]:
    """(options, builtin version) of a TPUP_FULLY_CONNECTED read from a model; ModelError if malformed."""
    if len(raw) != 4 * _WORDS:
        raise ModelError(f"{where}: {CUSTOM_CODE} has {len(raw)} bytes of options, expected {4 * _WORDS}")
    w = struct.unpack(f"<{_WORDS}i", raw)
    activation = {v: k for k, v in ACTIVATION_CODE.items()}.get(w[7])
    if w[0] != FORMAT or w[1] < 1 or w[2] & ~(FAST_REQUANT | ONE_SCALE) or w[5] > w[6] or activation is None or w[8] not in (0, 1):
        raise ModelError(f"{where}: {CUSTOM_CODE} has invalid options {list(w)}")
    return FullyConnectedOptions(fused_activation=activation, keep_num_dims=bool(w[8])), w[1]


def with_constant(graph: Graph, op: Op, tensors: list[Tensor]) -> tuple[int, ...]:
    """A FULLY_CONNECTED's inputs on the harness: input, weights, bias (-1 for none) and its packed
    constant, appended to `tensors` (an op already on the harness keeps its own)."""
    if op.kernel.split("+")[0] == "tpup":
        return op.inputs
    values = packed_constant(graph, op)
    data = np.frombuffer(values.astype("<i4").tobytes(), dtype=np.uint8).copy()
    data.setflags(write=False)
    t = Tensor(len(tensors), f"{graph.tensors[op.outputs[0]].name}/packed", "int32", values.shape, data=data)
    tensors.append(t)
    return op.inputs[0], op.inputs[1], op.inputs[2] if len(op.inputs) > 2 else -1, t.index


def constant_ok(graph: Graph, op: Op) -> bool:
    """Whether a harness FULLY_CONNECTED's input 3 holds what `packed_constant` computes now."""
    if len(op.inputs) != 4 or op.inputs[3] < 0:
        return False
    c = graph.tensors[op.inputs[3]]
    return c.is_constant and c.dtype == "int32" and np.array_equal(c.values(), packed_constant(graph, op))
