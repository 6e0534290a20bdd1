"""A segment of a model as its own standalone .tflite, and several models merged into one.

`extract_segment` keeps only the segment's operators (in their order), the tensors they use, the
buffers those tensors need (every other buffer is dropped), the operator codes they use and the
model's other subgraphs (control-flow bodies) unchanged; its inputs and outputs are the given
tensors, names kept, so segments chain by tensor name (Coral's PipelinedModelRunner rule).
Signature defs and the offline memory plan are dropped (they describe the whole model).

Stored shapes are not always the shapes the runtime allocates. A model converted with a dynamic
batch (Keras' default) stores every tensor with shape signature -1 in the batch and the
placeholder 1 in its shape; LiteRT recomputes the shapes when it prepares the model, so between
SPACE_TO_BATCH_ND (block 2x2) and BATCH_TO_SPACE_ND a tensor stored as [1, h, w, c] is really
[4, h, w, c]. A segment whose input is such a tensor cannot be prepared (BATCH_TO_SPACE_ND: batch
1 is not divisible by the block), and TFLite Micro, which never recomputes shapes, runs the whole
model on the placeholders: BATCH_TO_SPACE_ND then writes a quarter of its output and the ops after
it read arena bytes nothing wrote (outputs depend on the op order and the memory plan).
`tpu_pipeline.toolchain.execute.litert.runtime_shapes` asks LiteRT for the real shapes (this room
runs nothing); `with_static_shapes` writes them into a model; `extract_segment` gives the tensors
it keeps their real shapes.
"""

from __future__ import annotations

import copy

from ai_edge_litert import schema_py_generated as schema

from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.tflite.names import opcode_name, text as _text
from tpu_pipeline.toolchain.tflite.metadata import OFFLINE_PLAN_NAME

_KEEP_METADATA = ("min_runtime_version", "CONVERSION_METADATA")


class _Buffers:
    def __init__(self, model: schema.ModelT):
        self.src = model.buffers or []
        self.out = [schema.BufferT()]
        self.map: dict[int, int] = {0: 0}

    def get(self, index: int) -> int:
        if index not in self.map:
            if index >= len(self.src):
                raise ModelError(f"a tensor refers to buffer {index}, which does not exist")
            self.map[index] = len(self.out)
            self.out.append(self.src[index])
        return self.map[index]


def _copy_tensor(t: schema.TensorT, bufs: _Buffers, shape=None) -> schema.TensorT:
    tt = copy.copy(t)
    tt.buffer = bufs.get(int(t.buffer or 0))
    if shape is not None:
        tt.shape = [int(d) for d in shape]
        tt.shapeSignature = [int(d) for d in shape]
    return tt


def _has_dynamic_dims(sg: schema.SubGraphT) -> bool:
    for t in sg.tensors or []:
        if t.shapeSignature is not None and any(int(d) < 0 for d in t.shapeSignature):
            return True
        if t.shape is not None and any(int(d) < 0 for d in t.shape):
            return True
    return False


def needs_runtime_shapes(model: schema.ModelT) -> bool:
    """Whether the main subgraph stores placeholder shapes (shape signature -1): its real shapes
    are then LiteRT's (`tpu_pipeline.toolchain.execute.litert.runtime_shapes`)."""
    return _has_dynamic_dims(model.subgraphs[0])


def stored_shapes(model: schema.ModelT) -> dict[int, tuple[int, ...]]:
    """Shape of every tensor of the main subgraph as stored."""
    return {i: tuple(int(d) for d in (t.shape if t.shape is not None else ()))
            for i, t in enumerate(model.subgraphs[0].tensors or [])}


def has_custom_ops(model: schema.ModelT) -> bool:
    """Whether any op code of the model is a custom op."""
    return any(opcode_name(model, i)[0].startswith("CUSTOM") for i in range(len(model.operatorCodes or [])))


