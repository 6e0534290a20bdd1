"""The chain DP's Pareto fronts (select.py's `_Chain.front`): coverings of the spans by variants,
each variant an arc from its first span to its last + 1, labelled by (tail, latency)."""

from __future__ import annotations

import bisect
import operator

import numpy as np


class Arcs:
    """Variants as arcs over the spans, as plain lists, with what no limit changes: per span the
    least tail and the least latency of any way on from it (two backward passes) and the arcs
    ending there. The selection asks the front of one set of arcs (a cap's) under limit after
    limit: this is made once per set."""

    def __init__(self, variants, first, end, tail, lat, n_spans: int):
        self.variants, self.n = variants, n_spans
        self.first, self.tail, self.lat = first, tail, lat = first.tolist(), tail.tolist(), lat.tolist()
        end = end.tolist()
        most = np.iinfo(np.int64).max
        rest_tail, rest_ns = [most] * (n_spans + 1), [most] * (n_spans + 1)  # the least of any way on
        rest_tail[n_spans] = rest_ns[n_spans] = 0
        self.ending: dict[int, list[int]] = {}  # end span -> the arcs ending there, in order
        starting: dict[int, list[int]] = {}
        for k, (a, e) in enumerate(zip(first, end)):
            self.ending.setdefault(e, []).append(k)
            starting.setdefault(a, []).append(k)
        for s in sorted(starting, reverse=True):  # (later spans first: theirs are final)
            least_t, least_n = most, most
            for k in starting[s]:
                on = rest_tail[end[k]]
                if on < most:
                    least_t = min(least_t, tail[k] + on)
                    least_n = min(least_n, lat[k] + rest_ns[end[k]])
            rest_tail[s], rest_ns[s] = least_t, least_n
        self.rest_tail, self.rest_ns = rest_tail, rest_ns


def front_of(arcs: Arcs, max_tail: int | None, max_lat: int | None = None):
    """The Pareto front of (tail, latency ns) over coverings of the spans by `arcs`, tail at most
    `max_tail`, latency at most `max_lat`: [(tail, latency, variants)], each label a covering
    nothing else beats on both. A label that could not end within the limits even on the least
    tail and the least latency of any way on from its span is not kept: with a tight limit, as
    the selection's second level sets, few labels survive. (A loop over plain lists: the fronts
    the selection asks are small, thousands of them, where array operations per span cost more
    than the loop.)"""
    first, tail, lat, n_spans = arcs.first, arcs.tail, arcs.lat, arcs.n
    rest_tail, rest_ns, ending = arcs.rest_tail, arcs.rest_ns, arcs.ending
    labels: list[list] = [[] for _ in range(n_spans + 1)]
    labels[0] = [(0, 0, None, None)]  # (tail, latency, the label before, the variant's index)
    unlimited = float("inf")
    by_tail_then_lat = operator.itemgetter(0, 1)
    for s in range(1, n_spans + 1):
        cands = []
        room_t = unlimited if max_tail is None else max_tail - rest_tail[s]
        room_n = unlimited if max_lat is None else max_lat - rest_ns[s]
        for k in ending.get(s, ()):
            t, n = tail[k], lat[k]
            for label in labels[first[k]]:  # (a span's labels: tails ascending, latencies descending)
                t2 = label[0] + t
                if t2 > room_t:
                    break  # (the rest have larger tails)
                n2 = label[1] + n
                if n2 <= room_n:
                    cands.append((t2, n2, label, k))
        cands.sort(key=by_tail_then_lat)
        kept, best_lat = [], unlimited
        for c in cands:  # ascending tail: keep each one faster than every smaller-tail label
            if c[1] < best_lat:
                kept.append(c)
                best_lat = c[1]
        labels[s] = kept
    out = []
    for c in labels[n_spans]:
        chosen, label = [], c
        while label[3] is not None:
            chosen.append(arcs.variants[label[3]])
            label = label[2]
        out.append((c[0], c[1], chosen[::-1]))
    return out


# steps (label extensions, staircase points) beyond which count_within gives up (None: CP-SAT
# breaks the ties as before), so a count never costs more than a few solves; the benchmark set's
# counts stay under it, each under 5 ms (a solve: 6-9 ms)
MAX_COUNT_WORK = 50_000


