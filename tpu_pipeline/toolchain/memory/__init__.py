"""Lifetimes under a runtime's semantics, arena planners, and lower bounds.

Flatbuffer-free: plans are plain values; `tpu_pipeline.toolchain.tflite.metadata.with_offline_plan` writes them.
"""

from tpu_pipeline.toolchain.memory.semantics import SEMANTICS, TFLITE, TFLM, Semantics, align, get_semantics
from tpu_pipeline.toolchain.memory.lifetimes import Buffer, Lifetimes, lifetimes, peak_memory
from tpu_pipeline.toolchain.memory.plan import ArenaPlan, arena_size, check_plan, first_conflict
from tpu_pipeline.toolchain.memory.runtime_planners import tflite_arena, tflm_greedy
from tpu_pipeline.toolchain.memory.bounds import op_footprints, order_free_lower_bound
from tpu_pipeline.toolchain.memory.preprocess import live_lower_bound
from tpu_pipeline.toolchain.memory.planners import PLANNERS, plan_arena, plan_buffers
from tpu_pipeline.toolchain.memory.tflm import OfflinePlan, offline_plan, plan_for_tflm
from tpu_pipeline.toolchain.memory.offchip import Traffic, offchip_traffic

__all__ = [
    "SEMANTICS", "TFLITE", "TFLM", "Semantics", "align", "get_semantics",
    "Buffer", "Lifetimes", "lifetimes", "peak_memory",
    "ArenaPlan", "arena_size", "check_plan", "first_conflict", "tflite_arena", "tflm_greedy",
    "op_footprints", "order_free_lower_bound",
    "PLANNERS", "OfflinePlan", "live_lower_bound", "offline_plan", "plan_arena", "plan_buffers",
    "plan_for_tflm", "Traffic", "offchip_traffic",
]
