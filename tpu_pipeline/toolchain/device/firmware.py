"""A board's `[firmware]` section: the facts its harness firmware is built from (board layer,
linker script, UART, clocks; tpu_pipeline/toolchain/firmware/project.py writes them out)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tpu_pipeline.toolchain.device.cpus import CPU_FLAGS
from tpu_pipeline.toolchain.errors import UsageError

# ---- the [firmware] section: the board layer export-mcu writes (tpu_pipeline/toolchain/firmware/project.py)
#     [firmware]
#     cpu = "cortex-m4+fp"          # code generation (tpu_pipeline.toolchain.device.cpus.CPU_FLAGS)
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

    @classmethod
    def from_json(cls, d: dict) -> "BoardFirmware":
        """The record `to_json` wrote (an exported project's export.json)."""
        try:
            return cls(**{**d, "init_writes": tuple(tuple(w) for w in d.get("init_writes", ()))})
        except TypeError as exc:
            raise UsageError(f"export.json: the board entry does not match this version ({exc})") from None

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


def parse_firmware(d: dict, label: str, ram_bytes: int) -> BoardFirmware:
    """The validated `[firmware]` section of the descriptor `d` (parsed TOML, which has one);
    UsageError naming the key. `ram_bytes`: the arena's RAM bank."""
    fw = d["firmware"]
    if not isinstance(fw, dict):
        raise UsageError(f"{label}: [firmware] must be a table")
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
        ram_origin=_int(fw, "ram_origin", label), ram_bytes=ram_bytes,
        stack_bytes=_int(fw, "stack_bytes", label, 16384, 1024), heap_bytes=_int(fw, "heap_bytes", label, 4096),
        uart=uart, uart_base=_int(fw, "uart_base", label), uart_clock_hz=_int(fw, "uart_clock_hz", label, minimum=1),
        uart_rx_irq=_int(fw, "uart_rx_irq", label, -1, -1), uart_tx_pin=_int(fw, "uart_tx_pin", label, 0),
        uart_rx_pin=_int(fw, "uart_rx_pin", label, 0), uart_af=_int(fw, "uart_af", label, 0),
        gpio_base=_int(fw, "gpio_base", label, 0), uart_lpuart=lpuart, init_writes=tuple(tuple(w) for w in writes),
        ticks=ticks, core_clock_hz=_int(fw, "core_clock_hz", label, minimum=1), qemu_machine=machine)
