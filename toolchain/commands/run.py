"""`tpu-pipeline run DIR|model [--backend auto|emulator|coral|mcu] [--iterations N] [--json]`."""

from __future__ import annotations

import sys
from pathlib import Path

from toolchain import report as out
from toolchain.errors import DeviceError, InfeasibleError, ModelError, UsageError, VerificationError

HELP = "run a compiled pipeline or a model on Coral, an MCU over serial, or the host emulator; measure it"


def add_arguments(p) -> None:
    p.add_argument("target", help="a compiled directory (report.json + segments) or a .tflite")
    p.add_argument("--backend", default="auto", choices=("auto", "emulator", "coral", "mcu"),
                   help="auto (default) takes hardware when found, else the emulator")
    p.add_argument("--device", help="device descriptor (devices/<name>.toml); default: report.json's, "
                   "else coral-usb (sparkfun-edge with --backend mcu)")
    p.add_argument("--iterations", "-N", type=int, default=20, help="timed inferences (default 20)")
    p.add_argument("--warmup", type=int, default=2, help="untimed inferences first (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--port", help="serial port of the MCU harness (mcu backend)")
    p.add_argument("--baud", type=int, help="serial baud rate (default: the device's [link] baud)")
    p.add_argument("--power-meter", metavar="PORT", help="serial port of a UM24C/UM25C/UM34C USB power meter")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for any one answer (default 10)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def device_kind(name: str) -> str:
    from toolchain.cost.mcu import device_dict

    return str(device_dict(name).get("kind", "edgetpu"))


def execute(args, target: Path, device: str | None, kind_hint: str | None = None):
    """Shared by run and profile: choose a backend, run, return (report, choice)."""
    from runtime.backends import select_backend
    from runtime.deployment import load_deployment
    from runtime.render import progress_bar

    if args.iterations < 1:
        raise UsageError(f"--iterations must be at least 1, got {args.iterations}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must be non-negative, got {args.warmup}")
    dep = load_deployment(target)
    if device is None:
        device = "sparkfun-edge" if args.backend == "mcu" else (dep.device or "coral-usb")
    kind = kind_hint or device_kind(device)
    choice = select_backend(args.backend, kind, getattr(args, "port", None), dep)
    if not args.json:
        out.console(stderr=True).print(f"backend: {choice.backend} ({choice.reason})")
    power = None
    if getattr(args, "power_meter", None):
        from runtime.power import PowerRecorder, UmMeter

        power = PowerRecorder(UmMeter(args.power_meter, timeout=min(args.timeout, 5.0)))
    total = args.iterations * (2 if choice.backend != "mcu" and kind != "mcu" else 1)
    with progress_bar(total, "inferences", enabled=not args.json and args.iterations >= 20) as progress:
        if kind == "mcu" or choice.backend == "mcu":
            if len(dep.segments) != 1:
                raise UsageError(f"{target}: an MCU runs one model, not a {len(dep.segments)}-segment pipeline")
            model = dep.segments[0].path
            if choice.backend == "mcu":
                if not getattr(args, "port", None):
                    raise UsageError("--backend mcu needs --port (the harness's serial port)")
                from runtime.backends.mcu import run_mcu

                rep = run_mcu(model, args.port, device, args.iterations, args.seed, args.baud, args.timeout,
                              progress, power)
            elif choice.backend == "coral":
                raise UsageError(f"device '{device}' is an MCU; use --backend mcu or emulator")
            else:
                from runtime.backends.emulator import run_mcu_emulation

                rep = run_mcu_emulation(model, device, args.iterations, args.warmup, args.seed, progress)
        elif choice.backend == "coral":
            from runtime.backends.coral import run_coral

            rep = run_coral(dep, args.iterations, args.warmup, args.seed, progress, args.timeout)
        elif choice.backend == "mcu":
            raise UsageError(f"device '{device}' is an Edge TPU; --backend mcu needs an MCU device (--device sparkfun-edge)")
        else:
            from runtime.backends.emulator import run_edgetpu_emulation

            recorder = power.start() if power is not None else None
            rep = run_edgetpu_emulation(dep, args.iterations, args.warmup, args.seed, device, progress)
            if recorder is not None:
                rep.energy = recorder.stop().to_json(2 * args.iterations)
    return rep, choice


def finish(rep, args) -> int:
    """Print the report, then turn what went wrong into the right exit code."""
    from runtime.render import print_run_report

    if args.json:
        out.print_json(rep.to_json())
    else:
        print_run_report(rep, out.console(), getattr(args, "top", 10))
    sys.stdout.flush()
    if rep.error:
        if rep.arena is not None and rep.arena.get("fits") is False:
            raise InfeasibleError(f"{rep.model}: {rep.error}")
        if rep.arena is not None and rep.arena.get("fits") is None:
            raise ModelError(f"{rep.model}: {rep.error}")
        raise DeviceError(rep.error)
    if rep.verified is False:
        raise VerificationError(f"{rep.model}: pipeline outputs differ from the whole model "
                                f"(max |diff| {rep.max_abs_diff})")
    return 0


def run(args) -> int:
    rep, _ = execute(args, Path(args.target), args.device)
    return finish(rep, args)
