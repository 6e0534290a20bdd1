"""Optimality-preserving fusion of ops into units that always run back to back.

Zhong et al. (Theorem IV.1) fuse monotonic linear chains. Their statement uses a one-output-per-op
memory model; ours has multi-output ops, scratch, graph inputs freed after last use and outputs
pinned to the end, so we use two exchange rules proved directly on `MemModel` (the memory at a step
is R(S) + what that step adds). Units u and v (each an op or an already fused chain) with every
successor of u inside v:

Rule B ("pull v up"): additionally every predecessor of v is in u and every tensor v reads from
outside is written by u. Take any order ... u x1..xk v ...; moving v right after u changes only
(a) the steps of x1..xk, each by exactly out_surv(v) - in_free(v) (v's outputs that outlive v
appear earlier; v's inputs, which only u and v touch, die earlier), and (b) v's own steps, which
now sit on the resident set right after u. So if out_surv(v) <= in_free(v) and every step of v
adds at most what u's last step provably frees (its scratch plus the tensors guaranteed to die
there), no step of the new order exceeds a step of the old one.

Rule C ("push u down"): moving u right before v changes the steps of x1..xk by at most
in_free(u) - out_surv(u) (u's inputs may live longer, u's outputs appear later) and puts u's steps
on a resident set at most R(before v) - out_surv(u) + in_free(u); so if in_free(u) <= out_surv(u)
and each step of u adds at most that difference below v's first step, the new order is no worse.

Either rule turns every order into one, no worse, in which u and v are adjacent, so fusing them
keeps an optimal order in the search space. Rules are applied until nothing changes (a fixed
point). Here in_free(X) = bytes X reads from outside that are not graph outputs, out_surv(X) =
bytes X writes that someone outside X reads or that are graph outputs.
"""

from __future__ import annotations

from tpu_pipeline.toolchain.schedule.model import MemModel, bits


def _inside(unit) -> int:
    m = 0
    for v in unit:
        m |= 1 << v
    return m


class _Summary:
    __slots__ = ("inside", "in_free", "out_surv", "peak_rel", "slack_end", "first_born_extra", "ok")


def _summary(model: MemModel, unit, done: int = 0) -> _Summary:
    """Figures of a unit run back to back. `done`: ops known to have run before the unit."""
    s = _Summary()
    inside = _inside(unit)
    s.inside = inside
    s.ok = True
    size, mask, born, pe = model.size, model.mask, model.born, model.pin_end
    touched = []
    for v in unit:
        for t in model.touch[v]:
            if t not in touched:
                touched.append(t)
    in_free = out_surv = 0
    for t in touched:
        b = born[t]
        if b >= 0 and (inside >> b) & 1:
            if pe[t] or mask[t] & ~inside:
                out_surv += size[t]
        else:
            if b < 0 and not model.pin_start[t]:
                s.ok = False  # read before any write: born where first touched, order-dependent
            if not pe[t]:
                in_free += size[t]
    s.in_free, s.out_surv = in_free, out_surv
    # Internal profile relative to the resident bytes just before the unit, counting only deaths
    # that are certain (every toucher inside the unit or already done): an upper bound.
    rel = 0
    peak_rel = None
    scope = inside | done
    seen = 0
    first_born_extra = None
    slack_end = 0
    for j, v in enumerate(unit):
        seen |= 1 << v
        new = sum(size[t] for t in model.touch[v] if born[t] == v)
        live = rel + new + model.extra[v]
        if first_born_extra is None:
            first_born_extra = new + model.extra[v]
        peak_rel = live if peak_rel is None else max(peak_rel, live)
        died = 0
        for t in model.touch[v]:
            m = mask[t]
            if not pe[t] and not (m & ~scope) and not (m & inside & ~seen):
                died += size[t]
        rel += new - died
        if j == len(unit) - 1:
            slack_end = model.extra[v] + died
    s.peak_rel = peak_rel or 0
    s.slack_end = slack_end
    s.first_born_extra = first_born_extra or 0
    return s


