"""The chosen variant's real arena can come out above the model as it is (its graph too big for
the scheduler or the planner in the time left, or its ops' tail unknown to the selection): keep
whichever is smaller."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.fit.realise import realise
from tpu_pipeline.toolchain.memory.tflm_target import target_tail


def keep_smaller(state, deadline):
    p, sem, sel, baseline = state.params, state.sem, state.selection, state.baseline
    whole, sched, plan = state.realised
    as_is_chosen = len(sel.variants) == len(baseline.variants) and all(
        a is b for a, b in zip(sel.variants, baseline.variants))

    def counted(g, plan) -> int:  # what the budget and the memory objective count
        return plan.head + ((target_tail(g, sem).bytes or 0) if p.arena == "whole" else 0)

    if as_is_chosen or counted(whole, plan) <= baseline.arena or (p.budget is not None and baseline.arena > p.budget):
        return state, PassRecord("keep_smaller", "no gain", 0.0, {})
    again = realise(state.working, list(state.spans), baseline, sem, state.deadline, state.progress, state.t0)
    as_is_arena = counted(again[0], again[2])
    if as_is_arena >= counted(whole, plan):
        return state, PassRecord("keep_smaller", "no gain", 0.0, {})
    note = (f"the chosen variant's arena ({counted(whole, plan):,} B) came out above the model as it "
            f"is ({as_is_arena:,} B); the model as it is was kept")
    state = replace(state, selection=baseline, realised=again, graph=again[0], notes=state.notes + (note,))
    return state, PassRecord("keep_smaller", "ran", 0.0, {"arena": as_is_arena})
