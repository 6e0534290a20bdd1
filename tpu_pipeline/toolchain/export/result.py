"""What export-mcu reports (export.json): every figure of the exported project."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ExportResult:
    out_dir: str
    files: tuple[str, ...]
    device: str
    ops: tuple[str, ...]  # distinct op codes the resolver registers, in first-use order
    model_bytes: int
    planned_head: int  # arena head our plan gives TFLM (scratch placed by TFLM's own rule)
    tflm_own_head: int  # what TFLM would allocate without our plan
    measured_head: int  # what TFLM allocated with the exported model
    measured_tail: int
    arena_size: int  # HARNESS_ARENA_SIZE
    sram_bytes: int
    flash_bytes: int
    planner: str
    pinned_tensors: int
    model_crc: str
    firmware: dict | None = None  # the board's [firmware] facts when a buildable project was written
    # the harness's arena in the board's banks: {"head", "tail", "head_bytes", "tail_bytes"}
    # (deploy/banks.harness_arena); None: the whole arena in the first bank
    arena_banks: dict | None = None
    notes: tuple[str, ...] = ()  # what export changed in the model to make it exact for TFLite Micro

    def to_json(self) -> dict:
        return asdict(self)
