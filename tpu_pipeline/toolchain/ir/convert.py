"""Conversion between the flatbuffer object API (ModelT) and the Graph IR, both directions.

With tpu_pipeline/toolchain/tflite, the only place that knows the schema: builtin options are decoded into the
records of `tpu_pipeline.toolchain.ir.options` here (`decode_options`, called by `from_model`) and encoded
only here (`encode_options`, called by `to_model`); whole models for a graph are built here too
(`standalone_model`, `rewritten_model`, `prune_buffers`).
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.ir import kernels, overlap, stage
from tpu_pipeline.toolchain.ir import options as opts
from tpu_pipeline.toolchain.ir.graph import Graph, Op, Quantization, Tensor
from tpu_pipeline.toolchain.tflite.names import BUILTIN_NAMES, opcode_name, text as _text

BUILTIN_CODES = {k: v for v, k in BUILTIN_NAMES.items()}
DTYPE_NAMES = {v: k.lower() for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
DTYPE_CODES = {k: v for v, k in DTYPE_NAMES.items()}


# ---- builtin options: schema tables <-> the records of tpu_pipeline.toolchain.ir.options ---------------------
def _enum_names(enum_class) -> dict[int, str]:
    return {v: k for k, v in vars(enum_class).items() if not k.startswith("_")}


OPTION_TYPE_NAMES = _enum_names(schema.BuiltinOptions)
OPTION_TYPE_CODES = {k: v for v, k in OPTION_TYPE_NAMES.items()}
# Record fields whose schema values are enumeration codes: field -> (code -> name).
_ENUM_FIELDS = {
    "padding": _enum_names(schema.Padding),
    "fused_activation": _enum_names(schema.ActivationFunctionType),
    "weights_format": _enum_names(schema.FullyConnectedOptionsWeightsFormat),
}
_ENUM_CODES = {f: {v: k for k, v in names.items()} for f, names in _ENUM_FIELDS.items()}
_CAMEL = {"fused_activation": "fusedActivationFunction", "dilation_w": "dilationWFactor",
          "dilation_h": "dilationHFactor"}
_RECORD_OF_KIND = {r.KIND: r for r in opts.RECORDS}
# Record fields no builtin's schema has: a harness kernel's explicit padding (ir.kernels), written
# in its custom options instead.
_IR_ONLY_FIELDS = frozenset({"pad_top", "pad_left"})


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return _CAMEL.get(name, head + "".join(w[:1].upper() + w[1:] for w in rest))


def _decode_value(name: str, value):
    if name == "quantized_bias_type":
        return DTYPE_NAMES[int(value)]
    if name in _ENUM_FIELDS:
        return _ENUM_FIELDS[name][int(value)]
    if value is None or isinstance(value, (bool, float)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    return tuple(int(v) for v in value)  # an int vector (numpy array or list)


def _encode_value(name: str, value):
    if name == "quantized_bias_type":
        return DTYPE_CODES[value]
    if name in _ENUM_FIELDS:
        return _ENUM_CODES[name][value]
    return list(value) if isinstance(value, tuple) else value


def _same_fields(a, b) -> bool:
    """Whether two schema option objects hold the same values (vectors compared as lists)."""
    def norm(v):
        return [int(x) for x in v] if v is not None and not isinstance(v, (bool, int, float)) else v
    va, vb = vars(a), vars(b)
    return va.keys() == vb.keys() and all(norm(va[k]) == norm(vb[k]) for k in va)


def decode_options(type_code: int, raw) -> opts.Options:
    """The record for one operator's builtin options; an OpaqueOptions holding `raw` unchanged
    when no record describes every field of it exactly (so writing it back is lossless)."""
    if raw is None or not type_code:
        return None
    kind = OPTION_TYPE_NAMES.get(type_code)
    record = _RECORD_OF_KIND.get(kind)
    try:
        if record is None:
            if kind is None or vars(raw):
                return opts.OpaqueOptions(type_code, raw)
            out = opts.FieldlessOptions(kind)
        else:
            values = {f.name: _decode_value(f.name, getattr(raw, _camel(f.name)))
                      for f in dataclasses.fields(record) if f.name not in _IR_ONLY_FIELDS}
            out = record(**values)
        if _same_fields(encode_options(out)[1], raw):
            return out
    except (AttributeError, KeyError, TypeError, ValueError):
        pass  # a field this schema version lacks, an unknown enum code, a nested table
    return opts.OpaqueOptions(type_code, raw)


def encode_options(record: opts.Options) -> tuple[int, object]:
    """(BuiltinOptions type code, schema object) for an options record (0, None for none).
    Schema fields the record does not name keep their defaults."""
    if record is None:
        return 0, None
    if isinstance(record, opts.OpaqueOptions):
        return record.type_code, record.raw
    obj = getattr(schema, record.KIND + "T")()
    if isinstance(record, opts.FieldlessOptions):
        return OPTION_TYPE_CODES[record.KIND], obj
    if getattr(record, "padding", None) == "EXPLICIT":
        raise ValueError(f"{record.KIND}: explicit padding has no builtin encoding (a harness kernel writes it)")
    for f in dataclasses.fields(record):
        if f.name in _IR_ONLY_FIELDS:
            continue
        camel = _camel(f.name)
        if not hasattr(obj, camel):
            raise ValueError(f"{record.KIND} has no field {camel} in this schema")
        setattr(obj, camel, _encode_value(f.name, getattr(record, f.name)))
    return OPTION_TYPE_CODES[record.KIND], obj


def _ints(values) -> tuple[int, ...]:
    return () if values is None else tuple(int(v) for v in values)


def _quantization(q) -> Quantization | None:
    if q is None or q.scale is None or len(q.scale) == 0:
        return None
    zp = q.zeroPoint if q.zeroPoint is not None else [0] * len(q.scale)
    # tolist: Python floats and ints in one call (a float32 scale widens exactly, as float() does;
    # the schema's zero points are int64: per-channel ones are thousands per tensor)
    return Quantization(tuple(np.asarray(q.scale).tolist()), tuple(np.asarray(zp, dtype=np.int64).tolist()),
                        int(q.quantizedDimension or 0))


def from_model(model: schema.ModelT, subgraph: int = 0) -> Graph:
    """The IR of one subgraph (the main one by default); other subgraphs are left to `to_model`."""
    if subgraph >= len(model.subgraphs):
        raise ModelError(f"the model has no subgraph {subgraph}")
    sg = model.subgraphs[subgraph]
    tensors = _tensors(model, sg)
    ops = []
    produced_by: dict[int, int] = {}
    for i, o in enumerate(sg.operators or []):
        op = _op(model, o, i, tensors)
        for t in op.outputs:
            # The passes assume one writer per tensor and ops stored in an order they can run in.
            if t < 0:  # an omitted optional output, as the runtimes allow
                continue
            if t in produced_by:
                raise ModelError(f"tensor '{tensors[t].name}' is written by operators {produced_by[t]} and {i}")
            if tensors[t].is_constant:
                raise ModelError(f"operator {i} ({op.opcode}) writes the constant tensor '{tensors[t].name}'")
            produced_by[t] = i
        ops.append(op)
    _check_runnable(sg, tensors, ops, produced_by)
    external = ()
    if subgraph == 0:  # inputs the offline plan keeps outside the arena (harness firmware only)
        from tpu_pipeline.toolchain.tflite.metadata import EXTERNAL, read_offline_plan

        plan = read_offline_plan(model)
        if plan is not None:
            external = tuple(t for t in _ints(sg.inputs) if t < len(plan) and plan[t] == EXTERNAL)
            graph = Graph(tuple(tensors), tuple(ops), _ints(sg.inputs), _ints(sg.outputs), _text(sg.name), external)
            return kernels.infer_in_place(graph, plan)
    return Graph(tuple(tensors), tuple(ops), _ints(sg.inputs), _ints(sg.outputs), _text(sg.name), external)


def _tensors(model: schema.ModelT, sg) -> list[Tensor]:
    tensors = []
    for i, t in enumerate(sg.tensors or []):
        buf = model.buffers[t.buffer] if t.buffer and t.buffer < len(model.buffers) else None
        data = None
        if buf is not None and buf.data is not None and len(buf.data) > 0:
            data = np.asarray(buf.data, dtype=np.uint8)
            data.flags.writeable = False
        if t.type not in DTYPE_NAMES:
            raise ModelError(f"tensor '{_text(t.name)}' has unknown type code {t.type}")
        tensors.append(Tensor(
            index=i,
            name=_text(t.name),
            dtype=DTYPE_NAMES[t.type],
            shape=_ints(t.shape),
            buffer=int(t.buffer or 0),
            is_variable=bool(t.isVariable),
            quant=_quantization(t.quantization),
            signature=_ints(t.shapeSignature) if t.shapeSignature is not None else None,
            data=data,
            source=i,
        ))
    return tensors


def _op(model: schema.ModelT, o, i: int, tensors: list[Tensor]) -> Op:
    """Operator `i` as an Op: its options decoded (the harness's custom ops as their own op codes)."""
    if o.opcodeIndex >= len(model.operatorCodes or []):
        raise ModelError(f"operator {i} refers to operator code {o.opcodeIndex}, which does not exist")
    name, builtin, version = opcode_name(model, o.opcodeIndex)
    options = decode_options(int(o.builtinOptionsType or 0), o.builtinOptions)
    for field in ("stride_w", "stride_h", "dilation_w", "dilation_h", "filter_width", "filter_height"):
        # 0 or less is no window at all: LiteRT refuses it, TFLite Micro computes garbage from it
        if getattr(options, field, 1) < 1:
            raise ModelError(f"operator {i} ({name}) has {field} {getattr(options, field)}; it must be at least 1")
    kernel = ""
    if name == f"CUSTOM:{stage.OPCODE}":
        options = stage.decode(o.customOptions, _ints(o.inputs), tensors, f"operator {i}")
        name, builtin, version, kernel = stage.OPCODE, 0, 1, kernels.kernel_name()
    elif name.startswith("CUSTOM:") and name[7:] in kernels.builtin_of():
        name, options, version, kernel = kernels.decode_options(name[7:], o.customOptions, f"operator {i}")
        builtin = kernels.BUILTIN_CODE[name]
    for t in (*_ints(o.inputs), *_ints(o.outputs)):
        if t >= len(tensors) or t < -1:
            raise ModelError(f"operator {i} ({name}) refers to tensor {t}, which does not exist")
    return Op(opcode=name, inputs=_ints(o.inputs), outputs=_ints(o.outputs), source=i, options=options,
              builtin_code=builtin, version=version, intermediates=_ints(o.intermediates), kernel=kernel)


def _check_runnable(sg, tensors: list[Tensor], ops: list[Op], produced_by: dict[int, int]) -> None:
    """The graph's inputs and outputs exist, and every op reads what is written before it or filled
    from outside (a graph input, a constant, a variable)."""
    for k, t in enumerate((*_ints(sg.inputs), *_ints(sg.outputs))):
        if not 0 <= t < len(tensors):
            raise ModelError(f"graph {'input' if k < len(_ints(sg.inputs)) else 'output'} tensor {t} does not exist")
    graph_inputs = set(_ints(sg.inputs))
    for i, op in enumerate(ops):
        for t in op.inputs:
            writer = produced_by.get(t, -1)
            if writer >= i:
                when = "itself" if writer == i else f"operator {writer}, later"
                raise ModelError(f"operator {i} ({op.opcode}) reads '{tensors[t].name}', written by {when}: "
                                 "the operators are not stored in an order they can run in")
            if (t >= 0 and writer < 0 and t not in graph_inputs and tensors[t].kind == "activation"
                    and all(d != 0 for d in tensors[t].shape)):
                # Nothing would ever fill it: neither a graph input, a constant, a variable nor
                # an operator's output (an empty tensor needs no data).
                raise ModelError(f"operator {i} ({op.opcode}) reads '{tensors[t].name}', which no operator "
                                 "writes and which is neither a graph input nor a constant")


def _new_tensor(t: Tensor, model: schema.ModelT) -> schema.TensorT:
    tt = schema.TensorT()
    tt.name = t.name
    tt.type = DTYPE_CODES[t.dtype]
    tt.shape = list(t.shape)
    tt.isVariable = t.is_variable
    if t.signature is not None:
        tt.shapeSignature = list(t.signature)
    if t.quant is not None:
        q = schema.QuantizationParametersT()
        q.scale = list(t.quant.scale)
        q.zeroPoint = list(t.quant.zero_point)
        q.quantizedDimension = t.quant.axis
        tt.quantization = q
    tt.buffer = 0
    if t.data is not None:
        buf = schema.BufferT()
        buf.data = np.array(t.data, dtype=np.uint8)
        tt.buffer = len(model.buffers)
        model.buffers.append(buf)
    return tt


def _custom_opcode_index(model: schema.ModelT, custom_code: str) -> int:
    for i, code in enumerate(model.operatorCodes):
        builtin = max(int(code.builtinCode or 0), int(code.deprecatedBuiltinCode or 0))
        if builtin == schema.BuiltinOperator.CUSTOM and _text(code.customCode) == custom_code:
            return i
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    code.customCode = custom_code
    code.version = 1
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def _opcode_index(model: schema.ModelT, op: Op) -> int:
    for i, code in enumerate(model.operatorCodes):
        builtin = max(int(code.builtinCode or 0), int(code.deprecatedBuiltinCode or 0))
        if builtin == op.builtin_code and int(code.version or 1) == op.version and builtin != schema.BuiltinOperator.CUSTOM:
            return i
    code = schema.OperatorCodeT()
    code.builtinCode = op.builtin_code
    code.deprecatedBuiltinCode = min(op.builtin_code, 127)
    code.version = op.version
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def to_model(graph: Graph, model: schema.ModelT, subgraph: int = 0) -> schema.ModelT:
    """A new ModelT: `model` with subgraph `subgraph` replaced by `graph`.

    Tensors and ops that came from the model keep every field they had (only what the IR
    changed is overwritten); new ones are built from the IR. `model` itself is not modified.
    """
    out = copy.copy(model)
    out.buffers = list(model.buffers or [])
    out.operatorCodes = list(model.operatorCodes or [])
    out.subgraphs = list(model.subgraphs)
    src = model.subgraphs[subgraph]
    sg = copy.copy(src)

    old_to_new: dict[int, int] = {}
    tensors = []
    for k, t in enumerate(graph.tensors):
        if t.index != k:
            raise ValueError(f"graph tensor at position {k} has index {t.index}")
        if t.source is not None:
            tt = copy.copy(src.tensors[t.source])
            old_to_new[t.source] = k
            if _text(tt.name) != t.name:  # a pass renamed it (e.g. compile's unique names)
                tt.name = t.name
        else:
            tt = _new_tensor(t, out)
        tensors.append(tt)
    sg.tensors = tensors

    operators = []
    for op in graph.ops:
        if op.source is not None:
            ot = copy.copy(src.operators[op.source])
            template_name = opcode_name(model, ot.opcodeIndex)[0]
            if template_name != op.opcode:
                ot.opcodeIndex = _opcode_index(out, op)
        else:
            ot = schema.OperatorT()
            ot.opcodeIndex = _opcode_index(out, op)
        ot.inputs = list(op.inputs)
        ot.outputs = list(op.outputs)
        if op.intermediates:
            ot.intermediates = list(op.intermediates)
        if kernels.is_harness(op):
            ot.opcodeIndex = _custom_opcode_index(out, kernels.custom_code(op))
            ot.builtinOptionsType, ot.builtinOptions = 0, None
            if stage.is_stage(op):
                ot.customOptions = list(stage.encode(op.options))
            else:
                ring = overlap.ring_rows(graph, op) if kernels.OVERLAP in kernels.flags(op) else 0
                ot.customOptions = list(kernels.encode_options(graph, op, ring))
        elif op.kernel and not kernels.runs_in_place(op):  # (in place: the offline plan says it)
            raise ValueError(f"unknown kernel '{op.kernel}'")
        else:
            ot.builtinOptionsType, ot.builtinOptions = encode_options(op.options)
            if op.source is not None and ot.customOptions is not None and not op.is_custom:
                ot.customOptions = None  # was a custom kernel's op in the source model
        operators.append(ot)
    sg.operators = operators
    sg.inputs = list(graph.inputs)
    sg.outputs = list(graph.outputs)
    out.subgraphs[subgraph] = sg

    if out.signatureDefs:
        # an interface tensor the graph replaced (rewrite.interface) keeps its position in the signature
        for old, new in (*zip(_ints(src.inputs), graph.inputs), *zip(_ints(src.outputs), graph.outputs)):
            old_to_new.setdefault(old, new)
        out.signatureDefs = [_remap_signature(s, subgraph, old_to_new) for s in out.signatureDefs]
    return out


def _remap_signature(sig, subgraph: int, old_to_new: dict[int, int]):
    if sig.subgraphIndex != subgraph:
        return sig
    sig = copy.copy(sig)
    for field_name in ("inputs", "outputs"):
        maps = []
        for m in getattr(sig, field_name) or []:
            m = copy.copy(m)
            if m.tensorIndex in old_to_new:
                m.tensorIndex = old_to_new[m.tensorIndex]
            maps.append(m)
        setattr(sig, field_name, maps)
    return sig


# ---- whole models built from or edited for the IR ------------------------------------------------
def standalone_model(graph: Graph, model: schema.ModelT | None = None) -> schema.ModelT:
    """A ModelT for `graph`: `rewritten_model(graph, model)` when the source model is known, else
    one built from the IR alone (builtin ops only; enough for calibration and tests)."""
    if model is not None:
        return rewritten_model(graph, model)
    base = schema.ModelT()
    base.version = 3
    base.description = b"tpu-pipeline rewrite"
    base.buffers = [schema.BufferT()]
    base.operatorCodes = []
    sg = schema.SubGraphT()
    sg.tensors, sg.operators, sg.inputs, sg.outputs = [], [], [], []
    base.subgraphs = [sg]
    if any(op.is_custom for op in graph.ops):
        raise ModelError(f"graph '{graph.name}' has custom ops; it cannot be run without its source model")
    bare = Graph(tuple(dataclasses.replace(t, source=None) for t in graph.tensors),
                 tuple(dataclasses.replace(op, source=None) for op in graph.ops),
                 graph.inputs, graph.outputs, graph.name)
    return to_model(bare, base)


def prune_buffers(model: schema.ModelT) -> schema.ModelT:
    """Empty the buffers no tensor and no metadata entry refers to any more (a rewrite's sliced
    filters replace the originals); indices stay, so nothing else needs renumbering."""
    used = {0}
    for sg in model.subgraphs or []:
        used.update(int(t.buffer or 0) for t in sg.tensors or [])
    used.update(int(m.buffer) for m in model.metadata or [])
    if all(i in used or not (b.data is not None and len(b.data)) for i, b in enumerate(model.buffers or [])):
        return model
    out = copy.copy(model)
    out.buffers = [b if i in used else schema.BufferT() for i, b in enumerate(model.buffers)]
    return out


def rewritten_model(graph: Graph, model: schema.ModelT) -> schema.ModelT:
    """The ModelT to write for a rewritten graph: `to_model`, without a stale offline memory plan
    (its offsets were for the old tensors) and without the buffers nothing refers to any more."""
    from tpu_pipeline.toolchain.tflite import OFFLINE_PLAN_NAME

    out = to_model(graph, model)
    if out.metadata:
        kept = [m for m in out.metadata if _text(m.name) != OFFLINE_PLAN_NAME]
        if len(kept) != len(out.metadata):
            out = copy.copy(out)
            out.metadata = kept
    return prune_buffers(out)


def builtin_view_bytes(data: bytes, label: str = "model") -> bytes:
    """The model `data` with every op on its builtin kernel (`tpu_pipeline.toolchain.ir.kernels.builtin_view`):
    what LiteRT and the host's TFLite Micro run for a model that picks harness kernels per op.
    `data` itself when it picks none and keeps no input outside the arena. An offline plan follows
    the tensors into the view, except for what only the harness firmware can run: tensors planned
    over another's bytes (the in and out of an overlapped op) and tensors outside the arena are left
    to the runtime."""
    return builtin_view_numbered(data, label)[0]


def builtin_view_numbered(data: bytes, label: str = "model") -> tuple[bytes, dict[int, int] | None]:
    """`builtin_view_bytes`, and where each of `data`'s tensors is in it (tensor index -> index in
    the view; the harness-only constants absent): the view drops and adds tensors, so a tensor
    index a runtime reports for the view is not `data`'s. None: the view is `data` itself."""
    from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model
    from tpu_pipeline.toolchain.tflite.metadata import read_offline_plan, with_offline_plan

    model = read_model(data, name=label)
    graph = from_model(model)
    if not kernels.kernel_choices(graph) and not graph.external:
        return data, None
    view, remap = kernels.builtin_view_mapped(graph)
    plan = read_offline_plan(model)
    out = to_model(view, model)
    if plan is not None:
        harness_only = {t for op in graph.ops if kernels.OVERLAP in kernels.flags(op) for t in (op.inputs[0], op.outputs[0])}
        offsets = [-1] * len(view.tensors)
        for old, new in remap.items():
            if old < len(plan) and plan[old] >= 0 and old not in harness_only:
                offsets[new] = plan[old]
        out = with_offline_plan(out, offsets, label)
    return model_to_bytes(out), remap
