"""The baseline is the model as the user gave it, not its harness form: its proven peak and its
predicted latency."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.budget import Deadline
from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.schedule.api import schedule


def baseline(state, deadline):
    sem = state.sem
    base_sched = schedule(state.original, time_limit=None,
                          deadline=Deadline(max(0.5, 0.05 * state.params.time_limit)), semantics=sem)
    base = replace(state.baseline, peak=base_sched.peak,
                   latency_s=estimate_mcu(state.original, state.device, sem.kernels).latency_s)
    return replace(state, baseline=base), PassRecord("baseline", "ran", 0.0, {"peak": base.peak})
