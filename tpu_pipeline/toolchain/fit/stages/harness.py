"""The model in its harness form (ir.kernels via variants.on_harness): what the spans index."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.fit.variants import on_harness


def harness(state, allowed):
    graph, notes = on_harness(state.working, state.params.relaid_weights)
    return (replace(state, graph=graph, working=graph, notes=state.notes + tuple(notes)),
            PassRecord("harness", "ran" if graph is not state.working else "no gain", 0.0, {"notes": len(notes)}))
