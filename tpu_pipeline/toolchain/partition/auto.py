"""`compile -n auto`: how many Edge TPUs a model needs.

Every n from 1 to K is partitioned exactly (partition.partition) on ONE problem, so the down-set
lattice, which does not depend on n, is listed and costed once (lattice.lattice_of). The rows
are searched with a share of the time limit each (their refinement simulates fewer candidates
than a plain `-n` compile); the chosen n is then partitioned again with the whole time limit,
so its segments are exactly those `compile -n <chosen>` writes.

The choice: the smallest n whose throughput per TPU is within `knee` (default 5 %) of the best
throughput per TPU over 1..K. Pipelining a model that fits on one TPU adds a host round-trip per
stage, so one TPU is usually the most efficient; a model whose parameters do not fit on chip
gains more than linearly while each extra TPU caches more of them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tpu_pipeline.toolchain.cost.edgetpu import PS_PER_S
from tpu_pipeline.toolchain.partition.problem import PartitionProblem

DEFAULT_MAX_N = 8
DEFAULT_KNEE = 0.05


@dataclass(frozen=True)
class Candidate:
    n: int
    period_s: float
    throughput_per_s: float
    cached_bytes: int           # parameters cached on chip, over all TPUs
    streamed_bytes: int         # parameters streamed from the host on every inference
    proven: bool                # the period is proven optimal for the simulator
    period_lower_bound_s: float
    seconds: float
    pruned: bool = False        # not searched: its lower bound keeps it below the knee (see `sweep`)

    @property
    def throughput_per_tpu(self) -> float:
        return self.throughput_per_s / self.n

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "throughput_per_tpu": self.throughput_per_tpu}


def candidate(part) -> Candidate:
    """The row of `-n auto`'s table for one partition."""
    stages = part.cost.stages
    return Candidate(part.n, part.cost.period_s, part.cost.throughput_per_s, sum(s.sram_bytes for s in stages),
                     sum(s.offchip_bytes for s in stages), bool(part.sim_proven),
                     (part.period_lower_bound_ps or part.cost.period_bound_ps) / 1e12, part.seconds,
                     part.refined_by == "pruned")


def choose(rows: list[Candidate], knee: float) -> tuple[int, str]:
    """The smallest n within `knee` of the best throughput per TPU, and why (one sentence)."""
    best = max(rows, key=lambda r: (r.throughput_per_tpu, -r.n))
    pick = min((r for r in rows if r.throughput_per_tpu >= (1 - knee) * best.throughput_per_tpu), key=lambda r: r.n)
    fastest = max(rows, key=lambda r: (r.throughput_per_s, -r.n))
    if pick.n == best.n:
        why = f"n={pick.n} has the best throughput per TPU ({pick.throughput_per_tpu:,.1f}/s)"
    else:
        why = (f"n={pick.n} is the fewest TPUs within {knee:.0%} of the best throughput per TPU "
               f"({pick.throughput_per_tpu:,.1f}/s vs {best.throughput_per_tpu:,.1f}/s at n={best.n})")
    if fastest.n != pick.n:
        why += (f"; n={fastest.n} would be {'at least ' if fastest.pruned else ''}"
                f"x{fastest.throughput_per_s / pick.throughput_per_s:.2f} faster "
                f"({fastest.throughput_per_s:,.1f}/s) on {fastest.n} TPUs")
    return pick.n, why


@dataclass(frozen=True)
class Sweep:
    candidates: tuple[Candidate, ...]
    n_chosen: int
    reason: str
    knee: float
    max_n: int
    skipped: str = ""            # why the table stops below max_n, if it does

    def to_json(self) -> dict:
        return {"n_candidates": [c.to_json() for c in self.candidates], "n_chosen": self.n_chosen,
                "reason": self.reason, "knee": self.knee, "max_n": self.max_n, "skipped": self.skipped}


def sweep(graph, problem: PartitionProblem, max_n: int, knee: float, time_limit: float, run) -> tuple[Sweep, object]:
    """Partition for n = 1..max_n (as far as the graph allows) and choose; `run(n, time_limit,
    prune_above_ps)` partitions `problem` for n. Returns the sweep and the chosen n's partition
    (searched again with the whole time limit, so it equals what `-n <chosen>` gives).

    The rows are searched in order of n, and a row is only searched if it could be chosen: its
    throughput per TPU can reach `knee` of the best row so far only with a period of at most
    `prune_limit_ps`; when its period is proven above that (partition's `prune_above_ps`), the
    row shows its best warm start, not proven, `pruned`. A later row can only raise the best, so
    a pruned row stays out of the choice."""
    top = min(max_n, problem.max_stages(), problem.n_ops)
    skipped = "" if top == max_n else (f"at most {top} segments are possible for this graph "
                                       f"(the sinks and what follows the first graph output share the last one)")
    share = max(0.25, time_limit / top)
    parts: dict = {}
    for n in range(1, top + 1):
        best = max((candidate(p).throughput_per_tpu for p in parts.values()), default=None)
        parts[n] = run(n, share, None if best is None else prune_limit_ps(n, knee, best))
    n, _ = choose([candidate(p) for p in parts.values()], knee)
    chosen = run(n, time_limit, None) if share < time_limit else parts[n]
    parts[n] = chosen
    rows = tuple(candidate(parts[k]) for k in sorted(parts))
    # the full search only improves the chosen row, which keeps it the choice; say why from the final table
    n, why = choose(list(rows), knee)
    pruned = [r.n for r in rows if r.pruned]
    if pruned:
        why += (f"; n={_span(pruned)} not searched past the warm starts: their periods are proven too long to "
                f"come within {knee:.0%} of the best throughput per TPU")
    return Sweep(rows, n, why, knee, max_n, skipped), parts[n]


def prune_limit_ps(n: int, knee: float, best_per_tpu: float) -> int:
    """The longest period at which n TPUs reach (1 - knee) of `best_per_tpu` throughput per TPU
    (rounded up, with a picosecond to spare: pruning less is always safe)."""
    return int(PS_PER_S / (n * (1 - knee) * best_per_tpu)) + 2


def _span(ns: list[int]) -> str:
    return ",".join(map(str, ns)) if len(ns) < 3 or ns != list(range(ns[0], ns[-1] + 1)) else f"{ns[0]}..{ns[-1]}"


__all__ = ["Candidate", "Sweep", "sweep", "choose", "candidate", "prune_limit_ps", "DEFAULT_MAX_N", "DEFAULT_KNEE"]
