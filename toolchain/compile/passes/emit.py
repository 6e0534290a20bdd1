"""Serialise the optimised whole model (unless the plan pass already did) and take the IR of
exactly those bytes, so op and tensor positions below index what is written."""

from __future__ import annotations

import dataclasses

from toolchain.compile.state import CompileState, PassRecord
from toolchain.ir import from_model, to_model
from toolchain.tflite import model_to_bytes, read_model


def emit(state: CompileState, _allowed: float) -> tuple[CompileState, PassRecord]:
    whole = state.whole if state.whole is not None else model_to_bytes(to_model(state.graph, state.template))
    graph = from_model(read_model(whole))
    state = dataclasses.replace(state, whole=whole, graph=graph)
    return state, PassRecord("emit", "ran", 0.0, {"bytes": len(whole)})
