"""The chosen selection applied to the whole graph, scheduled and planned (fit/realise.py)."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.fit.realise import realise as realised_of


def realise(state, deadline):
    whole, sched, plan = done = realised_of(state.working, list(state.spans), state.selection, state.sem,
                                            state.deadline, state.progress, state.t0)
    return (replace(state, graph=whole, realised=done),
            PassRecord("realise", "ran", 0.0, {"ops": len(whole.ops), "head": plan.head, "peak": sched.peak}))
