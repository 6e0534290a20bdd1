"""`tpu-pipeline run DIR|model [--backend auto|emulator|coral|mcu|qemu] [--iterations N] [--format ...]`."""

from __future__ import annotations

import contextlib
import sys

from tpu_pipeline.output import printer
from tpu_pipeline.runtime.backends import BUILTIN
from tpu_pipeline.toolchain.device import DEFAULT_KERNEL_SET, KERNEL_SET_NAMES



def add_arguments(p) -> None:
    p.add_argument("target", nargs="+", help="a compiled directory (report.json + segments) or a .tflite; several "
                                             ".tflite files with --backend qemu: one shared arena (docs/deploy.md)")
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

    if len(args.target) > 1:
        return _shared(args)
    args.target = args.target[0]
    return finish(lambda: api.run(args.target, backend=args.backend, device=args.device, iterations=args.iterations,
                                  warmup=args.warmup, seed=args.seed, port=args.port, baud=args.baud,
                                  power_meter=args.power_meter, timeout=args.timeout, kernels=args.kernels,
                                  **hooks(args)), args)


def _shared(args) -> int:
    """Several models built as one library on one arena, run one at a time in QEMU."""
    from tpu_pipeline import api_shared
    from tpu_pipeline.toolchain.errors import UsageError

    if args.backend != "qemu":
        raise UsageError("several models run on one shared arena with --backend qemu only (profile predicts them)")
    d = api_shared.profile_shared(args.target, args.device or "qemu-mps2-an386", args.kernels, measure=True,
                                  inferences=max(1, min(args.iterations, 3)), seed=args.seed)
    return show_shared(d, args)


def show_shared(d: dict, args) -> int:
    """Print a shared-arena report (profile and run of several models) and exit as it says:
    1 when a model's outputs or the measured arena differ, 3 when the arena does not fit."""
    from tpu_pipeline.output import printer
    from tpu_pipeline.toolchain import report as out
    from tpu_pipeline.toolchain.errors import InfeasibleError, VerificationError

    if args.json:
        out.print_json(d)
    else:
        c = printer(args)
        for m in d["models"]:
            c.print(f"{m['model']}: head {m['arena_head_predicted']:,} B + tail {m['arena_tail_predicted']:,} B"
                    + (f", outputs identical to the model alone: {m['outputs_match']}" if "outputs_match" in m else ""))
        c.print(f"one shared arena ({d['kernels']}): head {d['head']:,} B + stacked tails {d['tail']:,} B = "
                f"{d['shared_arena_bytes_predicted']:,} B predicted (separate arenas "
                f"{d['separate_arena_bytes_predicted']:,} B); {d['arena_bytes_available']:,} B available on {d['device']}"
                + (f"; measured in QEMU {d['arena_bytes_measured']:,} B" if "arena_bytes_measured" in d else ""))
    bad = [m["model"] for m in d["models"] if m.get("outputs_match") is False]
    if bad:
        raise VerificationError(f"outputs differ from each model run alone: {', '.join(bad)}")
    if d.get("arena_matches_prediction") is False:
        raise VerificationError(f"the shared arena measured {d['arena_bytes_measured']:,} B, predicted "
                                f"{d['shared_arena_bytes_predicted']:,} B")
    if not d["fits"]:
        raise InfeasibleError(f"the shared arena of {d['shared_arena_bytes_predicted']:,} B exceeds the "
                              f"{d['arena_bytes_available']:,} B {d['device']} leaves for one arena")
    return 0
