"""The arena TFLite Micro really allocates for the planned model (the host interpreter)."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena


def measure(state, allowed):
    measured = measure_tflm_arena(state.data, arena_size=max(64 * 1024 * 1024, 4 * state.options.device.memory.sram_bytes))
    return replace(state, measured=measured), PassRecord("measure", "ran", 0.0,
                                                         {"head": measured.head, "tail": measured.tail})
