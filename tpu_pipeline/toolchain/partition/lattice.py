"""The exact `latency` partition by dynamic programming over the graph's down-sets.

A valid assignment of ops to n stages is a chain of down-sets (sets closed under predecessors)
D_0 < D_1 < ... < D_{n-2} of the graph, D_k = the ops in stages 0..k, strictly growing, the last
one without the ops that must be in the last stage. A stage's cost depends only on the two
down-sets around it: its ops are D_k minus D_{k-1}; a boundary tensor enters it iff its producer
is in D_{k-1} (or it is a graph input) and a consumer is in the stage; it leaves it iff its
producer is in the stage and a consumer is outside D_k (or it is a graph output). So the period
bound P = max(slowest stage, shared-link work, host work) (see cpsat.py) is minimised exactly by a
dynamic programme over chains, as long as the down-sets can be listed: CNNs built from blocks have
about as many down-sets as ops (ResNet152: 224 for 211 ops; DenseNet201: 512 for 511), a random
wiring has more (randwire_small: 10,673 for 92), a wide cell network too many (then CP-SAT).

With the stage costs of every pair of down-sets as matrices, per threshold T:

    g_k(D)  = min over chains of k+1 stages ending at D of the slowest stage     (min-max)
    f_T,k(D) = min over those whose every stage is <= T of the summed link work   (min-sum)

and P* = max(host work, the smallest T with f_T(V) <= T): the chain that attains P* has every
stage and its link work <= P*, and f_T(V) <= T gives a chain whose P is <= T. T is found by
bisection between max(g(V), f_UB(V)) and an upper bound UB. Every answer is exact (integer
picoseconds, the cost model's own formula): no tolerance is needed, it is proven.

`ChainProblem.chains` lists the chains whose P is below a threshold, smallest P first (the
simulated period is never below P, so these are the only candidates that can beat an incumbent's
simulated period): A* with the smallest slowest stage and link work any completion can have.
`refine_chains` simulates them in that order. Only the down-sets whose stages can fit under an
upper bound are costed (their compute and parameters bound where each cut can be), from both
ends inwards, each layer pruning the next; that is what keeps randwire_small at 1.3 M pairs.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass

import numpy as np

from tpu_pipeline.toolchain.partition.problem import PartitionProblem
from tpu_pipeline.toolchain.partition.search import Refined, SolveResult

# Listing the down-sets stops past this many: the pair matrices grow with its square.
MAX_DOWNSETS = 12000
# ... and the chain problem once it has costed this many pairs of down-sets (~3 s on one loaded
# core; randwire_small needs 1.3 M for n=4, 14.6 M for n=6), costed this many at a time.
MAX_PAIRS = 16_000_000
CHUNK = 500_000
# The refinement's listing expands at most this many partial chains per candidate it may simulate
# (DenseNet201, n=6: ~1,000 per chain listed, 40 chains in 1.8 s of one loaded core).
EXPANSIONS_PER_CANDIDATE = 500
# The tie-break lists at most this many chains of the optimal period when the link term binds.
MAX_TIED = 2000
INF = np.iinfo(np.int64).max // 4


def downsets(problem: PartitionProblem, limit: int | None = None) -> list[int] | None:
    """Every down-set of the graph that keeps each state group whole (all of its ops or none: a
    cut between them would split a variable across two interpreters), as an int bit mask (bit v =
    op v), by size; None past `limit` (default MAX_DOWNSETS) of down-sets enumerated."""
    limit = MAX_DOWNSETS if limit is None else limit
    N = problem.n_ops
    pred = [0] * N
    for v in range(N):
        for u in problem.preds[v]:
            pred[v] |= 1 << u
    succs = problem.succs
    ready0 = sum(1 << v for v in range(N) if pred[v] == 0)
    level = {0: ready0}   # down-set -> ops that may be added next
    out = [0]
    while level:
        nxt: dict[int, int] = {}
        for d, ready in level.items():
            r = ready
            while r:
                low = r & -r
                v = low.bit_length() - 1
                r ^= low
                e = d | low
                if e in nxt:
                    continue
                add = ready & ~low
                for s in succs[v]:
                    if pred[s] & ~e == 0:
                        add |= 1 << s
                nxt[e] = add
        out.extend(nxt)
        if len(out) > limit:
            return None
        level = nxt
    groups = [sum(1 << v for v in g) for g in problem.state_groups]
    return [d for d in out if all(d & g in (0, g) for g in groups)]


class Lattice:
    """The down-sets of one problem and the exact stage costs between them."""

    def __init__(self, problem: PartitionProblem, masks: list[int]):
        self.problem = problem
        p, m = problem, problem.model
        N, M = p.n_ops, len(masks)
        self.masks = masks
        nbytes = (N + 7) // 8
        raw = np.frombuffer(b"".join(d.to_bytes(nbytes, "little") for d in masks), dtype=np.uint8)
        X = np.unpackbits(raw.reshape(M, nbytes), axis=1, bitorder="little")[:, :N]
        # the per-tensor arrays are built tensor by tensor, so as rows (tensor, down-set), and
        # turned into the (down-set, feature) matrices the pair costs gather rows of at the end
        XT = np.ascontiguousarray(X.T).astype(np.float64)
        X = X.astype(np.float64)
        tensors = p.tensors
        T = len(tensors)
        nb = np.array([bt.nbytes for bt in tensors], dtype=np.float64)
        is_input = np.array([bt.producer is None for bt in tensors], dtype=bool)
        gout = np.array([bt.graph_output for bt in tensors], dtype=bool)
        # per tensor: its producer's row of XT (inputs: none), the sum of its consumers' rows
        inside = np.zeros((T, M))                          # producer in the down-set
        cnt = np.zeros((T, M))                             # consumers in the down-set
        ncons = np.zeros(T)
        for t, bt in enumerate(tensors):
            if bt.producer is not None:
                inside[t] = XT[bt.producer]
            users = sorted(set(bt.consumers))
            ncons[t] = len(users)
            if users:
                cnt[t] = XT[users].sum(0)
        pin = inside.copy()
        pin[is_input] = 1                                  # graph inputs: produced before every stage
        leaves = inside * ((cnt < ncons[:, None]) | gout[:, None])  # produced inside, read outside or a graph output
        multi = ncons > 1
        # Bytes through the host of the stage between down-sets D' and D (D' a proper subset):
        #   in  = sum_t nb_t pin(D') [a consumer in D, none of them only in D']
        #   out = sum_t nb_t leaves(D) - sum_t nb_t pin(D') leaves(D)      (pin of an input: leaves 0)
        # For a tensor with one consumer [consumer in D \ D'] = cnt(D) - cnt(D'), so everything but
        # the multi-consumer tensors is one matrix product A(D') . B(D) plus a term per side.
        single = ~multi
        # integers below 2**24 are exact in float32, which halves the products' cost
        exact32 = 2 * nb.sum() < 2**24 and N < 2**24
        ft = np.float32 if exact32 else np.float64
        A = np.vstack([pin[single] * nb[single][:, None], -pin * nb[:, None]])
        B = np.vstack([cnt[single], leaves])
        self.A, self.B = np.ascontiguousarray(A.T, dtype=ft), np.ascontiguousarray(B.T, dtype=ft)
        self.row_const = np.rint(-nb[single] @ (pin[single] * cnt[single])).astype(np.int64)
        self.col_const = np.rint(nb @ leaves).astype(np.int64)
        self.multi = [(nb[t], pin[t].astype(np.int8), cnt[t].astype(np.int8)) for t in np.flatnonzero(multi)]
        self.X = X.astype(ft)
        # the masks as 64-bit words: D' is a subset of D iff no word of D' has a bit outside D's
        pad = (-nbytes) % 8
        self.words = np.ascontiguousarray(np.pad(raw.reshape(M, nbytes), ((0, 0), (0, pad)))).view(np.uint64)
        self.size = X.sum(1).astype(np.int64)
        self.comp = (X @ np.array([oc.compute_ps for oc in p.op_costs], dtype=np.float64)).astype(np.int64)
        self.par = (X @ np.array([oc.param_bytes for oc in p.op_costs], dtype=np.float64)).astype(np.int64)
        self.ppb, self.over, self.sram, self.overlap = m.ps_per_byte, m.overhead_ps, m.sram_bytes, m.overlap

    def __len__(self) -> int:
        return len(self.masks)

    def pair_costs(self, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(latency, link work) in ps of the stage between down-set rows[i] and cols[j] (the
        stage's ops: cols[j] minus rows[i]); INF where rows[i] is not a proper subset of cols[j]."""
        size_r, size_c = self.size[rows][:, None], self.size[cols][None, :]
        wr, wc = self.words[rows], self.words[cols]
        outside = np.zeros((len(rows), len(cols)), dtype=bool)
        for w in range(wr.shape[1]):
            outside |= (wr[:, w][:, None] & ~wc[:, w][None, :]) != 0
        subset = ~outside & (size_c > size_r)
        moved = self.A[rows] @ self.B[cols].T
        moved = np.rint(moved).astype(np.int64) + self.row_const[rows][:, None] + self.col_const[cols][None, :]
        for w, pin, cnt in self.multi:
            sel = np.flatnonzero(pin[rows])
            if len(sel):
                moved[sel] += int(w) * (cnt[cols][None, :] > cnt[rows[sel]][:, None])
        comp = self.comp[cols][None, :] - self.comp[rows][:, None]
        stream = self.ppb * np.maximum(0, (self.par[cols][None, :] - self.par[rows][:, None]) - self.sram)
        transfer = self.ppb * moved
        link = stream + transfer
        lat = self.over + transfer + (np.maximum(comp, stream) if self.overlap else comp + stream)
        lat[~subset] = INF
        link[~subset] = INF
        return lat, link


