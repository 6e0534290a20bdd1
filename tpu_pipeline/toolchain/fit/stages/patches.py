"""Patch-based execution candidates (by copies and as stage ops) of the spans' local regions,
each at its cheapest stage (a bound); the selection builds the ones it picks."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.fit.variants import patch_candidates


def patches(state, allowed):
    found = patch_candidates(state.working, list(state.spans), list(state.as_is), state.params.harness,
                             list(state.twins), tails=state.tail_fixed is not None)
    return replace(state, candidates=tuple(found)), PassRecord("patches", "ran", 0.0, {"candidates": len(found)})
