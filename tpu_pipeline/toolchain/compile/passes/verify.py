"""--verify: the segment files as written chained in LiteRT against the optimised whole model (bit-identical), the
optimised whole model against the input(s) in LiteRT, and in TFLite Micro where it is fast enough."""

from __future__ import annotations

import dataclasses

from tpu_pipeline.toolchain.compile.state import CompileState, PassRecord
from tpu_pipeline.toolchain.errors import ModelError, VerificationError
from tpu_pipeline.toolchain.execute.child import RuntimeCrash, start_in_child
from tpu_pipeline.toolchain.execute.compare import verify_chain, verify_models
from tpu_pipeline.toolchain.execute.litert import runtime_shapes
from tpu_pipeline.toolchain.ir import from_model, macs, to_model
from tpu_pipeline.toolchain.partition.host import litert_missing_kernels, runnable_part, verification_scope
from tpu_pipeline.toolchain.rewrite.verify import tflm_hazards
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model
from tpu_pipeline.toolchain.tflite.extract import runtime_exact_model

# TFLite Micro runs the reference kernels: seconds per inference for the largest zoo models.
TFLM_VERIFY_MAX_MACS = 300_000_000


def _verify_in_tflm(source: bytes, whole: bytes, whole_model, graph) -> dict:
    """The optimised whole model against the input model in TFLite Micro: integer outputs
    bit-identical, float within rounding. The reference is the input with what TFLite Micro would
    read unwritten taken out (`runtime_exact_model`: on the raw input its outputs depend on the
    arena's earlier contents), in the input's own op order."""
    total = sum(macs(graph, i) or 0 for i in range(len(graph.ops)))
    if total > TFLM_VERIFY_MAX_MACS:
        return {"skipped": f"{total / 1e9:.1f} GMACs: too slow for TFLite Micro's reference kernels here"}
    model = read_model(source)
    reference = model_to_bytes(runtime_exact_model(model, runtime_shapes(model))[0])
    result = verify_models(reference, whole, runs=2, runtimes=("tflm",))[0]
    if result.outputs and not result.ok:
        worst = max(o.max_abs for o in result.outputs)
        raise VerificationError(f"the optimised model differs from the input in TFLite Micro (max |diff| {worst:g})")
    return {**result.to_json(), "hazards": tflm_hazards(whole_model)}


def named_as_loaded(data: bytes) -> bytes:
    """The input model as the load pass builds the IR from it (`runtime_exact_model`, then empty or
    repeated tensor names made unique), written back: the chained comparison matches tensors by
    name, and a model with unnamed tensors (TFLite Micro's keyword_scrambled) must meet the
    optimised model's names. LiteRT's outputs are those of the input."""
    model = read_model(data)
    model = runtime_exact_model(model, runtime_shapes(model))[0]
    graph, _ = from_model(model).with_unique_tensor_names()
    return model_to_bytes(to_model(graph, model))


def is_integer_model(graph) -> bool:
    return not any(t.dtype.startswith("float") for t in graph.tensors if t.kind == "activation")


def start_whole_checks(state: CompileState):
    """The optimised whole model against the single input model, in LiteRT and in TFLite Micro,
    started in a child process as soon as `emit` has written it: neither depends on the
    partition, so on two cores they run while it searches. `verify` collects them (None: they
    are not wanted, and `verify` runs them itself if it needs them)."""
    if not state.options.verify or len(state.sources) != 1:
        return None
    whole = state.whole_model if state.whole_model is not None else read_model(state.whole)
    missing = litert_missing_kernels(whole, state.graph)
    if missing:  # verify compares the runnable parts instead
        return None
    return state.graph, state.whole, start_in_child(_whole_checks, state.sources[0], state.whole, whole, state.graph,
                                                    runtime="LiteRT", doing="checking the whole model")


