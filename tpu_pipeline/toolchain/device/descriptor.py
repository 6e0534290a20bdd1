"""A device as typed sections: what every room below an entry point takes instead of a name.

    dev = load_device("sparkfun-edge")       # tpu_pipeline.toolchain.device.load: validated once
    dev.memory.sram_bytes, dev.memory.banks  # RAM: the firmware's bank first, then any others
    dev.compute.clock_hz, dev.link.baud, dev.power.idle_w
    dev.firmware                             # BoardFirmware or None (no harness for this board)

The sections mirror the descriptor's TOML tables (units in the key names). Edge TPU and MCU
descriptors share the record; a field the kind does not have is None (its validation in load.py
makes sure the kind's own fields are there).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tpu_pipeline.toolchain.device.firmware import BoardFirmware

# The op classes both cost models price and the descriptors' per-class tables are keyed by.
# Pooling, softmax, reductions and data movement are "other".
OP_CLASSES = ("conv", "depthwise", "fully_connected", "elementwise", "other")


@dataclass(frozen=True)
class RamBank:
    """One RAM region of an MCU: `[memory] sram_bytes` alone is one, or a descriptor lists several
    as `[[memory.banks]]` (name, origin, size_bytes, wait_states), the first holding the firmware;
    deploy/banks.py places the arena's head and tail in them."""
    name: str
    size: int  # bytes
    origin: int | None = None  # its first address, where the descriptor says (`[firmware] ram_origin`)
    wait_states: int | None = None  # extra cycles per access (0: tightly coupled); None: not stated


@dataclass(frozen=True)
class Memory:
    banks: tuple[RamBank, ...] = ()  # MCU RAM; banks[0] holds the firmware (and by default the arena)
    flash_bytes: int | None = None  # MCU: what the model and code may take
    param_sram_bytes: int | None = None  # Edge TPU: the on-chip parameter cache

    @property
    def sram_bytes(self) -> int:
        """The firmware's bank's bytes (an MCU's `[memory] sram_bytes`)."""
        return self.banks[0].size


@dataclass(frozen=True)
class Compute:
    clock_hz: float | None = None  # MCU core clock
    cycles_per_instruction: float | None = None  # MCU: the fitted instruction model's cycles (None: per-MAC rates)
    cycles_per_mac: dict[str, float] = field(default_factory=dict, hash=False)  # MCU: op class -> rate
    peak_ops_per_s: float | None = None  # Edge TPU
    efficiency: dict[str, float] = field(default_factory=dict, hash=False)  # Edge TPU: op class -> fraction of peak


@dataclass(frozen=True)
class Link:
    baud: int | None = None  # MCU serial line
    host_bandwidth_bytes_per_s: float | None = None  # Edge TPU host link


@dataclass(frozen=True)
class Power:
    active_w: float
    idle_w: float


@dataclass(frozen=True)
class Timing:
    """An Edge TPU's fixed costs (tpu_pipeline/toolchain/cost/edgetpu.py, cost/pipeline.py)."""
    invoke_overhead_s: float
    per_op_s: float = 0.0
    stream_overlaps_compute: bool = False  # the TPU runs a layer while the next parameters stream in
    host_concurrency: int = 0  # invokes the host serves at once (0: any)


@dataclass(frozen=True)
class Device:
    name: str
    kind: str  # "edgetpu" or "mcu"
    description: str
    memory: Memory
    compute: Compute
    link: Link
    power: Power
    timing: Timing | None = None  # Edge TPU only
    firmware: BoardFirmware | None = None  # MCU boards the harness firmware can be built for
    path: str = ""  # the descriptor file
    given: str = ""  # the name or path it was asked for by (what messages and reports quote)
    # the descriptor's content less its cost-model figures: what a firmware build depends on
    firmware_key: str = field(default="", compare=False, repr=False)

    @property
    def label(self) -> str:
        return self.given or self.name
