"""`tpu-pipeline profile model.tflite --device sparkfun-edge|coral-usb [...]`."""

from __future__ import annotations

from tpu_pipeline.commands import run as run_cmd
from tpu_pipeline.commands.options import non_negative_int, positive_int, seconds
from tpu_pipeline.runtime.backends import BUILTIN
from tpu_pipeline.toolchain.device import DEFAULT_KERNEL_SET, KERNEL_SET_NAMES



def add_arguments(p) -> None:
    p.add_argument("model", nargs="+", help="a .tflite file (or a compiled directory for an Edge TPU device); "
                                            "several .tflite files: one shared TFLite Micro arena (docs/deploy.md)")
    p.add_argument("--device", required=True, help="device descriptor: sparkfun-edge, coral-usb, ... or a .toml")
    p.add_argument("--backend", default="auto", choices=("auto", *BUILTIN))
    p.add_argument("--kernels", dest="mcu_kernels", choices=KERNEL_SET_NAMES, default=None,
                   help="MCU: TFLite Micro kernels the predictions (arena, latency, energy) are for "
                        f"(default {DEFAULT_KERNEL_SET.name}; with --backend qemu also the firmware's)")
    p.add_argument("--iterations", "-N", type=positive_int, default=20)
    p.add_argument("--warmup", type=non_negative_int, default=2)
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--port", help="serial port of the MCU harness (real device)")
    p.add_argument("--baud", type=positive_int)
    p.add_argument("--power-meter", metavar="PORT", help="serial port of a UM24C/UM25C/UM34C USB power meter")
    p.add_argument("--timeout", type=seconds, default=10.0)
    p.add_argument("--top", type=non_negative_int, default=10, help="slowest ops to list (default 10)")
    p.add_argument("--host-ops", action="store_true",
                   help="MCU: also time every op alone in TFLite Micro on the host (slow on big models)")


def run(args) -> int:
    from tpu_pipeline import api

    if len(args.model) > 1:
        return _shared(args)
    args.model = args.model[0]
    return run_cmd.finish(lambda: api.profile(args.model, args.device, backend=args.backend, kernels=args.mcu_kernels,
                                              iterations=args.iterations, warmup=args.warmup, seed=args.seed,
                                              port=args.port, baud=args.baud, power_meter=args.power_meter,
                                              timeout=args.timeout, host_ops=args.host_ops, **run_cmd.hooks(args)),
                          args)


def _shared(args) -> int:
    """Several models on one MCU, run one at a time on one arena: predicted, or measured in QEMU."""
    from tpu_pipeline import api_shared
    from tpu_pipeline.toolchain.errors import UsageError

    if args.backend not in ("auto", "qemu"):
        raise UsageError("several models: --backend auto (predicted) or qemu (measured in QEMU)")
    d = api_shared.profile_shared(args.model, args.device, args.mcu_kernels, measure=args.backend == "qemu",
                           inferences=min(args.iterations, 3), seed=args.seed)
    return run_cmd.show_shared(d, args)
