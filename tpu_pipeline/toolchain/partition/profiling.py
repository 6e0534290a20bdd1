"""libcoral's profiling-based partitioner (`partition_with_profiling`), with simulated profiles.

libcoral (coral/tools/partitioner/profiling_based_partitioner.cc, partition_with_profiling.cc)
re-partitions by measuring segments on real TPUs; here every "measurement" is the pipeline
simulator's steady state (tpu_pipeline/toolchain/cost/pipeline.py), the per-segment figure being the stage's
invoke time with the shared link and host contended, as libcoral's benchmark reports per segment.
The algorithm, step by step:

  * the segments are op counts along libcoral's execution order (the same TopologicalSort as the
    parameter-count partitioner); the last segment keeps every op from the first output node on;
  * bounds: the parameter-count partition is measured; lower = its fastest segment, upper = its
    slowest;
  * bisection while upper - lower > diff_threshold (1 ms by default): target = (lower+upper)/2;
    search a partition whose segments 0..n-2 each measure <= target: segment i starts with every
    op it may take (later segments one op each, the last its minimum), and gives one op at a time
    to segment i+1 until it meets the target and the rest can be searched the same way
    (backtracking); the last segment's latency decides: below the target -> upper = target and
    keep the partition; else if below upper -> upper = that latency and keep it; lower = target;
  * a measured candidate's every segment latency is cached by (start, count), as libcoral does.

Deviation: failed searches of (segment, start) are remembered for the current target so that the
backtracking stays polynomial (libcoral re-measures; with its cache the answers are the same).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_pipeline.toolchain.cost.pipeline import simulate_many
from tpu_pipeline.toolchain.partition.heuristic import producer_consumer_edges, coral_heuristic, coral_topological_sort
from tpu_pipeline.toolchain.partition.problem import PartitionProblem

DIFF_THRESHOLD_NS = 1_000_000   # libcoral's default --diff_threshold_ns
PROFILE_FRAMES = 16             # frames per simulated "benchmark" (libcoral runs 10 inferences)


@dataclass(frozen=True)
class ProfilingResult:
    stages: tuple[int, ...]
    num_ops: tuple[int, ...]     # ops per segment along the execution order
    measurements: int            # candidates simulated
    note: str = ""


class _Profiler:
    def __init__(self, problem: PartitionProblem, order: list[int], n: int):
        self.problem, self.order, self.n = problem, order, n
        self.cache: dict[tuple[int, int], int] = {}
        self.measurements = 0

    def stages_of(self, num_ops) -> tuple[int, ...]:
        stages = [0] * len(self.order)
        pos = 0
        for s, c in enumerate(num_ops):
            for q in range(pos, pos + c):
                stages[self.order[q]] = s
            pos += c
        return tuple(stages)

    def segment_ns(self, num_ops, k: int) -> int:
        starts = [sum(num_ops[:i]) for i in range(self.n)]
        key = (starts[k], num_ops[k])
        if key not in self.cache:
            self.measure(num_ops, starts)
        return self.cache[key]

    def measure(self, num_ops, starts=None) -> list[int]:
        """Simulate the candidate; cache every segment's contended invoke time (ns)."""
        starts = starts or [sum(num_ops[:i]) for i in range(self.n)]
        p = self.problem
        sc = p.stage_costs(self.stages_of(num_ops), self.n)
        m = p.model
        sim = simulate_many([[m.load(s) for s in sc]], m.bandwidth, PROFILE_FRAMES, host_slots=m.host_slots)[0]
        self.measurements += 1
        lat = [round(st.busy_s * 1e9) for st in sim.stages]
        for i in range(self.n):
            self.cache.setdefault((starts[i], num_ops[i]), lat[i])
        return lat


def _search(prof: _Profiler, num_ops: list[int], target: int, i: int, last_min: int, failed: set) -> bool:
    """libcoral's SearchPartition with step 1: make segments i..n-2 meet `target`."""
    n = prof.n
    if i == n - 1:
        return True
    start = sum(num_ops[:i])
    if (i, start) in failed:
        return False
    total = len(prof.order) - start
    num_ops[n - 1] = last_min
    for j in range(i + 1, n - 1):
        num_ops[j] = 1
    num_ops[i] = total - (n - 2 - i) - last_min
    if num_ops[i] <= 0:
        failed.add((i, start))
        return False
    cand = list(num_ops)
    while cand[i] > 0:
        lat = prof.segment_ns(cand, i)
        if 0 < lat <= target:
            trial = list(cand)
            if _search(prof, trial, target, i + 1, last_min, failed):
                num_ops[:] = trial
                return True
        cand[i] -= 1
        cand[i + 1] += 1
    failed.add((i, start))
    return False


def profiling_partition(problem: PartitionProblem, n: int, diff_threshold_ns: int = DIFF_THRESHOLD_NS,
                        max_measurements: int = 20000) -> ProfilingResult:
    """Stage of each op under libcoral's profiling-based partitioner, profiled by the simulator."""
    g = problem.graph
    order = coral_topological_sort(g)
    N = len(order)
    if n == 1:
        return ProfilingResult(tuple([0] * N), (N,), 0)
    out_deg = [0] * N
    for p, _ in producer_consumer_edges(g):
        out_deg[p] += 1
    first_output = next(k for k, v in enumerate(order) if out_deg[v] == 0)
    last_min = max(N - first_output, 1)
    prof = _Profiler(problem, order, n)
    base = coral_heuristic(g, n)
    base_counts = [sum(1 for s in base.stages if s == k) for k in range(n)]
    lat = prof.measure(base_counts)
    lower, upper = min(lat), max(lat)
    best: list[int] | None = None
    if upper - lower <= diff_threshold_ns:
        return ProfilingResult(base.stages, tuple(base_counts), prof.measurements,
                               "bounds already within the threshold: the parameter-count partition")
    while upper - lower > diff_threshold_ns and prof.measurements < max_measurements:
        target = (lower + upper) // 2
        num_ops = [1] * n
        num_ops[0] = N - (n - 1)
        if _search(prof, num_ops, target, 0, last_min, set()):
            last = prof.segment_ns(num_ops, n - 1)
            if last < target:
                best, upper = list(num_ops), target
            else:
                if last < upper:
                    best, upper = list(num_ops), last
                lower = target
        else:
            lower = target  # libcoral: no candidate -> treated as the maximum latency
    note = "" if prof.measurements < max_measurements else f"stopped after {max_measurements} measurements"
    if best is None:
        return ProfilingResult(base.stages, tuple(base_counts), prof.measurements,
                               (note + "; " if note else "") + "no partition met a target: the parameter-count partition")
    return ProfilingResult(prof.stages_of(best), tuple(best), prof.measurements, note)


__all__ = ["ProfilingResult", "profiling_partition", "DIFF_THRESHOLD_NS"]
