"""A firmware project for one board: the board layer, linker script and Makefile that
`export-mcu` writes next to the harness, from the device descriptor's `[firmware]` section.

    [firmware]
    cpu = "cortex-m4+fp"          # code generation (tpu_pipeline.toolchain.firmware.library.CPU_FLAGS)
    library_cpu = "cortex-m4+fp"  # optional: the TFLite Micro library build to link (default: cpu)
    flash_origin, ram_origin      # where [memory] flash_bytes and sram_bytes start
    stack_bytes, heap_bytes       # reserved at the top of RAM
    uart = "cmsdk" | "stm32-usart" | "nrf52-uarte" | "apollo3"   # firmware/uart-<name>/board_uart.cc
    uart_base, uart_clock_hz, uart_rx_irq (-1: poll)
    uart_tx_pin, uart_rx_pin, uart_af  # pin routing, where the UART needs it
    gpio_base, uart_lpuart        # STM32: the UART pins' GPIO port; LPUART baud formula
    init_writes = [[addr, bits]]  # registers OR-ed with bits before the UART starts (clock/power enables)
    ticks = "systick" | "dwt"     # DWT cycle counter on silicon; SysTick where it is missing (QEMU)
    core_clock_hz                 # the clock the board layer runs the core at: HARNESS_TICKS_PER_S
    qemu_machine                  # emulated boards only: qemu-system-arm -M <machine>
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from tpu_pipeline.toolchain.data import FIRMWARE_DIR
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.firmware.library import CPU_FLAGS

UARTS = ("cmsdk", "stm32-usart", "nrf52-uarte", "apollo3")
TICKS = ("systick", "dwt")
PROJECT_VERSION = 1


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
    from tpu_pipeline.toolchain.cost.devices import available_devices, load_device

    return [n for n in available_devices() if "firmware" in load_device(n).raw]


def _board_config(b: BoardFirmware, baud: int) -> str:
    return "\n".join([
        "#pragma once", f"// Generated by tpu-pipeline export-mcu for {b.board}: the board layer's facts.", "",
        f"#define BOARD_NAME \"{b.board}\"",
        f"#define BOARD_CORE_CLOCK_HZ {b.core_clock_hz}u",
        f"#define BOARD_UART_BASE 0x{b.uart_base:08X}u",
        f"#define BOARD_UART_CLOCK_HZ {b.uart_clock_hz}u",
        f"#define BOARD_UART_RX_IRQ {b.uart_rx_irq}",
        f"#define BOARD_UART_TX_PIN {b.uart_tx_pin}",
        f"#define BOARD_UART_RX_PIN {b.uart_rx_pin}",
        f"#define BOARD_UART_AF {b.uart_af}",
        f"#define BOARD_UART_BAUD {baud}u",
        f"#define BOARD_GPIO_BASE 0x{b.gpio_base:08X}u",
        f"#define BOARD_UART_LPUART {1 if b.uart_lpuart else 0}",
        "#define BOARD_INIT_WRITES {" + ", ".join(f"{{0x{a:08X}u, 0x{v:08X}u}}" for a, v in b.init_writes)
        + ("" if b.init_writes else "{0u, 0u}") + "}",
        f"#define BOARD_TICKS_DWT {1 if b.ticks == 'dwt' else 0}",
        "",
    ])


def _fill(template: str, values: dict[str, str]) -> str:
    for k, v in values.items():
        template = template.replace(f"@{k}@", v)
    return template


def project_files(d: dict) -> dict[str, bytes]:
    """The board layer, linker script, board_config.h and Makefile for device dict `d`."""
    b = board_firmware(d)
    baud = int(d.get("link", {}).get("baud", 115200))
    common = FIRMWARE_DIR / "cortex-m"
    uart_dir = FIRMWARE_DIR / f"uart-{b.uart}"  # uart-cmsdk, uart-stm32-usart, uart-nrf52-uarte, uart-apollo3
    files = {
        "startup.c": (common / "startup.c").read_bytes(),
        "platform.cc": (common / "platform.cc").read_bytes(),
        "board_uart.cc": (uart_dir / "board_uart.cc").read_bytes(),
        "board_config.h": _board_config(b, baud).encode(),
    }
    files["link.ld"] = _fill((common / "link.ld.in").read_text(), {
        "BOARD": b.board, "FLASH_ORIGIN": f"0x{b.flash_origin:08X}", "FLASH_BYTES": str(b.flash_bytes),
        "RAM_ORIGIN": f"0x{b.ram_origin:08X}", "RAM_BYTES": str(b.ram_bytes),
        "STACK_BYTES": str(b.stack_bytes), "HEAP_BYTES": str(b.heap_bytes)}).encode()
    files["Makefile"] = _fill((common / "Makefile.in").read_text(), {
        "BOARD": b.board, "LIB_CPU": b.library_cpu, "PYTHON": shlex.quote(sys.executable),
        "CPU_FLAGS": " ".join(b.cpu_flags)}).encode()
    return files
