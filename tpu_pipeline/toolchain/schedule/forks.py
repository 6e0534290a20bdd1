"""Lazy slices: the moves the exact search needs around a fork tensor read only by slices.

A *slice* s of a fork tensor I is a one-op unit that reads only I (and constants), writes one
tensor x read by exactly one other op c, requests no scratch, and depends on nothing but I's
writer, and c's unit depends on nothing but s; I is no graph output and every op that reads I is
such a slice (the tiles of a patched region, docs/fit.md). (With two slices feeding one unit,
both cannot sit right before it: the brute-force test found that.)

Theorem. Some optimal order has the form: slices each immediately followed by the unit of its
consumer c ("pairs"), and at most one run of consecutive slices, which holds every slice not in a
pair and ends with the last reader of I.

Proof. Take an optimal order with units contiguous. While a slice s that is not the last reader
of I is immediately followed by a unit f other than c's unit, swap them. f does not read x, and
it reads no I (only slices do), so f's steps lose x's bytes: lower. s's step moves after f: it
was R + x, it becomes R + D_f + x, where D_f (what f leaves resident) is at most what f's last
step held above R, so it is no higher than f's old last step. Nothing else changes. Each swap
moves a slice later, so this ends; then every slice not followed by its own consumer is followed
by a slice, i.e. sits in a run of slices that ends with a slice followed by its consumer or with
the last reader of I. A run of slices can be permuted freely (slice steps are R plus the slices
so far: the largest, the last, is the same), so a run ending in a slice s' followed by its
consumer can put s' first and keep pushing the others; what is left is pairs and one run up to
the last reader of I. Moving a slice never splits another unit, and a free move (dp.py) from a
state of this form keeps the form, so the search may offer only: a pair (s, then c's unit, once
that unit is ready), or the run of all slices not yet run (after it no slice is left).
"""

from __future__ import annotations

from tpu_pipeline.toolchain.schedule.model import MemModel


def lazy_slices(model: MemModel, units, ops_mask: int,
                upred) -> tuple[dict[int, tuple[int, int]], dict[int, list[int]]]:
    """For the units of a piece (`upred`: per unit, the bitset of its predecessor units): (slice
    unit -> (fork tensor, its consumer's unit), fork tensor -> its slice units). Forks whose
    readers are not all slices of this piece, each the only predecessor of its consumer's unit,
    are left out."""
    owner = {v: k for k, u in enumerate(units) for v in u}
    slices: dict[int, tuple[int, int]] = {}
    for k, u in enumerate(units):
        if len(u) != 1 or model.extra[u[0]]:
            continue
        s = u[0]
        born = [t for t in model.touch[s] if model.born[t] == s]
        read = [t for t in model.touch[s] if model.born[t] != s]
        if len(born) != 1 or len(read) != 1:
            continue
        (x,), (fork,) = born, read
        readers = model.mask[x] & ~(1 << s)
        if model.pin_end[x] or model.pin_end[fork] or bin(readers).count("1") != 1:
            continue
        writer = model.born[fork]
        if model.preds[s] != (0 if writer < 0 else 1 << writer):
            continue
        c = readers.bit_length() - 1
        if c not in owner or upred[owner[c]] != 1 << k:
            continue  # the consumer's unit waits for nothing else (else two slices could need it)
        slices[k] = (fork, owner[c])
    groups: dict[int, list[int]] = {}
    for k, (fork, _) in slices.items():
        groups.setdefault(fork, []).append(k)
    out_s, out_g = {}, {}
    for fork, ks in groups.items():
        writer = model.born[fork]
        readers = model.mask[fork] & ~(0 if writer < 0 else 1 << writer)
        mine = 0
        for k in ks:
            mine |= 1 << units[k][0]
        if len(ks) >= 2 and readers == mine and not readers & ~ops_mask:
            out_g[fork] = sorted(ks)
            out_s.update((k, slices[k]) for k in ks)
    return out_s, out_g


def moves(piece, U: int, ready, twins: bool = False) -> list[tuple[int, ...]]:
    """The unit sequences the search may run next from unit set U (see the theorem); with
    `twins`, a twin branch's unit only after its elder twin's (twins.py)."""
    out: list[tuple[int, ...]] = []
    runs_offered: set[int] = set()
    lazy, groups = piece.lazy, piece.fork_groups
    twin = piece.twin if twins else None
    for k in ready:
        # a twin's unit waits for its elder's (a slice's consumer, in its chain, then for the
        # elder's pair; the eldest slice not run does not wait and offers the run)
        if twin and twin[k] >= 0 and not (U >> twin[k]) & 1:
            continue
        if k not in lazy:
            out.append((k,))
            continue
        fork, c = lazy[k]
        out.append((k, c))  # c's unit waits for nothing but k (lazy_slices), so it is ready now
        if fork not in runs_offered:
            runs_offered.add(fork)
            out.append(tuple(j for j in groups[fork] if not (U >> j) & 1))
    return out

