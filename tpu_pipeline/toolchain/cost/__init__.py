"""Cost models built from device descriptors (devices/*.toml)."""

from tpu_pipeline.toolchain.cost.devices import Device, OP_CLASSES, available_devices, load_device
from tpu_pipeline.toolchain.cost.edgetpu import EdgeTpuCostModel, OpCost, PipelineCost, StageCost, op_class, PS_PER_S

__all__ = ["Device", "OP_CLASSES", "available_devices", "load_device", "EdgeTpuCostModel", "OpCost",
           "PipelineCost", "StageCost", "op_class", "PS_PER_S"]
