"""Twin branches: isomorphic chains of units the exact search orders canonically.

A *chain* is a maximal run of units u1 .. uL of a piece where each u(i+1) waits for u(i) alone
and is u(i)'s only successor unit. Two chains are *twins* when they start after the same units,
end before the same units, and look the same to the memory model op by op: the same scratch, and
for every tensor an op touches the same size and pins, the same touchers inside the chain (by
position), and the same touchers outside; a tensor that other chains of the same shape touch too
(the input all the tiles of a patched region are cut from, docs/fit.md) must be the very same
tensor. Swapping two twins (op for op, tensor for tensor) then maps the memory model onto itself:
every state has a mirror image with the same bytes at every step.

Theorem. Number the twins of a class 1..c. Some optimal order keeps, at every step, the progress
of the twins (units run) non-increasing in their number; so the search may offer a unit of twin j
only once twin j-1 has run the unit at the same position.

Proof. Take an optimal order and walk it; at a step that runs the unit at position p of twin j
while an earlier twin i is also at p (the first such i), swap i and j from that step to the end:
i and j have run the same units so far, so the state is its own mirror and the swapped rest has
the same bytes at every step. The step now advances i, the first twin at p, which keeps progress
non-increasing; later steps are handled alike. From any state of this form an optimal completion
of the form exists (the same walk), so the restriction composes with the free moves of dp.py and
the pairs and runs of forks.py: a free move the restriction allows leads to a state of the form,
and a pair or run of slices maps to a pair or run under the swap.
"""

from __future__ import annotations

from tpu_pipeline.toolchain.schedule.model import MemModel


def twin_links(model: MemModel, units, upred, usucc) -> list[int]:
    """Per unit of a piece: the unit at the same position of the twin before its chain's (see the
    module docstring), which must have run first; -1 where there is none."""
    chains = _chains(upred, usucc)
    shaped: dict[tuple, list[list[int]]] = {}
    for ch in chains:
        shaped.setdefault((upred[ch[0]], tuple(sorted(usucc[ch[-1]])), len(ch)), []).append(ch)
    links = [-1] * len(units)
    for same_shape in shaped.values():
        if len(same_shape) < 2:
            continue
        others = 0
        for ch in same_shape:
            for k in ch:
                for v in units[k]:
                    others |= 1 << v
        classes: dict[tuple, list[list[int]]] = {}
        for ch in same_shape:
            classes.setdefault(_signature(model, units, ch, others), []).append(ch)
        for twins in classes.values():
            twins.sort()
            for before, ch in zip(twins, twins[1:]):
                for a, b in zip(before, ch):
                    links[b] = a
    return links


def _chains(upred, usucc) -> list[list[int]]:
    """The piece's units cut into maximal chains (each unit in one)."""
    def follows(k: int) -> bool:  # k waits for one unit alone, whose only successor it is
        p = upred[k]
        if p == 0 or p & (p - 1):
            return False
        return usucc[p.bit_length() - 1] == [k]

    chains = []
    for k in range(len(upred)):
        if follows(k):
            continue
        ch = [k]
        while len(usucc[ch[-1]]) == 1 and follows(usucc[ch[-1]][0]):
            ch.append(usucc[ch[-1]][0])
        chains.append(ch)
    return chains


def _signature(model: MemModel, units, chain: list[int], others: int) -> tuple:
    """What the memory model sees of a chain, with its own ops and tensors by position."""
    ops = [v for k in chain for v in units[k]]
    pos = {v: i for i, v in enumerate(ops)}
    mine = 0
    for v in ops:
        mine |= 1 << v
    sig = [tuple(len(units[k]) for k in chain)]
    for v in ops:
        touched = []
        for t in model.touch[v]:
            inside = tuple(sorted(pos[w] for w in _bits(model.mask[t] & mine)))
            outside = model.mask[t] & ~mine
            # a tensor other chains of this shape touch too: only the very same one is symmetric
            name = t if outside & others else None
            born = pos.get(model.born[t], -1 if model.born[t] < 0 else -2)
            touched.append((model.size[t], model.pin_start[t], model.pin_end[t], inside,
                            outside & ~others, name, born if born != -2 else ("out", model.born[t])))
        sig.append((model.extra[v], tuple(touched)))
    return tuple(sig)


def _bits(x: int):
    while x:
        low = x & -x
        yield low.bit_length() - 1
        x ^= low
