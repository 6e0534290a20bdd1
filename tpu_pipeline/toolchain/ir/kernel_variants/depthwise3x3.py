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

from tpu_pipeline.toolchain.ir.graph import Graph
from tpu_pipeline.toolchain.ir.kernel_variants.record import KernelVariant

MAX_BUFFER = 324  # (harness/tpup_conv.h kDw3MaxBuffer: int16s on the stack)


def buffer_shape(stride_a: int, stride_b: int, rows_out: int, cols_out: int) -> tuple[int, int]:
    """(rows, cols) of the kernel's int16 buffer for rows_out rows of cols_out outputs at strides
    stride_a across and stride_b along its rows (harness/tpup_depthwise3x3.cc ShapeFor)."""
    return (rows_out - 1) * stride_a + 3, (cols_out + 3) & ~1 if stride_b == 1 else 4 * ((cols_out + 1) // 2) + 2


def buffer_fits(stride_h: int, stride_w: int, out_h: int, out_w: int) -> bool:
    """Whether the buffer fits MAX_BUFFER in either orientation (as the map is, or transposed:
    harness/tpup_depthwise3x3.cc ChoosePlan takes one that fits, and a band's is no larger)."""
    plain = buffer_shape(stride_h, stride_w, out_h, out_w)
    turned = buffer_shape(stride_w, stride_h, out_w, out_h)
    return min(plain[0] * plain[1], turned[0] * turned[1]) <= MAX_BUFFER


def applies(graph: Graph, i: int) -> bool:
    """A 3x3 window, one output channel per input channel, no dilation, strides 1 or 2, and a
    buffer within MAX_BUFFER."""
    op = graph.ops[i]
    if op.opcode != "DEPTHWISE_CONV_2D":
        return False
    o, w = op.options, graph.tensors[op.inputs[1]].shape
    x, y = graph.tensors[op.inputs[0]].shape, graph.tensors[op.outputs[0]].shape
    return (o.depth_multiplier == 1 and o.dilation_h == 1 and o.dilation_w == 1 and x[3] == w[3] == y[3]
            and w[1] == w[2] == 3 and o.stride_h in (1, 2) and o.stride_w in (1, 2)
            and buffer_fits(o.stride_h, o.stride_w, y[1], y[2]))


def wins(graph: Graph, i: int) -> bool:
    return True


VARIANT = KernelVariant(flag="dw3", bit=0x1000, opcode="DEPTHWISE_CONV_2D", applies=applies, wins=wins,
                        cost_class="tpup_depthwise_3x3", cost_fallback="depthwise_opt", source="tpup_depthwise3x3.cc")
