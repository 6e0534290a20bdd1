"""The variants of a fit, each at the cheapest stage that answers the question (bound, estimate,
measured), and the selection over them (select.py's chain DP steers, CP-SAT answers)."""

from __future__ import annotations

from tpu_pipeline.toolchain.budget import Deadline
from tpu_pipeline.toolchain.fit.select import Selection, chain_select, select
from tpu_pipeline.toolchain.fit.variants import Variant, best_order, refine, twins_of, upgrade
from tpu_pipeline.toolchain.memory.semantics import Semantics


class Pool:
    """The variants, each at the cheapest stage that answers the question: a selection is made on
    what is known (floors are optimistic: bounds <= estimates <= measured), every variant it picks
    that is not measured yet is taken one stage further, and the selection is made again, until
    it picks only measured variants. The answer is then `select`'s (CP-SAT) over the measured
    variants, which must agree with the chain DP that steered the loop."""

    def __init__(self, graph, spans, variants, device, sem: Semantics, op_seconds, harness=True, tail_fixed=None):
        self.graph, self.spans, self.variants = graph, spans, list(variants)
        self.device, self.sem, self.op_seconds = device, sem, op_seconds
        self.harness = harness  # kernel twins of measured variants may be offered
        self.tail_fixed = tail_fixed  # the whole arena is selected on (None: the head alone)
        self.estimated = self.measured = 0
        self.dropped = 0  # candidates whose tiles would read nothing of some tensor (a grid too fine)
        self.stopped = False  # a selection ended at its deadline (its answer: the best measured one)
        self.pruned: dict = {}  # the chain DP's dominance pruning, per group of spans, kept between its calls
        self.regions: dict = {}  # (first, last, form) -> the region's geometry, shared by its grids' estimates
        self._at: dict[int, int] = {}  # id(variant) -> its position when last looked up (index)
        self.hopeful: dict[int, tuple] = {}  # id(variant) -> (it, it at its lower bound): search.with_best_orders
        self.pruned_hopeful: dict = {}  # the chain DP's caches over those

    def estimate_all(self, deadline: Deadline) -> None:
        """Every candidate still at its bound estimated at once (the tile geometry is cheap, and
        the selection would estimate nearly all of them one region at a time, choosing again
        after each): the chain DP then chooses again only after a build."""
        out = []
        for v in self.variants:
            if v.stage == "bound" and not deadline.expired():
                v = self._upgraded(v)
                if v is None:
                    self.dropped += 1
                    continue
            out.append(v)
        self.variants = out

    def select(self, n_spans, budget, objective, deadline, latency_bound=None) -> Selection | None:
        while True:
            pick = chain_select(self.variants, n_spans, budget=budget, objective=objective,
                                latency_bound=latency_bound, tail_fixed=self.tail_fixed, pruned=self.pruned)
            if pick is None or all(v.stage == "measured" for v in pick):
                break
            if deadline.expired():
                self.stopped = True
                break  # out of time: the best among the measured variants
            for v in pick:
                if v.stage != "measured" and not deadline.expired():  # a build can take seconds
                    # a bound picked: its region's other grids are estimated with it (cheap, and
                    # the next pick is most often one of them)
                    group = [w for w in self.variants if w.stage == "bound" and w.first == v.first
                             and w.last == v.last and w.form == v.form and w.region == v.region] \
                        if v.stage == "bound" else [v]
                    for w in group:
                        self._step(w)
        measured = [v for v in self.variants if v.stage == "measured"]
        # a pick of measured variants only is the optimum over all (bounds and estimates are floors),
        # so over the measured ones: CP-SAT needs to solve the second level only (select's `known`)
        done = pick is not None and all(v.stage == "measured" for v in pick)
        sel = select(measured, n_spans, budget=budget, objective=objective, latency_bound=latency_bound,
                     deadline=Deadline(max(1.0, deadline.remaining())), tail_fixed=self.tail_fixed,
                     known=pick if done else None)
        if sel is not None and done:
            dp = (sum(round(v.latency_s * 1e9) for v in pick), arena_of(pick, self.tail_fixed))
            cp = (sum(round(v.latency_s * 1e9) for v in sel.variants), sel.arena)
            if sel.proven and dp != cp:  # same optimum; variants may differ on ties
                raise AssertionError(f"fit: CP-SAT's selection {cp} disagrees with the chain DP's {dp}")
        return sel

    def order(self, v: Variant, deadline: Deadline, below: int | None = None) -> None:
        """Build `v` if it is not yet, then ask the exact scheduler for its best order (`below`:
        for one under this peak)."""
        k = self.index(v)
        while v is not None and v.stage != "measured":
            v = self._upgraded(v)
        if v is None:
            del self.variants[k]
            self.dropped += 1
            return
        v = best_order(v, self.sem, deadline, below)
        self.variants[k] = v
        if self.harness:
            self.variants += twins_of(v, self.device, self.sem)

    def refine(self, budget, deadline, only=None, below=None) -> bool:
        measured = [v for v in self.variants
                    if v.stage == "measured" and (only is None or any(v is w for w in only))]
        better = refine(measured, budget, deadline, self.sem, below)
        changed = [(a, b) for a, b in zip(measured, better) if a != b]
        for old, new in changed:
            self.variants[self.index(old)] = new
        return bool(changed)

    def _step(self, v: Variant) -> None:
        """`v` one stage further in the pool (a candidate that does not exist after all: dropped,
        counted); kernel twins of a newly measured variant join the pool."""
        k = self.index(v)
        up = self._upgraded(v)
        if up is None:
            del self.variants[k]
            self.dropped += 1
            return
        self.variants[k] = up
        if up.stage == "measured" and self.harness:
            self.variants += twins_of(up, self.device, self.sem)

    def index(self, v: Variant) -> int:
        """Where `v` (itself, not an equal one) is in the list: its position as last seen, checked,
        else a search that notes every position (thousands of variants, asked after every step)."""
        k = self._at.get(id(v))
        if k is None or k >= len(self.variants) or self.variants[k] is not v:
            self._at = {id(w): j for j, w in enumerate(self.variants)}
            k = self._at[id(v)]
        return k

    def _upgraded(self, v: Variant) -> Variant | None:
        """`v` one stage further (upgrade), counted; None if it does not exist after all."""
        self.estimated += v.stage == "bound"
        self.measured += v.stage == "estimate"
        return upgrade(self.graph, self.spans, v, self.op_seconds, self.device, self.sem, self.regions)


def arena_of(pick: list[Variant], tail_fixed: int | None) -> int:
    """The memory a list of variants is selected on: the peak, plus the tail when counted."""
    peak = max(v.peak for v in pick)
    return peak if tail_fixed is None else peak + sum(v.tail for v in pick) + tail_fixed
