"""Moved to `toolchain.cost.op_timing` (the compiler never imports the runtime); kept as an alias."""

from toolchain.cost.op_timing import tflm_op_times  # noqa: F401
