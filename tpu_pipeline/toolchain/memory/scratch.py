"""Scratch buffers that kernels request from the arena, for their own op's step only.

Under TFLite Micro these are the kernels' `RequestScratchBufferInArena` calls, in the order each
kernel makes them. Two kernel sets:

- `tflm` (reference kernels, the `tflite_micro` wheel): sizes measured against the real
  interpreter and pinned by tests/test_memory_tflm.py.
- `tflm-cmsis-nn` (TFLite Micro's cmsis_nn kernels, CMSIS-NN built for a Cortex-M4/M7 with the
  DSP extension and without MVE, compiled by GCC): each size is what the kernel's Prepare asks
  CMSIS-NN's `arm_*_get_buffer_size*` for on that target. Ops without a CMSIS-NN kernel run the
  reference kernel in that build and request what it requests.

Under TFLite the CPU kernels' temporaries (im2col and the like) depend on the kernel path chosen
at run time and are not modelled.
"""

from __future__ import annotations

from tpu_pipeline.toolchain.ir import DTYPE_SIZES, Graph
from tpu_pipeline.toolchain.ir.geometry import leading_pads
from tpu_pipeline.toolchain.ir import kernels, overlap, stage
from tpu_pipeline.toolchain.device import CMSIS_NN
from tpu_pipeline.toolchain.memory.semantics import Semantics

_INT32 = 4
_INT16 = 2

