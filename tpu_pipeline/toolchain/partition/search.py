"""What the partition searches return: the strategies' objectives, the exact step's result and the
simulation refinement's. Plain records, so that the partitioner can choose its search (the
down-set DP of lattice.py or CP-SAT in cpsat.py) without importing the other."""

from __future__ import annotations

from dataclasses import dataclass

STRATEGIES = {
    "latency": ("period_ps", "sum_stage_ps"),
    "1-3": ("max_param_bytes", "max_comm_bytes"),
    "1-2-3": ("max_param_bytes", "offchip_bytes", "max_comm_bytes"),
    "2-1-3": ("offchip_bytes", "max_param_bytes", "max_comm_bytes"),
}


@dataclass(frozen=True)
class SolveResult:
    stages: tuple[int, ...]
    objectives: dict            # name -> value of the solution
    bounds: dict                # name -> proven lower bound at that step
    proven_optimal: bool
    seconds: float
    status: str
    proven_steps: tuple = ()    # per objective of the strategy: proven optimal (given the earlier ones)?
    stopped_by: tuple = ()      # per step run: "optimal", "within gap", "deterministic limit", "wall clock", ...
    reproducible: bool = True   # no step was stopped by the wall clock (or run in parallel)
    method: str = "cpsat"       # "downsets": the exact DP over down-sets; "cpsat": CP-SAT


@dataclass(frozen=True)
class Refined:
    stages: tuple[int, ...]
    period_ps: int              # simulated period of `stages`
    proven: bool                # no assignment has a smaller simulated period
    candidates: int             # assignments simulated
    lower_bound_ps: int         # every assignment's simulated period is >= this
    wall_stopped: bool = False  # the wall clock (not the work budget) ended the search
    stopped_by: str = ""        # "proven", "within gap", "candidates" (the budget), "cap" (the down-set DP costed
                                # no chain above its upper bound), "deterministic limit", "wall clock"
