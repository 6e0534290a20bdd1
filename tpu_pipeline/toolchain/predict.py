"""What the cost models predict for a model on a device: the runtime's one door to them.

The runtime measures; beside each measurement it shows the prediction. It asks here, with the
`Device` it was given (board facts it reads from the Device itself), and never imports the cost
models (`cost/`) directly.

    mcu_prediction(graph, device, kernels)      # cost.mcu.McuEstimate: per-op cycles, latency, energy
    edgetpu_segments(paths, device)             # cost.edgetpu.PipelineCost of a compiled pipeline
"""

from __future__ import annotations

from pathlib import Path

from tpu_pipeline.toolchain.cost.edgetpu import EdgeTpuCostModel, PipelineCost, StageCost
from tpu_pipeline.toolchain.cost.mcu import McuEstimate, estimate_mcu
from tpu_pipeline.toolchain.device import Device, KernelSet
from tpu_pipeline.toolchain.ir import Graph, from_model, total_param_bytes
from tpu_pipeline.toolchain.tflite import read_model


def mcu_prediction(graph: Graph, device: Device, kernels: KernelSet) -> McuEstimate:
    """The MCU cost model's cycles, latency and energy of one inference of `graph`."""
    return estimate_mcu(graph, device, kernels)


def edgetpu_segments(paths: list[Path], device: Device) -> tuple[PipelineCost, list[StageCost]]:
    """The Edge TPU cost model's stages of the segment files `paths`, pipelined by the simulator
    (shared link and host)."""
    model = EdgeTpuCostModel(device)
    stages = []
    for path in paths:
        g = from_model(read_model(path))
        compute = sum(c.compute_ps for c in model.op_costs(g))
        in_b = sum(g.tensors[t].nbytes for t in g.inputs)
        out_b = sum(g.tensors[t].nbytes for t in g.outputs)
        stages.append(model.stage(len(g.ops), compute, total_param_bytes(g), in_b, out_b))
    return model.pipeline(stages), stages
