"""Edge TPU pipeline segments: CP-SAT stage assignment, with Coral's heuristic as the baseline."""

from __future__ import annotations

import dataclasses

from tpu_pipeline.toolchain.compile.state import CompileState, PassRecord
from tpu_pipeline.toolchain.partition import partition as partition_graph


def partition(state: CompileState, allowed: float) -> tuple[CompileState, PassRecord]:
    o = state.options
    part = partition_graph(state.graph, o.n, device=o.device, strategy=o.strategy, time_limit=allowed,
                           colocate=o.colocate, workers=o.workers, label=o.label, gap=o.gap)
    state = dataclasses.replace(state, partition=part)
    return state, PassRecord("partition", "ran", 0.0, {"strategy": o.strategy, "proven_optimal": part.proven_optimal})
