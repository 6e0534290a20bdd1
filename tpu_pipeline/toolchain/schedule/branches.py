"""Branch bodies that some optimal order runs back to back (the patch branches of a tiled region,
and any other single-entry branch whose memory never dips below its two ends).

A *body* B hangs off one entry tensor x: x is written by an op w outside B and touched otherwise
only by ops of B; every other tensor an op of B touches is written inside B; its exits are the
tensors B writes that an op outside B reads (or graph outputs), and every such outside reader
depends on all of B (otherwise it could run, and free an exit, in the middle of B). res(D), for
a down-set D of B, is the bytes of B's tensors resident between steps once exactly D has run (x
until its last reader in B; a tensor written in D until its last toucher, exits to the end of
B): res({}) = size(x), res(B) = the exits.

Theorem (one valley at each end). If res(D) >= max(res({}), res(B)) for every proper, non-empty
down-set D of B, some optimal order runs B contiguously, in an order of B whose largest step
above the bytes resident before it is least.

Proof. Take an optimal order pi in which B is interleaved. Resident bytes split into B's part
(which depends only on the set of B's ops run, since B shares no tensor with any other op but x,
whose writer w runs before B, and its exits, whose outside readers run after B) and the rest
R_o (which depends only on the other ops run). Let tau be, among the gaps just before B's ops in
pi, one where R_o is least, and move all of B, in its own order, to tau. (1) B's steps now sit
on R_o(tau) <= the R_o each of them saw before, with the same increments: no higher. (2) Every
other op between B's first and last op saw B's part at res(D) for some proper non-empty D; now
it sees res({}) (if before tau) or res(B) (if after), both <= res(D), and its own increment is
unchanged: no higher. (3) Steps outside that window are unchanged. So the new order is no
worse; and as B's steps then depend only on its inner order and R_o(tau), an inner order with
the least largest step is no worse either. tau lies next to an op of B, so bodies already made
contiguous stay so: applying this to disjoint bodies one by one yields an optimal order in which
each is a contiguous unit. The exchange needs the last step of the graph to be the same op:
with a graph output no op touches (live at the last step only) the rule is not applied.
"""

from __future__ import annotations

import time

from tpu_pipeline.toolchain.schedule.model import MemModel, bits

MAX_BODY = 256  # ops in one body
MAX_DOWNSETS = 4096  # down-sets enumerated per body; a body with more is left alone
MAX_SEGMENTED = 64  # closures up to this many ops are also tried cut short at each single exit


def _grow(model: MemModel, x: int) -> int:
    """Bitset of the ops that depend on x only (through tensors written among themselves)."""
    w = model.born[x]
    body = model.mask[x] & ~(1 << w)
    frontier = list(bits(body))
    while frontier:
        u = frontier.pop()
        for t in model.touch[u]:
            if model.born[t] != u:
                continue
            for r in bits(model.mask[t] & ~body):
                if all(s == x or model.born[s] == r or (model.born[s] >= 0 and (body >> model.born[s]) & 1)
                       for s in model.touch[r]) and not model.preds[r] & ~(body | (1 << w)):
                    body |= 1 << r
                    frontier.append(r)
    return body


def _ancestors(model: MemModel) -> list[int]:
    """Per op, the bitset of its ancestors (op positions are a topological order)."""
    anc = [0] * model.n
    for v in range(model.n):
        a = model.preds[v]
        for p in bits(model.preds[v]):
            a |= anc[p]
        anc[v] = a
    return anc


def _valid(model: MemModel, x: int, body: int, anc: list[int]) -> bool:
    w = model.born[x]
    if model.mask[x] & ~(body | (1 << w)):
        return False  # x has a reader outside: a body cut short at one exit can leave one behind
    for t in _exits(model, body):
        for r in bits(model.mask[t] & ~body):
            if anc[r] & body != body:
                return False  # an exit's reader could run, and free it, in the middle of the body
    for u in bits(body):
        if model.preds[u] & ~(body | (1 << w)):
            return False
        for t in model.touch[u]:
            if t == x:
                continue
            b = model.born[t]
            if b < 0 or not (body >> b) & 1 or model.pin_start[t]:
                return False
    return True


def _body_tensors(model: MemModel, x: int, body: int) -> list[int]:
    seen = {x}
    for u in bits(body):
        seen.update(model.touch[u])
    return sorted(seen)


def _res(model: MemModel, x: int, tensors, body: int, done: int) -> int:
    return sum(model.size[t] for t in tensors if _alive(model, x, t, body, done))


