"""`ExportState`: the plain record export-mcu's stages hand each other (run by toolchain/driver.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_pipeline.toolchain.export.params import ExportParams
from tpu_pipeline.toolchain.export.result import ExportResult
from tpu_pipeline.toolchain.ir import Graph


@dataclass(frozen=True)
class ExportState:
    options: ExportParams
    src: Path  # the model file (names it in messages and in harness_config.h)
    model_data: bytes | None = None  # the model when it is not the file itself (e.g. fit's output)
    model: Any = None  # the model as tflite/ reads it, made exact for TFLite Micro
    notes: tuple[str, ...] = ()  # one per change that made it exact
    graph: Graph | None = None
    opcodes: tuple[str, ...] = ()  # distinct op codes the resolver registers, in first-use order
    methods: tuple[str, ...] = ()  # their MicroMutableOpResolver calls
    offsets: tuple[int, ...] = ()  # the offline plan written into the model
    planned_head: int = 0
    planner: str = ""
    own_head: int = 0  # TFLite Micro's own planner's head (predicted)
    planned: Any = None  # the model with the offline plan
    data: bytes = b""  # its bytes
    measured: Any = None  # execute.tflm_arena's measurement of `data`
    arena_size: int = 0  # HARNESS_ARENA_SIZE
    arena_banks: dict | None = None  # the arena in the board's banks (deploy/banks.harness_arena); None: the first
    files: tuple[tuple[str, bytes], ...] = ()
    result: ExportResult | None = None
