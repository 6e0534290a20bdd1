"""Order-independent lower bounds on the best peak (certificates).

`static`: every op's own footprint (what it reads, writes and its scratch) plus what is resident
through the whole piece — `Piece.static_lower_bound`.

`cut_lower_bound`: for each op v, the least that can be live at v's step over ALL topological
orders: min over down-sets S (ancestors of v in S, v and its descendants not) of live(v, S). The
bytes live at v's step are v's footprint plus every other tensor that is written inside S and read
outside it (or is a graph output), plus graph inputs still to be read: a closure problem, solved
exactly as a minimum s-t cut (source side = S). No order peaks below max over v of this value,
which is at least the footprint bound and often much closer to the optimum; it also raises the
search's floor.
"""

from __future__ import annotations

import time

import numpy as np
from ortools.graph.python import max_flow

from toolchain.schedule.model import bits


def cut_lower_bound(piece, deadline: float | None = None, floor: int = 0) -> int:
    """max over the piece's ops v of min over orders of the live bytes at v's step.
    Stops early (returning a smaller but valid bound) at the deadline."""
    # Over 80 lines on purpose: one flow network is built once (arcs, their indices, the
    # tensors' size arcs) and re-solved per op by toggling capacities in place; split, every
    # helper would take and return that whole arc bookkeeping.
    model = piece.model
    ops = sorted(bits(piece.ops))
    if not ops:
        return 0
    idx = {v: 2 + k for k, v in enumerate(ops)}
    S0, S_end = piece.S0, piece.S0 | piece.ops
    INF = int(sum(model.size) + sum(model.extra) + model.const_all + 1)

    tails, heads, caps = [], [], []

    def arc(a, b, c):
        tails.append(a)
        heads.append(b)
        caps.append(c)
        return len(tails) - 1

    # closure: b in S => a in S for every predecessor a of b inside the piece
    for v in ops:
        for a in bits(model.preds[v] & piece.ops):
            arc(idx[v], idx[a], INF)
    src_arc = {v: arc(0, idx[v], 0) for v in ops}
    snk_arc = {v: arc(idx[v], 1, 0) for v in ops}

    base = model.const_all
    forced = []  # (tensor, size): alive at every step of the piece
    size_arcs: dict[int, list[int]] = {}  # tensor -> arcs carrying its size
    next_node = 2 + len(ops)
    for t in range(len(model.size)):
        m = model.mask[t]
        inside = m & piece.ops
        if not inside:
            a0 = (model.pin_start[t] or m & S0) and (model.pin_end[t] or m & ~S0)
            a1 = (model.pin_start[t] or m & S_end) and (model.pin_end[t] or m & ~S_end)
            if a0 and a1:
                base += model.size[t]
            continue
        s = model.size[t]
        after = model.pin_end[t] or bool(m & ~S_end)
        writer = model.born[t]
        if model.pin_start[t] or (writer >= 0 and (S0 >> writer) & 1):
            if after:
                forced.append(t)
                continue
            x = next_node
            next_node += 1
            size_arcs[t] = [arc(0, x, s)]
            for c in bits(inside):
                arc(x, idx[c], INF)
        elif writer >= 0 and (piece.ops >> writer) & 1:
            if after:
                size_arcs[t] = [arc(idx[writer], 1, s)]
            else:
                readers = inside & ~(1 << writer)
                if not readers:
                    continue  # dies where it is written
                x = next_node
                next_node += 1
                size_arcs[t] = [arc(idx[writer], x, s)]
                for c in bits(readers):
                    arc(x, idx[c], INF)
        else:
            continue  # read before written: ignored (the bound stays valid, only weaker)

    flow = max_flow.SimpleMaxFlow()
    flow.add_arcs_with_capacity(np.array(tails, dtype=np.int64), np.array(heads, dtype=np.int64),
                                np.array(caps, dtype=np.int64))
    # ancestors / descendants inside the piece
    pos = {v: k for k, v in enumerate(ops)}
    anc = {}
    for v in ops:  # op positions are a topological order of the graph
        a = model.preds[v] & piece.ops
        for p in bits(a):
            a |= anc[p]
        anc[v] = a
    desc = {}
    for v in reversed(ops):
        d = model.succs[v] & piece.ops
        for s_ in bits(d):
            d |= desc[s_]
        desc[v] = d
    del pos

    forced_size = {t: model.size[t] for t in forced}
    best = floor
    fps = []
    for v in ops:
        fp = base + model.extra[v] + sum(model.size[t] for t in model.touch[v])
        fp += sum(sz for t, sz in forced_size.items() if t not in model.touch[v])
        fps.append((fp, v))
    fps.sort(reverse=True)
    for fp, v in fps:
        if deadline is not None and time.monotonic() > deadline:
            break
        touched = model.touch[v]
        for t in touched:
            for a in size_arcs.get(t, ()):
                flow.set_arc_capacity(a, 0)
        for a in bits(anc[v]):
            flow.set_arc_capacity(src_arc[a], INF)
        for d in bits(desc[v] | (1 << v)):
            flow.set_arc_capacity(snk_arc[d], INF)
        status = flow.solve(0, 1)
        if status == flow.OPTIMAL:
            value = fp + int(flow.optimal_flow())
            best = max(best, value)
        for t in touched:
            for a in size_arcs.get(t, ()):
                flow.set_arc_capacity(a, model.size[t])
        for a in bits(anc[v]):
            flow.set_arc_capacity(src_arc[a], 0)
        for d in bits(desc[v] | (1 << v)):
            flow.set_arc_capacity(snk_arc[d], 0)
    return best