def cut_before_custom_ops(model: schema.ModelT):
    """The main subgraph cut to the ops not downstream of a custom op (LiteRT may have no kernel
    for one), every tensor they make an output, and the source index of each tensor of the cut;
    None when the model has no custom op."""
    sg = model.subgraphs[0]
    ops = sg.operators or []
    blocked = {k for k, o in enumerate(ops) if opcode_name(model, o.opcodeIndex)[0].startswith("CUSTOM")}
    if not blocked:
        return None
    tainted = {int(t) for k in blocked for t in ops[k].outputs if t >= 0}
    for k, o in enumerate(ops):  # the stored order is topological
        if k not in blocked and any(int(t) in tainted for t in o.inputs if t >= 0):
            blocked.add(k)
            tainted |= {int(t) for t in o.outputs if t >= 0}
    keep = [k for k in range(len(ops)) if k not in blocked]
    made = sorted({int(t) for k in keep for t in ops[k].outputs if t >= 0})
    return _extract(model, keep, [int(t) for t in sg.inputs], made, 0, None, None)


def stale_shapes(model: schema.ModelT, real: dict) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Tensors of the main subgraph whose stored shape differs from `real`, the shape LiteRT
    allocates (`execute.litert.runtime_shapes`): index -> (stored, real). Empty for a model with
    static shapes."""
    sg = model.subgraphs[0]
    if not _has_dynamic_dims(sg):
        return {}
    out = {}
    for i, t in enumerate(sg.tensors or []):
        stored = tuple(int(d) for d in (t.shape if t.shape is not None else ()))
        if i in real and real[i] != stored:
            out[i] = (stored, real[i])
    return out


def with_static_shapes(model: schema.ModelT, real: dict) -> tuple[schema.ModelT, dict]:
    """A copy of `model` whose main-subgraph tensors carry `real`, the shapes LiteRT allocates
    (`execute.litert.runtime_shapes`), stored as
    both shape and shape signature (a static model; the Edge TPU compiler needs one anyway), and
    the tensors whose stored shape changed (index -> (old, new)). A model that is already static
    is returned unchanged. Call this right after reading a model, before the IR is built: the
    memory model, the offline plan and the partitioner's traffic all use the stored sizes, and
    TFLite Micro runs on the stored shapes."""
    sg = model.subgraphs[0]
    if not _has_dynamic_dims(sg):
        return model, {}
    changed = stale_shapes(model, real)
    out = copy.copy(model)
    sg2 = copy.copy(sg)
    tensors = []
    for i, t in enumerate(sg.tensors or []):
        if i in real and (i in changed or (t.shapeSignature is not None and any(int(d) < 0 for d in t.shapeSignature))):
            t = copy.copy(t)
            t.shape = [int(d) for d in real[i]]
            t.shapeSignature = [int(d) for d in real[i]]
        tensors.append(t)
    sg2.tensors = tensors
    out.subgraphs = [sg2] + list(model.subgraphs[1:])
    return out, changed


def extract_segment(model: schema.ModelT, ops: list[int] | tuple[int, ...], inputs, outputs,
                    subgraph: int = 0, name: str | None = None, *, real: dict) -> schema.ModelT:
    """A new ModelT holding operators `ops` (positions in subgraph `subgraph`, kept in the given
    order) with graph inputs `inputs` and outputs `outputs` (tensor indices of that subgraph).
    `real`: the main subgraph's shapes as LiteRT allocates them (`execute.litert.runtime_shapes`),
    given to the kept tensors of a model with placeholder shapes."""
    return _extract(model, ops, inputs, outputs, subgraph, name, real)[0]


def segment_bytes(model: schema.ModelT, ops, inputs, outputs, *, real: dict) -> bytes:
    """`extract_segment` of the main subgraph, serialised: the .tflite bytes of a part of a model
    (callers outside this room never see the flatbuffer objects)."""
    from tpu_pipeline.toolchain.tflite.io import model_to_bytes

    return model_to_bytes(extract_segment(model, ops, inputs, outputs, real=real))


def _extract(model, ops, inputs, outputs, subgraph, name, real_shapes: dict | None):
    """extract_segment, and the source index of each tensor of the result."""
    src = model.subgraphs[subgraph]
    bufs = _Buffers(model)
    used = set(int(t) for t in inputs) | set(int(t) for t in outputs)
    for i in ops:
        o = src.operators[i]
        for field in (o.inputs, o.outputs, o.intermediates):
            for t in field if field is not None else ():
                if t >= 0:
                    used.add(int(t))
    order = sorted(used)
    remap = {old: new for new, old in enumerate(order)}
    opcode_map: dict[int, int] = {}
    codes = []

    def code(idx: int) -> int:
        if idx not in opcode_map:
            opcode_map[idx] = len(codes)
            codes.append(model.operatorCodes[idx])
        return opcode_map[idx]

    # every kept tensor gets the shape the runtime really allocates (see the module docstring)
    real = real_shapes if real_shapes is not None and subgraph == 0 and _has_dynamic_dims(src) else {}
    sg = schema.SubGraphT()
    sg.name = name if name is not None else src.name
    sg.tensors = [_copy_tensor(src.tensors[t], bufs, real.get(t)) for t in order]
    sg.operators = []
    for i in ops:
        o = copy.copy(src.operators[i])
        o.inputs = [remap[t] if t >= 0 else -1 for t in (o.inputs if o.inputs is not None else [])]
        o.outputs = [remap[t] if t >= 0 else -1 for t in (o.outputs if o.outputs is not None else [])]
        if o.intermediates is not None and len(o.intermediates):
            o.intermediates = [remap[t] if t >= 0 else -1 for t in o.intermediates]
        o.opcodeIndex = code(int(o.opcodeIndex))
        sg.operators.append(o)
    sg.inputs = [remap[int(t)] for t in inputs]
    sg.outputs = [remap[int(t)] for t in outputs]

    out = schema.ModelT()
    out.version = model.version
    out.description = model.description
    subgraphs = []
    for k, other in enumerate(model.subgraphs):
        if k == subgraph:
            subgraphs.append(sg)
            continue
        o2 = copy.copy(other)
        o2.tensors = [_copy_tensor(t, bufs) for t in (other.tensors or [])]
        for op in other.operators or []:
            code(int(op.opcodeIndex))
        o2.operators = []
        for op in other.operators or []:
            op2 = copy.copy(op)
            op2.opcodeIndex = opcode_map[int(op.opcodeIndex)]
            o2.operators.append(op2)
        subgraphs.append(o2)
    if subgraph != 0:
        raise ModelError("only the main subgraph (0) can be partitioned")
    out.subgraphs = subgraphs
    out.operatorCodes = codes
    out.metadata = []
    for entry in model.metadata or []:
        if _text(entry.name) in _KEEP_METADATA and _text(entry.name) != OFFLINE_PLAN_NAME:
            e = copy.copy(entry)
            e.buffer = bufs.get(int(entry.buffer))
            out.metadata.append(e)
    out.buffers = bufs.out
    out.signatureDefs = []
    return out, order


def merge_models(models: list[schema.ModelT], prefixes: list[str], name: str = "merged") -> schema.ModelT:
    """One model whose main subgraph runs the main subgraphs of `models` side by side.

    Tensor names get `prefixes[i]` in front so that names stay unique; graph inputs and outputs
    are those of each model in turn. Models with more than one subgraph are refused."""
    out = schema.ModelT()
    out.version = models[0].version
    out.description = f"{name}: " + " + ".join(prefixes)
    out.buffers = [schema.BufferT()]
    out.operatorCodes = []
    sg = schema.SubGraphT()
    sg.name = name
    sg.tensors, sg.operators, sg.inputs, sg.outputs = [], [], [], []
    code_key: dict[tuple, int] = {}
    for m, prefix in zip(models, prefixes):
        if len(m.subgraphs) != 1:
            raise ModelError(f"{prefix}: models with control flow (several subgraphs) cannot be co-deployed")
        src = m.subgraphs[0]
        bufs = _Buffers(m)
        bufs.out = out.buffers
        base = len(sg.tensors)
        for t in src.tensors or []:
            tt = copy.copy(t)
            tt.buffer = bufs.get(int(t.buffer or 0))
            tt.name = f"{prefix}{_text(t.name)}"
            sg.tensors.append(tt)
        local_codes = {}
        for idx, c in enumerate(m.operatorCodes or []):
            key = (int(c.builtinCode or 0), int(c.deprecatedBuiltinCode or 0), _text(c.customCode), int(c.version or 1))
            if key not in code_key:
                code_key[key] = len(out.operatorCodes)
                out.operatorCodes.append(c)
            local_codes[idx] = code_key[key]
        for o in src.operators or []:
            o2 = copy.copy(o)
            o2.inputs = [t + base if t >= 0 else -1 for t in (o.inputs if o.inputs is not None else [])]
            o2.outputs = [t + base if t >= 0 else -1 for t in (o.outputs if o.outputs is not None else [])]
            if o.intermediates is not None and len(o.intermediates):
                o2.intermediates = [t + base if t >= 0 else -1 for t in o.intermediates]
            o2.opcodeIndex = local_codes[int(o.opcodeIndex)]
            sg.operators.append(o2)
        sg.inputs += [int(t) + base for t in src.inputs]
        sg.outputs += [int(t) + base for t in src.outputs]
    out.subgraphs = [sg]
    out.metadata = []
    out.signatureDefs = []
    return out


def _padding_space_to_batch_ops(model: schema.ModelT) -> list:
    """(position, 2x2 paddings) of every SPACE_TO_BATCH_ND of the main subgraph that pads: 4-D,
    constant, not all zero."""
    import numpy as np

    src = model.subgraphs[0]
    todo = []
    for k, op in enumerate(src.operators or []):
        if opcode_name(model, op.opcodeIndex)[0] != "SPACE_TO_BATCH_ND" or len(op.inputs) < 3:
            continue
        x, pads = src.tensors[op.inputs[0]], src.tensors[op.inputs[2]]
        buf = model.buffers[pads.buffer] if pads.buffer else None
        if buf is None or buf.data is None or len(buf.data) != 16 or x.shape is None or len(x.shape) != 4:
            continue  # only the 4-D NHWC form with constant [[t, b], [l, r]] paddings
        p = np.frombuffer(bytes(bytearray(buf.data)), dtype="<i4").reshape(2, 2)
        if np.any(p != 0):
            todo.append((k, p))
    return todo


def padding_space_to_batch_zero_points(model: schema.ModelT) -> list[int]:
    """The output zero point of every SPACE_TO_BATCH_ND of the main subgraph whose paddings are not
    constant zeros (TFLite Micro's kernel pads those with an arena byte it never wrote)."""
    import numpy as np

    sg = model.subgraphs[0]
    pads = []
    for op in sg.operators or []:
        if opcode_name(model, op.opcodeIndex)[0] != "SPACE_TO_BATCH_ND" or len(op.inputs) < 3:
            continue
        pt = sg.tensors[op.inputs[2]]
        buf = model.buffers[pt.buffer] if pt.buffer else None
        data = np.frombuffer(bytes(buf.data), dtype=np.int32) if buf is not None and buf.data is not None else None
        if data is None or np.any(data != 0):
            q = sg.tensors[op.outputs[0]].quantization
            zp = int(q.zeroPoint[0]) if q is not None and q.zeroPoint is not None and len(q.zeroPoint) else 0
            pads.append(zp)
    return pads


def _int32_const(out: schema.ModelT, sg: schema.SubGraphT, name: bytes, values) -> int:
    """Append a constant int32 tensor (and its buffer) to `sg` / `out`; its tensor index."""
    import numpy as np

    arr = np.asarray(values, dtype="<i4")
    b = schema.BufferT()
    b.data = np.frombuffer(arr.tobytes(), dtype=np.uint8)
    out.buffers.append(b)
    t = schema.TensorT()
    t.name, t.type, t.shape, t.buffer = name, schema.TensorType.INT32, list(arr.shape), len(out.buffers) - 1
    sg.tensors.append(t)
    return len(sg.tensors) - 1


def _pad_opcode(out: schema.ModelT, codes: dict[int, int], version: int) -> int:
    """Index of the PAD operator code of `version` in `out` (added once if missing; `codes` caches)."""
    if version not in codes:
        for i, c in enumerate(out.operatorCodes):
            if max(int(c.builtinCode or 0), int(c.deprecatedBuiltinCode or 0)) == schema.BuiltinOperator.PAD \
                    and int(c.version or 1) == version:
                codes[version] = i
                break
        else:
            c = schema.OperatorCodeT()
            c.builtinCode = c.deprecatedBuiltinCode = schema.BuiltinOperator.PAD
            c.version = version
            out.operatorCodes.append(c)
            codes[version] = len(out.operatorCodes) - 1
    return codes[version]


def explicit_space_to_batch_padding(model: schema.ModelT) -> tuple[schema.ModelT, int]:
    """A copy of `model` in which every SPACE_TO_BATCH_ND that pads (main subgraph, 4-D, constant
    paddings) reads an explicit PAD of its input and pads nothing itself; and how many were
    changed. LiteRT's outputs are unchanged (both are data movement, PAD fills with the zero
    point as SPACE_TO_BATCH_ND does). TFLite Micro's SPACE_TO_BATCH_ND never initialises its pad
    value (see tpu_pipeline.toolchain.rewrite.verify.tflm_hazards), its PAD does: after this, its outputs no
    longer depend on what the arena held. Costs one padded copy of each such input. Stored shapes
    must be the real ones (`with_static_shapes` first)."""
    src = model.subgraphs[0]
    todo = _padding_space_to_batch_ops(model)
    if not todo:
        return model, 0
    out = copy.copy(model)
    out.buffers = list(model.buffers or [])
    out.operatorCodes = list(model.operatorCodes or [])
    sg = copy.copy(src)
    sg.tensors = list(src.tensors)
    ops = list(src.operators)

    codes: dict[int, int] = {}
    for k, p in reversed(todo):  # back to front, so earlier positions stay valid
        op = copy.copy(ops[k])
        x_idx = int(op.inputs[0])
        x = sg.tensors[x_idx]
        base = x.name if isinstance(x.name, bytes) else (x.name or "").encode()
        padded = copy.copy(x)
        padded.name = base + b"/space_to_batch_pad"
        padded.buffer = 0
        padded.shape = [int(x.shape[0]), int(x.shape[1]) + int(p[0].sum()), int(x.shape[2]) + int(p[1].sum()),
                        int(x.shape[3])]
        padded.shapeSignature = list(padded.shape)
        sg.tensors.append(padded)
        t_pad = len(sg.tensors) - 1
        pad_op = schema.OperatorT()
        pad_op.opcodeIndex = _pad_opcode(out, codes, 2 if x.type == schema.TensorType.INT8 else 1)
        pad_op.inputs = [x_idx, _int32_const(out, sg, base + b"/space_to_batch_pad/paddings",
                                             [[0, 0], p[0], p[1], [0, 0]])]
        pad_op.outputs = [t_pad]
        pad_op.builtinOptionsType = schema.BuiltinOptions.PadOptions
        pad_op.builtinOptions = schema.PadOptionsT()
        op.inputs = [t_pad, int(op.inputs[1]),
                     _int32_const(out, sg, base + b"/space_to_batch_pad/none", [[0, 0], [0, 0]])]
        ops[k] = op
        ops.insert(k, pad_op)
    sg.operators = ops
    out.subgraphs = [sg] + list(model.subgraphs[1:])
    return out, len(todo)


def without_unused_tensors(model: schema.ModelT) -> tuple[schema.ModelT, int]:
    """A copy of `model` without the main subgraph's non-constant tensors that no operator reads,
    writes or keeps as an intermediate and that are not graph inputs, outputs or signature
    tensors (the interface stays, used or not). TFLite Micro would allocate arena bytes for each
    (FACTS: an unused 76,800-byte float input took a head of 76,816 B), LiteRT none; no output
    changes. Returns the model and how many tensors went (the same object when none did)."""
    sg = model.subgraphs[0]
    tensors = sg.tensors or []
    keep = set(int(t) for t in (*(sg.inputs if sg.inputs is not None else []),
                                *(sg.outputs if sg.outputs is not None else [])))
    for op in sg.operators or []:
        for field in (op.inputs, op.outputs, op.intermediates):
            keep.update(int(t) for t in (field if field is not None else []) if t >= 0)
    for sig in model.signatureDefs or []:
        if (sig.subgraphIndex or 0) == 0:
            keep.update(int(m.tensorIndex) for m in (*(sig.inputs or []), *(sig.outputs or [])))
    buffers = model.buffers or []

    def constant(t) -> bool:
        b = buffers[t.buffer] if t.buffer and t.buffer < len(buffers) else None
        return b is not None and b.data is not None and len(b.data) > 0

    dropped = [i for i, t in enumerate(tensors) if i not in keep and not constant(t)]
    if not dropped:
        return model, 0
    gone = set(dropped)
    new_index = {}
    for i in range(len(tensors)):
        if i not in gone:
            new_index[i] = len(new_index)

    def remap(values):
        return None if values is None else [new_index[int(t)] if t >= 0 else int(t) for t in values]

    out = copy.copy(model)
    new_sg = copy.copy(sg)
    new_sg.tensors = [t for i, t in enumerate(tensors) if i not in gone]
    new_sg.inputs, new_sg.outputs = remap(sg.inputs), remap(sg.outputs)
    operators = []
    for op in sg.operators or []:
        op = copy.copy(op)
        op.inputs, op.outputs, op.intermediates = remap(op.inputs), remap(op.outputs), remap(op.intermediates)
        operators.append(op)
    new_sg.operators = operators
    out.subgraphs = [new_sg, *model.subgraphs[1:]]
    if model.signatureDefs:
        sigs = []
        for sig in model.signatureDefs:
            if (sig.subgraphIndex or 0) == 0:
                sig = copy.copy(sig)
                for field in ("inputs", "outputs"):
                    maps = []
                    for m in getattr(sig, field) or []:
                        m = copy.copy(m)
                        m.tensorIndex = new_index[int(m.tensorIndex)]
                        maps.append(m)
                    setattr(sig, field, maps)
            sigs.append(sig)
        out.signatureDefs = sigs
    if model.metadata:  # an offline plan counts the tensors: it no longer fits
        out.metadata = [m for m in model.metadata if _text(m.name) != OFFLINE_PLAN_NAME]
    return out, len(dropped)


def runtime_exact_model(model: schema.ModelT, real: dict) -> tuple[schema.ModelT, list[str]]:
    """`model` with what makes TFLite Micro read bytes it never wrote taken out: the real shapes
    written (`with_static_shapes`) and SPACE_TO_BATCH_ND padding made explicit
    (`explicit_space_to_batch_padding`); and without the tensors no operator uses
    (`without_unused_tensors`), which TFLite Micro would give arena bytes. LiteRT's outputs are unchanged. Returns the model and
    one note per change (empty and the same object when nothing was needed). Apply it to the
    input before the IR is built, and use the result (in the input's op order) as TFLite Micro's
    reference when verifying."""
    notes = []
    out, changed = with_static_shapes(model, real)
    if changed:
        notes.append(f"{len(changed)} tensor(s) were stored with placeholder shapes (dynamic batch); "
                     f"their real shapes are written, so TFLite Micro and the memory plan use them")
    out, padded = explicit_space_to_batch_padding(out)
    if padded:
        notes.append(f"{padded} SPACE_TO_BATCH_ND op(s) now read an explicit PAD: TFLite Micro's kernel pads "
                     f"with uninitialised arena bytes, its PAD with the zero point")
    out, unused = without_unused_tensors(out)
    if unused:
        notes.append(f"{unused} tensor(s) that no operator uses were dropped (TFLite Micro would give them arena "
                     f"bytes); graph inputs and outputs stay, used or not")
    return out, notes