def _alive(model: MemModel, x: int, t: int, body: int, done: int) -> bool:
    m = model.mask[t]
    if t == x:
        return bool(m & body & ~done)
    return bool((done >> model.born[t]) & 1) and (model.pin_end[t] or bool(m & ~done))


def body_order(model: MemModel, x: int, body: int) -> tuple[int, ...] | None:
    """The inner order of B with the least largest step if the theorem applies, else None."""
    tensors = _body_tensors(model, x, body)
    ops = list(bits(body))
    size, extra, mask, born, pin_end = model.size, model.extra, model.mask, model.born, model.pin_end
    # per op, what does not depend on the down-set: its predecessors in B, the tensors it touches,
    # the bytes it creates (the search visits every (down-set, op) pair: this is the schedule's
    # hottest loop on random wirings)
    preds = {u: model.preds[u] & body for u in ops}
    touched = {u: tuple(set(model.touch[u])) for u in ops}
    new = {u: sum(size[t] for t in model.touch[u] if model.born[t] == u) for u in ops}
    start, end = _res(model, x, tensors, body, 0), _res(model, x, tensors, body, body)
    need = max(start, end)
    # best[D] = (least largest step above R_o to reach D, last op, previous D)
    best: dict[int, tuple[int, int, int]] = {0: (0, -1, -1)}
    res = {0: start}
    layer = [0]
    while layer:
        nxt = []
        for D in layer:
            g, rd = best[D][0], res[D]
            for u in ops:
                bit = 1 << u
                if D & bit or preds[u] & ~D:
                    continue
                D2 = D | bit
                if D2 not in res:
                    # only the tensors u touches can change state between D and D2
                    r2 = rd
                    for t in touched[u]:  # _alive at D2 minus _alive at D, written out
                        m = mask[t]
                        if t == x:
                            r2 += size[t] * (bool(m & body & ~D2) - bool(m & body & ~D))
                        else:
                            b = born[t]
                            r2 += size[t] * ((bool((D2 >> b) & 1) and (pin_end[t] or bool(m & ~D2)))
                                             - (bool((D >> b) & 1) and (pin_end[t] or bool(m & ~D))))
                    res[D2] = r2
                    if D2 != body and r2 < need:
                        return None
                    nxt.append(D2)
                    if len(res) > MAX_DOWNSETS:
                        return None
                step = max(g, rd + new[u] + extra[u])
                if D2 not in best or step < best[D2][0]:
                    best[D2] = (step, u, D)
        layer = nxt
    order = []
    D = body
    while D:
        _, u, prev = best[D]
        order.append(u)
        D = prev
    return tuple(reversed(order))


def _exits(model: MemModel, body: int) -> set[int]:
    out = set()
    for u in bits(body):
        for t in model.touch[u]:
            if model.born[t] == u and (model.pin_end[t] or model.mask[t] & ~body):
                out.add(t)
    return out


def _segments(model: MemModel, x: int, closure: int) -> list[int]:
    """Bodies from x to one exit tensor inside the closure: the ops up to that tensor's writer
    (its ancestors in the closure) when nothing else leaves them."""
    anc: dict[int, int] = {}
    out = []
    for v in bits(closure):  # positions are a topological order
        a = 1 << v
        for p in bits(model.preds[v] & closure):
            a |= anc[p]
        anc[v] = a
        if a != closure and bin(a).count("1") >= 2 and len(_exits(model, a)) == 1:
            out.append(a)
    return out


def body_units(model: MemModel, until: float | None = None) -> list[tuple[int, ...]]:
    """Units: the accepted bodies (largest first, disjoint), every other op on its own. At `until`
    (monotonic seconds) no further body is looked for: leaving ops on their own is always safe."""
    if model.final_only:
        return [(v,) for v in range(model.n)]
    cands = []
    anc = _ancestors(model)
    for x in range(len(model.size)):
        if until is not None and time.monotonic() >= until:
            break
        if model.born[x] < 0 or model.pin_start[x] or model.pin_end[x]:
            continue
        closure = _grow(model, x)
        k = bin(closure).count("1")
        if not 2 <= k <= MAX_BODY:
            continue
        subs = [closure] + (_segments(model, x, closure) if k <= MAX_SEGMENTED else [])
        cands.extend((-bin(b).count("1"), x, b) for b in subs if _valid(model, x, b, anc))
    cands.sort()
    taken = 0
    units: list[tuple[int, ...]] = []
    for _, x, body in cands:
        if body & taken or (until is not None and time.monotonic() >= until):
            continue
        order = body_order(model, x, body)
        if order is not None:
            units.append(order)
            taken |= body
    units.extend((v,) for v in range(model.n) if not (taken >> v) & 1)
    return units
