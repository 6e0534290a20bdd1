"""Divide and conquer at forced cuts.

A unit x is a cut point when every other unit is its ancestor or its descendant. Then in EVERY
topological order the ancestors run before x and the descendants after it, so the orders of the
graph are exactly the concatenations (order of ancestors, x, order of descendants). The live bytes
at a step depend only on the set of ops run so far (`MemModel.step`), so the steps of one piece do
not depend on how another piece is ordered: the best peak of the graph is the maximum of the best
peaks of the pieces, each solved in the context of everything before it. Concatenating optimal
pieces is therefore optimal, with no condition on tensor sizes, graph inputs or graph outputs
crossing the cut (those are simply resident during the pieces they span).
"""

from __future__ import annotations

from tpu_pipeline.toolchain.schedule.model import MemModel, bits


def unit_dag(model: MemModel, units):
    """Per unit: bitsets (over unit indices) of predecessor and successor units."""
    owner = {}
    for k, u in enumerate(units):
        for v in u:
            owner[v] = k
    preds = []
    for k, u in enumerate(units):
        inside = 0
        pm = 0
        for v in u:
            inside |= 1 << v
            pm |= model.preds[v]
        m = 0
        for w in bits(pm & ~inside):
            m |= 1 << owner[w]
        preds.append(m)
    succs = [0] * len(units)
    for k, p in enumerate(preds):
        for j in bits(p):
            succs[j] |= 1 << k
    return preds, succs


def pieces(model: MemModel, units) -> list[list[int]]:
    """Split units (given in a topological order) into consecutive pieces at the cut points;
    returns lists of unit indices. Every cut point is a piece of its own."""
    m = len(units)
    if m == 0:
        return []
    preds, succs = unit_dag(model, units)
    anc = [0] * m
    for k in range(m):  # units are in topological order
        a = preds[k]
        for j in bits(preds[k]):
            a |= anc[j]
        anc[k] = a
    desc = [0] * m
    for k in range(m - 1, -1, -1):
        d = succs[k]
        for j in bits(succs[k]):
            d |= desc[j]
        desc[k] = d
    full = (1 << m) - 1
    cuts = [k for k in range(m) if (anc[k] | desc[k] | (1 << k)) == full]
    out: list[list[int]] = []
    prev = 0  # bitset of units already placed
    for c in cuts:
        between = anc[c] & ~prev
        if between:
            out.append(sorted(bits(between)))
        out.append([c])
        prev |= between | (1 << c)
    rest = full & ~prev
    if rest:
        out.append(sorted(bits(rest)))
    return out
