"""The min-cut bound: for each op v, the least that can be live at v's step over ALL
topological orders: min over down-sets S (ancestors of v in S, v and its descendants not) of
live(v, S). The bytes live at v's step are v's footprint plus every other tensor that is written
inside S and read outside it (or is a graph output), plus graph inputs still to be read: a closure
problem, solved exactly as a minimum s-t cut (source side = S). No order peaks below max over v of
this value, which is at least the static bound and often much closer to the optimum; it also
raises the search's floor. `CutNet` is shared with the branching bound (branching.py).
"""

from __future__ import annotations

import time

import numpy as np

from tpu_pipeline.toolchain.schedule.bounds.static import footprint
from tpu_pipeline.toolchain.schedule.model import bits
from tpu_pipeline.toolchain.schedule.problem import BoundQuery, Piece


def _reach(model, inside: int, ops: list[int]) -> tuple[dict[int, int], dict[int, int]]:
    """Each op's ancestors and descendants inside the piece, as bitsets (`ops` in topological order)."""
    anc: dict[int, int] = {}
    desc: dict[int, int] = {}
    for v in ops:
        a = model.preds[v] & inside
        for p in bits(a):
            a |= anc[p]
        anc[v] = a
    for v in reversed(ops):
        d = model.succs[v] & inside
        for s in bits(d):
            d |= desc[s]
        desc[v] = d
    return anc, desc


class CutNet:
    """The min-cut network of a piece, built once: `cut(v, anc, desc)` is the least number of
    bytes live at v's step over the down-sets S with `anc` inside S and `desc` (v included)
    outside it; `anc`/`desc` may hold more than v's ancestors/descendants (a branch of the
    order), which only raises the value. One network, capacities toggled per query."""

    def __init__(self, piece):
        model = self.model = piece.model
        self.ops = ops = sorted(bits(piece.ops))
        self.idx = idx = {v: 2 + k for k, v in enumerate(ops)}
        S0, S_end = piece.S0, piece.S0 | piece.ops
        self.INF = INF = int(sum(model.size) + sum(model.extra) + model.const_all + 1)
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
        self.src_arc = {v: arc(0, idx[v], 0) for v in ops}
        self.snk_arc = {v: arc(idx[v], 1, 0) for v in ops}
        base = model.const_all
        forced = []  # tensors alive at every step of the piece
        self.size_arcs = size_arcs = {}  # tensor -> arcs carrying its size
        node = 2 + len(ops)
        for t in range(len(model.size)):
            m = model.mask[t]
            inside = m & piece.ops
            if not inside:
                # untouched by the piece: alive before its first step iff alive after its last
                if (model.pin_start[t] or m & S0) and (model.pin_end[t] or m & ~S0):
                    base += model.size[t]
                continue
            s = model.size[t]
            after = model.pin_end[t] or bool(m & ~S_end)
            writer = model.born[t]
            if model.pin_start[t] or (writer >= 0 and (S0 >> writer) & 1):
                if after:
                    forced.append(t)
                    continue
                size_arcs[t] = [arc(0, node, s)]
                for c in bits(inside):
                    arc(node, idx[c], INF)
                node += 1
            elif writer >= 0 and (piece.ops >> writer) & 1:
                if after:
                    size_arcs[t] = [arc(idx[writer], 1, s)]
                else:
                    readers = inside & ~(1 << writer)
                    if not readers:
                        continue  # dies where it is written
                    size_arcs[t] = [arc(idx[writer], node, s)]
                    for c in bits(readers):
                        arc(node, idx[c], INF)
                    node += 1
            # else: read before written: ignored (the bound stays valid, only weaker)
        # op -> its source / sink arc, for toggling many at once from a bitset
        self.nbytes = (model.n + 7) // 8
        self.src_of = np.zeros(self.nbytes * 8, dtype=np.int32)
        self.snk_of = np.zeros(self.nbytes * 8, dtype=np.int32)
        for v in ops:
            self.src_of[v], self.snk_of[v] = self.src_arc[v], self.snk_arc[v]
        from ortools.graph.python import max_flow  # OR-Tools loads (~30 ms) only when a cut bound is built

        self.flow = max_flow.SimpleMaxFlow()
        self.flow.add_arcs_with_capacity(np.array(tails, dtype=np.int64), np.array(heads, dtype=np.int64),
                                         np.array(caps, dtype=np.int64))
        self.anc, self.desc = _reach(model, piece.ops, ops)
        through = base - model.const_all  # footprint() counts const_all
        self.fp = {v: through + footprint(model, v) + sum(model.size[t] for t in forced if t not in model.touch[v])
                   for v in ops}

    def _ops_of(self, mask: int) -> np.ndarray:
        """The set bits of an op bitset (all inside the piece), as a boolean array."""
        raw = np.frombuffer(mask.to_bytes(self.nbytes, "little"), dtype=np.uint8)
        return np.unpackbits(raw, bitorder="little").astype(bool)

    def _toggle(self, v: int, anc: int, desc: int, on: bool) -> None:
        flow, model = self.flow, self.model
        for t in model.touch[v]:
            for a in self.size_arcs.get(t, ()):
                flow.set_arc_capacity(a, 0 if on else model.size[t])
        cap = self.INF if on else 0
        for arcs_of, mask in ((self.src_of, anc), (self.snk_of, desc | (1 << v))):
            arcs = arcs_of[self._ops_of(mask)]
            flow.set_arcs_capacity(arcs, np.full(len(arcs), cap, dtype=np.int64))

    def cut(self, v: int, anc: int | None = None, desc: int | None = None,
            source_side: bool = False) -> tuple[int | None, int]:
        """(bytes, the ops of the piece in the cheapest S) at v's step; bytes None if the
        solver failed (no bound)."""
        anc = self.anc[v] if anc is None else anc
        desc = self.desc[v] if desc is None else desc
        if anc & (desc | (1 << v)):
            return self.INF, 0  # contradictory branch: no order has it
        self._toggle(v, anc, desc, True)
        try:
            if self.flow.solve(0, 1) != self.flow.OPTIMAL:
                return None, 0
            value = self.fp[v] + int(self.flow.optimal_flow())
            S = 0
            if source_side:
                for node in self.flow.get_source_side_min_cut():
                    if 2 <= node < 2 + len(self.ops):
                        S |= 1 << self.ops[node - 2]
            return value, S
        finally:
            self._toggle(v, anc, desc, False)


def cut_lower_bound(piece, deadline: float | None = None, floor: int = 0) -> int:
    """max over the piece's ops v of min over orders of the live bytes at v's step.
    Stops early (returning a smaller but valid bound) at the deadline."""
    if not piece.ops:
        return 0
    net = CutNet(piece)
    best = floor
    for v in sorted(net.ops, key=lambda v: -net.fp[v]):
        if deadline is not None and time.monotonic() > deadline:
            break
        value, _ = net.cut(v)
        if value is not None:
            best = max(best, value)
    return best


def piece_bound(piece: Piece, query: BoundQuery) -> int:
    """The min-cut bound as a LowerBound (bounds/__init__.py)."""
    return cut_lower_bound(piece, query.deadline, query.floor)
