"""Flag "dw3": the harness's int8 depthwise 3x3 kernel for narrow maps
(harness/tpup_depthwise3x3.cc, both firmware builds), TinyEngine's approach. One channel at a
time: its input is widened once into a small int16 buffer (transposed where the map is taller
than wide), the input offset folded into the bias and the padding holding the zero point; then
one flattened pass over the buffer's rows (a row's right padding the next row's left), two
outputs side by side per step, a pair of taps per SMLAD against the window row's weights as int16
pairs (w0, w1) and (w1, w2). Strides 1 and 2 (each direction), any padding; TFLite's
DepthwiseConvPerChannel integers (SMMULR's requantisation where the channel's bias, the input
offset and the window's size bound every sum below 2^30 and the shift allows, checked per channel
in the kernel, else TFLite's integers).

What it costs: flash, nothing of the model's (the int8 weights are read in place and paired per
channel at run time; no constant input). Arena: one scratch buffer (`scratch`, asked for at
Prepare by harness/tpup_conv.cc, counted by memory/scratch.py): a pass's int32 sums (at most
MAX_RUN + 1) then the int16 buffer (at most MAX_BUFFER int16s, 648 bytes; `buffer_shape`), each
as large as the op's calls need: at most 912 bytes. Stack: nothing of its own. `applies` takes
only layers whose buffer fits, which is what makes it a kernel for narrow maps. Where it wins was
measured in QEMU (docs/bench/harness_kernels.md; `wins`). Patch stages run it on streamed row
stripes (`in_stages`; rewrite/patch_stage.py STRIPES_ONLY: through a ring, a call per output row,
it lost) where every call's buffer fits (`_dw3_misfits` there; tpup_stage.cc refuses a call it
does not hold); its buffer is then part of the stage's kernel buffer."""

from __future__ import annotations

from tpu_pipeline.toolchain.ir.geometry import leading_pads
from tpu_pipeline.toolchain.ir.graph import Graph, Op
from tpu_pipeline.toolchain.ir.kernel_variants.record import KernelVariant

MAX_BUFFER = 324  # (harness/tpup_conv.h kDw3MaxBuffer: the buffer's int16s)
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


def _plan(stride_h: int, stride_w: int, rows_out: int, cols_out: int, pad_top: int, pad_left: int, in_h: int,
          in_w: int) -> tuple[int, int, tuple[int, int, int, int]]:
    """(rows_out, cols_out, shape) of the buffer a call takes (harness ChoosePlan): transposed where
    the map is taller than wide and that buffer fits, or where only it fits."""
    plain = buffer_shape(stride_h, stride_w, rows_out, cols_out, pad_left, in_w)
    turned = buffer_shape(stride_w, stride_h, cols_out, rows_out, pad_top, in_h)
    if buffer_fits(turned) and (rows_out > cols_out or not buffer_fits(plain)):
        return cols_out, rows_out, turned
    return rows_out, cols_out, plain


def _call_bytes(plan: tuple[int, int, tuple[int, int, int, int]]) -> int:
    """A call's scratch (harness Depthwise3x3BufferBytes): the sums of a pass, 8-aligned, then the
    int16 buffer rounded up to a word."""
    rows_out, cols_out, (_, _, run, elems) = plan
    rows = min(rows_out, MAX_RUN // run)
    return (((rows - 1) * run + cols_out + 1) // 2 * 8 + 7) // 8 * 8 + (elems + 1) // 2 * 4


def scratch(graph: Graph, op: Op) -> int:
    """The op's buffer (harness/tpup_conv.cc OwnBufferSize): the whole call's, and when its rows
    go through a ring (overlapped) the largest of that and a one-row call's (the first row's band:
    every row's buffer has its shape)."""
    o = op.options
    x, y = graph.tensors[op.inputs[0]].shape, graph.tensors[op.outputs[0]].shape
    top, left = leading_pads(graph, op)
    whole = _call_bytes(_plan(o.stride_h, o.stride_w, y[1], y[2], top, left, x[1], x[2]))
    if "overlap" not in op.kernel.split("+")[1:]:  # (ir/kernels.py OVERLAP: that module imports this one)
        return whole
    first, last = -top, 2 - top  # input rows the first output row reads
    rows = min(last, x[1] - 1) - max(first, 0) + 1
    return max(whole, _call_bytes(_plan(o.stride_h, o.stride_w, 1, y[2], max(first, 0) - first, left, rows, x[2])))


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
    return buffer_fits(_plan(o.stride_h, o.stride_w, y[1], y[2], top, left, x[1], x[2])[2])


MIN_OUTPUTS = 16  # output pixels a channel from which it beat CMSIS-NN's 3x3 kernel (4 x 4: a tie)


def wins(graph: Graph, i: int) -> bool:
    """At stride 1 on maps of at least MIN_OUTPUTS output pixels (docs/bench/harness_kernels.md:
    1.28-1.92x the better of "fast" and CMSIS-NN's from 5 x 5, 1.01x at 4 x 4; on 3 x 3 maps CMSIS-NN's
    is faster, 0.77-0.78x: a channel's set-up, widening its map and pairing its weights, outweighs
    its loop there, and "fast" loses there too, so CMSIS-NN's keeps them). At stride 2 it lost on
    three of four maps (0.59-0.94x; 1.16x on kws's 25 x 5), so it stays off there."""
    op = graph.ops[i]
    y = graph.tensors[op.outputs[0]].shape
    return op.options.stride_h == op.options.stride_w == 1 and y[1] * y[2] >= MIN_OUTPUTS


VARIANT = KernelVariant(flag="dw3", bit=0x2000, opcode="DEPTHWISE_CONV_2D", applies=applies, wins=wins,
                        cost_class="tpup_depthwise_3x3", cost_fallback="depthwise_opt", source="tpup_depthwise3x3.cc",
                        scratch=scratch, in_stages=True)
