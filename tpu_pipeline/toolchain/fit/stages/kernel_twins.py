"""The harness kernels' twins of every variant so far (requantization in flash, overlapped and
direct convolutions, ADD/MUL in place, and without the variants that bring tail bytes: `lean_twins`);
switched off with the builtin kernels."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.fit.variants import twins_of


def kernel_twins(state, allowed):
    found = tuple(t for v in state.as_is + state.rewrites for t in twins_of(v, state.device, state.sem))
    return replace(state, twins=found), PassRecord("kernel_twins", "ran", 0.0, {"variants": len(found)})
