"""The model read, TFLite Micro's verdict on it, its unused tensors dropped, its graph."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena
from tpu_pipeline.toolchain.ir import from_model
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model
from tpu_pipeline.toolchain.tflite.extract import without_unused_tensors


def read(state, allowed):
    src = state.src
    model = read_model(state.model_data, name=str(src)) if state.model_data is not None else read_model(src)
    # TFLite Micro's own verdict first: the same words as every MCU command for a model it cannot run
    measure_tflm_arena(model_to_bytes(model), label=str(src))
    model, dropped = without_unused_tensors(model)  # TFLite Micro would give them arena bytes; nothing reads them
    graph = from_model(model)
    if len(model.subgraphs) > 1:
        raise ModelError(f"{src}: {len(model.subgraphs)} subgraphs; the harness runs single-subgraph models")
    return replace(state, model=model, graph=graph), PassRecord("read", "ran", 0.0, {"ops": len(graph.ops)})
