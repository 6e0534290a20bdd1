"""Per-op kernel choices a deployment can make, carried in the model as distinct op codes.

TFLite Micro binds one kernel to each op code, so a model can only choose an implementation per op
if each implementation has its own code. Our MCU harness registers, next to the kernel set's own
kernels, one more:

- `direct`: an int8 CONV_2D computed by TFLite's reference convolution (one output at a time from
  the input, no im2col), which asks the arena for no scratch. CMSIS-NN's convolution asks for an
  int16 im2col buffer of two filter windows (`tpu_pipeline.toolchain.memory.scratch`) and is faster. Both give
  the same int8 result: the harness's direct kernel is the reference kernel the host's TFLite Micro
  runs, and CMSIS-NN's convolution is bit-exact with it.

In a .tflite file a direct convolution is the custom op `TPUP_CONV_2D_DIRECT` with the CONV_2D's
inputs and outputs and 28 bytes of custom options: seven little-endian int32, [CONV_2D version,
padding (TfLitePadding: 1 SAME, 2 VALID), stride_w, stride_h, dilation_w, dilation_h, fused
activation (TfLiteFusedActivation: 0 none, 1 relu, 2 relu_n1_to_1, 3 relu6)]. In the IR it is a
CONV_2D with `kernel="direct"`, so every pass sees a convolution; only the scratch model, the cost
model and the writer look at the kernel. Runtimes without the harness's kernel (LiteRT, the host's
TFLite Micro) run `builtin_view`: the same graph with CONV_2D codes.
"""

from __future__ import annotations

import dataclasses
import struct

from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.ir.graph import Graph, Op
from tpu_pipeline.toolchain.ir.options import Conv2DOptions

DIRECT = "direct"
DIRECT_CONV_CODE = "TPUP_CONV_2D_DIRECT"
CONV_2D_BUILTIN = 3
_FORMAT = "<7i"
_PADDING = {"SAME": 1, "VALID": 2}
_ACTIVATION = {"NONE": 0, "RELU": 1, "RELU_N1_TO_1": 2, "RELU6": 3}


def can_run_direct(graph: Graph, op_pos: int) -> bool:
    """Whether the harness's direct kernel computes op `op_pos`: an int8 CONV_2D with per-axis int8
    filters, an int32 bias or none, and a fused activation it applies (none, relu, relu_n1_to_1, relu6)."""
    op = graph.ops[op_pos]
    if op.opcode != "CONV_2D" or not isinstance(op.options, Conv2DOptions) or len(op.inputs) < 2:
        return False
    if op.options.fused_activation not in _ACTIVATION or op.options.padding not in _PADDING:
        return False
    x, w, y = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]], graph.tensors[op.outputs[0]]
    bias_ok = len(op.inputs) < 3 or op.inputs[2] < 0 or graph.tensors[op.inputs[2]].dtype == "int32"
    return (x.dtype == w.dtype == y.dtype == "int8" and w.quant is not None and x.quant is not None
            and y.quant is not None and len(x.shape) == 4 and len(w.shape) == 4 and bias_ok)


def with_kernel(graph: Graph, op_positions, kernel: str = DIRECT) -> Graph:
    """`graph` with the ops at `op_positions` run by `kernel` ("" = the kernel set's own)."""
    chosen = set(op_positions)
    for i in chosen:
        if kernel == DIRECT and not can_run_direct(graph, i):
            raise ValueError(f"op {i} ({graph.ops[i].opcode}) cannot run the direct convolution kernel")
    ops = tuple(dataclasses.replace(op, kernel=kernel) if i in chosen else op for i, op in enumerate(graph.ops))
    return dataclasses.replace(graph, ops=ops)


def builtin_view(graph: Graph) -> Graph:
    """`graph` with every op on its builtin kernel: what runtimes without the harness run."""
    if not any(op.kernel for op in graph.ops):
        return graph
    return dataclasses.replace(graph, ops=tuple(dataclasses.replace(op, kernel="") for op in graph.ops))


def kernel_choices(graph: Graph) -> dict[int, str]:
    """Op position -> chosen kernel, for the ops not on the kernel set's own."""
    return {i: op.kernel for i, op in enumerate(graph.ops) if op.kernel}


# ---- the custom op code's options <-> the IR --------------------------------------------------
def direct_options(op: Op) -> bytes:
    o = op.options
    return struct.pack(_FORMAT, op.version, _PADDING[o.padding], o.stride_w, o.stride_h, o.dilation_w,
                       o.dilation_h, _ACTIVATION[o.fused_activation])


def direct_op(custom_options, where: str) -> tuple[Conv2DOptions, int]:
    """(options, CONV_2D version) from a TPUP_CONV_2D_DIRECT op's custom options; ModelError if malformed."""
    raw = bytes(bytearray(custom_options if custom_options is not None else b""))
    if len(raw) != struct.calcsize(_FORMAT):
        raise ModelError(f"{where}: {DIRECT_CONV_CODE} has {len(raw)} bytes of options, expected "
                         f"{struct.calcsize(_FORMAT)}")
    version, pad, sw, sh, dw, dh, act = struct.unpack(_FORMAT, raw)
    padding = {v: k for k, v in _PADDING.items()}.get(pad)
    activation = {v: k for k, v in _ACTIVATION.items()}.get(act)
    if padding is None or activation is None or min(sw, sh, dw, dh, version) < 1:
        raise ModelError(f"{where}: {DIRECT_CONV_CODE} has invalid options {[version, pad, sw, sh, dw, dh, act]}")
    return Conv2DOptions(padding=padding, stride_w=sw, stride_h=sh, fused_activation=activation,
                         dilation_w=dw, dilation_h=dh), version
