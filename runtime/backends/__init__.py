"""Backends: where a deployment runs. `select_backend` picks one and says why.

- `emulator`: LiteRT on the host per segment (Edge TPU pipelines, with the cost model's
  predictions beside the host times), or TFLite Micro with the device's SRAM as the arena (MCUs).
- `coral`: Edge TPUs over USB or PCIe through libedgetpu's LiteRT delegate.
- `mcu`: the harness firmware over a serial port (firmware_configs/PROTOCOL.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from toolchain.errors import UsageError

BACKENDS = ("auto", "emulator", "coral", "mcu")


@dataclass(frozen=True)
class Choice:
    backend: str  # emulator | coral | mcu
    reason: str


def select_backend(requested: str, device_kind: str = "edgetpu", port: str | None = None,
                   deployment=None) -> Choice:
    """The backend to use. `auto` takes hardware when it is found, else the emulator."""
    if requested not in BACKENDS:
        raise UsageError(f"unknown backend '{requested}' (one of {', '.join(BACKENDS)})")
    if requested != "auto":
        return Choice(requested, "requested")
    if device_kind == "mcu":
        if port:
            return Choice("mcu", f"serial port {port} given")
        return Choice("emulator", "no --port given for the MCU: emulating it with TFLite Micro")
    from runtime.backends.coral import coral_readiness

    ok, why = coral_readiness(deployment)
    if ok:
        return Choice("coral", why)
    return Choice("emulator", f"{why}: emulating the Edge TPU pipeline on the host")
