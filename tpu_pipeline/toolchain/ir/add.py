"""The harness's int8 ADD (TPUP_ADD, harness/tpup_add.cc): which ADDs it takes, the requantization
TFLite Micro's Prepare derives for them, and its options on disk.

TFLite Micro's ADD requantizes both inputs and the sum per element (reference AddFunc; CMSIS-NN's
arm_elementwise_add_s8 computes the same integers): about 80 instructions an element in QEMU.
TPUP_ADD tabulates each input's scaled term once a call from `TABLE_MIN` elements (the patch
stage's ADD step does the same, harness/tpup_add.h) and takes two loads, an add and the sum's
requantization an element. It runs two per-tensor-quantized int8 inputs of one shape (no
broadcast), its requantization computed here as CalculateOpDataAdd computes it and carried in its
options: no persistent data, no scratch. It reads each element before writing it, so the plan may
lay its output over a dying input as it does for the builtin (tpu_pipeline.toolchain.ir.kernels
`in_place_source`; its kernel is then `HARNESS_IN_PLACE`).

Options (little-endian int32): [format 1, builtin version, left shift, input 1 offset, input 1
multiplier, input 1 shift, input 2 offset, input 2 multiplier, input 2 shift, output offset,
output multiplier, output shift, activation min, max, activation].
"""

from __future__ import annotations

import struct

import numpy as np

from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.ir.graph import Graph, Op
from tpu_pipeline.toolchain.ir.kernel_variants.record import HarnessOp
from tpu_pipeline.toolchain.ir.mean_mul import per_tensor_int8
from tpu_pipeline.toolchain.ir.options import AddOptions
from tpu_pipeline.toolchain.ir.requant import ACTIVATION_CODE, activation_range, quantize_multiplier

OPCODE = "ADD"
HARNESS_OP = HarnessOp("TPUP_ADD", OPCODE, "tpup::Register_ADD", ("tpup_add.cc",), "tpup_add", "add")
TABLE_MIN = 128  # elements from which the kernel tabulates (harness/tpup_add.cc kTableMin)
STAGE_TABLE_MIN = 256  # elements of a call from which a patch stage's ADD step does (harness/tpup_add.h kAddTableMin)
LEFT_SHIFT = 20  # CalculateOpDataAdd's for int8
FORMAT = 1
WORDS = 15


def add_params(graph: Graph, op: Op) -> list[int]:
    """TFLite Micro's CalculateOpDataAdd for int8: [left shift, input 1 offset, multiplier, shift,
    input 2 offset, multiplier, shift, output offset, multiplier, shift] (double arithmetic on the
    float32 scales, as the C++ does)."""
    a, b, y = (graph.tensors[t] for t in (*op.inputs[:2], op.outputs[0]))
    sa, sb, sy = (float(np.float32(t.quant.scale[0])) for t in (a, b, y))
    twice = 2 * max(sa, sb)
    m1, s1 = quantize_multiplier(sa / twice)
    m2, s2 = quantize_multiplier(sb / twice)
    mo, so = quantize_multiplier(twice / ((1 << LEFT_SHIFT) * sy))
    return [LEFT_SHIFT, -int(a.quant.zero_point[0]), m1, s1, -int(b.quant.zero_point[0]), m2, s2,
            int(y.quant.zero_point[0]), mo, so]


def wins(graph: Graph, op: Op) -> bool:
    """Whether TPUP_ADD is faster than the builtin on `op` under both kernel sets: from TABLE_MIN
    elements (below, its AddFunc per element loses to CMSIS-NN's arm_elementwise_add_s8: QEMU,
    docs/bench/harness_kernels.md)."""
    return graph.tensors[op.outputs[0]].num_elements >= TABLE_MIN


def refusal(graph: Graph, op: Op) -> str | None:
    """Why TPUP_ADD cannot run `op` (None when it can)."""
    if len(op.outputs) != 1 or len(op.inputs) != 2 or min(op.inputs) < 0:
        return "not two inputs and one output"
    a, b, y = (graph.tensors[t] for t in (*op.inputs, op.outputs[0]))
    if not isinstance(op.options, AddOptions) or op.options.fused_activation not in ACTIVATION_CODE \
            or not all(per_tensor_int8(t) for t in (a, b, y)):
        return "not an int8 ADD with per-tensor quantization"
    if not (a.shape == b.shape == y.shape):
        return "its inputs are broadcast (TPUP_ADD takes equal shapes only)"
    if max(s for s in add_params(graph, op)[3::3]) > 0:
        return "a requantization multiplier is not below one"  # (QuantizeMultiplierSmallerThanOneExp's check)
    return None


def encode(graph: Graph, op: Op) -> bytes:
    left, o1, m1, s1, o2, m2, s2, zy, mo, so = add_params(graph, op)
    lo, hi = activation_range(graph, op)
    return struct.pack(f"<{WORDS}i", FORMAT, op.version, left, o1, m1, s1, o2, m2, s2, zy, mo, so, lo, hi,
                       ACTIVATION_CODE[op.options.fused_activation])


def decode(raw: bytes, where: str) -> tuple[AddOptions, int]:
    """(options, builtin version) of a TPUP_ADD read from a model; ModelError if malformed."""
    code = HARNESS_OP.custom_code
    if len(raw) != 4 * WORDS:
        raise ModelError(f"{where}: {code} has {len(raw)} bytes of options, expected {4 * WORDS}")
    w = struct.unpack(f"<{WORDS}i", raw)
    activation = {v: k for k, v in ACTIVATION_CODE.items()}.get(w[14])
    if w[0] != FORMAT or w[1] < 1 or not 0 <= w[2] <= LEFT_SHIFT or activation is None or w[12] > w[13] \
            or any(not -31 <= s <= 0 for s in (w[5], w[8], w[11])):
        raise ModelError(f"{where}: {code} has invalid options {list(w)}")
    return AddOptions(fused_activation=activation), w[1]