@dataclass
class _Layer:
    rows: np.ndarray     # down-set indices before the stage
    cols: np.ndarray     # down-set indices after it
    lat: np.ndarray      # (rows, cols) stage latency, INF where no stage fits
    link: np.ndarray     # (rows, cols) its link work


def cut_windows(lattice: Lattice, n: int, ub: int) -> list[np.ndarray]:
    """For each cut k < n-1, the down-sets D_k can be if every stage fits under ub: stages
    0..k hold its compute and parameters (each stage at most ub - overhead of compute and of
    parameter stream), stages k+1..n-1 the rest, each stage non-empty, the last-stage ops after it."""
    p, L, m = lattice.problem, lattice, lattice.problem.model
    M, N = len(lattice), p.n_ops
    last = np.zeros(N, dtype=bool)
    last[list(p.last_stage_ops)] = True
    no_last = (L.X[:, last].sum(1) == 0) if last.any() else np.ones(M, dtype=bool)
    cap = ub - m.overhead_ps
    cap_par = m.sram_bytes + cap // m.ps_per_byte
    tc, tp = L.comp[-1], L.par[-1]
    cuts = []
    for k in range(n - 1):
        ok = (no_last & (L.size >= k + 1) & (N - L.size >= n - 1 - k)
              & (L.comp <= (k + 1) * cap) & (tc - L.comp <= (n - 1 - k) * cap)
              & (L.par <= (k + 1) * cap_par) & (tp - L.par <= (n - 1 - k) * cap_par))
        cuts.append(np.flatnonzero(ok))
    return cuts


