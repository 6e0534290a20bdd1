"""`tpu-pipeline profile model.tflite --device sparkfun-edge|coral-usb [...]`."""

from __future__ import annotations

from pathlib import Path

from tpu_pipeline.commands import run as run_cmd
from tpu_pipeline.commands.options import non_negative_int, positive_int, seconds
from toolchain.errors import UsageError

HELP = "profile a model on a device (or its emulation): latency, throughput, arena bytes, energy, slowest ops"


def add_arguments(p) -> None:
    p.add_argument("model", help="a .tflite file (or a compiled directory for an Edge TPU device)")
    p.add_argument("--device", required=True, help="device descriptor: sparkfun-edge, coral-usb, ... or a .toml")
    p.add_argument("--backend", default="auto", choices=("auto", "emulator", "coral", "mcu"))
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
    p.add_argument("--json", action="store_true")


def run(args) -> int:
    target = Path(args.model)
    kind = run_cmd.device_kind(args.device)
    if kind == "mcu" and target.is_dir():
        raise UsageError(f"{target}: profile an MCU with one .tflite, not a directory")
    rep, choice = run_cmd.execute(args, target, args.device, kind)
    if kind == "mcu" and args.host_ops and choice.backend == "emulator" and not rep.error:
        from toolchain.cost.op_timing import tflm_op_times

        times = tflm_op_times(target.read_bytes(), iterations=max(1, min(args.iterations, 5)))
        for o in rep.ops:
            o["host_s"] = times.get(o["index"])
    if kind == "edgetpu" and target.is_file() and not rep.ops:
        from toolchain.cost.edgetpu import PS_PER_S, EdgeTpuCostModel
        from toolchain.ir import load

        _, graph = load(target)
        costs = EdgeTpuCostModel(args.device).op_costs(graph)
        rep.ops = [{"index": i, "opcode": op.opcode, "class": c.op_class, "work": c.macs,
                    "predicted_s": c.compute_ps / PS_PER_S} for i, (op, c) in enumerate(zip(graph.ops, costs))]
    return run_cmd.finish(rep, args)
