"""A lean twin (fit/variants.lean_twins) is chosen on the selection's tail bound, which rounds
every allocation up: its 16 bytes can vanish in the real tail's alignment (chain_int8: the same
4,004 B arena at twice the latency). Each chosen lean twin (or a twin of one) is swapped for the
variant of the same spans that keeps the kernel variant and is faster at the least tail, within
the selection's peak; where that selection, realised, takes no more arena, it is kept: the same
bytes, faster. A try that poses the whole graph's scheduler the question the kept realisation
answered (a kernel swapped, the head's buffers the same) takes that answer and plans its arena
only (fit/realise.py `_same_answer`); the tries' patches are built once."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.fit.realise import realise
from tpu_pipeline.toolchain.fit.select import Selection
from tpu_pipeline.toolchain.memory.tflm_target import target_tail


UNLEAN_SINGLES = 4  # lean twins swapped one at a time (largest gain first) when all together take more arena


def unlean(state, deadline):
    p, sem, sel = state.params, state.sem, state.selection
    if sel is None or not any(v.lean_of is not None for v in sel.variants) or state.deadline.expired():
        return state, PassRecord("unlean", "no gain", 0.0, {})
    origins = tuple(_origin(v, state.pool.variants, sel.peak) for v in sel.variants)
    swaps = [k for k, (o, v) in enumerate(zip(origins, sel.variants)) if o is not v]
    if not swaps:
        return state, PassRecord("unlean", "no gain", 0.0, {})

    def counted(g, plan) -> int:  # what the budget and the memory objective count
        return plan.head + ((target_tail(g, sem).bytes or 0) if p.arena == "whole" else 0)

    def hopeless(g, sched) -> bool:  # above the kept arena even at a head of its order's peak (no plan is below it)
        return sched.peak + ((target_tail(g, sem).bytes or 0) if p.arena == "whole" else 0) > counted(*done[::2])

    # all at once, then (where their 16 B each add up past the real tail's alignment, chain_int8:
    # three lean twins since the window variant) one at a time, the largest gain first
    tries = [swaps] + ([[k] for k in sorted(swaps, key=lambda k: sel.variants[k].latency_s - origins[k].latency_s,
                                              reverse=True)[:UNLEAN_SINGLES]] if len(swaps) > 1 else [])
    best, done, kept = sel, state.realised, []
    built: dict = {}  # (the swaps change kernels: the patches are built once)
    for ks in tries:
        if state.deadline.expired() or (kept and ks == swaps):
            break
        chosen = tuple(origins[k] if k in ks or k in kept else v for k, v in enumerate(sel.variants))
        tail = sel.tail and sel.tail + sum(o.tail - v.tail for o, v in zip(chosen, sel.variants))
        alt = Selection(chosen, max(v.peak for v in chosen), sum(v.latency_s for v in chosen), sel.proven, tail)
        tried = realise(state.working, list(state.spans), alt, sem, state.deadline, state.progress, state.t0,
                        like=(done, best), built=built, hopeless=hopeless)
        if tried is not None and counted(tried[0], tried[2]) <= counted(*done[::2]) and alt.latency_s < best.latency_s:
            best, done, kept = alt, tried, kept + ks
            if ks == swaps:
                break
    if best is sel:
        return state, PassRecord("unlean", "no gain", 0.0, {})
    state = replace(state, selection=best, realised=done, graph=done[0])
    return state, PassRecord("unlean", "ran", 0.0, {"arena": counted(done[0], done[2]), "swapped": len(kept)})


def _origin(v, pool, peak: int):
    """`v`, or where it is lean (a lean twin or a twin of one), the variant of its spans that is
    not, faster, within `peak`, of the least tail (then the fastest)."""
    if v.lean_of is None:
        return v
    faster = [u for u in pool if u.first == v.first and u.last == v.last and u.lean_of is None
              and u.stage == "measured" and u.peak <= peak and u.latency_s < v.latency_s]
    return min(faster, key=lambda u: (u.tail, u.latency_s), default=v)
