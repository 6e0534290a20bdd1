"""The ancestry bound, on a whole graph: cheap enough to ask before scheduling at all (the
rewrite search asks it of every candidate, rewrite/driver.py).

While op v runs, a tensor t (v does not touch it) is live in the shared memory model exactly when
one of its touchers ran before v and another runs after v (a graph input counts as touched at step
0, a graph output at step n). If a toucher of t is an ancestor of v and another a descendant of v,
that holds in EVERY topological order. So v's step costs at least v's footprint plus every such
tensor; the maximum over v bounds every order. Costs O(edges) bitset operations and one vector sum
per tensor; it is what makes "the peak lies elsewhere" a proof: the op at the old peak keeps its
ancestors and descendants under a rewrite that does not touch them. The min-cut bound
(mincut.py) is at least this one, per piece, at a higher price.
"""

from __future__ import annotations

import numpy as np

from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.memory.semantics import TFLM
from tpu_pipeline.toolchain.schedule.bounds.static import footprints
from tpu_pipeline.toolchain.schedule.model import bits, build_model


def ancestry_lower_bound(graph: Graph, semantics=TFLM) -> int:
    """No topological order of `graph` peaks below this (0 where the memory model's in-place
    sharing depends on the order: no claim then)."""
    m = build_model(graph, semantics)
    n = m.n
    if n == 0 or not m.exact:
        return 0
    anc = [0] * n
    for v in range(n):  # graph.ops are in a topological order
        a = 0
        for p in bits(m.preds[v]):
            a |= anc[p] | (1 << p)
        anc[v] = a
    desc = [0] * n
    for v in range(n - 1, -1, -1):
        d = 0
        for q in bits(m.succs[v]):
            d |= desc[q] | (1 << q)
        desc[v] = d
    nbytes = (n + 7) // 8
    total = np.zeros(n, dtype=np.int64)
    full = m.full
    for t, size in enumerate(m.size):
        after_toucher = full if m.pin_start[t] else 0  # ops with a toucher among their ancestors
        before_toucher = full if m.pin_end[t] else 0  # ops with a toucher among their descendants
        for u in bits(m.mask[t]):
            if not m.pin_start[t]:
                after_toucher |= desc[u]
            if not m.pin_end[t]:
                before_toucher |= anc[u]
        through = after_toucher & before_toucher & ~m.mask[t]
        if through:
            flags = np.unpackbits(np.frombuffer(through.to_bytes(nbytes, "little"), dtype=np.uint8),
                                  bitorder="little")[:n]
            total += flags.astype(np.int64) * size
    fps = footprints(m)
    return int(max(int(total[v]) + fps[v] for v in range(n)))
