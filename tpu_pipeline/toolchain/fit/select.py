"""TASO's selection as a CP-SAT model: one variant per run of spans, fastest under a memory budget.

Wen et al. (TASO) pick one primitive per layer with an ILP whose memory is the SUM of the chosen
primitives' footprints (their Formula 13); an arena's cost is its PEAK, so here memory is a
maximum: `peak >= peak(v)` for every chosen variant `v`, and the constraint is `peak <= budget`.
Each variant covers a contiguous run of spans (`first..last`); the chosen variants cover every span
exactly once. Objectives are lexicographic: latency then memory (`objective="latency"`), or memory
then latency (`"memory"`, optionally under a latency bound). The Pareto frontier is the
epsilon-constraint sweep: the fastest selection, then the fastest one strictly smaller, and so on.

Memory is the arena head (the peak) or, with `tail_fixed` given, the whole arena TFLite Micro
takes: the peak plus the persistent tail, which is additive (each variant brings its ops' part,
`Variant.tail`; `tail_fixed` is the rest): then a variant that shrinks the head but grows the tail
more is never chosen. The budget and the memory objective then count peak + sum(tail) + tail_fixed.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from tpu_pipeline.toolchain.budget import Deadline
from tpu_pipeline.toolchain.cpsat import new_solver
from tpu_pipeline.toolchain.fit.fronts import Arcs, count_within, front_of
from tpu_pipeline.toolchain.fit.variants import Variant

_NS = 1e9  # latency is modelled in integer nanoseconds


@dataclass(frozen=True)
class Selection:
    variants: tuple[Variant, ...]  # in span order
    peak: int  # max of the chosen variants' peaks
    latency_s: float  # sum of their predicted latencies
    proven: bool  # CP-SAT proved the lexicographic optimum
    tail: int = 0  # whole-arena selections: the variants' tails + the fixed part (0: the head alone counted)

    @property
    def arena(self) -> int:
        """What the selection minimises or holds under the budget: the peak, plus the tail when counted."""
        return self.peak + self.tail

    def to_json(self) -> dict:
        return {"peak_bytes": self.peak, "tail_bytes": self.tail or None, "arena_bytes": self.arena,
                "latency_s_predicted": self.latency_s, "proven_optimal": self.proven,
                "variants": [v.to_json() for v in self.variants]}


def select(variants: list[Variant], n_spans: int, *, budget: int | None = None, objective: str = "latency",
           latency_bound: float | None = None, deadline: Deadline | None = None,
           tail_fixed: int | None = None, known: list[Variant] | None = None) -> Selection | None:
    """The best selection, or None when no selection meets `budget` (and `latency_bound`).
    `tail_fixed` None: memory is the peak; an int: the whole arena (module docstring). `known`: an
    optimal selection of the first level (the objective) already found among `variants` (the chain
    DP's, exact): its value stands for the first CP-SAT model's, which then is not solved (the second
    is the same model either way; fit.pool checks its answer against the DP's)."""
    usable = [v for v in variants if budget is None or v.peak + (v.tail + tail_fixed if tail_fixed is not None else 0)
              <= budget]
    if known is not None:
        chosen, proven1 = known, True
    else:
        first = _solve(usable, n_spans, budget, latency_bound, "latency" if objective == "latency" else "memory",
                       None, deadline, tail_fixed)
        if first is None:
            return None
        chosen, proven1 = first
    lat = sum(_ns(v) for v in chosen)
    memory = _arena(chosen, tail_fixed)
    if known is not None and _only_optimum(usable, n_spans, memory, lat, tail_fixed):
        return _selection(sorted(known, key=lambda v: v.first), True, tail_fixed)
    if objective == "latency":  # second level: the least memory at that latency
        second = _solve(usable, n_spans, budget, None, "memory", lat, deadline, tail_fixed)
    else:  # the fastest at that memory
        second = _solve(usable, n_spans, memory, latency_bound, "latency", None, deadline, tail_fixed)
    if second is not None:
        chosen, proven2 = second
    else:
        proven2 = False
    return _selection(chosen, proven1 and proven2, tail_fixed)


def _only_optimum(usable, n_spans: int, memory: int, lat: int, tail_fixed: int | None) -> bool:
    """Whether the chain DP's optimum (`memory`, `lat` ns: optimal on both levels, either way round)
    is the only covering of `usable` with no more of either: then the second level's CP-SAT solve,
    whose answer is an optimal covering, could only find it (most solves of a frontier sweep; where
    ties remain, CP-SAT decides them as it always has)."""
    return count_within(usable, n_spans, memory, lat, {id(v): _ns(v) for v in usable}, tail_fixed) == 1


def _arena(chosen, tail_fixed: int | None) -> int:
    peak = max(v.peak for v in chosen)
    return peak if tail_fixed is None else peak + sum(v.tail for v in chosen) + tail_fixed


def chain_select(variants: list[Variant], n_spans: int, *, budget: int | None = None, objective: str = "latency",
                 latency_bound: float | None = None, tail_fixed: int | None = None,
                 pruned: dict | None = None) -> list[Variant] | None:
    """The same optimum as `select`, by dynamic programming over the chain of spans (a variant is
    an arc from span `first` to `last + 1`): milliseconds for thousands of variants, so the lazy
    evaluation in fit.py can ask it after every variant it measures; the answer `fit` returns is
    `select`'s (CP-SAT) over the measured variants, checked against this one. With `tail_fixed`
    (the whole arena) each cap P on the peak gets the coverings' Pareto front of (tail, latency).
    `pruned`: a dict the caller keeps between calls, so only the groups of variants that changed
    are pruned of dominated ones again (the lazy evaluation asks after every step)."""
    variants = _undominated(variants, pruned)
    if tail_fixed is not None:
        return _chain_whole(variants, n_spans, budget, objective, latency_bound, tail_fixed, pruned)
    usable = [v for v in variants if budget is None or v.peak <= budget]
    if objective == "latency":
        best = _fastest(usable, n_spans)
        if best is None or (latency_bound is not None and best[0] > latency_bound * _NS):
            return None
        return best[2]
    if latency_bound is None:  # the smallest peak of any covering (a minimax path), then the fastest at it
        top = _smallest_peak(usable, n_spans)
        return None if top is None else _fastest([v for v in usable if v.peak <= top], n_spans)[2]
    peaks = sorted({v.peak for v in usable})  # the smallest threshold with a covering (under the bound)
    lo, hi, found = 0, len(peaks) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        best = _fastest([v for v in usable if v.peak <= peaks[mid]], n_spans)
        if best is not None and (latency_bound is None or best[0] <= latency_bound * _NS):
            found, hi = best, mid - 1
        else:
            lo = mid + 1
    return None if found is None else found[2]


def _undominated(variants: list[Variant], cache: dict | None = None) -> list[Variant]:
    """The variants no other of the same spans matches or beats on peak, tail and latency at once
    (of equal ones the first): a best covering never needs the rest. Patch candidates still at
    their bounds are equal across grids, so this keeps one per region until they are estimated.
    `cache`: (first, last) -> (the group's variants, what was kept), reused while the group is the same."""
    ids = tuple(map(id, variants))
    if cache is not None and cache.get("all", (None,))[0] == ids:
        return cache["all"][1]  # (the frontier sweep asks again and again of the same variants)
    groups: dict[tuple[int, int], list[Variant]] = {}
    for v in variants:
        groups.setdefault((v.first, v.last), []).append(v)
    out = []
    for key, group in groups.items():
        group_ids = tuple(map(id, group))
        hit = None if cache is None else cache.get(key)
        if hit is not None and hit[0] == group_ids:
            out += hit[1]
            continue
        kept = _skyline(group)
        if cache is not None:  # (the group's variants are held too, so their ids stay theirs)
            cache[key] = (group_ids, kept, group)
        out += kept
    if cache is not None:  # (the variants held too, so their ids stay theirs)
        cache["all"] = (ids, out, list(variants))
    return out


def _skyline(group: list[Variant]) -> list[Variant]:
    """The variants of `group`, by (peak, tail, latency) (stable: ties keep their order), that no
    earlier one matches or beats on tail and latency at once (its peak is no higher). The kept
    ones' (tail, latency) staircase answers each in a bisection: tails ascending, latencies
    descending, the least latency at a tail at most v's is the last step at or below it."""
    kept: list[Variant] = []
    tails: list[int] = []  # the staircase: tails ascending
    lats: list[float] = []  # and their latencies, descending
    for v in sorted(group, key=lambda v: (v.peak, v.tail, v.latency_s)):
        k = bisect.bisect_right(tails, v.tail)
        if k and lats[k - 1] <= v.latency_s:
            continue  # an earlier one has a tail and a latency no larger
        kept.append(v)
        j = k
        while j < len(tails) and lats[j] >= v.latency_s:  # the steps v now beats (tails >= v's)
            j += 1
        if k and tails[k - 1] == v.tail:  # (a step at v's tail is slower: v replaces it)
            k -= 1
        tails[k:j], lats[k:j] = [v.tail], [v.latency_s]
    return kept


def _smallest_peak(variants: list[Variant], n_spans: int) -> int | None:
    """The least max-peak over coverings of the spans (None if the variants cover none)."""
    best: list = [None] * (n_spans + 1)
    best[0] = 0
    for v in sorted(variants, key=lambda v: v.last):
        prev = best[v.first]
        if prev is not None:
            cand = max(prev, v.peak)
            if best[v.last + 1] is None or cand < best[v.last + 1]:
                best[v.last + 1] = cand
    return best[n_spans]


def _fastest(variants: list[Variant], n_spans: int, ns: dict | None = None):
    """(latency ns, peak, variants) of the covering that is fastest, then smallest; None if none.
    `ns`: the variants' latencies in ns by id (else computed)."""
    ns = ns if ns is not None else {id(v): _ns(v) for v in variants}
    ending: dict[int, list[Variant]] = {}
    for v in variants:
        ending.setdefault(v.last + 1, []).append(v)
    best: list = [None] * (n_spans + 1)
    best[0] = (0, 0, [])
    for s in range(1, n_spans + 1):
        for v in ending.get(s, ()):
            prev = best[v.first]
            if prev is None:
                continue
            cand = (prev[0] + ns[id(v)], max(prev[1], v.peak), prev[2] + [v])
            if best[s] is None or cand[:2] < best[s][:2]:
                best[s] = cand
    return best[n_spans]


def _chain_whole(variants, n_spans, budget, objective, latency_bound, tail_fixed,
                 cache: dict | None = None) -> list[Variant] | None:
    """chain_select for the whole arena: for each cap P on the peak (the distinct variant peaks),
    the coverings by variants of peak <= P; a covering's arena is P + its tail + tail_fixed (no
    more than that: its own peak may be lower, which a lower P also covers). Memory first: the
    least arena (`_least_arena`), then the fastest at it. Latency first: caps fall from the
    highest, each giving the fastest covering within the budget, until the fastest covering under
    the cap, whatever its tail, is no faster than the best; then the least arena at that latency
    (memory first, bounded by it). Under a cap the fastest covering (of least tail) settles it
    when its tail fits; only where it does not is the Pareto front of (tail, latency) walked."""
    room = None if budget is None else budget - tail_fixed
    usable = [v for v in variants if room is None or v.peak <= room]
    chain = _chain_of(variants, n_spans, cache)  # (on every variant: no cap asked is above the room)
    ns = chain.ns
    bound = None if latency_bound is None else latency_bound * _NS
    if objective == "memory":
        return _least_arena(chain, usable, n_spans, ns, room, tail_fixed, bound)
    fastest_ns = None
    for cap in sorted({v.peak for v in usable}, reverse=True):
        quickest = chain.best(cap, None, latency_first=True)
        if not quickest or (fastest_ns is not None and quickest[0][1] >= fastest_ns) \
                or (bound is not None and quickest[0][1] > bound):
            break  # a lower cap has fewer variants: nothing faster below
        max_tail = None if room is None else room - cap
        if max_tail is None or quickest[0][0] <= max_tail:
            fastest_ns = quickest[0][1]  # the fastest under this cap fits: nothing under it is faster
            continue
        if quickest[0][0] + max(v.peak for v in quickest[0][2]) <= room:
            # it fits under its own peak, a lower cap: no covering under this cap or a lower one
            # is faster, and the caps between would only walk fronts that cannot beat it
            fastest_ns = quickest[0][1] if fastest_ns is None else min(fastest_ns, quickest[0][1])
            break
        if not chain.best(cap, max_tail):
            continue  # no covering under this cap fits the budget
        top = None if fastest_ns is None else fastest_ns - 1  # only a faster one matters
        top = bound if top is None else top if bound is None else min(top, bound)
        for _, lat, _ in chain.front(cap, max_tail, top):
            if fastest_ns is None or lat < fastest_ns:
                fastest_ns = lat
    if fastest_ns is None:
        return None
    return _least_arena(chain, usable, n_spans, ns, room, tail_fixed, fastest_ns)


def _chain_of(variants, n_spans: int, cache: dict | None) -> "_Chain":
    """The _Chain of these variants, kept in `cache` while they stay the same: the frontier sweep
    asks of the same variants under one budget after another, and a cap's shortest paths do not
    depend on the budget."""
    ids = (n_spans, tuple(map(id, variants)))
    hit = None if cache is None else cache.get("chain")
    if hit is not None and hit[0] == ids:
        return hit[1]
    shared = None if cache is None else cache.setdefault("arcs", {})
    chain = _Chain(variants, n_spans, {id(v): _ns(v) for v in variants}, shared)
    if cache is not None:
        cache["chain"] = (ids, chain)  # (the chain holds its variants: their ids stay theirs)
    return chain


def _least_arena(chain, usable, n_spans, ns, room, tail_fixed, bound) -> list[Variant] | None:
    """The covering of least arena (cap + tail + tail_fixed, within `room` for cap + tail), then
    the fastest, with latency at most `bound` ns (None: any). Per cap, the covering of least
    (tail, latency) (a lexicographic shortest path); with a bound, where that one could still
    win, the Pareto front of (tail, latency) within the bound. Caps rise from the lowest that
    any covering (within the bound) fits under until a cap plus the least tail of any covering
    passes the best arena."""
    caps = sorted({v.peak for v in usable})
    least = chain.best(caps[-1], None) if caps else []
    if not least:
        return None
    lowest = _smallest_peak(usable, n_spans)  # (no covering under a lower cap)
    if bound is not None:  # the lowest cap with a covering within the bound (fastest: falls as caps rise)
        lo, hi = 0, len(caps) - 1
        if chain.best(caps[-1], None, latency_first=True)[0][1] > bound:
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            quickest = chain.best(caps[mid], None, latency_first=True)
            lo, hi = (lo, mid) if quickest and quickest[0][1] <= bound else (mid + 1, hi)
        lowest = max(lowest, caps[lo])
    best = None  # ((arena, latency), variants)
    for cap in (c for c in caps if c >= lowest):
        if best is not None and cap + least[0][0] + tail_fixed > best[0][0]:
            break  # no covering under this cap or a higher one can have a smaller arena
        max_tail = None if room is None else room - cap
        front = chain.best(cap, max_tail)
        if not front or (best is not None and cap + front[0][0] + tail_fixed > best[0][0]):
            continue  # none fits, or none under this cap beats the best
        if bound is not None and front[0][1] > bound:
            front = chain.front(cap, max_tail, bound)
        for tail, lat, chosen in front:
            if bound is None or lat <= bound:
                key = (cap + tail + tail_fixed, lat)
                if best is None or key < best[0]:
                    best = (key, chosen)
    return None if best is None else best[1]


def _by_end(variants) -> dict[int, list[Variant]]:
    ending: dict[int, list[Variant]] = {}
    for v in variants:
        ending.setdefault(v.last + 1, []).append(v)
    return ending


def _unwind(label) -> list[Variant]:
    """The variants of a DP label (tail, latency, previous label, variant), first span first."""
    out = []
    while label[3] is not None:
        out.append(label[3])
        label = label[2]
    return out[::-1]


class _Chain:
    """Lexicographic shortest paths over one set of variants under many caps on the peak: per end
    span, numpy arrays of the variants ending there, and keys that order by tail then latency
    (tail x 2^40 + latency ns) or by latency then tail (latency ns x 2^22 + tail): exact while a
    covering's sums stay below 2^22 bytes and 2^40 ns; otherwise the plain DP."""

    _SHIFT, _TAIL = 1 << 40, 1 << 22

    def __init__(self, variants, n_spans: int, ns: dict, arcs: dict | None = None):
        self.n = n_spans
        self.variants = list(variants)
        most_tail = max((v.tail for v in self.variants), default=0)  # a covering sums at most n_spans of each
        most_ns = max((ns[id(v)] for v in self.variants), default=0)
        self.exact = n_spans * most_tail < self._TAIL and n_spans * most_ns < self._SHIFT
        m = len(self.variants)
        first = np.fromiter((v.first for v in self.variants), np.int64, m)
        end = np.fromiter((v.last + 1 for v in self.variants), np.int64, m)
        peak = np.fromiter((v.peak for v in self.variants), np.int64, m)
        self._tails = np.fromiter((v.tail for v in self.variants), np.int64, m)
        self._lat = np.fromiter((ns[id(v)] for v in self.variants), np.int64, m)
        tail, lat = (self._tails, self._lat) if self.exact else (np.zeros(m, np.int64), np.zeros(m, np.int64))
        keys = (tail * self._SHIFT + lat, lat * self._TAIL + tail)
        order = np.argsort(end, kind="stable")
        ends, starts = np.unique(end[order], return_index=True)
        self.by_end = {}  # end span -> (variant indices, first spans, peaks, keys tail first, keys latency first)
        for e, ks in zip(ends.tolist(), np.split(order, starts[1:])):
            self.by_end[e] = (ks, first[ks], peak[ks], keys[0][ks], keys[1][ks])
        self.ns = ns
        self._first, self._end = first, end
        # under a cap the peak no longer matters: per group of spans, only the variants no other
        # of the group beats on tail and latency (`under`); sorted by group, tail, latency once
        lat = self._lat
        group = first * (n_spans + 1) + end
        self._sorted = np.lexsort((lat, self._tails, group))
        self._group, self._peak = group[self._sorted], peak[self._sorted]
        ranks = np.unique(self._group, return_inverse=True)[1].reshape(-1)
        big = int(lat.max(initial=0)) + 1
        # a group's latencies lifted above every later group's: a running minimum restarts per group
        self._lifted = lat[self._sorted] + (int(ranks.max(initial=0)) - ranks) * big
        self._under: dict[int, tuple] = {}  # cap -> (its variants, their indices): under()
        self._fronts: dict[int, tuple] = {}  # cap -> (max tail, max latency, its front): front()
        self._arcs: dict[int, Arcs] = {}  # cap -> its variants as arcs: front()
        # (variants, by identity) -> their Arcs, shared by the chains of one selection: after a
        # build the chain is new, but most caps keep the variants they had (the Arcs hold them:
        # their ids stay theirs)
        self._shared = {} if arcs is None else arcs
        self._caps = np.unique(peak)  # (sorted)
        self._rows = ({}, {})  # [latency_first]: cap -> (key, picks), filled block by block (_row)
        self._last, self._size = [None, None], [32, 32]  # [latency_first]: the last cap asked, the next block

    def under(self, cap: int) -> list:
        """The variants of peak <= cap that no other of their group (same spans) matches or beats
        on tail and latency at once: a Pareto front of coverings never needs the rest."""
        if cap not in self._under:
            ok = self._peak <= cap
            lifted, group = self._lifted[ok], self._group[ok]
            if lifted.size == 0:
                return []
            before = np.concatenate(([np.iinfo(np.int64).max], np.minimum.accumulate(lifted)[:-1]))
            keep = np.concatenate(([True], group[1:] != group[:-1])) | (lifted < before)
            if len(self._under) > 64:
                self._under.clear()
            at = self._sorted[ok][keep]
            self._under[cap] = ([self.variants[int(k)] for k in at], at)
        return self._under[cap][0]

    def front(self, cap: int, max_tail: int | None, max_lat: int | None):
        """fronts.front_of the variants under `cap` within the limits. A front within wider limits holds
        it (whatever beats a point within the limits is within them too): the last one asked per
        cap is kept and read while the limits narrow, as they do from one budget to the next."""
        hit = self._fronts.get(cap)
        if hit is not None and _within(max_tail, hit[0]) and _within(max_lat, hit[1]):
            return [f for f in hit[2] if _within(f[0], max_tail) and _within(f[1], max_lat)]
        arcs = self._arcs.get(cap)
        if arcs is None:  # (what no limit changes, made once per cap, or per set of variants)
            under = self.under(cap)
            key = (self.n, tuple(map(id, under)))
            arcs = self._shared.get(key)
            if arcs is None:
                at = self._under[cap][1] if under else np.zeros(0, np.int64)
                arcs = Arcs(under, self._first[at], self._end[at], self._tails[at], self._lat[at], self.n)
                if len(self._shared) >= 512:
                    self._shared.clear()
                self._shared[key] = arcs
            if len(self._arcs) > 64:
                self._arcs.clear()
            self._arcs[cap] = arcs
        out = front_of(arcs, max_tail, max_lat)
        self._fronts[cap] = (max_tail, max_lat, out)
        return out

    def best(self, cap: int, max_tail: int | None, latency_first: bool = False):
        """[(tail, latency ns, variants)] of the least-(tail, latency) covering (`latency_first`:
        the least (latency, tail)) by variants of peak <= cap, with tail <= max_tail; [] when none."""
        if not self.exact:
            under = [v for v in self.variants if v.peak <= cap]
            if latency_first:
                quick = _fastest(under, self.n, self.ns)
                return [] if quick is None else [(sum(v.tail for v in quick[2]), quick[0], quick[2])]
            return _least_tail(under, self.n, self.ns, max_tail)
        key, pick = self._row(cap, latency_first)
        if key is None:
            return []
        if latency_first:
            lat, tail = divmod(key, self._TAIL)
        else:
            tail, lat = divmod(key, self._SHIFT)
        if max_tail is not None and tail > max_tail:
            return []
        chosen, at = [], self.n
        while at > 0:
            v = self.variants[int(pick[at])]
            chosen.append(v)
            at = v.first
        return [(tail, lat, chosen[::-1])]

    def _row(self, cap: int, latency_first: bool):
        """(the least key or None, the variant picked per end span) under `cap`. The selection asks
        cap after cap (falling in the latency-first sweep, rising for the least arena): a miss
        solves a block of the caps next in the direction it moves, all at once (one array pass per
        end span over caps x variants), the block doubling while the misses go on."""
        cache = self._rows[latency_first]
        if cap not in cache:
            at = int(np.searchsorted(self._caps, cap))
            if at == len(self._caps) or self._caps[at] != cap:
                caps = np.array([cap], dtype=np.int64)  # (not a variant's peak: alone)
            else:
                last, size = self._last[latency_first], self._size[latency_first]
                down = last is not None and cap < last
                lo, hi = (max(0, at - size + 1), at + 1) if down else (at, min(len(self._caps), at + size))
                caps = self._caps[lo:hi]
                self._size[latency_first] = min(2 * size, self._MAX_BLOCK)
            self._last[latency_first] = cap
            self._solve_caps(caps, latency_first, cache)
        return cache[cap]

    _MAX_BLOCK = 256

    def _solve_caps(self, caps, latency_first: bool, cache: dict) -> None:
        none = np.iinfo(np.int64).max
        k = len(caps)
        best = np.full((k, self.n + 1), none, dtype=np.int64)
        best[:, 0] = 0
        pick = np.full((k, self.n + 1), -1, dtype=np.int64)
        rows = np.arange(k)
        for end in range(1, self.n + 1):
            if end not in self.by_end:
                continue
            idx, first, peak, by_tail, by_lat = self.by_end[end]
            prev = best[:, first]
            ok = (peak[None, :] <= caps[:, None]) & (prev != none)
            cand = np.where(ok, prev + (by_lat if latency_first else by_tail)[None, :], none)
            at = np.argmin(cand, axis=1)
            best[:, end], pick[:, end] = cand[rows, at], idx[at]
        for r, c in enumerate(caps.tolist()):
            key = int(best[r, self.n])
            cache[c] = (None, None) if key == none else (key, pick[r])


def _within(limit: int | None, wider: int | None) -> bool:
    """A limit (None: none) no wider than `wider`."""
    return wider is None or (limit is not None and limit <= wider)


def _least_tail(variants, n_spans: int, ns: dict, max_tail: int | None):
    """[(tail, latency ns, variants)] of the covering with the least tail, then the least latency
    (at most `max_tail`); [] when none."""
    ending = _by_end(variants)
    best: list = [None] * (n_spans + 1)
    best[0] = (0, 0, None, None)
    for s in range(1, n_spans + 1):
        for v in ending.get(s, ()):
            prev = best[v.first]
            if prev is None:
                continue
            cand = (prev[0] + v.tail, prev[1] + ns[id(v)], prev, v)
            if best[s] is None or cand[:2] < best[s][:2]:
                best[s] = cand
    end = best[n_spans]
    if end is None or (max_tail is not None and end[0] > max_tail):
        return []
    return [(end[0], end[1], _unwind(end))]


MAX_FRONTIER_POINTS = 256  # a whole-arena frontier steps by a few bytes of tail: TinyEngine's vww has more than 64


def pareto(choose, deadline: Deadline | None = None, max_points: int = MAX_FRONTIER_POINTS) -> list[Selection]:
    """The time/memory frontier, fastest first, by the epsilon-constraint sweep: `choose(budget)`
    gives the fastest selection with a peak <= budget (ties to the smaller peak; None when there is
    none); each next point is asked for strictly less memory than the previous one."""
    points: list[Selection] = []
    budget = None
    while len(points) < max_points and not (deadline is not None and deadline.expired()):
        sel = choose(budget)
        if sel is None:
            break
        points.append(sel)
        budget = sel.arena - 1
    return points


def _ns(v: Variant) -> int:
    return int(round(v.latency_s * _NS))


def _solve(variants, n_spans, budget, latency_bound, minimise, latency_cap, deadline, tail_fixed=None):
    if not variants:
        return None
    m, x, peak = _model(variants, n_spans)
    memory = peak
    if tail_fixed is not None:  # the whole arena: the head and the tail
        memory = peak + cp_model.LinearExpr.weighted_sum(x, [v.tail for v in variants]) + tail_fixed
    if budget is not None:
        m.Add(memory <= budget)
    latency = cp_model.LinearExpr.weighted_sum(x, [_ns(v) for v in variants])
    if latency_bound is not None:
        m.Add(latency <= int(latency_bound * _NS))
    if latency_cap is not None:
        m.Add(latency <= latency_cap)
    m.Minimize(latency if minimise == "latency" else memory)
    seconds = 10.0 if deadline is None else max(0.05, deadline.remaining())
    solver = new_solver(seconds, workers=1)
    status = solver.Solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    chosen = [v for k, v in enumerate(variants) if solver.Value(x[k])]
    return sorted(chosen, key=lambda v: v.first), status == cp_model.OPTIMAL


def _model(variants, n_spans: int):
    """(model, x, peak): the CP-SAT model every selection shares, one literal per variant (x),
    every span covered exactly once, `peak` at least each chosen variant's. (The same model,
    constraint for constraint, as one made span by span over all the variants: the cover lists in
    one pass; the pareto sweep makes hundreds of these.)"""
    m = cp_model.CpModel()
    x = [m.NewBoolVar(f"v{k}") for k in range(len(variants))]
    cover: list[list] = [[] for _ in range(n_spans)]
    for k, v in enumerate(variants):
        for s in range(v.first, v.last + 1):
            cover[s].append(x[k])
    for s in range(n_spans):  # every span covered exactly once
        m.AddExactlyOne(cover[s])
    peak = m.NewIntVar(0, max(v.peak for v in variants), "peak")
    for k, v in enumerate(variants):
        m.Add(peak >= v.peak).OnlyEnforceIf(x[k])
    return m, x, peak


def _selection(chosen, proven, tail_fixed=None) -> Selection:
    tail = 0 if tail_fixed is None else sum(v.tail for v in chosen) + tail_fixed
    return Selection(tuple(chosen), max(v.peak for v in chosen), sum(v.latency_s for v in chosen), proven, tail)
