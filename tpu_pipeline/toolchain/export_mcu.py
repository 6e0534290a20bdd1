"""Export a model for the TFLite Micro harness firmware (tpu_pipeline/toolchain/data/firmware/harness).

Writes into DIR: `model.tflite` (the model with our arena plan inside as TFLM's offline plan),
`model_data.cc/.h` (that model as a 16-byte aligned C array), `op_resolver.h`
(a MicroMutableOpResolver<N> registering only the ops the model uses), `harness_config.h` (arena
size from our plan plus the measured tail, baud rate, clock, model CRC), the harness sources, and
`export.json` (every figure, for tools). The arena head is checked against TFLite Micro itself.
For a board with a `[firmware]` section it also writes the board layer (startup.c, platform.cc,
board_uart.cc, board_config.h), a linker script with the board's flash and SRAM, and a Makefile:
`make -C DIR` (or `tpu-pipeline build-firmware DIR`) then builds the ELF (tpu_pipeline/toolchain/firmware/).

The work is export/'s stage list on the pass driver; this module is its entry and keeps the names
other code imports (the resolver's op codes and calls, the C array, ExportResult).
"""

from __future__ import annotations

from pathlib import Path

from tpu_pipeline.toolchain.device import Device
from tpu_pipeline.toolchain.driver import run_passes
from tpu_pipeline.toolchain.export.params import ExportParams
from tpu_pipeline.toolchain.export.result import ExportResult
from tpu_pipeline.toolchain.export.sources import c_array, harness_custom_ops, resolver_method, resolver_opcode
from tpu_pipeline.toolchain.export.stages import STAGES
from tpu_pipeline.toolchain.export.stages.arena import PLANNING_BYTES_PER_BUFFER
from tpu_pipeline.toolchain.export.state import ExportState


def export_mcu(model_path: str | Path, device: Device, out_dir: str | Path, verify: bool = True,
               model_data: bytes | None = None, split_ok: bool = False) -> ExportResult:
    """`model_data`: the model to export when it is not the file itself (e.g. `fit`'s output);
    `split_ok`: an arena larger than the first bank is fine when two banks hold its head and tail."""
    return export_with(model_path, ExportParams(device, Path(out_dir), verify, split_ok=split_ok), model_data)


def export_with(model_path: str | Path, params: ExportParams, model_data: bytes | None = None) -> ExportResult:
    state, _ = run_passes(STAGES, ExportState(params, Path(model_path), model_data))
    return state.result


__all__ = ["ExportParams", "ExportResult", "PLANNING_BYTES_PER_BUFFER", "c_array", "harness_custom_ops",
           "export_mcu", "export_with", "resolver_method", "resolver_opcode"]
