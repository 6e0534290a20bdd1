"""The model read, TFLite Micro's verdict on it, made exact for TFLite Micro (as every command that
writes a model makes it: `loader.load_exact`), its graph."""

from __future__ import annotations

from dataclasses import replace

from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.execute.litert import runtime_shapes
from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena
from tpu_pipeline.toolchain.ir import from_model
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model
from tpu_pipeline.toolchain.tflite.extract import runtime_exact_model


def read(state, allowed):
    src = state.src
    model = read_model(state.model_data, name=str(src)) if state.model_data is not None else read_model(src)
    # TFLite Micro's own verdict first: the same words as every MCU command for a model it cannot run
    measure_tflm_arena(model_to_bytes(model), label=str(src))
    # what would make the board's TFLite Micro read bytes nothing wrote goes: a padding
    # SPACE_TO_BATCH_ND pads with one (a model as given computes what its arena held at power-on,
    # not what LiteRT computes), placeholder shapes; and the tensors no op uses, which it would give bytes
    model, notes = runtime_exact_model(model, runtime_shapes(model))
    graph = from_model(model)
    if len(model.subgraphs) > 1:
        raise ModelError(f"{src}: {len(model.subgraphs)} subgraphs; the harness runs single-subgraph models")
    state = replace(state, model=model, graph=graph, notes=tuple(notes))
    return state, PassRecord("read", "ran", 0.0, {"ops": len(graph.ops)})
