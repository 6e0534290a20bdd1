"""Each span as it is (its best order, priced), the ops' predicted seconds, and the part of the
target's tail no variant changes."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.fit.realise import tail_fixed_of
from tpu_pipeline.toolchain.fit.variants import as_is_variants


def as_is(state, allowed):
    g, sem = state.working, state.sem
    variants = as_is_variants(g, list(state.spans), state.device, sem, allowed, state.progress)
    op_seconds = {o.index: o.seconds for o in estimate_mcu(g, state.device, sem.kernels).ops}
    tail_fixed, note = tail_fixed_of(g, sem, state.params.arena)
    state = replace(state, as_is=tuple(variants), op_seconds=op_seconds, tail_fixed=tail_fixed,
                    notes=state.notes + ((note,) if note else ()))
    return state, PassRecord("as_is", "ran", 0.0, {"variants": len(variants)})
