"""Flag "dw3": the harness's int8 depthwise 3x3 kernel for narrow maps
(harness/tpup_depthwise3x3.cc, both firmware builds), TinyEngine's approach. One channel at a
time: its padded band of input is widened once into a small int16 buffer with the input offset
added (a padding tap holds 0), then two outputs side by side per pass, a pair of taps per SMLAD
against the row's weights held as int16 pairs (w0, w1) and (w1, w2) in registers. Strides 1 and 2
(each direction), any padding; TFLite's DepthwiseConvPerChannel integers (SMMULR's requantisation
where the channel's weights, bias and input offset bound every sum small enough, checked per
channel in the kernel, else TFLite's integers).

What it costs: flash, nothing of the model's (the int8 weights are read in place, no re-laid
constant). Arena: nothing. Stack: the buffer, rows x cols int16s (`buffer_shape`: rows = (out_h - 1) x
stride_h + 3, cols = out_w + 2 rounded up to even at stride 1, about 2 out_w + 2 at stride 2; or the
same transposed, which the kernel takes where the map is taller than wide), at most MAX_BUFFER
(648 bytes, no more than the "fast" kernel's weights on the stack), which is what makes it a
kernel for narrow maps (`applies`), plus 128 bytes of sums. Where it wins is measured in QEMU (docs/bench/harness_kernels.md)."""

from __future__ import annotations

from tpu_pipeline.toolchain.ir.geometry import leading_pads
from tpu_pipeline.toolchain.ir.graph import Graph
from tpu_pipeline.toolchain.ir.kernel_variants.record import KernelVariant

MAX_BUFFER = 324  # (harness/tpup_conv.h kDw3MaxBuffer: int16s on the stack)
WINS_FROM_OUTPUTS = 16  # stride 2: 12x12 -> 6x6 won in QEMU (67 vs CMSIS-NN's 71 a output), 6x6 -> 3x3 lost (115 vs 68)
MAX_RUN = 64  # (harness/tpup_depthwise3x3.cc kChunk: sums a pass holds, at least a buffer row's)


def buffer_shape(stride_a: int, stride_b: int, rows_out: int, cols_out: int, pad_b: int, n_b: int) \
        -> tuple[int, int, int, int]:
    """(rows, cols, run, elems) of the kernel's int16 buffer for rows_out rows of cols_out outputs at
    strides stride_a across and stride_b along its rows, pad_b padding columns before n_b input
    columns (harness/tpup_depthwise3x3.cc ShapeFor): rows of cols (even) read as one flattened run
    (output (ra, rb) at ra x run + rb, a row's right padding the next row's left), elems the
    int16s a pass may read."""
    reach, inner = (cols_out - 1) * stride_b + 3 - pad_b, pad_b + n_b
    cols = (max(reach, inner) + 1) & ~1
    rows, run = (rows_out - 1) * stride_a + 3, stride_a * cols // stride_b
    read = ((rows_out - 1) * run + cols_out - 1) * stride_b + 2 * cols + 6
    return rows, cols, run, max(read, rows * cols)


def buffer_fits(shape: tuple[int, int, int, int]) -> bool:
    return shape[3] <= MAX_BUFFER and shape[2] <= MAX_RUN


def applies(graph: Graph, i: int) -> bool:
    """A 3x3 window, one output channel per input channel, no dilation, strides 1 or 2, and a
    buffer within MAX_BUFFER."""
    op = graph.ops[i]
    if op.opcode != "DEPTHWISE_CONV_2D":
        return False
    o, w = op.options, graph.tensors[op.inputs[1]].shape
    x, y = graph.tensors[op.inputs[0]].shape, graph.tensors[op.outputs[0]].shape
    if not (o.depth_multiplier == 1 and o.dilation_h == 1 and o.dilation_w == 1 and x[3] == w[3] == y[3]
            and w[1] == w[2] == 3 and o.stride_h in (1, 2) and o.stride_w in (1, 2)):
        return False
    top, left = leading_pads(graph, op)
    plain = buffer_shape(o.stride_h, o.stride_w, y[1], y[2], left, x[2])
    turned = buffer_shape(o.stride_w, o.stride_h, y[2], y[1], top, x[1])  # (the kernel's transposed buffer)
    return buffer_fits(plain) or buffer_fits(turned)


def wins(graph: Graph, i: int) -> bool:
    """Stride 1: faster than "fast" and CMSIS-NN's kernels on every narrow map measured but the
    smallest (3 x 3: CMSIS-NN's, which "fast" also loses to); stride 2: where a channel has at
    least WINS_FROM_OUTPUTS outputs (its per-channel set-up, a few hundred instructions, paid off)."""
    op, y = graph.ops[i], graph.tensors[graph.ops[i].outputs[0]].shape
    return op.options.stride_h == op.options.stride_w == 1 or y[1] * y[2] >= WINS_FROM_OUTPUTS


VARIANT = KernelVariant(flag="dw3", bit=0x1000, opcode="DEPTHWISE_CONV_2D", applies=applies, wins=wins,
                        cost_class="tpup_depthwise_3x3", cost_fallback="depthwise_opt", source="tpup_depthwise3x3.cc")
