"""`tpu-pipeline profile model.tflite --device sparkfun-edge|coral-usb [...]`."""

from __future__ import annotations

from pathlib import Path

from tpu_pipeline.commands import run as run_cmd
from tpu_pipeline.commands.options import non_negative_int, positive_int, seconds
from tpu_pipeline.toolchain.errors import UsageError

HELP = "profile a model on a device (or its emulation): latency, throughput, arena bytes, energy, slowest ops"


def add_arguments(p) -> None:
    p.add_argument("model", help="a .tflite file (or a compiled directory for an Edge TPU device)")
    p.add_argument("--device", required=True, help="device descriptor: sparkfun-edge, coral-usb, ... or a .toml")
    p.add_argument("--backend", default="auto", choices=("auto", "emulator", "coral", "mcu", "qemu"))
    p.add_argument("--kernels", dest="mcu_kernels", choices=("cmsis-nn", "reference"), default=None,
                   help="MCU: TFLite Micro kernels the predictions (arena, latency, energy) are for "
                        "(default cmsis-nn; with --backend qemu also the firmware's)")
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
    target = Path(args.model)
    kind = run_cmd.device_kind(args.device)
    if kind == "mcu" and target.is_dir():
        raise UsageError(f"{target}: profile an MCU with one .tflite, not a directory")
    kernels = getattr(args, "mcu_kernels", None)
    if kernels and kind != "mcu":
        raise UsageError(f"--kernels is for MCU devices; '{args.device}' is not one")
    args.kernels = kernels if args.backend == "qemu" else None  # the firmware's kernels: qemu only
    rep, choice = run_cmd.execute(args, target, args.device, kind)
    if kind == "mcu" and target.is_file():
        rep = _McuProfile(rep, _mcu_predictions(rep, target, args.device, kernels or "cmsis-nn"))
    if kind == "mcu" and args.host_ops and choice.backend == "emulator" and not rep.error:
        from tpu_pipeline.toolchain.cost.op_timing import tflm_op_times

        times = tflm_op_times(target.read_bytes(), iterations=max(1, min(args.iterations, 5)))
        for o in rep.ops:
            o["host_s"] = times.get(o["index"])
    if kind == "edgetpu" and target.is_file() and not rep.ops:
        from tpu_pipeline.toolchain.cost.edgetpu import PS_PER_S, EdgeTpuCostModel
        from tpu_pipeline.toolchain.ir import load

        _, graph = load(target)
        costs = EdgeTpuCostModel(args.device).op_costs(graph)
        rep.ops = [{"index": i, "opcode": op.opcode, "class": c.op_class, "work": c.macs,
                    "predicted_s": c.compute_ps / PS_PER_S} for i, (op, c) in enumerate(zip(graph.ops, costs))]
    return run_cmd.finish(rep, args)


class _McuProfile:
    """A backend's report plus the MCU predictions as top-level JSON keys (attributes pass through)."""

    def __init__(self, rep, extra: dict):
        self._rep, self._extra = rep, extra

    def __getattr__(self, name):
        return getattr(self._rep, name)

    def to_json(self) -> dict:
        d = self._rep.to_json()
        for k, v in self._extra.items():
            if d.get(k) is None:  # the qemu backend's own arena_bytes_predicted (same model) stays
                d[k] = v
        return d


def _mcu_predictions(rep, target: Path, device: str, kernels: str) -> dict:
    """Arena (32-bit target, export-mcu's plan), latency and energy for `kernels` on `device`."""
    from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
    from tpu_pipeline.toolchain.errors import ToolchainError
    from tpu_pipeline.toolchain.ir import load
    from tpu_pipeline.toolchain.memory.tflm_target import export_plan_offsets, target_arena
    from tpu_pipeline.toolchain.tflite.metadata import total_tensor_count

    model, graph = load(target)
    est = estimate_mcu(graph, device, kernels=kernels)
    try:
        arena = target_arena(graph, kernels, export_plan_offsets(graph, total_tensor_count(model)))
    except ToolchainError as exc:  # e.g. control flow: no offline plan is written
        arena = None
        rep.notes.append(f"arena not predicted: {exc}")
    if arena is not None and arena.tail is None:
        rep.notes.append(f"arena not predicted: {', '.join(target_tail_unmodelled(graph, kernels))} not modelled")
    if any(graph.tensors[t].dtype == "float32" for op in graph.ops for t in op.inputs[:1] if t >= 0):
        rep.notes.append("the MCU cost model is fitted on int8 kernels in QEMU: float32 ops are predicted "
                         "with the int8 coefficients, not from measurements")
    for o in rep.ops if rep.backend == "emulator" else ():
        c = est.ops[o["index"]]
        o.update(predicted_s=c.seconds, instructions_predicted=c.instructions)
    if rep.backend == "emulator":
        rep.predicted.update(latency_s=est.latency_s, energy_j=est.energy_j, cycles=est.cycles,
                             throughput_per_s=1.0 / est.latency_s if est.latency_s else None,
                             source=f"MCU cost model ({est.device}, {kernels} kernels)")
    return {"kernels": kernels, "arena_bytes_predicted": arena.total if arena else None,
            "arena_head_predicted": arena.head if arena else None,
            "arena_tail_predicted": arena.tail if arena else None,
            "latency_s_predicted": est.latency_s, "energy_j_predicted": est.energy_j,
            "instructions_predicted": est.instructions, "cycles_per_instruction": est.cycles_per_instruction,
            "clock_hz": est.clock_hz}


def target_tail_unmodelled(graph, kernels: str) -> tuple[str, ...]:
    from tpu_pipeline.toolchain.memory.tflm_target import target_tail

    return target_tail(graph, kernels).unmodelled
