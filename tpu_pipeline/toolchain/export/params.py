"""`ExportParams`: what export-mcu is asked for, checked once where the command or the caller starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpu_pipeline.toolchain.device import Device
from tpu_pipeline.toolchain.errors import UsageError


@dataclass(frozen=True)
class ExportParams:
    device: Device  # an MCU: its SRAM and flash bound the project, its [firmware] section adds the board layer
    out_dir: Path
    verify: bool = True  # TFLite Micro's real head must not exceed the planned one (the check_head stage)
    time_limit: float = 5.0  # seconds for the arena planner
    split_ok: bool = False  # the arena may go to the board's banks as head and tail apart (the library)

    def __post_init__(self) -> None:
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise UsageError(f"{self.out_dir}: exists and is not a directory")
        if self.device.kind != "mcu":
            raise UsageError(f"device '{self.device.name}' is not an MCU (kind = {self.device.kind!r})")

    @property
    def passes(self) -> tuple[str, ...]:
        """The optional stages that are on (the driver's switch)."""
        return ("check_head",) if self.verify else ()
