"""Edge TPU pipeline partitioning: exact stage assignment (a DP over down-sets, or CP-SAT), Coral's
heuristic baseline, interfaces.

    from tpu_pipeline.toolchain.partition import partition
    p = partition(graph, 4, device="coral-usb", strategy="latency", time_limit=10.0)
    p.stages            # stage of each op (position in graph.ops)
    p.cost              # PipelineCost under the device's cost model
    p.baseline          # Coral's parameter-count heuristic, same cost model
    p.cost.period_ps    # the simulator's period (shared link and host); p.sim_proven: no other
                        # assignment has a smaller simulated period (lattice.refine_chains)
    p.method            # latency's exact step: "downsets" (lattice.py) or "cpsat" (cpsat.py)
    p.profiled          # with profiled=True: libcoral's profiling-based partitioner (simulated profiles)
    p.interfaces        # per segment: input and output tensor indices (Coral's rules)
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from tpu_pipeline.toolchain.cost.edgetpu import EdgeTpuCostModel, PipelineCost
from tpu_pipeline.toolchain.device import Device, load_device
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.partition.contiguous import best_contiguous
from tpu_pipeline.toolchain.partition.heuristic import HeuristicResult, coral_heuristic, coral_topological_sort
from tpu_pipeline.toolchain.partition.problem import BoundaryTensor, PartitionProblem, SegmentInterface
from tpu_pipeline.toolchain.partition.search import STRATEGIES

STRATEGY_NAMES = tuple(STRATEGIES) + ("coral",)
# The partition stops when its answer is proven or within this fraction of the proven bound.
DEFAULT_GAP = 0.01
# The simulation refinement simulates at most this many candidates per second of the time limit
# (40 at the default 10 s): a count, so that the answer does not depend on the machine's speed.
# Measured on the 55 paper cases: 300 candidates instead of 40 improve 6 of them, by 0.2 to 4.5 %
# (the geometric-mean gain over Coral by 0.2 %).
CANDIDATES_PER_SECOND = 4
# `compile --profile` is a deliberate step after a measured run: its refinement simulates up to
# this many candidates per second of --time-limit (25,000 at the default 10 s, about 20 s of work on
# the demo) with the compile's whole allowance (REFINE_WALL_FACTOR x --time-limit) as its wall
# clock, so it proves its answer within --gap instead of stopping at the count.
PROFILE_CANDIDATES_PER_SECOND = 2500
REFINE_WALL_FACTOR = 3


def __getattr__(name):
    # CP-SAT (OR-Tools, which imports pandas: ~0.5 s) loads only when a search needs it
    if name in ("solve", "refine_by_simulation"):
        from tpu_pipeline.toolchain.partition import cpsat
        return getattr(cpsat, name)
    raise AttributeError(name)


@dataclass(frozen=True)
class Partition:
    n: int
    stages: tuple[int, ...]
    strategy: str
    cost: PipelineCost
    interfaces: tuple[SegmentInterface, ...]
    objectives: dict
    bounds: dict
    proven_optimal: bool
    seconds: float
    baseline: "Partition | None" = None
    note: str = ""
    proven_steps: tuple = ()   # per objective of the strategy, in order
    stopped_by: tuple = ()     # per CP-SAT step: "optimal", "deterministic limit", "wall clock", ...
    reproducible: bool = True  # the same graph and options give these stages again (see cpsat.solve)
    sim_proven: bool = False   # strategy latency: no assignment has a smaller simulated period
    sim_candidates: int = 0    # assignments simulated to establish that
    period_lower_bound_ps: int = 0  # every assignment's simulated period is at least this
    profiled: "Partition | None" = None
    gap_limit: float = 0.0     # the tolerance asked for: stop within this fraction of the bound
    method: str = ""           # the exact step: "downsets" (DP over the graph's down-sets) or "cpsat"
    refined_by: str = ""       # why the simulation refinement stopped (search.Refined.stopped_by)

    @property
    def gap(self) -> float | None:
        """How far the simulated period may be above the best possible: period / its proven lower
        bound - 1 (0 when proven optimal; None without a bound)."""
        if self.sim_proven:
            return 0.0
        low = self.period_lower_bound_ps
        return self.cost.period_ps / low - 1 if low else None

    @property
    def primary_proven(self) -> bool:
        """The strategy's first objective (for `latency`: the throughput) is proven optimal."""
        return bool(self.proven_steps and self.proven_steps[0])

    def ops_of(self, k: int) -> tuple[int, ...]:
        return tuple(v for v, s in enumerate(self.stages) if s == k)

    @property
    def gain(self) -> float | None:
        """Throughput of this partition / throughput of the baseline."""
        if self.baseline is None:
            return None
        return self.cost.throughput_per_s / self.baseline.cost.throughput_per_s


