"""Cost models of a device (tpu_pipeline.toolchain.device.Device: the typed descriptor)."""

from tpu_pipeline.toolchain.cost.classes import OP_CLASSES
from tpu_pipeline.toolchain.cost.edgetpu import EdgeTpuCostModel, OpCost, PipelineCost, StageCost, op_class, PS_PER_S

__all__ = ["OP_CLASSES", "EdgeTpuCostModel", "OpCost", "PipelineCost", "StageCost", "op_class", "PS_PER_S"]
