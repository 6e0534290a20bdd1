"""Memory-optimal operator ordering: exact DP over scheduled sets with soft budgeting, CP-SAT,
optimality-preserving fusion, divide-and-conquer at forced cuts, baselines, one entry point."""

from tpu_pipeline.toolchain.schedule.api import METHODS, Schedule, schedule
from tpu_pipeline.toolchain.schedule.heuristics import BASELINES
from tpu_pipeline.toolchain.schedule.model import MemModel, build_model

__all__ = ["METHODS", "Schedule", "schedule", "BASELINES", "MemModel", "build_model"]
