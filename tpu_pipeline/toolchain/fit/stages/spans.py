"""The graph cut into spans (fit/spans.py): every variant covers a run of them."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.budget import say
from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.fit.spans import split_spans


def spans(state, allowed):
    cut = split_spans(state.working)
    say(state.progress, state.t0, f"fit: {len(state.working.ops)} ops in {len(cut)} spans")
    return replace(state, spans=tuple(cut)), PassRecord("spans", "ran", 0.0, {"spans": len(cut)})