def _whole_checks(source: tuple[str, bytes], whole: bytes, whole_model, graph) -> dict:
    """Each check's outcome, (True, result) or (False, its exception), raised by `verify` in order."""
    label, data = source
    out = {}
    for name, check in (("litert", lambda: verify_chain([(label, named_as_loaded(data), "")], [whole],
                                                          exact=is_integer_model(graph))),
                        ("tflm", lambda: _verify_in_tflm(data, whole, whole_model, graph))):
        try:
            out[name] = (True, check())
        except Exception as exc:  # noqa: BLE001 - re-raised by verify, where the foreground would raise it
            out[name] = (False, exc)
    return out


def _outcome(checks: dict | None, name: str, run):
    """The early check `name`'s result (its exception raised), or `run()` when it was not started."""
    if checks is None:
        return run()
    ok, value = checks[name]
    if ok:
        return value
    raise value


def verify(state: CompileState, _allowed: float) -> tuple[CompileState, PassRecord]:
    o, graph, part = state.options, state.graph, state.partition
    early = state.early_checks
    state = dataclasses.replace(state, early_checks=None)
    if early is not None and (early[0] is not graph or early[1] != state.whole):
        early[2].cancel()  # a pass changed the model since: check what is there now
        early = None
    whole = state.whole_model if state.whole_model is not None else read_model(state.whole)
    # what LiteRT can run here: all of it, unless a custom op has no kernel (it stays on the host)
    # the early checks started only where LiteRT has every kernel
    scope = verification_scope(whole, graph, part.stages, part.interfaces, {} if early is not None else None,
                               written=[seg.data for seg in state.segments])
    try:
        verification = verify_chain([(f"{o.stem}.tflite", scope.reference, "")], list(scope.segments))
    except RuntimeCrash as exc:  # LiteRT dies on the model: the pipeline's host runtime cannot run it
        raise ModelError(f"{exc}; compile's Edge TPU pipeline runs on LiteRT, so this model cannot be compiled "
                         f"(the MCU commands run it in TFLite Micro)") from None
    verification["scope"] = scope.to_json()
    checks = None if early is None else early[2].result()
    notes = []
    if scope.complete and len(state.sources) == 1:
        label, data = state.sources[0]
        # built only when the early check did not run (it compared the same two models)
        reference = lambda: [(label, named_as_loaded(data), "")]  # noqa: E731
        optimised = state.whole
    elif scope.complete:
        reference = [(label, data, pre) for (label, data), pre in zip(state.sources, state.prefixes)]
        optimised = state.whole
    elif len(state.sources) == 1:  # compare the runnable parts of the input and of the result
        label, data = state.sources[0]
        source = read_model(named_as_loaded(data))
        reference = [(label, runnable_part(source, from_model(source))[0], "")]
        optimised = runnable_part(whole, graph)[0]
    else:
        reference = None
    if reference is not None:
        # the optimised whole model against the input(s): integer models must match exactly;
        # float models may differ by rounding where a rewrite reassociated sums (reported)
        src = _outcome(checks, "litert", lambda: verify_chain(reference() if callable(reference) else reference,
                                                              [optimised], exact=is_integer_model(graph)))
        verification["whole_vs_source"] = {k: src[k] for k in ("bit_identical", "max_abs_diff", "outputs_compared")}
        if not src["bit_identical"]:
            notes.append(f"float model: the optimised model differs from the input by at most "
                         f"{src['max_abs_diff']:g} (rewrites reassociate float sums); the segments match the "
                         "optimised model exactly")
    if not scope.complete:
        notes.append(f"verification skipped {len(scope.skipped_ops)} op(s) LiteRT cannot run here "
                     f"({'; '.join(scope.reasons)}); outputs not compared: "
                     f"{', '.join(scope.unverified_outputs) or 'none'}")
        verification["whole_vs_source_tflm"] = {"skipped": "the model has ops TFLite Micro cannot run here"}
    elif len(state.sources) == 1:
        verification["whole_vs_source_tflm"] = _outcome(
            checks, "tflm", lambda: _verify_in_tflm(state.sources[0][1], state.whole, whole, graph))
    state = dataclasses.replace(state, verification=verification, notes=state.noted(*notes))
    return state, PassRecord("verify", "ran", 0.0, verification)
