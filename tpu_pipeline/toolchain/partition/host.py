"""Models with ops that cannot run here: what of a partition can still be checked.

Custom ops (Coral's PoseNet decoder, MediaPipe's ops) stay on the host in the last segment
(`PartitionProblem.host_ops`). LiteRT may have no kernel for them, so neither the whole model nor
the last segment can be run here. `verification_scope` cuts the whole model and the segments to
the ops LiteRT can run (everything not downstream of an op it has no kernel for) and names what
is left unchecked; the cut models chain by tensor name exactly like the real segments, so the
same chained comparison applies:

    scope = verification_scope(whole_model, graph, part.stages, part.interfaces)
    verify_chain([(label, scope.reference, "")], list(scope.segments))   # compile's LiteRT check
    report["unverified"] = scope.to_json()

and `runnable_part` does the same for one model (the input against the optimised whole model).
`model` is the model as `tpu_pipeline.toolchain.loader.load` returns it, passed through untouched: cutting it is
`tpu_pipeline.toolchain.tflite.extract.segment_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.execute.litert import litert_load_error, runtime_shapes
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.partition.problem import downstream
from tpu_pipeline.toolchain.tflite.extract import segment_bytes


def _litert_loads(data: bytes) -> str | None:
    """None if LiteRT builds and prepares an interpreter for `data`, else its first error line."""
    error = litert_load_error(data)
    return None if error is None else error.splitlines()[0]


def litert_missing_kernels(model, graph: Graph) -> dict[int, str]:
    """Custom ops of the main subgraph LiteRT cannot run: op position -> reason. Each custom
    code is tried once, as a model holding only that op (LiteRT registers a few custom ops,
    e.g. TFLite_Detection_PostProcess; others have no kernel here)."""
    verdict: dict[str, str | None] = {}
    out = {}
    for v, op in enumerate(graph.ops):
        if not op.is_custom:
            continue
        if op.opcode not in verdict:
            ins = [t for t in dict.fromkeys(op.inputs) if t >= 0 and graph.is_activation(t)]
            outs = [t for t in dict.fromkeys(op.outputs) if t >= 0]
            try:
                data = segment_bytes(model, [v], ins, outs, real=runtime_shapes(model))
                verdict[op.opcode] = _litert_loads(data)
            except ModelError as exc:
                verdict[op.opcode] = str(exc)
        if verdict[op.opcode] is not None:
            out[v] = verdict[op.opcode]
    return out


@dataclass(frozen=True)
class VerificationScope:
    reference: bytes                 # the whole model cut to what LiteRT can run
    segments: tuple[bytes, ...]      # the segments cut likewise, in order (empty ones left out)
    skipped_ops: tuple[int, ...]     # op positions not checked: no kernel here, or downstream of one
    unverified_outputs: tuple[str, ...]  # names of graph outputs that cannot be compared here
    compared: tuple[str, ...]        # names of the tensors the chained comparison covers
    reasons: tuple[str, ...]         # one line per op code LiteRT has no kernel for

    @property
    def complete(self) -> bool:
        return not self.skipped_ops

    def to_json(self) -> dict:
        return {"complete": self.complete, "skipped_ops": len(self.skipped_ops),
                "unverified_outputs": list(self.unverified_outputs), "compared_tensors": list(self.compared),
                "reasons": list(self.reasons)}


def runnable_part(model, graph: Graph, missing: dict[int, str] | None = None) -> tuple[bytes, tuple[str, ...]]:
    """The model cut to the ops LiteRT can run (none downstream of an op it has no kernel for),
    as .tflite bytes, and the names of its outputs: the graph outputs those ops make and the
    tensors they hand to the rest. Tensor names are kept, so the cut of the input model and the
    cut of the optimised model compare output by output (compile's whole-vs-source check)."""
    whole = verification_scope(model, graph, [0] * len(graph.ops), [_single(graph)], missing)
    return whole.reference, whole.compared


def _single(graph: Graph):
    from tpu_pipeline.toolchain.partition.problem import SegmentInterface

    return SegmentInterface(tuple(graph.inputs), tuple(graph.outputs))


def verification_scope(model, graph: Graph, stages, interfaces,
                       missing: dict[int, str] | None = None, written=None) -> VerificationScope:
    """The parts of the whole model and of its segments (`stages`, `interfaces` of a Partition;
    `model` is the whole model the segments were cut from) that LiteRT can run. Segments are
    cut with the shapes LiteRT allocates (see extract_segment). `missing` defaults to
    `litert_missing_kernels(model, graph)`. `written`: the segment files as compile wrote them
    (each `segment_bytes(model, ops of stage k, interfaces[k].inputs, interfaces[k].outputs)`);
    a segment whose cut here is that same call is taken as written, not cut again, so the check
    runs the very files delivered."""
    if missing is None:
        missing = litert_missing_kernels(model, graph)
    n = len(interfaces)
    skipped = downstream(graph.succs, missing)
    run = [v for v in range(len(graph.ops)) if v not in skipped]
    produced = {t for v in run for t in graph.ops[v].outputs if t >= 0}
    available = produced | set(graph.inputs)
    # what the runnable part hands to the skipped part, and the graph outputs it makes itself
    handed = {t for v in skipped for t in graph.ops[v].inputs if t in produced}
    ref_outs = [t for t in graph.outputs if t in produced] + sorted(handed - set(graph.outputs))
    reference = segment_bytes(model, run, list(graph.inputs), ref_outs, real=runtime_shapes(model))
    segs = []
    for k in range(n):
        ops = [v for v in run if stages[v] == k]
        if not ops:
            continue
        reads = {t for v in ops for t in graph.ops[v].inputs}
        ins = [t for t in interfaces[k].inputs if t in reads]
        outs = [t for t in interfaces[k].outputs if t in available and t in {u for v in ops for u in graph.ops[v].outputs}]
        outs += [t for t in ref_outs if t not in outs and any(t in graph.ops[v].outputs for v in ops)]
        if not outs:
            continue
        same = (written is not None and ins == list(interfaces[k].inputs) and outs == list(interfaces[k].outputs)
                and len(ops) == sum(1 for s in stages if s == k))
        segs.append(written[k] if same else segment_bytes(model, ops, ins, outs, real=runtime_shapes(model)))
    names = {t: graph.tensors[t].name for t in range(len(graph.tensors))}
    reasons = tuple(sorted({f"{graph.ops[v].opcode}: {why}" for v, why in missing.items()}))
    return VerificationScope(reference, tuple(segs), tuple(sorted(skipped)),
                             tuple(names[t] for t in graph.outputs if t not in produced),
                             tuple(names[t] for t in ref_outs), reasons)
