"""Read the input model(s) (validated by our reader, then loaded once by LiteRT), give each an
int8 interface if asked (`--int8-io`: the changed model is then the reference of every check),
merge co-deployed ones, give every tensor a unique name (segments chain by name), mark the inputs
the application keeps outside the arena (`--input-outside-arena`) and check that -n can be met
before anything expensive runs."""

from __future__ import annotations

import dataclasses

from tpu_pipeline.toolchain.compile.state import CompileState, PassRecord
from tpu_pipeline.toolchain.cost.edgetpu import EdgeTpuCostModel
from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.ir import from_model
from tpu_pipeline.toolchain.ir.convert import rewritten_model
from tpu_pipeline.toolchain.rewrite.interface import external_inputs, int8_io
from tpu_pipeline.toolchain.partition import PartitionProblem
from tpu_pipeline.toolchain.execute.litert import runtime_shapes
from tpu_pipeline.toolchain.execute.litert_check import check_loads_in_litert, start_litert_check
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_bytes, read_model
from tpu_pipeline.toolchain.tflite.metadata import total_tensor_count
from tpu_pipeline.toolchain.tflite.extract import (has_custom_ops, merge_models, needs_runtime_shapes,
                                                   runtime_exact_model)


def load(state: CompileState, _allowed: float) -> tuple[CompileState, PassRecord]:
    opts = state.options
    sources, models, notes, pending = [], [], [], None
    for p in opts.paths:
        data = read_bytes(p)  # ModelError naming what is wrong with the path
        # LiteRT's load check of the file as it is runs in a child while our reader parses it
        early = None if opts.int8_io else start_litert_check(data, str(p))
        model = read_model(data, name=str(p))  # its error comes first (the child is killed when dropped)
        if opts.int8_io:  # a new interface: the model with that change alone is the reference
            io_graph, changed = int8_io(from_model(model), str(p))
            notes += [f"{p}: {note}" if len(opts.paths) > 1 else note for note in changed]
            model = rewritten_model(io_graph, model)
            data = model_to_bytes(model)
        models.append(model)
        sources.append((str(p), data))
        if early is not None and _may_defer(opts, model):
            pending = early
            continue
        unresolved = _refused_by_litert(early if early is not None else lambda: check_loads_in_litert(data, str(p)))
        if unresolved:
            notes.append(unresolved)
    if len(models) == 1:
        model, prefixes = models[0], ("",)
    else:
        prefixes = tuple(f"{p.stem}/" for p in opts.paths)
        model = merge_models(models, list(prefixes), name=opts.stem)
    # what would make TFLite Micro read bytes it never wrote (placeholder shapes, SPACE_TO_BATCH_ND
    # padding) is taken out first, so every order and plan below gives the same TFLM outputs
    model, exact_notes = runtime_exact_model(model, runtime_shapes(model))
    notes += exact_notes
    graph, renamed = from_model(model).with_unique_tensor_names()
    if renamed:
        notes.append(f"{renamed} tensor(s) had an empty or duplicate name and were given a unique one")
    if not graph.ops:
        raise ModelError(f"{opts.paths[0]}: the model has no operators")
    if opts.input_outside_arena:
        graph = external_inputs(graph)
    for t in (*graph.inputs, *graph.outputs):
        graph.tensors[t].nbytes  # raises ModelError for dynamic shapes
    if opts.n is not None:  # -n auto tries what the graph allows; --cuts checks its own n
        PartitionProblem(graph, EdgeTpuCostModel(opts.device)).check_n(opts.n, opts.label)
    state = dataclasses.replace(state, sources=tuple(sources), prefixes=prefixes, template=model, graph=graph, loaded=graph,
                                other_subgraph_tensors=total_tensor_count(model) - len(graph.tensors),
                                notes=state.noted(*notes), litert_check=pending)
    return state, PassRecord("load", "ran", 0.0, {"ops": len(graph.ops), "models": len(opts.paths)})


def _refused_by_litert(check) -> str | None:
    """`check()`'s note, or its refusal as compile words it (the pipeline's host runtime is LiteRT)."""
    try:
        return check()
    except ModelError as exc:  # say where the model does run
        raise ModelError(f"{exc}; compile's Edge TPU pipeline runs on LiteRT, so this model cannot be compiled "
                         f"(the MCU commands inspect, schedule, plan, fit, profile and export-mcu accept what "
                         f"TFLite Micro runs)") from None


def _may_defer(opts, model) -> bool:
    """Whether LiteRT's load check may finish later (`confirm_litert`): nothing before the segments
    pass runs LiteRT in this process for this model (its shapes are stored, not LiteRT's; the
    rewrite pass's own check of a depthwise split confirms it first), and it can give no note
    (a note is only for a custom op), so the report is the same. One model, not fitted."""
    return len(opts.paths) == 1 and opts.budget is None and not needs_runtime_shapes(model) and not has_custom_ops(model)


def confirm_litert(state: CompileState) -> CompileState:
    """The deferred LiteRT load check (see `load`), collected: its refusal raised as at load."""
    if state.litert_check is None:
        return state
    check, state = state.litert_check, dataclasses.replace(state, litert_check=None)
    note = _refused_by_litert(check)
    return dataclasses.replace(state, notes=state.noted(note)) if note else state
