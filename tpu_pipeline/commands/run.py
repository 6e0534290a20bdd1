"""`tpu-pipeline run DIR|model [--backend auto|emulator|coral|mcu|qemu] [--iterations N] [--format ...]`."""

from __future__ import annotations

import contextlib
import sys

from tpu_pipeline.output import printer
from tpu_pipeline.runtime.backends import BUILTIN
from tpu_pipeline.toolchain.device import DEFAULT_KERNEL_SET, KERNEL_SET_NAMES

HELP = "run a compiled pipeline or a model on Coral, an MCU over serial, or the host emulator; measure it"


def add_arguments(p) -> None:
    p.add_argument("target", help="a compiled directory (report.json + segments) or a .tflite")
    p.add_argument("--backend", default="auto", choices=("auto", *BUILTIN),
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
    p.add_argument("--kernels", choices=KERNEL_SET_NAMES, default=None,
                   help=f"TFLite Micro kernels of the firmware (qemu backend; default {DEFAULT_KERNEL_SET.name})")


def hooks(args) -> dict:
    """Where run and profile say which backend they chose (stderr) and draw their progress bar."""
    from tpu_pipeline.output import Printer
    from tpu_pipeline.runtime import render  # the CLI sits above the runtime

    if args.json:
        return {}
    err = Printer("plain", sys.stderr)
    bar = (lambda total: render.progress_bar(total, "inferences", enabled=args.iterations >= 20))
    return {"announce": err.print, "progress_bar": bar}


def finish(call, args) -> int:
    """Run `call` (an API function), print its report, and exit as the report says: a failed run
    raises with its partial result attached, which is printed before the error line."""
    try:
        r = call()
    except Exception as exc:
        partial = getattr(exc, "result", None)
        if partial is not None:
            show(partial, args)
        raise
    show(r, args)
    return 0


def show(r, args) -> None:
    out = printer(args)
    if args.json:
        out.json(r.to_json())
    else:
        from tpu_pipeline.runtime import render

        render.print_run_report(r.report, out, getattr(args, "top", 10))
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.flush()


def run(args) -> int:
    from tpu_pipeline import api

    return finish(lambda: api.run(args.target, backend=args.backend, device=args.device, iterations=args.iterations,
                                  warmup=args.warmup, seed=args.seed, port=args.port, baud=args.baud,
                                  power_meter=args.power_meter, timeout=args.timeout, kernels=args.kernels,
                                  **hooks(args)), args)
