"""Loading a model for the passes: read and validate the file (tflite/), check that the runtimes
load it (execute/), make it exact for TFLite Micro (real shapes, explicit padding, no unused
tensors: tflite/extract.py) and convert it to the IR (ir/convert.py). It sits above all three, so
none of them needs another to load a file.

The model comes back as the flatbuffer object tree as read (only tflite/ and ir/convert.py look
inside it) with its IR.
"""

from __future__ import annotations

from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.execute.litert import runtime_shapes
from tpu_pipeline.toolchain.execute.litert_check import check_loads_in_litert
from tpu_pipeline.toolchain.ir.convert import from_model
from tpu_pipeline.toolchain.ir.graph import Graph
from tpu_pipeline.toolchain.tflite import read_bytes, read_model
from tpu_pipeline.toolchain.tflite.extract import runtime_exact_model, with_static_shapes


def load(path, check_litert: bool = False) -> tuple[object, Graph]:
    """Read a .tflite file and build the IR of its main subgraph (ModelError on any problem).

    `check_litert`: also refuse a model LiteRT cannot load (see `check_loads_in_litert`); the
    commands that write a model derived from the input ask for it.
    """
    label = str(path)
    data = read_bytes(path, label)
    model = read_model(data, name=label)
    graph = from_model(model)
    if check_litert:
        check_loads_in_litert(data, label)
    return resolve_dynamic_shapes(model, graph, label)


def resolve_dynamic_shapes(model: object, graph: Graph | None, label: str) -> tuple[object, Graph]:
    """One verdict on dynamic shapes for every command: a model with tensors of run-time size
    (shape signature -1 beyond the batch: [49, -1, 10], [-1, -1]) is taken with the shapes LiteRT
    allocates for it as stored (`runtime_shapes`, `with_static_shapes`, what compile and plan have always written);
    what LiteRT cannot size either is refused (ModelError) with the first such tensor named."""
    graph = graph if graph is not None else from_model(model)
    if not any(t.is_dynamic for t in graph.tensors):
        return model, graph
    try:
        model, _ = with_static_shapes(model, runtime_shapes(model))
    except ModelError:
        pass
    graph = from_model(model)
    for t in graph.tensors:
        if t.is_dynamic and t.kind == "activation":
            t.nbytes  # ModelError: "tensor '...' has a dynamic shape [...]; its size is unknown until run time"
    return model, graph


def load_exact(path, check_litert: bool = True, mcu: bool = False) -> tuple[object, Graph, list[str]]:
    """`load` for commands that write a model derived from the input: the model is first made
    exact for TFLite Micro (`tpu_pipeline.toolchain.tflite.extract.runtime_exact_model`: real shapes for
    placeholder ones, explicit padding for SPACE_TO_BATCH_ND, no tensors that no operator uses),
    so that no op order or arena plan can change its TFLite Micro outputs. Returns the model, its
    IR and one note per change.

    `mcu`: the command targets TFLite Micro (schedule, plan, fit): a model LiteRT refuses is
    accepted when TFLite Micro allocates it (TFLite Micro's own person_detect.tflite), with a note
    that checks run in TFLite Micro alone; refused only when neither runtime loads it."""
    model, _ = load(path)
    notes: list[str] = []
    if check_litert:
        notes += litert_or_tflm_notes(path, mcu)
    model, exact = runtime_exact_model(model, runtime_shapes(model))
    return model, from_model(model), notes + exact


def litert_or_tflm_notes(path, mcu: bool) -> list[str]:
    """Refuse (ModelError) a model LiteRT cannot load, unless `mcu` and TFLite Micro allocates it:
    then one note saying the checks run in TFLite Micro alone."""
    label = str(path)
    data = read_bytes(path, label)
    try:
        note = check_loads_in_litert(data, label)
    except ModelError as refusal:
        if not mcu:
            raise
        from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena  # TFLite Micro: only when asked

        try:
            measure_tflm_arena(data, label=label, invoke=True)  # loads and runs: an invalid model cannot pass
        except ModelError:
            raise refusal from None
        reason = str(refusal).split(": ", 1)[-1]
        return [f"{reason}; TFLite Micro loads it: the model is checked in TFLite Micro alone"]
    return [note] if note else []