def _make(problem: PartitionProblem, n, stages, strategy, bounds, proven, seconds, note="", baseline=None,
          proven_steps=(), stopped_by=(), reproducible=True):
    return Partition(n, tuple(stages), strategy, problem.evaluate(stages, n), problem.interfaces(stages, n),
                     problem.objectives(stages, n), bounds, proven, seconds, baseline, note, tuple(proven_steps),
                     tuple(stopped_by), reproducible)


def evaluated_partition(problem: PartitionProblem, stages, n: int, strategy: str,
                        baseline: Partition | None = None) -> Partition:
    """A given stage assignment (the user's cuts, a profiled run's) scored in the same cost model."""
    return _make(problem, n, stages, strategy, {}, False, 0.0, "", baseline)


def baseline_partition(graph: Graph, n: int, device: str | Device = "coral-usb",
                       problem: PartitionProblem | None = None) -> Partition:
    """Coral's parameter-count heuristic (libcoral) scored with the same cost model."""
    problem, t0 = _posed(graph, n, device, problem), time.perf_counter()
    h = coral_heuristic(graph, n)
    return _make(problem, n, h.stages, "coral", {}, False, time.perf_counter() - t0, _ruled(problem, h, n))


def profiled_partition(graph: Graph, n: int, device: str | Device = "coral-usb",
                       problem: PartitionProblem | None = None) -> Partition:
    """libcoral's profiling-based partitioner, every profile simulated (tpu_pipeline/toolchain/partition/profiling.py)."""
    from tpu_pipeline.toolchain.partition.profiling import profiling_partition

    problem, t0 = _posed(graph, n, device, problem), time.perf_counter()
    r = profiling_partition(problem, n)
    return _make(problem, n, r.stages, "coral-profiling", {"measurements": r.measurements}, False,
                 time.perf_counter() - t0, _ruled(problem, r, n))


def _posed(graph: Graph, n: int, device, problem: PartitionProblem | None) -> PartitionProblem:
    """The problem a Coral partitioner is scored in (the device's cost model unless given), `n` checked."""
    problem = problem or PartitionProblem(graph, EdgeTpuCostModel(load_device(device)))
    problem.check_n(n, graph.name or "model")
    return problem


def _ruled(problem: PartitionProblem, found, n: int) -> str:
    """A Coral partitioner's note, and that its stages break Coral's segment rules where they do."""
    if problem.is_valid(found.stages, n):
        return found.note
    return (found.note + "; " if found.note else "") + "violates Coral's segment rules for this graph"


def _warm_starts(problem, graph, base, n: int, strategy: str, colocate: bool):
    """(candidates, CP-SAT hint, upper bounds): the heuristic, and the best contiguous cut of two
    topological orders (DP)."""
    candidates = [base.stages] if problem.is_valid(base.stages, n) else []
    for order in (range(problem.n_ops), coral_topological_sort(graph)):
        cut = best_contiguous(problem, list(order), n)
        if cut is not None and not colocate and problem.is_valid(cut, n):
            candidates.append(cut)
    hint, ub = None, None
    if candidates:
        keys = STRATEGIES[strategy]
        hint = min(candidates, key=lambda st: tuple(problem.objectives(st, n)[k] for k in keys))
        if strategy == "latency" and problem.is_valid(base.stages, n):
            ub = {"period_ps": problem.objectives(hint, n)["period_ps"]}
    if colocate:
        hint = None  # the warm starts need not keep consumers together
    return candidates, hint, ub


