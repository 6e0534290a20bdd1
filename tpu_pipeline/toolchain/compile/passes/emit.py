"""Serialise the optimised whole model: the graph written back into the model as read, with the
plan pass's offsets as TFLite Micro's offline memory plan. `to_model` keeps tensor and op
positions, so the graph indexes these bytes as it is."""

from __future__ import annotations

import dataclasses

from tpu_pipeline.toolchain.compile.passes.verify import start_whole_checks
from tpu_pipeline.toolchain.compile.state import CompileState, PassRecord
from tpu_pipeline.toolchain.ir import to_model
from tpu_pipeline.toolchain.tflite import model_to_bytes, with_offline_plan
from tpu_pipeline.toolchain.tflite.io import checked_as_written


def emit(state: CompileState, _allowed: float) -> tuple[CompileState, PassRecord]:
    whole = to_model(state.graph, state.template)
    if state.offline_plan is not None:
        whole = with_offline_plan(whole, list(state.offline_plan))
    data = model_to_bytes(whole)
    # checked as a reader checks it, not unpacked again
    state = dataclasses.replace(state, whole=data, whole_model=checked_as_written(whole, data))
    # --verify's whole-model checks need nothing later passes make: they start now (verify.py)
    state = dataclasses.replace(state, early_checks=start_whole_checks(state))
    return state, PassRecord("emit", "ran", 0.0, {"bytes": len(data)})
