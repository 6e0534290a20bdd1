"""Memory-optimal operator ordering: exact DP over scheduled sets with soft budgeting, CP-SAT,
optimality-preserving fusion, divide-and-conquer at forced cuts, lower bounds and search stages
run from lists (bounds/, stages.py), baselines, one entry point and one record of its switches."""

from tpu_pipeline.toolchain.schedule.api import METHODS, Schedule, schedule
from tpu_pipeline.toolchain.schedule.heuristics import BASELINES
from tpu_pipeline.toolchain.schedule.model import MemModel, build_model
from tpu_pipeline.toolchain.schedule.params import ScheduleParams

__all__ = ["METHODS", "Schedule", "schedule", "ScheduleParams", "BASELINES", "MemModel", "build_model"]
