"""Overlapped ops' rigid groups can leave the realised plan above the selection's peak: tell the
pool what those variants really reach, select again and keep the new choice where it is smaller."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.budget import Deadline
from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.fit.realise import overshoot, realise
from tpu_pipeline.toolchain.memory.tflm_target import target_tail

REPLAN_ROUNDS = 3  # selections re-made when overlapped ops' groups keep the plan above the promised peak


def replan(state, deadline):
    p, pool, sem, whole_run = state.params, state.pool, state.sem, state.deadline
    sel, (whole, sched, plan) = state.selection, state.realised
    rounds = 0
    for _ in range(REPLAN_ROUNDS):
        over = overshoot(whole, plan, sel, sem)
        if not over or whole_run.expired():
            break
        for v, top in over:
            pool.variants[pool.index(v)] = replace(v, peak=top, lower_bound=min(v.lower_bound, top))
        more = Deadline(max(2.0, 0.3 * whole_run.remaining()))  # the search's own time is spent
        n = len(state.spans)
        again = pool.select(n, p.budget, p.objective, more) or pool.select(n, None, "memory", more)
        if again is None or [id(v) for v in again.variants] == [id(v) for v in sel.variants]:
            break
        tried = realise(state.working, list(state.spans), again, sem, whole_run, state.progress, state.t0)
        if tried[2].head + (target_tail(tried[0], sem).bytes or 0) >= plan.head + (target_tail(whole, sem).bytes or 0):
            break
        sel, (whole, sched, plan) = again, tried
        rounds += 1
    state = replace(state, selection=sel, realised=(whole, sched, plan), graph=whole)
    return state, PassRecord("replan", "ran" if rounds else "no gain", 0.0, {"rounds": rounds})
