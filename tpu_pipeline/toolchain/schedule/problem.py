"""The problem every search and bound of the scheduler works on, and what they hand back.

`Piece`: units to order after a set of ops already run (divide.py cuts the graph into pieces).
`SearchResult`: what one search found. `Known`: what is known about a piece while its stages
run (stages.py). `BoundQuery`: what a lower bound is told (bounds/). Nothing here searches.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tpu_pipeline.toolchain.schedule.forks import lazy_slices
from tpu_pipeline.toolchain.schedule.twins import twin_links
from tpu_pipeline.toolchain.schedule.model import MemModel, bits

if TYPE_CHECKING:
    from tpu_pipeline.toolchain.schedule.params import ScheduleParams


@dataclass
class SearchResult:
    order: list[int] | None  # op order of the piece, None if nothing better than `ub` was found
    peak: int  # peak of `order` over the piece's steps (or ub if order is None)
    lower_bound: int  # proven: no order of the piece peaks below this
    complete: bool  # the search finished (order optimal, or ub proven optimal)
    states: int


class Piece:
    """Units to order after the ops in S0 (with R0 = R(S0)); all outside predecessors are in S0."""

    def __init__(self, model: MemModel, units, S0: int = 0, R0: int | None = None):
        self.model = model
        self.units = [tuple(u) for u in units]
        self.S0 = S0
        self.R0 = model.r0 if (R0 is None and S0 == 0) else (model.resident(S0) if R0 is None else R0)
        self.inside = []
        owner = {}
        for k, u in enumerate(self.units):
            m = 0
            for v in u:
                m |= 1 << v
                owner[v] = k
            self.inside.append(m)
        self.ops = 0
        for m in self.inside:
            self.ops |= m
        self.upred = []
        for k, u in enumerate(self.units):
            pm = 0
            for v in u:
                pm |= model.preds[v]
            pm &= ~self.inside[k]
            if pm & ~(S0 | self.ops):
                raise ValueError("piece has predecessors outside the piece and S0")
            loc = 0
            for w in bits(pm & self.ops):
                loc |= 1 << owner[w]
            self.upred.append(loc)
        self.usucc = [[] for _ in self.units]
        for k, p in enumerate(self.upred):
            for j in bits(p):
                self.usucc[j].append(k)
        self.lazy: dict[int, tuple[int, int]] = {}  # see forks.py; set by use_lazy_slices()
        self.fork_groups: dict[int, list[int]] = {}
        self.twin: list[int] = []  # see twins.py; set by use_twins() (empty: no twins)

    def use_lazy_slices(self) -> "Piece":
        """Let the search offer slices of a fork only as pairs or one final run (forks.py)."""
        self.lazy, self.fork_groups = lazy_slices(self.model, self.units, self.ops, self.upred)
        return self

    def use_twins(self) -> "Piece":
        """Let the exact search run a twin branch's unit only after its elder twin's (twins.py)."""
        links = twin_links(self.model, self.units, self.upred, self.usucc)
        self.twin = links if any(a >= 0 for a in links) else []
        return self

    def apply(self, k: int, S: int, R: int) -> tuple[int, int, int]:
        """Run unit k after S: (peak over its steps, S after, R after)."""
        peak = 0
        step = self.model.step
        for v in self.units[k]:
            live, R = step(v, S, R)
            S |= 1 << v
            if live > peak:
                peak = live
        return peak, S, R

    @property
    def step0(self) -> int:
        """Bytes live at step 0 (the graph inputs) if this piece starts the graph, else 0: step 0
        belongs to the first piece."""
        return self.model.step0 if self.S0 == 0 else 0

    @property
    def ends_graph(self) -> bool:
        """The piece holds the graph's last step."""
        return (self.S0 | self.ops) == self.model.full

    def evaluate(self, order) -> int:
        """Peak over the piece's steps for an op order of the piece's ops."""
        return self.model.peak(order, self.S0, self.R0) if order else 0


def units_to_ops(piece: Piece, unit_order) -> list[int]:
    """The op order of a unit order."""
    return [v for k in unit_order for v in piece.units[k]]


def pieces_in_context(model: MemModel, units, plist) -> list[Piece]:
    """One Piece per part of `plist` (lists of indices into `units`); its context (S0, R0)
    follows from the pieces before it."""
    contexts = []
    S, R = 0, model.r0
    for p in plist:
        contexts.append((S, R))
        for k in p:
            for v in units[k]:
                _, R = model.step(v, S, R)
                S |= 1 << v
    return [Piece(model, [units[k] for k in p], S0, R0) for p, (S0, R0) in zip(plist, contexts)]


@dataclass(frozen=True)
class BoundQuery:
    """What a lower bound is told about a piece (bounds/)."""
    floor: int  # already proven for the piece: a bound may start from it (and return it)
    ub: int | None  # the best order's peak: a bound may stop once it reaches it (never return more)
    deadline: float | None  # monotonic seconds: stop by then with a smaller but valid bound


@dataclass(frozen=True)
class Known:
    """What is known about a piece while its stages run (stages.py): the best order found and
    its peak (the bound to beat), a proven floor (no order of the piece peaks below it, or the
    graph's bound already reaches it), whether a search settled the piece, the methods that ran
    and the lower bounds computed on the way (name, value)."""
    order: list[int]
    peak: int
    floor: int
    complete: bool = False
    methods: frozenset[str] = frozenset()
    bounds: tuple[tuple[str, int], ...] = ()

    @property
    def settled(self) -> bool:
        """Nothing is left to search: a search finished, or the best order is within the floor."""
        return self.complete or self.floor >= self.peak

    def better(self, order: list[int] | None, peak: int) -> "Known":
        """With `order` when it peaks lower than the best so far."""
        if order is None or peak >= self.peak:
            return self
        return replace(self, order=order, peak=peak)

    def raised(self, floor: int, bound: str | None = None) -> "Known":
        """With the floor raised to `floor` (proven); `bound` names the lower bound that proved it."""
        return replace(self, floor=max(self.floor, floor),
                       bounds=self.bounds + (((bound, floor),) if bound else ()))

    def searched(self, r: SearchResult, *methods: str) -> "Known":
        """After a search (`methods` name what ran): its order when it has one (no worse than the
        best so far, by the search's contract), its proven bound, whether it finished."""
        known = replace(self, floor=max(self.floor, r.lower_bound), complete=self.complete or r.complete,
                        methods=self.methods | set(methods))
        return known if r.order is None else replace(known, order=r.order, peak=r.peak)


@dataclass(frozen=True)
class StageContext:
    """What a stage is told besides the piece and what is known about it (stages.py)."""
    params: ScheduleParams
    method: str  # "auto", "dp" or "cpsat" (schedule()'s method)
    deadline: float  # monotonic seconds: the end of the whole call
    seed: int = 0
