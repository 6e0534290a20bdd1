"""Backends: where a deployment runs. One interface (`common.Backend`), one registry.

- `emulator`: LiteRT on the host per segment (Edge TPU pipelines, with the cost model's
  predictions beside the host times), or TFLite Micro with the device's SRAM as the arena (MCUs).
- `coral`: Edge TPUs over USB or PCIe through libedgetpu's LiteRT delegate.
- `mcu`: the harness firmware over a serial port (tpu_pipeline/toolchain/data/firmware/PROTOCOL.md).

`select_backend` picks one and says why; `run_backend` checks the request against what the
backend can do (device kind, a one-model MCU, `--power-meter`) and runs it. Options are checked
here, once, so no backend silently ignores one.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpu_pipeline.toolchain.errors import UsageError

if TYPE_CHECKING:
    from tpu_pipeline.runtime.backends.common import Backend, RunRequest

# The built-in backends, name -> "module:class" in this package: a new one is its module and one
# line here (the command line's --backend choices are read from it). Nothing heavy is imported
# until a backend is used, so the command line can list them at start-up.
BUILTIN = {
    "emulator": "emulator:EmulatorBackend",
    "coral": "coral:CoralBackend",
    "mcu": "mcu:McuBackend",
    "qemu": "qemu:QemuBackend",  # the harness firmware on an emulated board
}
_KIND = {"edgetpu": "an Edge TPU", "mcu": "an MCU"}
_EXTRA: dict[str, Backend] = {}


def __getattr__(name: str):  # Backend and RunRequest, loaded when first asked for
    if name in ("Backend", "RunRequest"):
        from tpu_pipeline.runtime.backends import common

        return getattr(common, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Choice:
    backend: str  # emulator | coral | mcu
    reason: str


def register(backend: Backend) -> None:
    """Add a backend (e.g. a board emulated in QEMU) under `backend.name`."""
    if not backend.name or backend.name == "auto":
        raise ValueError("a backend needs a name other than 'auto'")
    _EXTRA[backend.name] = backend


def registry() -> dict[str, Backend]:
    """Every backend by name: the built-in ones, then those added with `register`."""
    found: dict[str, Backend] = {}
    for name, where in BUILTIN.items():
        module, cls = where.split(":")
        found[name] = getattr(importlib.import_module(f"{__name__}.{module}"), cls)()
    found.update(_EXTRA)
    return found


def get_backend(name: str) -> Backend:
    backends = registry()
    if name not in backends:
        raise UsageError(f"unknown backend '{name}' (one of auto, {', '.join(backends)})")
    return backends[name]


def select_backend(requested: str, device_kind: str = "edgetpu", port: str | None = None,
                   deployment=None) -> Choice:
    """The backend to use. `auto` takes hardware when it is found, else the emulator."""
    if requested != "auto":
        get_backend(requested)
        return Choice(requested, "requested")
    reasons = []
    for b in registry().values():  # hardware first: the emulator always can
        if b.name == "emulator" or device_kind not in b.kinds:
            continue
        ok, why = b.readiness(port, deployment)
        if ok:
            return Choice(b.name, why)
        reasons.append(why)
    what = "the MCU with TFLite Micro" if device_kind == "mcu" else "the Edge TPU pipeline on the host"
    return Choice("emulator", f"{'; '.join(reasons) or 'no hardware backend'}: emulating {what}")


def run_backend(name: str, request: RunRequest, power_meter: str | None = None, progress=None):
    """Check `request` against backend `name`, open the power meter if asked, run. A RunReport."""
    backend = get_backend(name)
    if request.kind not in backend.kinds:
        others = [b.name for b in registry().values() if request.kind in b.kinds]
        raise UsageError(f"--backend {name} cannot run device '{request.device.label}': it is "
                         f"{_KIND.get(request.kind, request.kind)} (use --backend {' or '.join(others)})")
    n = len(request.deployment.segments)
    if request.kind == "mcu" and n != 1:
        raise UsageError(f"{request.deployment.source}: an MCU runs one model, not a {n}-segment pipeline")
    if power_meter and not backend.power_meter:
        raise UsageError(f"--power-meter: the {name} backend cannot use a power meter "
                         f"({backend.power_meter_why_not}); measure on hardware (--backend coral or mcu)")
    backend.check(request)
    power = None
    if power_meter:
        from tpu_pipeline.runtime.power import PowerRecorder, UmMeter

        power = PowerRecorder(UmMeter(power_meter, timeout=min(request.timeout, 5.0)))
    return backend.run(request, progress, power)


__all__ = ["BUILTIN", "Backend", "Choice", "RunRequest", "get_backend", "register", "registry", "run_backend",
           "select_backend"]
