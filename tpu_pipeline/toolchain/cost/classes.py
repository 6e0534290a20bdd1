"""The op classes both cost models (Edge TPU and MCU) and the device descriptors use: one table.

Pooling, softmax, reductions and data movement are "other": they have no multiply-accumulates;
the Edge TPU model charges them its per-op cost, the MCU model their output elements at the
device's `other` rate.
"""

from __future__ import annotations

from tpu_pipeline.toolchain.device import OP_CLASSES  # the descriptors' per-class tables are keyed by them

__all__ = ["OP_CLASSES", "op_class"]

_CLASS = {
    "CONV_2D": "conv", "CONV_3D": "conv", "TRANSPOSE_CONV": "conv", "CONV_3D_TRANSPOSE": "conv",
    "DEPTHWISE_CONV_2D": "depthwise",
    "FULLY_CONNECTED": "fully_connected", "BATCH_MATMUL": "fully_connected",
    "ADD": "elementwise", "SUB": "elementwise", "MUL": "elementwise", "DIV": "elementwise",
    "MAXIMUM": "elementwise", "MINIMUM": "elementwise", "SQUARED_DIFFERENCE": "elementwise",
    "RELU": "elementwise", "RELU6": "elementwise", "RELU_N1_TO_1": "elementwise",
    "LEAKY_RELU": "elementwise", "PRELU": "elementwise", "LOGISTIC": "elementwise",
    "TANH": "elementwise", "HARD_SWISH": "elementwise", "QUANTIZE": "elementwise",
    "DEQUANTIZE": "elementwise", "ABS": "elementwise", "NEG": "elementwise", "ELU": "elementwise",
    "GELU": "elementwise", "EXP": "elementwise", "SQRT": "elementwise", "RSQRT": "elementwise",
}


def op_class(opcode: str) -> str:
    """conv, depthwise, fully_connected, elementwise or other."""
    return _CLASS.get(opcode, "other")
