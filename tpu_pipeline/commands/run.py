"""`tpu-pipeline run DIR|model [--backend auto|emulator|coral|mcu] [--iterations N] [--json]`."""

from __future__ import annotations

from tpu_pipeline.output import printer
import sys
from pathlib import Path

from tpu_pipeline.toolchain import report as out
from tpu_pipeline.toolchain.errors import DeviceError, InfeasibleError, ModelError, UsageError, VerificationError

HELP = "run a compiled pipeline or a model on Coral, an MCU over serial, or the host emulator; measure it"


def add_arguments(p) -> None:
    p.add_argument("target", help="a compiled directory (report.json + segments) or a .tflite")
    p.add_argument("--backend", default="auto", choices=("auto", "emulator", "coral", "mcu", "qemu"),
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
    p.add_argument("--kernels", choices=("cmsis-nn", "reference"), default=None,
                   help="TFLite Micro kernels of the firmware (qemu backend; default cmsis-nn)")


def device_kind(name: str) -> str:
    from tpu_pipeline.toolchain.cost.mcu import device_dict

    return str(device_dict(name).get("kind", "edgetpu"))


def _compiled_for(dep) -> str | None:
    """The device report.json names, looked up only among devices/*.toml: a report never makes
    the runtime open a path of its choosing."""
    if dep.device is None:
        return None
    from tpu_pipeline.toolchain.cost.devices import available_devices

    known = available_devices()
    if dep.device not in known:
        raise ModelError(f"{dep.source}/report.json: device: '{dep.device}' is not a known device "
                         f"({', '.join(known)}); pass --device")
    return dep.device


def execute(args, target: Path, device: str | None, kind_hint: str | None = None):
    """Shared by run and profile: choose a backend, run, return (report, choice)."""
    from tpu_pipeline.runtime import backends, deployment, render  # the CLI sits above the runtime

    if args.iterations < 1:
        raise UsageError(f"--iterations must be at least 1, got {args.iterations}")
    if args.warmup < 0:
        raise UsageError(f"--warmup must be non-negative, got {args.warmup}")
    dep = deployment.load_deployment(target)
    if device is None:
        device = {"mcu": "sparkfun-edge", "qemu": "qemu-mps2-an386"}.get(args.backend) or (_compiled_for(dep) or "coral-usb")
    kind = kind_hint or device_kind(device)
    port = getattr(args, "port", None)
    choice = backends.select_backend(args.backend, kind, port, dep)
    if getattr(args, "kernels", None) and choice.backend != "qemu":
        raise UsageError(f"--kernels selects the firmware's TFLite Micro kernels: it needs --backend qemu, "
                         f"not {choice.backend}")
    request = backends.RunRequest(dep, device, kind, args.iterations, args.warmup, args.seed, port,
                                  getattr(args, "baud", None), args.timeout, getattr(args, "kernels", None))
    if not args.json:
        out.console(stderr=True).print(f"backend: {choice.backend} ({choice.reason})")
    total = backends.get_backend(choice.backend).progress_total(request)
    with render.progress_bar(total, "inferences", enabled=not args.json and args.iterations >= 20) as progress:
        rep = backends.run_backend(choice.backend, request, getattr(args, "power_meter", None), progress)
    return rep, choice


def finish(rep, args) -> int:
    """Print the report, then turn what went wrong into the right exit code."""
    if args.json:
        out.print_json(rep.to_json())
    else:
        from tpu_pipeline.runtime import render

        render.print_run_report(rep, printer(args), getattr(args, "top", 10))
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