def fuse(model: MemModel, units=None, max_unit: int = 10_000) -> list[tuple[int, ...]]:
    """Fuse units (default: single ops) to a fixed point; returns units in a topological order."""
    if units is None:
        units = [(v,) for v in range(model.n)]
    units = [tuple(u) for u in units]
    if model.final_only:
        return units  # a graph output no op touches sits on the last step: keep every order open
    changed = True
    while changed:
        changed = False
        owner = {}
        for k, u in enumerate(units):
            for v in u:
                owner[v] = k
        alive = [True] * len(units)
        # unit-level successor and predecessor sets
        usucc = []
        upred = []
        for k, u in enumerate(units):
            inside = _inside(u)
            sm = pm = 0
            for v in u:
                sm |= model.succs[v]
                pm |= model.preds[v]
            usucc.append({owner[w] for w in bits(sm & ~inside)})
            upred.append({owner[w] for w in bits(pm & ~inside)})
        for k in range(len(units)):
            if not alive[k] or len(usucc[k]) != 1:
                continue
            (j,) = usucc[k]
            # (j is alive: a merge replaces the merged unit in every successor set below; the
            # check only guards that bookkeeping, no test can make it fire)
            if not alive[j] or len(units[k]) + len(units[j]) > max_unit:
                continue
            u, v = units[k], units[j]
            su = _summary(model, u)
            if not su.ok:
                continue
            merged = False
            if upred[j] == {k}:  # Rule B candidate
                sv = _summary(model, v, done=su.inside)
                # (sv.ok is implied: _reads_only_from refuses the unwritten tensors it excludes)
                if _reads_only_from(model, v, su.inside) and sv.out_surv <= sv.in_free \
                        and sv.peak_rel <= su.slack_end:
                    merged = True
            if not merged:  # Rule C
                sv = _summary(model, v)
                if sv.ok and su.in_free <= su.out_surv and \
                        su.peak_rel - su.out_surv + su.in_free <= sv.first_born_extra:
                    merged = True
            if merged:
                units[k] = u + v
                alive[j] = False
                # keep the bookkeeping of the merged unit consistent for the rest of this pass
                usucc[k] = {w for w in usucc[j]}
                for w in usucc[j]:
                    upred[w].discard(j)
                    upred[w].add(k)
                for w in upred[j]:
                    if w != k:
                        usucc[w].discard(j)
                        usucc[w].add(k)
                upred[k] = (upred[k] | upred[j]) - {k, j}
                changed = True
        units = [u for k, u in enumerate(units) if alive[k]]
    return _topo_units(model, units)


def _reads_only_from(model: MemModel, v, u_inside: int) -> bool:
    """Every tensor unit v touches is written inside v or inside u (no graph inputs either)."""
    inside = _inside(v)
    for x in v:
        for t in model.touch[x]:
            b = model.born[t]
            if b < 0:
                return False
            if not ((inside >> b) & 1 or (u_inside >> b) & 1):
                return False
    return True


def _topo_units(model: MemModel, units) -> list[tuple[int, ...]]:
    """Units in a deterministic topological order (smallest first op position first)."""
    import heapq

    owner = {}
    for k, u in enumerate(units):
        for v in u:
            owner[v] = k
    indeg = [0] * len(units)
    succ: list[set[int]] = [set() for _ in units]
    for k, u in enumerate(units):
        inside = _inside(u)
        pm = 0
        for v in u:
            pm |= model.preds[v]
        ps = {owner[w] for w in bits(pm & ~inside)}
        indeg[k] = len(ps)
        for p in ps:
            succ[p].add(k)
    heap = [(min(u), k) for k, u in enumerate(units) if indeg[k] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, k = heapq.heappop(heap)
        out.append(units[k])
        for s in succ[k]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (min(units[s]), s))
    if len(out) != len(units):
        raise AssertionError("fusion produced a cyclic unit graph")
    return out