def _refined(problem, n: int, res, chains, candidates, prof, period, colocate: bool, time_limit: float,
             left_s: float, gap: float, seed: int, per_second: float):
    """(stages, extra figures) of `latency`'s refinement on the simulated period, from the best of
    the solver's answer, the warm starts and the profiled baseline."""
    low = res.bounds.get("period_ps", 0)  # the proven bound of P (CP-SAT's also when stopped within the gap)
    # the incumbent: the best simulated period among the solver's answer and the warm starts
    # (and the profiled baseline), so the result is never slower than either baseline
    known = [res.stages] + [c for c in candidates if problem.is_valid(c, n) and not colocate]
    if prof is not None and problem.is_valid(prof.stages, n) and not colocate:
        known.append(prof.stages)
    inc = min(dict.fromkeys(known), key=lambda st: (period(st), problem.objectives(st, n)["sum_stage_ps"]))
    budget = max(1, round(per_second * time_limit))
    wall = max(0.5, left_s)
    if chains is not None:
        from tpu_pipeline.toolchain.partition.lattice import refine_chains
        ref = refine_chains(chains, inc, budget, gap=gap, wall_s=wall, period_ps=period(inc))
    else:
        from tpu_pipeline.toolchain.partition.cpsat import refine_by_simulation
        # deterministic budget: half the time limit's; wall clock: what is left of the time limit
        ref = refine_by_simulation(problem, n, inc, low, time_limit / 2, max_candidates=budget, colocate=colocate,
                                   seed=seed, wall_s=wall, gap=gap)
    stages = ref.stages
    extra = {"sim_proven": ref.proven and bool(low), "sim_candidates": ref.candidates,
             "period_lower_bound_ps": ref.lower_bound_ps, "reproducible": res.reproducible and not ref.wall_stopped,
             "refined_by": ref.stopped_by}
    return stages, extra


def _pruned(problem: PartitionProblem, n: int, candidates, period, limit_ps: int, base: Partition) -> Partition | None:
    """The best warm start, unsearched, if every n-stage period is proven above `limit_ps`
    (`-n auto`: the row cannot come within the knee); else None."""
    from tpu_pipeline.toolchain.partition.lattice import period_exceeds

    low = period_exceeds(problem, n, limit_ps)
    if low is None:
        return None
    best = min(dict.fromkeys(candidates), key=lambda st: (period(st), problem.objectives(st, n)["sum_stage_ps"]))
    out = _make(problem, n, best, "latency", {"period_ps": low}, False, 0.0,
                f"not searched: every {n}-stage period is proven above {limit_ps / 1e9:.3f} ms", base)
    return dataclasses.replace(out, method="bound", period_lower_bound_ps=low, refined_by="pruned")