def count_within(variants, n_spans: int, max_arena: int, max_lat: int, ns: dict, tail_fixed: int | None,
                 most: int = 2) -> int | None:
    """How many coverings of the spans by `variants` (each an arc from `first` to `last` + 1) have
    an arena (the peak, plus the tails and `tail_fixed` when counted) at most `max_arena` and a
    latency (ns by id in `ns`) at most `max_lat`, counted up to `most`; None where that would
    take more than MAX_COUNT_WORK steps. Every covering is its own path, equal ones included (no
    label is dominated away), so where the limits are an optimum's a count of 1 proves it the only
    optimal covering: select.py then needs no CP-SAT solve to break ties. A label (peak, tail,
    latency) that no way on (`_rest_fronts`) can end within the limits is dropped."""
    tails = [0 if tail_fixed is None else v.tail for v in variants]
    fixed = 0 if tail_fixed is None else tail_fixed
    lats = [ns[id(v)] for v in variants]
    ending: dict[int, list[int]] = {}
    for k, v in enumerate(variants):
        ending.setdefault(v.last + 1, []).append(k)
    rest = _rest_fronts(variants, n_spans, tails, lats, max_arena - fixed, max_lat)
    if rest is None:
        return None
    labels: list[dict] = [{} for _ in range(n_spans + 1)]
    labels[0][(0, 0, 0)] = 1  # (peak, tail, latency) -> how many paths reach it, up to `most`
    work = 0
    for s in range(1, n_spans + 1):
        here, (rest_ns, rest_tail) = labels[s], rest[s]
        if not rest_ns:
            continue  # no way on from s within the limits
        for k in ending.get(s, ()):
            v = variants[k]
            work += len(labels[v.first])
            if work > MAX_COUNT_WORK:
                return None
            for (p, t, n), c in labels[v.first].items():
                p2, t2, n2 = max(p, v.peak), t + tails[k], n + lats[k]
                j = bisect.bisect_right(rest_ns, max_lat - n2) - 1  # the least tail on within the latency left
                if j >= 0 and p2 + t2 + rest_tail[j] + fixed <= max_arena:
                    here[(p2, t2, n2)] = min(most, here.get((p2, t2, n2), 0) + c)
    return min(most, sum(labels[n_spans].values()))


def _rest_fronts(variants, n_spans: int, tails, lats, max_memory: int, max_lat: int) -> list[tuple] | None:
    """Per span s, the ways on from s to the end within the limits as a staircase: latencies
    ascending and the least tail of a way on at each (descending); a way on's arcs' peaks and
    tails, with the least tail and latency of any way to s, stay within the limits. None past
    MAX_COUNT_WORK points."""
    starting: dict[int, list[int]] = {}
    for k, v in enumerate(variants):
        starting.setdefault(v.first, []).append(k)
    to_ns, to_tail = _ways_to(variants, n_spans, tails, lats)
    out: list[tuple[list, list]] = [([], []) for _ in range(n_spans + 1)]
    out[n_spans] = ([0], [0])
    work = 0
    for s in sorted(starting, reverse=True):  # (later spans first: theirs are final)
        points, room_ns, room_tail = [], max_lat - to_ns[s], max_memory - to_tail[s]
        for k in starting[s]:
            v = variants[k]
            on_ns, on_tail = out[v.last + 1]
            for n, t in zip(on_ns, on_tail):
                if n + lats[k] <= room_ns and t + tails[k] + v.peak <= room_tail:
                    points.append((n + lats[k], t + tails[k]))
            work += len(on_ns)
        if work > MAX_COUNT_WORK:
            return None
        points.sort()
        stair_ns, stair_tail = [], []
        for n, t in points:
            if not stair_tail or t < stair_tail[-1]:
                stair_ns.append(n)
                stair_tail.append(t)
        out[s] = (stair_ns, stair_tail)
    return out


def _ways_to(variants, n_spans: int, tails, lats) -> tuple[list, list]:
    """Per span s, the least latency and the least tail of any way from the first span to s."""
    most = float("inf")
    to_ns, to_tail = [most] * (n_spans + 1), [most] * (n_spans + 1)
    to_ns[0] = to_tail[0] = 0
    for k in sorted(range(len(variants)), key=lambda k: variants[k].first):  # (earlier spans first: final)
        v = variants[k]
        e = v.last + 1
        to_ns[e] = min(to_ns[e], to_ns[v.first] + lats[k])
        to_tail[e] = min(to_tail[e], to_tail[v.first] + tails[k])
    return to_ns, to_tail
