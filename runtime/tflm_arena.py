"""Moved to `toolchain.execute.tflm_arena` (the compiler never imports the runtime); kept as an
alias so existing callers keep working."""

from toolchain.execute.tflm_arena import TflmArena, check_tflm_dtypes, measure_tflm_arena  # noqa: F401