def partition(graph: Graph, n: int, device: str | Device = "coral-usb", strategy: str = "latency", time_limit: float = 10.0,
              colocate: bool = False, workers: int = 2, seed: int = 0, label: str | None = None,
              deterministic: bool = True, profiled: bool = False, gap: float = DEFAULT_GAP,
              problem: PartitionProblem | None = None, prune_above_ps: int | None = None,
              measured: bool = False) -> Partition:
    """Partition into n pipeline segments. `strategy`: latency (default: minimise the slowest
    predicted stage, then the sum), the paper's lexicographic 1-3, 1-2-3, 2-1-3, or coral (the
    heuristic only). The result is never slower than the heuristic under the cost model for
    `latency` (the heuristic's period is an upper bound and its solution the hint).

    `deterministic` (default): the same graph and options give the same stages on every run and
    machine load (one CP-SAT worker, budgets in deterministic time); `p.reproducible` is False
    only if the wall-clock limit cut a step short first. `deterministic=False` races `workers`
    workers against the wall clock instead.

    The search stops when its answer is proven optimal, or as soon as it is within `gap` (a
    fraction; default 1 %) of its proven lower bound, not at the time limit. Order: Coral's
    heuristic (the baseline), the warm starts, the exact step, then the refinement on the
    simulated period. `latency`'s exact step is a dynamic programme over the graph's down-sets
    (lattice.py: exact, milliseconds on CNNs built from blocks) when the graph has few enough of
    them, else CP-SAT (cpsat.py), which `deterministic` and `workers` are about; the DP's work is
    bounded by lattice.MAX_DOWNSETS and MAX_PAIRS (seconds at most). The refinement simulates at
    most CANDIDATES_PER_SECOND x `time_limit` candidates; `time_limit` also caps CP-SAT's and the
    refinement's wall clock. `p.gap` says how close the answer is. `problem`: the graph's problem
    if already built (its cached down-set lattice is shared between calls for several n; a
    profile-scaled problem, PartitionProblem.scaled, partitions for measured costs). `prune_above_ps`
    (`-n auto`): if every assignment's period is proven above it, the best warm start is returned
    unsearched (`p.refined_by` "pruned", `p.period_lower_bound_ps` the proof). `measured`
    (`compile --profile`): the refinement gets PROFILE_CANDIDATES_PER_SECOND x `time_limit`
    candidates and REFINE_WALL_FACTOR x `time_limit` of wall clock."""
    if strategy not in STRATEGY_NAMES:
        raise UsageError(f"unknown strategy '{strategy}' (choose from {', '.join(STRATEGY_NAMES)})")
    if time_limit <= 0:
        raise UsageError(f"--time-limit must be > 0, got {time_limit:g}")
    if not 0 <= gap < 1:
        raise UsageError(f"--gap must be a fraction in [0, 1), got {gap:g}")
    t_start = time.perf_counter()
    device = load_device(device)  # a name or path is resolved here, once (an entry of the library API)
    problem = problem or PartitionProblem(graph, EdgeTpuCostModel(device))
    problem.check_n(n, label or graph.name or "model")
    base = baseline_partition(graph, n, device, problem)
    if strategy == "coral":
        return dataclasses.replace(base, baseline=base)
    candidates, hint, ub = _warm_starts(problem, graph, base, n, strategy, colocate)
    simulated: dict[tuple, int] = {}

    def period(st) -> int:
        if st not in simulated:
            simulated[st] = problem.period_ps(st, n)
        return simulated[st]

    if prune_above_ps is not None and strategy == "latency" and not colocate and candidates:
        out = _pruned(problem, n, candidates, period, prune_above_ps, base)
        if out is not None:
            return dataclasses.replace(out, seconds=time.perf_counter() - t_start, gap_limit=gap)
    exact, chains = None, None
    if strategy == "latency" and not colocate:
        from tpu_pipeline.toolchain.partition.lattice import exact_latency
        known = list(dict.fromkeys(candidates))
        exact = exact_latency(problem, n, [period(c) for c in known], [problem.objectives(c, n)["period_ps"] for c in known])
    if exact is not None:
        res, chains = exact
    else:
        from tpu_pipeline.toolchain.partition.cpsat import solve
        res = solve(problem, n, strategy, time_limit, hint=hint, upper_bounds=ub, colocate=colocate,
                    workers=workers, seed=seed, deterministic=deterministic, gap=gap)
    stages, extra = res.stages, {}
    prof = profiled_partition(graph, n, device, problem) if profiled else None
    if strategy == "latency":
        left = (REFINE_WALL_FACTOR if measured else 1) * time_limit - (time.perf_counter() - t_start)
        stages, extra = _refined(problem, n, res, chains, candidates, prof, period, colocate, time_limit, left, gap,
                                 seed, PROFILE_CANDIDATES_PER_SECOND if measured else CANDIDATES_PER_SECOND)
    out = _make(problem, n, stages, strategy, res.bounds, res.proven_optimal, res.seconds, "", base,
                res.proven_steps, res.stopped_by, res.reproducible)
    return dataclasses.replace(out, profiled=prof, seconds=time.perf_counter() - t_start, gap_limit=gap,
                               method=res.method, **extra)


__all__ = ["Partition", "PartitionProblem", "SegmentInterface", "BoundaryTensor", "HeuristicResult",
           "STRATEGIES", "STRATEGY_NAMES", "DEFAULT_GAP", "CANDIDATES_PER_SECOND", "PROFILE_CANDIDATES_PER_SECOND",
           "partition", "baseline_partition",
           "profiled_partition", "evaluated_partition", "coral_heuristic", "solve", "refine_by_simulation"]
