"""Device descriptors: `devices/<name>.toml`, validated on load, units in the key names.

    load_device("coral-usb")            # a name in devices/
    load_device("path/to/board.toml")   # or a path

Edge TPU descriptors (`kind = "edgetpu"`) need `[memory] param_sram_bytes`,
`[link] host_bandwidth_bytes_per_s`, `[timing] invoke_overhead_s`, `[compute] peak_ops_per_s`,
`[compute.efficiency]` (one fraction of peak per op class) and `[power] active_w, idle_w`.
MCU descriptors (`kind = "mcu"`) need `[memory] sram_bytes, flash_bytes`, `[compute] clock_hz`,
`[compute.cycles_per_mac]` per op class, `[link] baud` and `[power] active_w, idle_w`; optionally
`[compute] cycles_per_instruction` (then the fitted instruction model of cost/mcu.py is used).
Op classes: conv, depthwise, fully_connected, elementwise, other.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tpu_pipeline.toolchain.cost.classes import OP_CLASSES
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.firmware.library import CPU_FLAGS

DEVICES_DIR = Path(__file__).resolve().parents[1] / "data" / "devices"  # package data (tpu_pipeline.toolchain.data)
KINDS = ("edgetpu", "mcu")

# (section path, key) -> (type, lowest, highest). The ranges only keep out values no real device
# has and that would break the arithmetic (1e300 bytes/s, 5e-324 ops/s, a negative power):
# bytes up to 1 TiB; bandwidth 1 B/s to 10 TB/s; overheads up to 10 s; peak 1 op/s to 1e18 op/s;
# clock 1 kHz to 100 GHz; baud 1 to 1e9; power 0 to 10 kW; efficiency (fraction of peak) 1e-6 to
# 1; cycles per MAC 1e-3 to 1e6.
TIB = 2**40
_EDGETPU_KEYS = {
    ("memory", "param_sram_bytes"): (int, 1, TIB),
    ("link", "host_bandwidth_bytes_per_s"): (float, 1.0, 1e13),
    ("timing", "invoke_overhead_s"): (float, 0.0, 10.0),
    ("compute", "peak_ops_per_s"): (float, 1.0, 1e18),
    ("power", "active_w"): (float, 0.0, 1e4),
    ("power", "idle_w"): (float, 0.0, 1e4),
}
_EDGETPU_OPTIONAL = {("timing", "per_op_s"): (float, 0.0, 10.0),
                     # tpu_pipeline/toolchain/cost/pipeline.py: streaming overlaps compute (0/1); invokes the host serves at once (0: any)
                     ("timing", "stream_overlaps_compute"): (int, 0, 1), ("timing", "host_concurrency"): (int, 0, 1024)}
_MCU_KEYS = {
    ("memory", "sram_bytes"): (int, 1, TIB),
    ("memory", "flash_bytes"): (int, 1, TIB),
    ("compute", "clock_hz"): (float, 1e3, 1e11),
    ("link", "baud"): (int, 1, 10**9),
    ("power", "active_w"): (float, 0.0, 1e4),
    ("power", "idle_w"): (float, 0.0, 1e4),
}
# cycles per instruction: 0.01 (an emulator's virtual clock, QEMU -icount) to 100 (a slow flash
# without cache); tpu_pipeline/toolchain/cost/mcu.py turns the fitted instruction counts into cycles with it.
_MCU_OPTIONAL = {("compute", "cycles_per_instruction"): (float, 0.01, 100.0)}
_PER_CLASS_RANGE = {"efficiency": (1e-6, 1.0), "cycles_per_mac": (1e-3, 1e6)}
MAX_FILE_BYTES = 1 << 20   # a descriptor is a few hundred bytes
MAX_NESTING = 16           # tables and arrays inside one another; tomllib recurses on each level


@dataclass(frozen=True)
class Device:
    name: str
    kind: str
    raw: dict = field(compare=False, repr=False)
    path: str = ""

    def get(self, section: str, key: str, default: Any = None) -> Any:
        return self.raw.get(section, {}).get(key, default)

    @property
    def description(self) -> str:
        return str(self.raw.get("description", self.name))

    # ---- Edge TPU ---------------------------------------------------------------------------
    @property
    def param_sram_bytes(self) -> int:
        return int(self.get("memory", "param_sram_bytes"))

    @property
    def host_bandwidth_bytes_per_s(self) -> float:
        return float(self.get("link", "host_bandwidth_bytes_per_s"))

    @property
    def invoke_overhead_s(self) -> float:
        return float(self.get("timing", "invoke_overhead_s"))

    @property
    def peak_ops_per_s(self) -> float:
        return float(self.get("compute", "peak_ops_per_s"))

    @property
    def efficiency(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.raw["compute"]["efficiency"].items()}

    # ---- MCU --------------------------------------------------------------------------------
    @property
    def sram_bytes(self) -> int:
        return int(self.get("memory", "sram_bytes"))

    @property
    def flash_bytes(self) -> int:
        return int(self.get("memory", "flash_bytes"))

    @property
    def clock_hz(self) -> float:
        return float(self.get("compute", "clock_hz"))

    @property
    def cycles_per_mac(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.raw["compute"]["cycles_per_mac"].items()}

    @property
    def baud(self) -> int:
        return int(self.get("link", "baud"))

    # ---- both -------------------------------------------------------------------------------
    @property
    def active_w(self) -> float:
        return float(self.get("power", "active_w"))

    @property
    def idle_w(self) -> float:
        return float(self.get("power", "idle_w"))


def available_devices() -> list[str]:
    return sorted(p.stem for p in DEVICES_DIR.glob("*.toml"))


def _resolve(name_or_path: str | Path) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        if not p.is_file():
            raise UsageError(f"{p}: no such device descriptor")
        return p
    candidate = DEVICES_DIR / f"{name_or_path}.toml"
    if not candidate.is_file():
        known = ", ".join(available_devices()) or "none"
        raise UsageError(f"unknown device '{name_or_path}' (known: {known}; or give a .toml path)")
    return candidate


def _number(label: str, value: Any, typ: type, lowest: float, highest: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{label} must be a number, got {value!r}")
    if typ is int and not (isinstance(value, int) or float(value).is_integer()):
        raise UsageError(f"{label} must be a whole number, got {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise UsageError(f"{label} must be finite, got {value!r}")
    if value <= 0 < lowest:
        raise UsageError(f"{label} must be > 0, got {value!r}")
    if value < 0:
        raise UsageError(f"{label} must be >= 0, got {value!r}")
    if not lowest <= value <= highest:
        raise UsageError(f"{label} must be between {lowest:g} and {highest:g}, got {value!r}")


def validate(raw: dict, label: str) -> None:
    """Raise UsageError naming the file and the first problem found."""
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise UsageError(f"{label}: missing 'name'")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise UsageError(f"{label}: 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
    keys = _EDGETPU_KEYS if kind == "edgetpu" else _MCU_KEYS
    for (section, key), (typ, lowest, highest) in keys.items():
        sec = raw.get(section)
        if not isinstance(sec, dict) or key not in sec:
            raise UsageError(f"{label}: missing [{section}] {key}")
        _number(f"{label}: [{section}] {key}", sec[key], typ, lowest, highest)
    if kind == "edgetpu":
        for (section, key), (typ, lowest, highest) in _EDGETPU_OPTIONAL.items():
            if key in raw.get(section, {}):
                _number(f"{label}: [{section}] {key}", raw[section][key], typ, lowest, highest)
    if kind == "mcu":
        for (section, key), (typ, lowest, highest) in _MCU_OPTIONAL.items():
            if key in raw.get(section, {}):
                _number(f"{label}: [{section}] {key}", raw[section][key], typ, lowest, highest)
    if kind == "mcu" and "firmware" in raw:  # the board layer's facts (board_firmware below)
        board_firmware(raw, label)
    table = "efficiency" if kind == "edgetpu" else "cycles_per_mac"
    per_class = raw.get("compute", {}).get(table)
    if not isinstance(per_class, dict):
        raise UsageError(f"{label}: missing [compute.{table}]")
    for cls in OP_CLASSES:
        if cls not in per_class:
            raise UsageError(f"{label}: [compute.{table}] has no '{cls}' entry")
    for cls, v in per_class.items():
        if cls not in OP_CLASSES:
            raise UsageError(f"{label}: [compute.{table}] unknown op class '{cls}' "
                             f"(known: {', '.join(OP_CLASSES)})")
        if table == "efficiency" and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 1:
            raise UsageError(f"{label}: [compute.efficiency] {cls} is a fraction of peak, must be <= 1, got {v}")
        _number(f"{label}: [compute.{table}] {cls}", v, float, *_PER_CLASS_RANGE[table])


def _nesting(text: str) -> int:
    """The deepest nesting of [ and { outside strings and comments (an upper bound is enough:
    it only has to stop tomllib's recursion long before Python's limit)."""
    depth = deepest = 0
    quote = None
    comment = False
    i = 0
    while i < len(text):
        c = text[i]
        if comment:
            comment = c != "\n"
        elif quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c == "#":
            comment = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth = max(depth - 1, 0)
        i += 1
    return deepest


def load_device(name_or_path: str | Path) -> Device:
    """Load and validate a descriptor by name (devices/<name>.toml) or path."""
    if isinstance(name_or_path, Device):
        return name_or_path
    path = _resolve(name_or_path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise UsageError(f"{path}: {size:,} bytes; a device descriptor is at most {MAX_FILE_BYTES:,}")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    if _nesting(text) > MAX_NESTING:
        raise UsageError(f"{path}: tables or arrays nested deeper than {MAX_NESTING}")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({' '.join(str(exc).split())})") from None
    except RecursionError:
        raise UsageError(f"{path}: nested too deeply") from None
    validate(raw, str(path))
    return Device(name=raw["name"], kind=raw["kind"], raw=raw, path=str(path))


# ---- the [firmware] section: the board layer export-mcu writes (tpu_pipeline/toolchain/firmware/project.py)
#     [firmware]
#     cpu = "cortex-m4+fp"          # code generation (tpu_pipeline.toolchain.firmware.library.CPU_FLAGS)
#     library_cpu = "cortex-m4+fp"  # optional: the TFLite Micro library build to link (default: cpu)
#     flash_origin, ram_origin      # where [memory] flash_bytes and sram_bytes start
#     stack_bytes, heap_bytes       # reserved at the top of RAM
#     uart = "cmsdk" | "stm32-usart" | "nrf52-uarte" | "apollo3"   # firmware/uart-<name>/board_uart.cc
#     uart_base, uart_clock_hz, uart_rx_irq (-1: poll)
#     uart_tx_pin, uart_rx_pin, uart_af  # pin routing, where the UART needs it
#     gpio_base, uart_lpuart        # STM32: the UART pins' GPIO port; LPUART baud formula
#     init_writes = [[addr, bits]]  # registers OR-ed with bits before the UART starts (clock/power enables)
#     ticks = "systick" | "dwt"     # DWT cycle counter on silicon; SysTick where it is missing (QEMU)
#     core_clock_hz                 # the clock the board layer runs the core at: HARNESS_TICKS_PER_S
#     qemu_machine                  # emulated boards only: qemu-system-arm -M <machine>
UARTS = ("cmsdk", "stm32-usart", "nrf52-uarte", "apollo3")
TICKS = ("systick", "dwt")


@dataclass(frozen=True)
class BoardFirmware:
    board: str
    cpu: str
    library_cpu: str
    flash_origin: int
    flash_bytes: int
    ram_origin: int
    ram_bytes: int
    stack_bytes: int
    heap_bytes: int
    uart: str
    uart_base: int
    uart_clock_hz: int
    uart_rx_irq: int
    uart_tx_pin: int
    uart_rx_pin: int
    uart_af: int
    gpio_base: int
    uart_lpuart: bool
    init_writes: tuple
    ticks: str
    core_clock_hz: int
    qemu_machine: str | None

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def cpu_flags(self) -> tuple[str, ...]:
        return CPU_FLAGS[self.cpu]


def _int(fw: dict, key: str, label: str, default=None, minimum: int = 0) -> int:
    v = fw.get(key, default)
    if v is None:
        raise UsageError(f"{label}: [firmware] {key} is missing")
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise UsageError(f"{label}: [firmware] {key} must be a whole number >= {minimum}, got {v!r}")
    return v


def board_firmware(d: dict, label: str | None = None) -> BoardFirmware:
    """The validated `[firmware]` section of device dict `d`; UsageError naming the key."""
    label = label or str(d.get("name", "device"))
    fw = d.get("firmware")
    if not isinstance(fw, dict):
        raise UsageError(f"device '{label}' has no [firmware] section: the harness cannot be built for it "
                         f"(boards with one: {', '.join(firmware_boards())})")
    cpu = fw.get("cpu")
    if cpu not in CPU_FLAGS:
        raise UsageError(f"{label}: [firmware] cpu must be one of {', '.join(CPU_FLAGS)}, got {cpu!r}")
    lib_cpu = fw.get("library_cpu", cpu)
    if lib_cpu not in CPU_FLAGS:
        raise UsageError(f"{label}: [firmware] library_cpu must be one of {', '.join(CPU_FLAGS)}, got {lib_cpu!r}")
    uart = fw.get("uart")
    if uart not in UARTS:
        raise UsageError(f"{label}: [firmware] uart must be one of {', '.join(UARTS)}, got {uart!r}")
    ticks = fw.get("ticks", "dwt")
    if ticks not in TICKS:
        raise UsageError(f"{label}: [firmware] ticks must be one of {', '.join(TICKS)}, got {ticks!r}")
    machine = fw.get("qemu_machine")
    if machine is not None and (not isinstance(machine, str) or not machine.replace("-", "").isalnum()):
        raise UsageError(f"{label}: [firmware] qemu_machine must be a machine name, got {machine!r}")
    writes = fw.get("init_writes", [])
    if not isinstance(writes, list) or not all(
            isinstance(w, list) and len(w) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                        and 0 <= x < 2 ** 32 for x in w) for w in writes):
        raise UsageError(f"{label}: [firmware] init_writes must be a list of [address, bits] pairs of 32-bit "
                         f"numbers, got {writes!r}")
    lpuart = fw.get("uart_lpuart", False)
    if not isinstance(lpuart, bool):
        raise UsageError(f"{label}: [firmware] uart_lpuart must be true or false, got {lpuart!r}")
    mem = d.get("memory", {})
    return BoardFirmware(
        board=str(d.get("name", label)), cpu=cpu, library_cpu=lib_cpu,
        flash_origin=_int(fw, "flash_origin", label), flash_bytes=int(mem.get("flash_bytes", 0)),
        ram_origin=_int(fw, "ram_origin", label), ram_bytes=int(mem.get("sram_bytes", 0)),
        stack_bytes=_int(fw, "stack_bytes", label, 16384, 1024), heap_bytes=_int(fw, "heap_bytes", label, 4096),
        uart=uart, uart_base=_int(fw, "uart_base", label), uart_clock_hz=_int(fw, "uart_clock_hz", label, minimum=1),
        uart_rx_irq=_int(fw, "uart_rx_irq", label, -1, -1), uart_tx_pin=_int(fw, "uart_tx_pin", label, 0),
        uart_rx_pin=_int(fw, "uart_rx_pin", label, 0), uart_af=_int(fw, "uart_af", label, 0),
        gpio_base=_int(fw, "gpio_base", label, 0), uart_lpuart=lpuart, init_writes=tuple(tuple(w) for w in writes),
        ticks=ticks, core_clock_hz=_int(fw, "core_clock_hz", label, minimum=1), qemu_machine=machine)


def firmware_boards() -> list[str]:
    """The descriptors with a [firmware] section: the boards the harness can be built for."""
    return [n for n in available_devices() if "firmware" in load_device(n).raw]