def pairs_at_most(lattice: Lattice, n: int, ub: int) -> int:
    """How many pairs a chain problem under ub costs at most (before any pruning)."""
    ends = [np.array([0])] + cut_windows(lattice, n, ub) + [np.array([len(lattice) - 1])]
    return sum(len(a) * len(b) for a, b in zip(ends, ends[1:]))


class ChainProblem:
    """All chains of n stages whose every stage fits under `ub` (an upper bound of the optimal P):
    the layers of pair costs, and the exact searches over them."""

    def __init__(self, lattice: Lattice, n: int, ub: int):
        self.lattice, self.n, self.ub = lattice, n, ub
        m = lattice.problem.model
        self.host = -(-n * m.overhead_ps // m.host_slots) if m.host_slots else 0
        self.layers: list[_Layer] = []
        self.pairs = 0
        self.exceeded = False     # stopped at MAX_PAIRS (not: no chain fits under ub)
        # The layers (stage j between ends[j] and ends[j+1]) are computed from both ends inwards,
        # the cheaper side first, each pruning the next: a down-set no chain reaches (from the
        # empty set, or on to V) under ub is dropped before its pairs are costed.
        ends = [np.array([0])] + cut_windows(lattice, n, ub) + [np.array([len(lattice) - 1])]
        done: dict[int, _Layer] = {}
        lo, hi = 0, n - 1
        while lo <= hi and all(len(e) for e in ends):
            front, back = len(ends[lo]) * len(ends[lo + 1]), len(ends[hi]) * len(ends[hi + 1])
            j = lo if front <= back else hi
            if self.pairs + min(front, back) > MAX_PAIRS:
                self.exceeded = True
                return
            layer = self._layer(ends[j], ends[j + 1], forward=j == lo)
            if j == lo:
                ends[lo + 1] = layer.cols
                lo += 1
            if j == hi:
                keep = (layer.lat < INF).any(1)
                layer = _Layer(layer.rows[keep], layer.cols, layer.lat[keep], layer.link[keep])
                ends[hi] = layer.rows
                hi -= 1
            done[j] = layer
        if lo <= hi or not all(len(e) for e in ends):
            return  # no chain fits under ub
        for j in range(n):
            layer = done[j]
            r, c = np.isin(layer.rows, ends[j]), np.isin(layer.cols, ends[j + 1])
            self.layers.append(_Layer(layer.rows[r], layer.cols[c], layer.lat[np.ix_(r, c)], layer.link[np.ix_(r, c)]))

    def _layer(self, rows: np.ndarray, cols: np.ndarray, forward: bool) -> "_Layer":
        """The pair costs from `rows` to `cols` under ub, costed in chunks; forward: only the
        columns some row reaches are kept, else only the rows that reach some column."""
        self.pairs += len(rows) * len(cols)
        along = cols if forward else rows
        step = max(1, CHUNK // max(1, len(rows) if forward else len(cols)))
        kept, lats, links = [], [], []
        for i in range(0, len(along), step):
            part = along[i:i + step]
            lat, link = self.lattice.pair_costs(rows, part) if forward else self.lattice.pair_costs(part, cols)
            over = lat > self.ub
            lat[over] = INF
            link[over] = INF
            ok = (lat < INF).any(0 if forward else 1)
            kept.append(part[ok])
            lats.append(lat[:, ok] if forward else lat[ok])
            links.append(link[:, ok] if forward else link[ok])
        join = np.hstack if forward else np.vstack
        if forward:
            return _Layer(rows, np.concatenate(kept), join(lats), join(links))
        return _Layer(np.concatenate(kept), cols, join(lats), join(links))

    @property
    def ok(self) -> bool:
        return bool(self.layers)

    # ---- the three dynamic programmes -------------------------------------------------------
    def _forward(self, value, combine):
        """Generic forward DP: value per column of the first layer, then combine(prev, layer)
        -> (candidates (rows, cols)); returns the per-layer argmins and the final value."""
        back = []
        cur = value(self.layers[0])[0]
        for layer in self.layers[1:]:
            cand = combine(cur, layer)
            arg = cand.argmin(0)
            cur = np.minimum(cand[arg, np.arange(cand.shape[1])], INF)
            back.append(arg)
        return cur[0], back

    def _chain(self, back) -> tuple[int, ...]:
        """Stage of each op of the chain the argmins `back` lead to (from V backwards)."""
        j, masks = 0, [self.lattice.masks[-1]]
        for k in range(self.n - 1, 0, -1):
            j = int(back[k - 1][j])
            masks.append(self.lattice.masks[int(self.layers[k].rows[j])])
        return self.stages_of(masks[::-1])

    def stages_of(self, masks) -> tuple[int, ...]:
        """Stage of each op, from the down-sets D_0 .. D_{n-2}, V as bit masks."""
        stages = [0] * self.lattice.problem.n_ops
        for k in range(len(masks) - 1, -1, -1):
            d = masks[k]
            while d:
                low = d & -d
                stages[low.bit_length() - 1] = k
                d ^= low
        return tuple(stages)

    def min_max_stage(self) -> int:
        """The smallest slowest stage over all chains (link work ignored)."""
        val, _ = self._forward(lambda L: L.lat, lambda cur, L: np.maximum(cur[:, None], L.lat))
        return int(val)

    def min_link(self, limit: int) -> tuple[int, tuple[int, ...] | None]:
        """The smallest link work over the chains whose every stage is <= limit, and one such chain."""
        return self._min_total(limit, lambda L: L.link)

    def min_sum_stage(self, limit: int) -> tuple[int, tuple[int, ...] | None]:
        """The smallest sum of stage latencies over the chains whose every stage is <= limit."""
        return self._min_total(limit, lambda L: L.lat)

    def _min_total(self, limit: int, cost) -> tuple[int, tuple[int, ...] | None]:
        """The smallest sum of `cost(layer)` over the chains whose every stage is <= limit, and one
        such chain (INF, None when there is none)."""
        def first(L):
            return np.where(L.lat <= limit, cost(L), INF)

        def step(cur, L):
            return np.where(L.lat <= limit, cur[:, None] + cost(L), INF)

        val, back = self._forward(first, step)
        return (int(val), self._chain(back)) if val < INF else (INF, None)

    def link_of(self, stages) -> int:
        return sum(s.link_ps for s in self.lattice.problem.stage_costs(stages, self.n))

    def min_period(self) -> tuple[int, tuple[int, ...]]:
        """The smallest P over all chains (exact) and a chain that attains it.

        T* = the smallest T with f(T) <= T, f(T) = the smallest link work of the chains whose every
        stage is <= T (non-increasing in T); P* = max(T*, host work). Bisection on integers between
        max(min-max stage, f(ub)) (no T below has f(T) <= T) and the P of a chain found."""
        p = self.lattice.problem
        lo = max(self.min_max_stage(), self.min_link(self.ub)[0])
        f, chain = self.min_link(lo)
        if f <= lo:
            self.p_star = max(lo, self.host)
            return self.p_star, chain
        f, chain = self.min_link(self.ub)
        hi = max(p.objectives(chain, self.n)["max_stage_ps"], f)
        while hi - lo > 1:  # invariant: f(lo) > lo, and `chain` has P = hi (its stages and link <= hi)
            mid = (lo + hi) // 2
            f, c = self.min_link(mid)
            if f <= mid:
                chain, hi = c, max(p.objectives(c, self.n)["max_stage_ps"], f)
            else:
                lo = mid
        self.p_star = max(hi, self.host)
        return self.p_star, chain

    def chains(self, limit: int, max_expanded: int | None = None):
        """Every chain with P < limit as (P, stages), smallest P first (A* over the layers: a
        partial chain's priority is the smallest P any completion can have, exact when complete;
        ties: the least link work first, as the simulator's contention grows with it). `limit`
        may be lowered while iterating through `self.limit`. After `max_expanded` partial chains
        the listing ends early; `self.frontier` is then the smallest P a chain not listed can
        have (else `limit`)."""
        n, L = self.n, self.layers
        hm = [np.zeros(1, dtype=np.int64)]          # per layer's rows: smallest slowest rest
        hl = [np.zeros(1, dtype=np.int64)]          # ... smallest link work of the rest
        for layer in reversed(L):
            hm.append(np.maximum(layer.lat, hm[-1][None, :]).min(1))
            hl.append(np.minimum(layer.link + hl[-1][None, :], INF).min(1))
        hm, hl = hm[::-1], hl[::-1]                 # hm[j]: for the rows of layer j (j = n: V)
        self.limit = self.frontier = limit
        tick = itertools.count()
        # An entry is one partial chain: the k-th child, by priority, of its parent, whose sorted
        # children (sib) it shares; popping it pushes its next sibling and its own first child,
        # so the heap grows by two per step, not by every child.
        root = (max(int(hm[0][0]), int(hl[0][0]), self.host), int(hl[0][0]), next(tick), 0, 0, 0, 0, (), None, 0)
        heap = [root]
        expanded = 0
        while heap:
            prio, _, _, j, i, slowest, link, path, sib, k = heapq.heappop(heap)
            if prio >= self.limit:
                return
            if sib is not None and k + 1 < len(sib[0]):
                heapq.heappush(heap, self._entry(sib, k + 1, tick))
            if j == n:
                masks = [self.lattice.masks[int(L[q].cols[c])] for q, c in enumerate(path)]
                yield prio, self.stages_of(masks)
                continue
            if max_expanded is not None and expanded >= max_expanded:
                self.frontier = prio
                return
            expanded += 1
            layer = L[j]
            cols = np.flatnonzero(layer.lat[i] < INF)
            mx = np.maximum(layer.lat[i, cols], slowest)
            lk = link + layer.link[i, cols]
            least = lk + hl[j + 1][cols]
            pr = np.maximum(np.maximum(mx, hm[j + 1][cols]), np.maximum(least, self.host))
            keep = pr < self.limit
            order = np.lexsort((least[keep], pr[keep]))
            if len(order):
                kids = tuple(a[keep][order] for a in (cols, pr, mx, lk, least)) + (path, j + 1)
                heapq.heappush(heap, self._entry(kids, 0, tick))

    @staticmethod
    def _entry(kids, k, tick):
        cols, pr, mx, lk, least, path, j = kids
        c = int(cols[k])
        return (int(pr[k]), int(least[k]), next(tick), j, c, int(mx[k]), int(lk[k]), path + (c,), kids, k)


def lattice_of(problem: PartitionProblem) -> Lattice | None:
    """The problem's down-set lattice (None past MAX_DOWNSETS), built once per problem: it does not
    depend on n, so `-n auto` costs it once for every n."""
    if "lattice" not in problem.cache:
        masks = downsets(problem)
        problem.cache["lattice"] = None if masks is None else Lattice(problem, masks)
    return problem.cache["lattice"]


def period_exceeds(problem: PartitionProblem, n: int, limit: int) -> int | None:
    """A proven lower bound above `limit` of every n-stage assignment's P (so of its simulated
    period), or None when none is found cheaply. `-n auto` uses it to leave a row that cannot
    reach the knee unsearched. First the mean stage (every stage costs the overhead and its
    compute), then the chain problem under `limit`: no chain whose every stage fits, or none of
    those whose link work fits, proves P > limit."""
    m = problem.model
    host = -(-n * m.overhead_ps // m.host_slots) if m.host_slots else 0
    cheap = max(m.overhead_ps - (-sum(oc.compute_ps for oc in problem.op_costs) // n), host)
    if cheap > limit:
        return cheap
    lattice = lattice_of(problem)
    if lattice is None or pairs_at_most(lattice, n, limit) > MAX_PAIRS:
        return None
    chains = ChainProblem(lattice, n, limit)
    if chains.exceeded:
        return None
    if chains.ok and max(chains.min_max_stage(), chains.min_link(limit)[0], chains.host) <= limit:
        return None
    return limit + 1


def exact_latency(problem: PartitionProblem, n: int, known_periods, known_bounds) -> tuple[SolveResult, ChainProblem] | None:
    """Strategy `latency` solved exactly over the down-sets: the smallest P (proven), among its
    chains the smallest sum of stage latencies, and the chain problem the refinement enumerates.
    `known_periods`, `known_bounds`: the simulated periods and the P of valid assignments known
    (the warm starts; may be empty). None when the graph has too many down-sets or pairs: CP-SAT
    then."""
    t0 = time.perf_counter()
    lattice = lattice_of(problem)
    # the pairs a chain problem costs grow with n: once one n ran past MAX_PAIRS, a larger n on the
    # same problem (`-n auto`) goes to CP-SAT without costing its pairs first
    if lattice is None or n >= problem.cache.get("pairs_exceeded_at", n + 1):
        return None
    m = problem.model
    # without a known assignment: no stage and no link work exceeds everything at once
    everything = (m.overhead_ps + sum(oc.compute_ps for oc in problem.op_costs) + m.ps_per_byte
                  * (sum(oc.param_bytes for oc in problem.op_costs) + 2 * n * sum(bt.nbytes for bt in problem.tensors)))
    everything = max(everything, -(-n * m.overhead_ps // m.host_slots) if m.host_slots else 0)
    # All chains up to the best known simulated period if that is affordable (the refinement can
    # then enumerate every candidate), else up to the best known P (all the exact step needs).
    chains = None
    upper = min(known_periods, default=everything)
    if pairs_at_most(lattice, n, upper) <= MAX_PAIRS:
        chains = ChainProblem(lattice, n, upper)
    if chains is None or not chains.ok:
        chains = ChainProblem(lattice, n, min(known_bounds, default=everything))
        if not chains.ok:
            if chains.exceeded:
                problem.cache["pairs_exceeded_at"] = min(n, problem.cache.get("pairs_exceeded_at", n))
            return None
    best, chain = chains.min_period()
    # the tie-break: the smallest sum of stage latencies among the chains of period P*. The
    # chains whose every stage is <= P* include them all; if their best also keeps the link work
    # <= P* it is the answer, else (the link term binds) the chains of period P* are listed.
    total, tied = chains.min_sum_stage(best)
    sum_proven = tied is not None and chains.link_of(tied) <= best
    stages = tied if sum_proven else chain
    if not sum_proven:
        listed, least = 0, problem.objectives(stages, n)["sum_stage_ps"]
        for _, cand in chains.chains(best + 1, EXPANSIONS_PER_CANDIDATE * MAX_TIED):
            listed += 1
            total_c = problem.objectives(cand, n)["sum_stage_ps"]
            if total_c < least:
                stages, least = cand, total_c
            if listed >= MAX_TIED:
                break
        else:
            sum_proven = chains.frontier >= chains.limit  # every chain of period P* listed
    obj = problem.objectives(stages, n)
    bounds = {"period_ps": best, "sum_stage_ps": obj["sum_stage_ps"] if sum_proven else min(total, obj["sum_stage_ps"])}
    res = SolveResult(stages, obj, bounds, sum_proven, time.perf_counter() - t0, "OPTIMAL" if sum_proven else "FEASIBLE",
                      (True, sum_proven), ("optimal", "optimal" if sum_proven else f"{MAX_TIED} chains listed"),
                      True, "downsets")
    return res, chains


def refine_chains(chains: ChainProblem, stages, max_candidates: int, gap: float = 0.0,
                  wall_s: float | None = None, period_ps: int | None = None) -> Refined:
    """The simulated period's refinement over the chains, smallest P first (see `ChainProblem.chains`):
    only a chain whose P is below the incumbent's simulated period S* can beat it, so when none
    is left the incumbent is optimal for the simulator. Stops at that proof, as soon as S* is
    within `gap` of the proven lower bound min(S*, P of the next chain), or after
    `max_candidates` simulations (a count: the same answer on every machine). `period_ps`: the
    incumbent's simulated period, if known."""
    problem, n = chains.lattice.problem, chains.n
    best = tuple(stages)
    best_s = problem.period_ps(best, n) if period_ps is None else period_ps
    seen, low = 1, min(best_s, chains.p_star)
    t0 = time.perf_counter()
    limit = min(best_s, chains.ub + 1)       # every chain with P < limit is in the layers
    why = "proven"
    if best_s <= low * (1 + gap):
        why = "proven" if best_s <= low else "within gap"
    else:
        for p, cand in chains.chains(limit, EXPANSIONS_PER_CANDIDATE * max_candidates):
            low = min(best_s, p)
            if best_s <= low * (1 + gap):
                why = "within gap"
                break
            if seen >= max_candidates:
                why = "candidates"
                break
            if wall_s is not None and time.perf_counter() - t0 > wall_s:
                why = "wall clock"
                break
            if cand == best:
                continue
            s = problem.period_ps(cand, n)
            seen += 1
            if s < best_s:
                best, best_s = cand, s
                chains.limit = min(best_s, chains.ub + 1)
        else:
            if chains.frontier < chains.limit:  # the listing's own budget ended it
                low, why = min(best_s, chains.frontier), "candidates"
            else:  # every chain below the limit was simulated
                low = min(best_s, chains.limit)
                why = "proven" if low == best_s else "cap"  # the chains above the cap were never costed
    proven = low == best_s  # nothing unsimulated is below it
    why = "proven" if proven else why
    return Refined(best, best_s, proven, seen, low, why == "wall clock", why)
