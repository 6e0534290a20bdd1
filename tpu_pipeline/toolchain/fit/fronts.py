"""The chain DP's Pareto fronts (select.py's `_Chain.front`): coverings of the spans by variants,
each variant an arc from its first span to its last + 1, labelled by (tail, latency), on arrays."""

from __future__ import annotations

import numpy as np


def pareto_front(variants, first, end, tail, lat, n_spans: int, max_tail: int | None, max_lat: int | None = None):
    """The Pareto front of (tail, latency ns) over coverings of the spans by `variants` (their
    first spans, end spans (last + 1), tails and latencies in ns as arrays), tail at most
    `max_tail`, latency at most `max_lat`: [(tail, latency, variants)], each label a covering
    nothing else beats on both. A label that could not end within the limits even on the least
    tail and the least latency of any way on from its span (two backward passes) is not kept:
    with a tight limit, as the selection's second level sets, few labels survive. Per end span,
    every (variant, label at its first span) pair at once, in the order a loop over the variants
    and their labels meets them (ties keep the first)."""
    most = np.iinfo(np.int64).max
    rest_tail, rest_ns = _rest(first, end, tail, lat, n_spans)
    # labels of every span so far, flat: tail, latency, the variant of their last arc, the label before
    lab_t, lab_n = np.zeros(1, np.int64), np.zeros(1, np.int64)
    lab_v, lab_p = np.full(1, -1, np.int64), np.full(1, -1, np.int64)
    at, count = np.zeros(n_spans + 1, np.int64), np.zeros(n_spans + 1, np.int64)  # span -> its labels' slice
    count[0] = 1
    by_end = np.argsort(end, kind="stable")
    bounds = np.searchsorted(end[by_end], np.arange(n_spans + 2))
    for s in range(1, n_spans + 1):
        at[s] = len(lab_t)
        if rest_tail[s] == most and (max_tail is not None or max_lat is not None):
            continue  # no way on from here: no label could end within a limit
        idx = by_end[bounds[s]:bounds[s + 1]]
        counts = count[first[idx]]
        total = int(counts.sum())
        if total == 0:
            continue
        arc = np.repeat(idx, counts)  # (variant, label) pairs, variant-major
        starts = np.repeat(at[first[idx]] - (np.cumsum(counts) - counts), counts)
        prev = starts + np.arange(total)
        t2, n2 = lab_t[prev] + tail[arc], lab_n[prev] + lat[arc]
        ok = np.ones(total, bool)
        if max_tail is not None:
            ok &= t2 <= max_tail - rest_tail[s]
        if max_lat is not None:
            ok &= n2 <= max_lat - rest_ns[s]
        t2, n2, arc, prev = t2[ok], n2[ok], arc[ok], prev[ok]
        order = np.lexsort((n2, t2))  # (stable: tail, then latency, then the loop's order)
        n_sorted = n2[order]
        before = np.concatenate(([most], np.minimum.accumulate(n_sorted)[:-1]))
        kept = order[n_sorted < before]  # ascending tail: each one faster than every smaller-tail label
        count[s] = len(kept)
        lab_t, lab_n = np.concatenate((lab_t, t2[kept])), np.concatenate((lab_n, n2[kept]))
        lab_v, lab_p = np.concatenate((lab_v, arc[kept])), np.concatenate((lab_p, prev[kept]))
    out = []
    for g in range(int(at[n_spans]), int(at[n_spans] + count[n_spans])):
        chosen, k = [], g
        while lab_v[k] >= 0:
            chosen.append(variants[int(lab_v[k])])
            k = int(lab_p[k])
        out.append((int(lab_t[g]), int(lab_n[g]), chosen[::-1]))
    return out


def _rest(first, end, tail, lat, n_spans: int):
    """Per span, the least tail and the least latency of any way on from it to the last span
    (int64 max where there is none)."""
    most = np.iinfo(np.int64).max
    rest_tail, rest_ns = np.full(n_spans + 1, most, np.int64), np.full(n_spans + 1, most, np.int64)
    rest_tail[n_spans] = rest_ns[n_spans] = 0
    by_first = np.argsort(first, kind="stable")
    bounds = np.searchsorted(first[by_first], np.arange(n_spans + 1))
    for s in range(n_spans - 1, -1, -1):
        idx = by_first[bounds[s]:bounds[s + 1]]
        idx = idx[rest_tail[end[idx]] < most]
        if idx.size:
            rest_tail[s] = int((tail[idx] + rest_tail[end[idx]]).min())
            rest_ns[s] = int((lat[idx] + rest_ns[end[idx]]).min())
    return rest_tail, rest_ns