# Ops with a cmsis_nn kernel whose scratch requests are not modelled here (int8 TRANSPOSE_CONV:
# CMSIS-NN's own buffers; BATCH_MATMUL), see `cmsis_nn_unmodelled`.
CMSIS_NN_UNMODELLED = frozenset({"BATCH_MATMUL"})
# Ops whose cmsis_nn kernel asks CMSIS-NN for a buffer (int8 modelled below; int16 is not).
CMSIS_NN_SCRATCH = ("CONV_2D", "DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "FULLY_CONNECTED")


def cmsis_nn_unmodelled(graph: Graph, op) -> str | None:
    """The op's name when the cmsis_nn build's scratch for it is not modelled, else None."""
    if op.opcode in CMSIS_NN_UNMODELLED:
        return op.opcode
    x = graph.tensors[op.inputs[2 if op.opcode == "TRANSPOSE_CONV" else 0]] if op.inputs else None
    if op.opcode == "TRANSPOSE_CONV" and x is not None and x.dtype == "int8":
        return "TRANSPOSE_CONV (int8)"  # arm_transpose_conv_s8's two buffers
    if op.opcode in CMSIS_NN_SCRATCH and op.opcode != "CONV_2D" and x is not None and x.dtype == "int16":
        return f"{op.opcode} (int16)"  # its s16 buffer sizes are not modelled
    return None


def scratch_requests(graph: Graph, op_pos: int, sem: Semantics) -> list[int]:
    """Byte sizes of the scratch buffers op `op_pos` requests, in request order."""
    if kernels.is_harness(graph.ops[op_pos]):
        return _harness(graph, op_pos, sem)
    if sem.kernels == CMSIS_NN:
        sizes = _cmsis_nn(graph, op_pos)
        if sizes is not None:
            return sizes
    elif sem.kernels is None:  # (not TFLite Micro: no kernel asks for scratch)
        return []
    return _reference(graph, op_pos)


def _harness(graph: Graph, op_pos: int, sem: Semantics) -> list[int]:
    """A harness convolution (tpu_pipeline.toolchain.ir.kernels) asks once, for its kernel's buffer
    (CMSIS-NN's, as the builtin asks; none for the direct kernel or the reference kernels) and,
    when overlapped, a ring of output rows after it (16-aligned), as harness/tpup_conv.cc does.
    A faster variant (tpu_pipeline.toolchain.ir.kernel_variants) asks what its record's `scratch`
    says (dw3's sums and int16 buffer; none for the others) in place of the kernel set's buffer; its MEAN and MUL
    (harness/tpup_mean_mul.cc) ask for nothing."""
    op = graph.ops[op_pos]
    if op.opcode in kernels.MEAN_MUL:
        return []
    if stage.is_stage(op):  # its tiles' buffers, its packed layers' set-ups, the largest buffer a layer's kernel asks for
        body = op.options.body
        own = max((_harness(body, j, sem)[0] if _harness(body, j, sem) else 0
                   for j, layer in enumerate(body.ops) if layer.opcode != "ADD"), default=0)
        total = -(-op.options.scratch // 16) * 16 + stage.setup_bytes(op.options) + own
        return [total] if total else []
    flags = kernels.flags(op)
    own, variant = 0, kernels.variant_of(op)
    if variant is not None:
        own = variant.scratch(graph, op) if variant.scratch is not None else 0
    elif sem.kernels == CMSIS_NN and kernels.DIRECT not in flags:
        own = sum(_cmsis_nn(graph, op_pos) or [])
    ring = 0
    if kernels.OVERLAP in flags:
        y = graph.tensors[op.outputs[0]].shape
        ring = overlap.ring_rows(graph, op) * y[2] * y[3]
    total = (-(-own // 16) * 16 if ring else own) + ring
    return [total] if total else []


def _reference(graph: Graph, op_pos: int) -> list[int]:
    op = graph.ops[op_pos]
    name = op.opcode
    if name in ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN") and len(op.inputs) >= 2:
        x = graph.tensors[op.inputs[0]]
        axis = graph.tensors[op.inputs[1]]
        out = graph.tensors[op.outputs[0]]
        sizes = []
        if name in ("MEAN", "SUM") and x.dtype in ("int8", "int16"):
            sizes.append(out.num_elements * _INT32)  # int32 accumulators
        sizes.append(len(x.shape) * _INT32)  # the iteration index
        sizes.append(axis.num_elements * _INT32)  # the resolved axes
        return sizes
    if name == "TRANSPOSE_CONV" and op.outputs:
        out = graph.tensors[op.outputs[0]]
        acc = {"int8": 4, "int16": 8}.get(out.dtype)  # int32 / int64 accumulators
        sizes = [out.num_elements * acc] if acc else []
        bias = graph.tensors[op.inputs[3]] if len(op.inputs) > 3 and op.inputs[3] >= 0 else None
        if out.dtype == "int16" and bias is not None and bias.dtype == "int16":
            sizes.append(bias.num_elements * 8)  # the 16-bit bias widened to 64 bits
        return sizes
    if name == "SVDF" and len(op.inputs) >= 5:
        return _svdf_reference(graph, op)
    if name == "CUSTOM:SignalRfft" and op.inputs and op.outputs:
        # TFLite Micro's signal library (audio front ends): one work buffer of fft_length elements;
        # the output holds fft_length / 2 + 1 complex values
        x, out = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
        fft_length = 2 * (out.shape[-1] // 2 - 1)
        return [fft_length * int(DTYPE_SIZES.get(x.dtype) or 0)]
    if name == "UNIDIRECTIONAL_SEQUENCE_LSTM" and len(op.inputs) >= 20:
        return _lstm_scratch(graph, op)
    return []


def _svdf_reference(graph: Graph, op) -> list[int]:
    """svdf_common.cc PrepareSvdf: int32 (float) filter activations for every batch; int8 also the
    int32 per-unit sums."""
    x, w_feature = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
    batch, filters = x.shape[0], w_feature.shape[0]
    units = filters // max(_raw_option(op, "rank", 1), 1)
    if x.dtype == "int8":
        return [batch * filters * _INT32, batch * units * _INT32]
    return [batch * filters * 4]


def _lstm_scratch(graph: Graph, op) -> list[int]:
    """unidirectional_sequence_lstm.cc Prepare: four gate buffers of batch x state dimension, of
    the cell state's type (the same in the cmsis_nn build's kernel, which wraps the reference one)."""
    x = graph.tensors[op.inputs[0]]
    hidden, cell = graph.tensors[op.inputs[18]], graph.tensors[op.inputs[19]]
    batch = x.shape[1] if _raw_option(op, "timeMajor", False) else x.shape[0]
    size = batch * hidden.shape[1] * {"float32": 4, "int16": 2}.get(cell.dtype, 0)
    return [size] * 4 if size else []


def _raw_option(op, field: str, default):
    """A field of options the IR keeps undecoded (SVDF's rank, the LSTM's time_major)."""
    return getattr(getattr(op.options, "raw", None), field, default) or default


def _cmsis_nn(graph: Graph, op_pos: int) -> list[int] | None:
    """CMSIS-NN kernel requests (int8), or None where the reference kernel runs."""
    op = graph.ops[op_pos]
    name = op.opcode
    if name == "UNIDIRECTIONAL_SEQUENCE_LSTM" and len(op.inputs) >= 20:
        # cmsis_nn/unidirectional_sequence_lstm.cc: three gate buffers where CMSIS-NN runs it
        # (int8 or int16 activations, int16 cell state), the reference kernel's four otherwise
        sizes = _lstm_scratch(graph, op)
        x, cell = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[19]]
        return sizes[:3] if x.dtype in ("int8", "int16") and cell.dtype == "int16" else sizes
    if name not in CMSIS_NN_SCRATCH:
        return None  # the reference kernel's requests (SVDF: the same, CMSIS-NN's DSP buffer is 0)
    x = graph.tensors[op.inputs[0]]
    if name == "CONV_2D" and x.dtype == "int16":
        bias = graph.tensors[op.inputs[2]] if len(op.inputs) > 2 and op.inputs[2] >= 0 else None
        if bias is None or bias.dtype == "int64":
            w = graph.tensors[op.inputs[1]]
            # arm_convolve_wrapper_s16_get_buffer_size (no MVE): two int16 im2col columns
            return _positive(2 * x.shape[3] * w.shape[1] * w.shape[2] * _INT16)
        return []
    if x.dtype != "int8":
        return []  # float32 runs the reference path inside the cmsis_nn kernel; int16 not modelled
    if name == "AVERAGE_POOL_2D":
        # arm_avgpool_s8_get_buffer_size_dsp: one int32 accumulator per channel
        return [x.shape[-1] * _INT32]
    if name == "FULLY_CONNECTED":
        return _cmsis_fc(graph, op)
    w = graph.tensors[op.inputs[1]]
    o = op.options
    ph, pw = leading_pads(graph, op)
    if name == "CONV_2D":
        return _positive(_cmsis_conv(x.shape, w.shape, o, ph, pw))
    out = graph.tensors[op.outputs[0]]
    # arm_depthwise_conv_wrapper_s8_get_buffer_size (DSP, no MVE): the 3x3 kernel needs none;
    # the "opt" kernel an int16 im2col of one filter window over all channels.
    if x.shape[-1] == out.shape[-1] and x.shape[0] == 1 and o.dilation_w == 1 and o.dilation_h == 1:
        if w.shape[1] == 3 and w.shape[2] == 3 and ph <= 1 and pw <= 1:
            return []
        return _positive(x.shape[-1] * w.shape[1] * w.shape[2] * _INT16)
    return []


def _cmsis_conv(xs, ws, o, ph: int, pw: int) -> int:
    """arm_convolve_wrapper_s8_get_buffer_size_dsp for input NHWC `xs`, filter OHWI `ws`."""
    cin, kh, kw = xs[3], ws[1], ws[2]
    if ph == 0 and pw == 0 and kh == 1 and kw == 1 and o.dilation_w == 1 and o.dilation_h == 1 and cin == ws[3]:
        return 0  # 1x1: the fast path's buffer is 0 unless built by Arm Compiler 6
    # 1xN (input height 1, ...) uses arm_convolve_s8_get_buffer_size too without MVE: the general rule.
    rhs_cols = kw * kh * cin
    aligned = rhs_cols + (-rhs_cols) % 4
    return 2 * aligned * _INT16  # two int16 im2col columns


def _cmsis_fc(graph: Graph, op) -> list[int]:
    w = graph.tensors[op.inputs[1]]
    out = graph.tensors[op.outputs[0]]
    per_channel = w.quant is not None and len(w.quant.scale) > 1
    accum_depth = w.shape[-1]
    if len(out.shape) > 2 and accum_depth % 4 == 0:
        # conv 1x1 path: per-tensor quantization faked per channel in a scratch buffer; the
        # 1x1 fast buffer itself is 0 under GCC
        return [] if per_channel else [out.shape[-1] * _INT32 * 2]
    return []  # arm_fully_connected_s8_get_buffer_size_dsp is 0


def _positive(size: int) -> list[int]:
    return [size] if size > 0 else []
