"""The identity rewrites: where they match, and the new graph each one makes.

All rewrites start from a CONCATENATION on the channel (last) axis whose only reader is the op
being rewritten:

- `conv_split`      concat -> CONV_2D         => one partial CONV_2D per concat input (its slice of
                                                 the filter's input channels; the bias only on the
                                                 first), summed by a chain of ADDs; the fused
                                                 activation on the last ADD only.
- `fc_split`        concat -> FULLY_CONNECTED => the same with the weight matrix's columns.
- `depthwise_split` concat -> DEPTHWISE_CONV_2D => one depthwise conv per concat input with its
                                                 filter, bias and per-channel quantization slices,
                                                 then the concat of their outputs.
- `commute`         concat -> U (a channel-wise op: element-wise with a scalar or per-channel
                                                 constant, pooling, resize, a reduction over other
                                                 axes, or a PAD that pads no channels)
                                              => U on every concat input, then the concat; this
                                                 moves the concat next to a conv the splits match.

Numerics. `depthwise_split` and `commute` compute every output element with the same arithmetic
as before: bit-exact in float and in int8 (int8 only when every concat input has the concat
output's quantization, i.e. the concat is a plain copy). The splits re-associate a sum: in float
the result equals the original within float rounding (see docs/rewrite.md for the bound); in int8
the partial sums must be requantized to int8, which is lossy, so int8 splits need `allow_lossy`
and calibration values for the concat inputs.

Writing a rule needs no flatbuffer schema: options are the typed records of
`tpu_pipeline.toolchain.ir.options` (`op.options.axis`, `op.options.fused_activation == "RELU6"`), and new ops
come from `tpu_pipeline.toolchain.ir.ops` (`ops.add(a, b, out, activation="RELU")`,
`ops.concatenation(xs, out, axis=3)`, `ops.like(template, inputs, outputs, **field_changes)`), added
to the graph with `GraphEditor.replace`. A rule that reads options checks their record type first:
options the reader could not decode are an `OpaqueOptions`, which no rule may match on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from tpu_pipeline.toolchain.ir import Graph, Quantization, ops
from tpu_pipeline.toolchain.ir.options import (Conv2DOptions, DepthwiseConv2DOptions, FullyConnectedOptions, ConcatenationOptions,
                                  fused_activation)
from tpu_pipeline.toolchain.rewrite.edit import GraphEditor

EXACT = "bit-exact"
FLOAT_ROUNDING = "float-rounding"
LOSSY = "lossy-int8"

_FUSED_OK = {"NONE", "RELU", "RELU_N1_TO_1", "RELU6"}  # ADD can apply them too
# Channel-wise ops: each output channel depends on the same input channel only, so they commute
# with a channel concat. Per element (or per channel) the arithmetic is the same after the
# rewrite; float kernels whose vectorised and scalar paths may round differently are marked
# float-rounding rather than bit-exact (int8 kernels are integer or table-driven: bit-exact).
_UNARY_EXACT = {"RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "ABS", "NEG", "QUANTIZE", "DEQUANTIZE",
                "LEAKY_RELU"}
_UNARY_ROUNDING = {"LOGISTIC", "TANH", "HARD_SWISH", "ELU", "GELU", "SQUARE", "SQRT", "RSQRT", "EXP", "LOG",
                   "AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"}
_BINARY_EXACT = {"ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM"}
_BINARY_ROUNDING = {"DIV"}
_REDUCE = {"MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN"}
_PADS = {"PAD", "PADV2"}


_RANK = {EXACT: 0, FLOAT_ROUNDING: 1, LOSSY: 2}
_OPTIONS = {"CONV_2D": Conv2DOptions, "FULLY_CONNECTED": FullyConnectedOptions,
            "DEPTHWISE_CONV_2D": DepthwiseConv2DOptions}


@dataclass(frozen=True)
class Candidate:
    """Rewrite every matching reader of one concat; the concat goes when all its readers match."""
    kind: str  # conv_split | fc_split | depthwise_split | commute, '+'-joined for several readers
    concat: int  # position of the CONCATENATION in graph.ops
    consumers: tuple  # positions of the readers rewritten
    kinds: tuple  # the rewrite of each reader
    numerics: str  # the least exact of them: bit-exact | float-rounding | lossy-int8
    branches: int
    target: str  # the concat output's name
    saved_bytes: int  # bytes of the concat output when the concat goes, else 0
    removes_concat: bool


# Values of activation tensors (raw, in their stored dtype) from calibration runs, by tensor index.
Values = Callable[[int], list]


# ---- matching ---------------------------------------------------------------------------------
def _channel_concat(graph: Graph, c: int):
    """(inputs, output) of a CONCATENATION on the last axis that only one op reads; else None."""
    op = graph.ops[c]
    if op.opcode != "CONCATENATION" or len(op.inputs) < 2 or len(op.outputs) != 1:
        return None
    out = op.outputs[0]
    t = graph.tensors[out]
    rank = len(t.shape)
    if not isinstance(op.options, ConcatenationOptions):
        return None
    axis = op.options.axis
    if axis < 0:
        axis += rank
    if rank < 2 or axis != rank - 1 or op.options.fused_activation != "NONE":
        return None
    if out in graph.outputs or not graph.consumers.get(out):
        return None
    if not all(graph.is_activation(x) and graph.tensors[x].dtype == t.dtype for x in op.inputs):
        return None
    if t.is_dynamic or any(graph.tensors[x].is_dynamic for x in op.inputs):
        return None
    return op.inputs, out


def _same_quant(graph: Graph, xs, out) -> bool:
    return all(graph.tensors[x].quant == graph.tensors[out].quant for x in xs)


def _channel_operand(t, channels: int, rank: int) -> bool:
    """A constant second operand that is a scalar or a per-channel vector ([C], [1,..,1,C])."""
    if t.num_elements == 1:
        return True
    return len(t.shape) <= rank and t.shape[-1] == channels and t.num_elements == channels


def _const(graph: Graph, t: int) -> bool:
    return t >= 0 and graph.tensors[t].is_constant


def _fused(op) -> str | None:
    return fused_activation(op.options)  # None for opaque options: no rule matches those


def find_candidates(graph: Graph, allow_lossy: bool = False, concat_outputs=None) -> list[Candidate]:
    """Every place a rewrite applies. `concat_outputs` limits the search to concats writing
    those tensor indices. Lossy int8 splits are listed only with `allow_lossy`."""
    found = []
    for c, op in enumerate(graph.ops):
        if op.opcode != "CONCATENATION":
            continue
        info = _channel_concat(graph, c)
        if info is None:
            continue
        xs, out = info
        if concat_outputs is not None and out not in concat_outputs:
            continue
        readers = graph.consumers[out]
        parts = []
        for k in readers:
            cons = graph.ops[k]
            if not cons.inputs or cons.inputs[0] != out or out in cons.inputs[1:] or not cons.outputs:
                continue
            kind, numerics = _match(graph, xs, out, cons)
            if kind is not None and (numerics != LOSSY or allow_lossy):
                parts.append((k, kind, numerics))
        if not parts:
            continue
        whole = len(parts) == len(readers)
        found.append(Candidate(
            kind="+".join(sorted({p[1] for p in parts})), concat=c, consumers=tuple(p[0] for p in parts),
            kinds=tuple(p[1] for p in parts), numerics=max((p[2] for p in parts), key=_RANK.get),
            branches=len(xs), target=graph.tensors[out].name,
            saved_bytes=graph.tensors[out].nbytes if whole else 0, removes_concat=whole))
    return found


def _match(graph: Graph, xs, out, cons):
    t_out = graph.tensors[out]
    dtype = t_out.dtype
    same_q = _same_quant(graph, xs, out)
    C = t_out.shape[-1]
    ins = cons.inputs
    if cons.opcode in ("CONV_2D", "FULLY_CONNECTED", "DEPTHWISE_CONV_2D"):
        if dtype not in ("float32", "int8") or len(ins) < 2 or not _const(graph, ins[1]):
            return None, None
        w = graph.tensors[ins[1]]
        if w.dtype != dtype or (len(ins) > 2 and ins[2] >= 0 and not _const(graph, ins[2])):
            return None, None
        if len(ins) > 3 or len(cons.outputs) != 1:
            return None, None
        if dtype == "int8" and not same_q:
            return None, None
        if not isinstance(cons.options, _OPTIONS[cons.opcode]):
            return None, None
        if cons.opcode == "CONV_2D":
            if len(w.shape) != 4 or w.shape[3] != C or _fused(cons) not in _FUSED_OK or len(t_out.shape) != 4:
                return None, None
            return "conv_split", (FLOAT_ROUNDING if dtype == "float32" else LOSSY)
        if cons.opcode == "FULLY_CONNECTED":
            o = cons.options
            if len(w.shape) != 2 or w.shape[1] != C or _fused(cons) not in _FUSED_OK:
                return None, None
            if o.weights_format != "DEFAULT" or o.asymmetric_quantize_inputs:
                return None, None
            return "fc_split", (FLOAT_ROUNDING if dtype == "float32" else LOSSY)
        # DEPTHWISE_CONV_2D
        if len(w.shape) != 4 or w.shape[0] != 1 or w.shape[3] % C or len(t_out.shape) != 4:
            return None, None
        q = w.quant
        if q is not None and len(q.scale) > 1 and q.axis != 3:
            return None, None
        return "depthwise_split", EXACT
    # commute: an element-wise op, or a PAD that adds no channels
    if dtype == "int8" and not same_q:
        return None, None
    if len(cons.outputs) != 1 or graph.tensors[cons.outputs[0]].is_dynamic:
        return None, None
    rounding = EXACT if dtype == "int8" else FLOAT_ROUNDING
    if cons.opcode in _UNARY_EXACT | _UNARY_ROUNDING and len(ins) == 1:
        return "commute", EXACT if cons.opcode in _UNARY_EXACT else rounding
    if cons.opcode in _BINARY_EXACT | _BINARY_ROUNDING and len(ins) == 2 and _const(graph, ins[1]) \
            and _fused(cons) in _FUSED_OK and _channel_operand(graph.tensors[ins[1]], C, len(t_out.shape)):
        return "commute", EXACT if cons.opcode in _BINARY_EXACT else rounding
    if cons.opcode in _REDUCE and len(ins) == 2 and _const(graph, ins[1]):
        rank = len(t_out.shape)
        axes = {int(a) % rank for a in graph.tensors[ins[1]].values().reshape(-1)}
        if rank - 1 not in axes and graph.tensors[cons.outputs[0]].shape[-1:] == (C,):
            return "commute", EXACT if cons.opcode == "REDUCE_MAX" or dtype == "int8" else FLOAT_ROUNDING
    if cons.opcode in _PADS and len(ins) >= 2 and _const(graph, ins[1]) and all(_const(graph, t) for t in ins[2:]):
        pads = graph.tensors[ins[1]].values().reshape(-1, 2)
        if len(pads) == len(t_out.shape) and not pads[-1].any():
            return "commute", EXACT
    return None, None


# ---- applying ---------------------------------------------------------------------------------
ALL_KINDS = ("conv_split", "fc_split", "depthwise_split", "commute")


def apply_candidate(graph: Graph, cand: Candidate, values: Values | None = None) -> tuple[Graph, set]:
    """The rewritten graph, and the indices (in it) of the concat outputs the rewrite created."""
    ed = GraphEditor(graph)
    fns = {"conv_split": _split_sum, "fc_split": _split_sum, "depthwise_split": _split_depthwise,
           "commute": _commute}
    new_concats = []
    for k, kind in zip(cand.consumers, cand.kinds):
        y = fns[kind](graph, ed, cand, k, values)
        if y is not None:
            new_concats.append(y)
    if cand.removes_concat:
        ed.remove(cand.concat)
    g = ed.finish()
    return g, {ed.index_map[y] for y in new_concats}


def _slices(graph: Graph, xs):
    off, out = 0, []
    for x in xs:
        c = graph.tensors[x].shape[-1]
        out.append((x, off, off + c))
        off += c
    return out


def _quant_of_range(lo: float, hi: float) -> Quantization:
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi - lo < 1e-9:
        hi = lo + 1e-6
    scale = (hi - lo) / 255.0
    zp = int(np.clip(round(-128 - lo / scale), -128, 127))
    return Quantization((float(scale),), (zp,), 0)


def _partial_sums(graph: Graph, k: int, branches, values: Values):
    """Float partial sums p_i (bias in the first) and running sums a_i on the calibration data."""
    from tpu_pipeline.toolchain.rewrite.numerics import conv2d_nhwc

    cons = graph.ops[k]
    w_t = graph.tensors[cons.inputs[1]]
    wq = w_t.values().astype(np.float64)
    ws = np.asarray(w_t.quant.scale, dtype=np.float64)
    wf = wq * (ws.reshape((-1,) + (1,) * (wq.ndim - 1)) if len(ws) > 1 else ws[0])
    bias = None
    if len(cons.inputs) > 2 and cons.inputs[2] >= 0:
        b_t = graph.tensors[cons.inputs[2]]
        bias = b_t.values().astype(np.float64) * np.asarray(b_t.quant.scale, dtype=np.float64)
    partial_ranges = [[np.inf, -np.inf] for _ in branches]
    acc_ranges = [[np.inf, -np.inf] for _ in branches]
    runs = len(values(branches[0][0]))
    for r in range(runs):
        acc = None
        for j, (x, a, b) in enumerate(branches):
            q = graph.tensors[x].quant
            xf = (values(x)[r].astype(np.float64) - q.zero_point[0]) * q.scale[0]
            if cons.opcode == "CONV_2D":
                o = cons.options
                p = conv2d_nhwc(xf, wf[..., a:b], o.stride_h or 1, o.stride_w or 1,
                                o.dilation_h or 1, o.dilation_w or 1, o.padding == "SAME")
            else:
                p = xf.reshape(-1, b - a) @ wf[:, a:b].T
            if j == 0 and bias is not None:
                p = p + bias
            acc = p if acc is None else acc + p
            for rng, v in ((partial_ranges[j], p), (acc_ranges[j], acc)):
                rng[0] = min(rng[0], float(v.min()))
                rng[1] = max(rng[1], float(v.max()))
    return [_quant_of_range(*r) for r in partial_ranges], [_quant_of_range(*r) for r in acc_ranges]


def _split_sum(graph: Graph, ed: GraphEditor, cand: Candidate, k: int, values: Values | None):
    cons, concat, y, y_t = _cell(graph, cand, k)
    w_t = graph.tensors[cons.inputs[1]]
    W = w_t.values()
    has_bias = len(cons.inputs) > 2 and cons.inputs[2] >= 0
    branches = _slices(graph, concat.inputs)
    # Sum the branches in the order they are produced, so each can die as soon as possible.
    order = sorted(range(len(branches)), key=lambda j: graph.producer.get(branches[j][0], -1))
    branches = [branches[j] for j in order]
    int8 = y_t.dtype == "int8"
    if int8:
        if values is None:
            raise ValueError("an int8 split needs calibration values")
        pq, aq = _partial_sums(graph, k, branches, values)
    else:
        pq = aq = [None] * len(branches)

    new_ops = []
    acc = None
    n = len(branches)
    base = y_t.name
    for j, (x, a, b) in enumerate(branches):
        w_part = ed.add_constant(f"{w_t.name}/part{j}", W[..., a:b], w_t.dtype, w_t.quant)
        inputs = [x, w_part]
        if has_bias:
            if j == 0:
                inputs.append(cons.inputs[2])
            else:
                b_t = graph.tensors[cons.inputs[2]]
                bq = None
                if int8:  # a zero bias in the accumulator's scale: input scale x weight scale
                    xs = graph.tensors[x].quant.scale[0]
                    bq = Quantization(tuple(xs * s for s in w_t.quant.scale), (0,) * len(w_t.quant.scale), 0)
                inputs.append(ed.add_constant(f"{b_t.name}/zero{j}", np.zeros(b_t.shape), b_t.dtype, bq))
        last_alone = n == 1
        p = y if last_alone else ed.add_activation(f"{base}/partial{j}", y_t.dtype, y_t.shape, pq[j])
        new_ops.append(ops.like(cons, inputs, [p], fused_activation=_fused(cons) if last_alone else "NONE"))
        if acc is None:
            acc = p
            continue
        final = j == n - 1
        s = y if final else ed.add_activation(f"{base}/sum{j}", y_t.dtype, y_t.shape, aq[j])
        new_ops.append(ops.add(acc, p, s, activation=_fused(cons) if final else "NONE", version=2 if int8 else 1))
        acc = s
    ed.replace(k, new_ops)
    return None


def _split_depthwise(graph: Graph, ed: GraphEditor, cand: Candidate, k: int, values: Values | None):
    cons, concat, y, y_t = _cell(graph, cand, k)
    w_t = graph.tensors[cons.inputs[1]]
    W = w_t.values()
    C = graph.tensors[concat.outputs[0]].shape[-1]
    M = W.shape[3] // C
    b_t = graph.tensors[cons.inputs[2]] if len(cons.inputs) > 2 and cons.inputs[2] >= 0 else None
    B = b_t.values() if b_t is not None else None
    new_ops, outs = [], []
    for j, (x, a, b) in enumerate(_slices(graph, concat.inputs)):
        lo, hi = a * M, b * M
        inputs = [x, ed.add_constant(f"{w_t.name}/part{j}", W[..., lo:hi], w_t.dtype, _slice_quant(w_t.quant, lo, hi))]
        if b_t is not None:
            inputs.append(ed.add_constant(f"{b_t.name}/part{j}", B[lo:hi], b_t.dtype, _slice_quant(b_t.quant, lo, hi)))
        o = ed.add_activation(f"{y_t.name}/part{j}", y_t.dtype, y_t.shape[:-1] + (hi - lo,), y_t.quant)
        new_ops.append(ops.like(cons, inputs, [o]))
        outs.append(o)
    return _replace_with_concat(ed, k, concat, new_ops, outs, y, len(y_t.shape))


def _commute(graph: Graph, ed: GraphEditor, cand: Candidate, k: int, values: Values | None):
    cons, concat, y, y_t = _cell(graph, cand, k)
    new_ops, outs = [], []
    operand = cons.inputs[1] if len(cons.inputs) == 2 and cons.opcode in _BINARY_EXACT | _BINARY_ROUNDING else None
    per_channel = operand is not None and graph.tensors[operand].num_elements > 1
    for j, (x, a, b) in enumerate(_slices(graph, concat.inputs)):
        o = ed.add_activation(f"{y_t.name}/part{j}", y_t.dtype, y_t.shape[:-1] + (b - a,), y_t.quant)
        rest = cons.inputs[1:]
        if per_channel:  # the branch's slice of a per-channel constant
            c_t = graph.tensors[operand]
            rest = (ed.add_constant(f"{c_t.name}/part{j}", c_t.values()[..., a:b], c_t.dtype,
                                    _slice_quant(c_t.quant, a, b)),)
        new_ops.append(ops.like(cons, (x, *rest), [o]))
        outs.append(o)
    return _replace_with_concat(ed, k, concat, new_ops, outs, y, len(y_t.shape))


def _cell(graph: Graph, cand: Candidate, k: int):
    """The rewritten consumer, the concatenation it reads, its output and that output's tensor."""
    cons = graph.ops[k]
    y = cons.outputs[0]
    return cons, graph.ops[cand.concat], y, graph.tensors[y]


def _replace_with_concat(ed: GraphEditor, k: int, concat, new_ops: list, outs: list, y: int, rank: int) -> int:
    """Op k becomes `new_ops` followed by the concatenation of their outputs `outs` into `y`."""
    new_ops.append(_concat_op(concat, outs, y, rank))
    ed.replace(k, new_ops)
    return y


def _concat_op(template, inputs, output, rank):
    return ops.concatenation(inputs, output, axis=rank - 1, version=template.version)


def _slice_quant(q: Quantization | None, lo: int, hi: int) -> Quantization | None:
    if q is None or len(q.scale) <= 1:
        return q
    return Quantization(q.scale[lo:hi], q.zero_point[lo:hi], q.axis)
