"""Memory-optimal operator ordering: exact DP over scheduled sets with soft budgeting, CP-SAT,
optimality-preserving fusion, divide-and-conquer at forced cuts, baselines, one entry point."""

from toolchain.schedule.api import METHODS, Schedule, schedule
from toolchain.schedule.heuristics import BASELINES
from toolchain.schedule.model import MemModel, build_model

__all__ = ["METHODS", "Schedule", "schedule", "BASELINES", "MemModel", "build_model"]
