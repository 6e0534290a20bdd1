"""TASO's selection over the pool of variants: the frontier first when asked (every selection is
then a point of it), else the fastest within the budget or the smallest; the probes after it."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.budget import say
from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.fit.pool import Pool
from tpu_pipeline.toolchain.fit.search import choose, from_frontier, frontier_of, selection_of


def select(state, deadline):
    p = state.params
    pool = Pool(state.working, list(state.spans), list(state.as_is + state.rewrites + state.twins + state.candidates),
                state.device, state.sem, state.op_seconds, p.harness, state.tail_fixed)
    n = len(state.spans)
    pool.estimate_all(deadline.sub(fraction=0.4))  # (then the chain DP chooses again only after a build)
    say(state.progress, state.t0, f"fit: {len(state.candidates)} patch candidates, {len(state.rewrites)} rewrite "
                                  f"variants, {len(state.twins)} kernel variants; selecting")
    frontier, complete = (), False
    if p.pareto:  # the frontier first: every selection asked for is then a point of it
        frontier, complete = frontier_of(pool, n, deadline)
        say(state.progress, state.t0, f"fit: frontier of {len(frontier)} points{'' if complete else ' (incomplete)'}")
        sel = from_frontier(frontier, p.budget, p.objective)
    else:
        sel = choose(pool, n, p.budget, p.objective, deadline)
    # the search ran out of time before its pick was all built and measured: the answer is the best
    # of what was measured, which can be far from the best there is (MobileNetV2 at 320 KiB: +127 %
    # latency at 30 s, +3.4 % at 120 s); the user must hear it
    cut_short = pool.stopped
    probes = {}
    for b in p.probe_budgets:  # after the main search: its measured variants answer most of these
        pool.stopped = False
        found = pool.select(n, b, "latency", deadline.sub(fraction=0.3))
        probes[b] = "time limit" if found is None and pool.stopped else found
    if sel is None:  # nothing fits: the smallest arena we can reach
        sel = frontier[-1] if frontier else pool.select(n, None, "memory", deadline.sub(fraction=0.5))
    say(state.progress, state.t0, f"fit: {pool.estimated} variants estimated, {pool.measured} built and measured")
    state = replace(state, pool=pool, baseline=selection_of(list(state.as_is), state.tail_fixed), selection=sel,
                    frontier=frontier, complete=complete, cut_short=cut_short, probes=probes)
    return state, PassRecord("select", "ran", 0.0, {"estimated": pool.estimated, "measured": pool.measured,
                                                   "frontier_complete": complete, "cut_short": cut_short})
