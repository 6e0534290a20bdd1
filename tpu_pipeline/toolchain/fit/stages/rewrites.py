"""The identity rewrites of runs of spans (and, with allow_lossy, the int8 partial-sum splits)."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.fit.variants import rewrite_variants


def rewrites(state, allowed):
    p = state.params
    found = rewrite_variants(state.working, list(state.spans), list(state.as_is), state.device, state.sem,
                             p.allow_lossy, state.model, allowed, p.harness,
                             p.relaid_weights)
    return replace(state, rewrites=tuple(found)), PassRecord("rewrites", "ran", 0.0, {"variants": len(found)})
