"""The graph IR: structure, costs, lifetimes semantics, and conversion back to the flatbuffer."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema

from conftest import FIXTURES, fixture_models
from tpu_pipeline.toolchain.execute.litert import seeded_outputs
from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.ir import Graph, Op, Tensor, from_model, macs, param_bytes, to_model
from tpu_pipeline.toolchain.loader import load
from tpu_pipeline.toolchain.memory import lifetimes, peak_memory
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model


def _act(i, n, name=None):
    return Tensor(i, name or f"t{i}", "int8", (1, n))


def test_lifetimes_follow_tflm_steps():
    # in -> a -> b ; in -> c ; (b, c) -> out, plus a dead-end output d of op 1
    t = [_act(0, 16), _act(1, 32), _act(2, 48), _act(3, 64), _act(4, 16), _act(5, 80)]
    ops = (Op("A", (0,), (1,)), Op("B", (1,), (2, 5)), Op("C", (0,), (3,)), Op("D", (2, 3), (4,)))
    g = Graph(tuple(t), ops, (0,), (4,))
    lt = {b.tensor: (b.first, b.last) for b in lifetimes(g).buffers}
    assert lt[0] == (0, 3)  # graph input: from step 0 to its last reader (op 2 at step 3)
    assert lt[1] == (1, 2)
    assert lt[5] == (2, 2)  # written, never read: lives for its producer's step only
    assert lt[4] == (4, 4)  # graph output: to the last step
    assert peak_memory(g) == max(lifetimes(g).live_bytes())
    # Running C first frees the input earlier.
    assert peak_memory(g, [2, 0, 1, 3]) != peak_memory(g, [0, 1, 2, 3])
    # TFLite keeps graph inputs for the whole run and rounds to 64 bytes.
    lt2 = {b.tensor: (b.first, b.last, b.size) for b in lifetimes(g, semantics="tflite").buffers}
    assert lt2[0] == (0, 4, 64)


def test_reordered_rejects_non_topological_orders():
    t = [_act(0, 16), _act(1, 16), _act(2, 16)]
    g = Graph(tuple(t), (Op("A", (0,), (1,)), Op("B", (1,), (2,))), (0,), (2,))
    with pytest.raises(ValueError):
        g.reordered([1, 0])
    assert g.reordered([0, 1]).ops == g.ops


def test_dynamic_shapes_refused_where_a_size_is_needed():
    t = Tensor(0, "x", "float32", (1, 8, 8, 3), signature=(-1, -1, -1, 3))
    with pytest.raises(ModelError, match="dynamic shape"):
        _ = t.nbytes
    # A -1 batch alone is the converter's default and allocates as batch 1.
    assert Tensor(0, "x", "float32", (1, 8, 8, 3), signature=(-1, 8, 8, 3)).nbytes == 768


@pytest.mark.parametrize("path", fixture_models(), ids=lambda p: p.name)
def test_ir_structure(path):
    model, g = load(path)
    assert g.is_topological(range(len(g.ops)))
    for i in range(len(g.ops)):
        for t in g.activation_outputs(i):
            assert g.producer[t] == i


# MACs and parameter bytes worked out by hand from each op's shapes and options (not by the
# formula under test): conv = output elements x kh*kw*cin, depthwise = output elements x kh*kw,
# pool = output elements x window, fully connected = out x in, elementwise/softmax = elements;
# parameters = int8 weights (1 B) + int32 bias (4 B), float32 4 B each.
_HAND_COSTS = {
    "chain_int8": [  # 3x3 convs: 32x32x3 -s2-> 16x16x8 -> 16x16x8 -s2-> 8x8x16 x2 ... -> 4x4x32
        (16 * 16 * 8 * 27, 8 * 27 + 8 * 4),
        (16 * 16 * 8 * 72, 8 * 72 + 8 * 4),
        (8 * 8 * 16 * 72, 16 * 72 + 16 * 4),
        (8 * 8 * 16 * 144, 16 * 144 + 16 * 4),
        (8 * 8 * 16 * 144, 16 * 144 + 16 * 4),
        (4 * 4 * 32 * 144, 32 * 144 + 32 * 4),
        (4 * 4 * 32 * 288, 32 * 288 + 32 * 4),
        (4 * 4 * 32 * 288, 32 * 288 + 32 * 4),
    ],
    "pool_softmax_int8": [
        (16 * 16 * 8 * 27, 8 * 27 + 8 * 4),  # 3x3 conv, 3 -> 8 channels, SAME
        (8 * 8 * 8 * 4, 0),  # 2x2 max pool, stride 2
        (4 * 4 * 8 * 4, 0),  # 2x2 average pool, stride 2
        (0, 2 * 4),  # reshape: no arithmetic, its int32 shape operand
        (10 * 128, 10 * 128),  # fully connected 128 -> 10, no bias
        (10, 0),  # softmax over 10 values
    ],
}


@pytest.mark.parametrize("name", sorted(_HAND_COSTS))
def test_macs_and_param_bytes_match_hand_counts(name):
    _, g = load(FIXTURES / f"{name}.tflite")
    assert [(macs(g, i), param_bytes(g, i)) for i in range(len(g.ops))] == _HAND_COSTS[name]


def test_depthwise_pool_and_add_macs_match_hand_counts():
    _, g = load(FIXTURES / "concat_conv_float32.tflite")
    hand = {1: 32 * 32 * 16 * 3 * 3 * 8,  # 3x3 conv 8 -> 16 channels, SAME
            2: 32 * 32 * 8 * 9,  # 3x3 depthwise, multiplier 1
            4: 32 * 32 * 8 * 9,  # 3x3 max pool, stride 1, SAME
            6: 0,  # concatenation moves data only
            8: 32 * 32 * 64 * 9,  # 3x3 depthwise on 64 channels
            10: 32 * 32 * 16}  # ADD: one per element
    assert {i: macs(g, i) for i in hand} == hand
    assert param_bytes(g, 2) == (3 * 3 * 8 + 8) * 4  # float32 depthwise weights and bias


@pytest.mark.parametrize("path", fixture_models(), ids=lambda p: p.name)
def test_to_model_of_unchanged_graph_is_identical(path):
    model = read_model(path)
    assert model_to_bytes(to_model(from_model(model), model)) == model_to_bytes(model)


def test_other_subgraphs_pass_through():
    path = FIXTURES / "control_flow_float32.tflite"
    model = read_model(path)
    assert len(model.subgraphs) > 1
    g = from_model(model)
    out = to_model(g, model)
    assert out.subgraphs[1:] == model.subgraphs[1:]
    for a, b in zip(seeded_outputs(path), seeded_outputs(model_to_bytes(out))):
        np.testing.assert_array_equal(a, b)


def test_custom_op_is_opaque_not_an_error(tmp_path):
    model = read_model(FIXTURES / "tiny_irregular_int8.tflite")
    model = copy.copy(model)
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    code.customCode = "MyAccelOp"
    model.operatorCodes = list(model.operatorCodes) + [code]
    sg = copy.copy(model.subgraphs[0])
    op = copy.copy(sg.operators[1])
    op.opcodeIndex = len(model.operatorCodes) - 1
    op.builtinOptionsType, op.builtinOptions, op.customOptions = 0, None, [1, 2, 3]
    sg.operators = [sg.operators[0], op, *sg.operators[2:]]
    model.subgraphs = [sg]
    path = tmp_path / "custom.tflite"
    path.write_bytes(model_to_bytes(model))
    _, g = load(path)
    assert g.ops[1].opcode == "CUSTOM:MyAccelOp" and macs(g, 1) is None
    assert lifetimes(g).peak > 0


# ---- builtin options: typed records decoded at the reader, encoded at the writer ---------------
def _packed(obj) -> bytes:
    import flatbuffers

    b = flatbuffers.Builder(0)
    b.Finish(obj.Pack(b))
    return bytes(b.Output())


def test_every_options_type_in_the_fixtures_round_trips_to_the_same_bytes():
    """Each operator's options (every subgraph of every committed model) decode to a typed record,
    not an opaque one, and encode back to the same packed table."""
    from tpu_pipeline.toolchain.ir.convert import OPTION_TYPE_NAMES, decode_options, encode_options
    from tpu_pipeline.toolchain.ir.options import OpaqueOptions

    seen = set()
    for path in fixture_models():
        model = read_model(path)
        for sg in model.subgraphs:
            for o in sg.operators:
                record = decode_options(o.builtinOptionsType, o.builtinOptions)
                if o.builtinOptions is None:
                    assert record is None
                    continue
                kind = OPTION_TYPE_NAMES[o.builtinOptionsType]
                assert not isinstance(record, OpaqueOptions), (path.name, kind)
                assert record.KIND == kind
                code, obj = encode_options(record)
                assert code == o.builtinOptionsType
                assert _packed(obj) == _packed(o.builtinOptions), (path.name, kind)
                seen.add(kind)
    # what the committed models hold (a new fixture adds to this, never silently drops one)
    assert {"Conv2DOptions", "DepthwiseConv2DOptions", "AddOptions", "ConcatenationOptions", "Pool2DOptions",
            "FullyConnectedOptions", "ReducerOptions", "SoftmaxOptions", "SubOptions", "MulOptions",
            "WhileOptions", "IfOptions"} <= seen


def test_option_records_name_every_scalar_field_of_the_schema():
    """A record that missed a schema field would silently reset it on write (only nested tables,
    which stay opaque when set, are not named)."""
    import dataclasses

    from tpu_pipeline.toolchain.ir.convert import _IR_ONLY_FIELDS, _camel
    from tpu_pipeline.toolchain.ir.options import RECORDS

    for record in RECORDS:
        fields = vars(getattr(schema, record.KIND + "T")())
        # (the explicit padding of the harness's convolutions has no builtin field)
        named = {_camel(f.name) for f in dataclasses.fields(record) if f.name not in _IR_ONLY_FIELDS}
        assert named <= set(fields), record.KIND
        assert set(fields) - named <= {"quantSpec"}, (record.KIND, set(fields) - named)


def test_options_a_record_cannot_describe_stay_opaque_and_are_written_back_unchanged():
    from tpu_pipeline.toolchain.ir.convert import decode_options, encode_options
    from tpu_pipeline.toolchain.ir.options import FullyConnectedOptions, OpaqueOptions, fused_activation

    fc = schema.FullyConnectedOptionsT()
    fc.fusedActivationFunction = 1
    assert decode_options(schema.BuiltinOptions.FullyConnectedOptions, fc) == FullyConnectedOptions("RELU")
    fc.quantSpec = schema.QuantSpecT() if hasattr(schema, "QuantSpecT") else object()  # a nested table
    opaque = decode_options(schema.BuiltinOptions.FullyConnectedOptions, fc)
    assert isinstance(opaque, OpaqueOptions) and opaque.raw is fc
    assert encode_options(opaque) == (schema.BuiltinOptions.FullyConnectedOptions, fc)
    assert fused_activation(opaque) is None  # unknown: no rewrite rule may rely on it
    bad = schema.Conv2DOptionsT()
    bad.fusedActivationFunction = 99  # an activation this schema does not name
    assert isinstance(decode_options(schema.BuiltinOptions.Conv2DOptions, bad), OpaqueOptions)


def test_ops_are_built_without_the_schema_and_written_with_it():
    """Op constructors give records; the writer turns them into the schema's tables."""
    import dataclasses

    from tpu_pipeline.toolchain.ir import ops
    from tpu_pipeline.toolchain.ir.options import AddOptions, ConcatenationOptions

    assert not hasattr(Op("ADD", (), ()), "options_type")
    add = ops.add(0, 1, 2, activation="RELU6", version=2)
    assert add.options == AddOptions("RELU6") and add.version == 2 and add.source is None
    cat = ops.concatenation([0, 1], 2, axis=-1)
    assert cat.options == ConcatenationOptions(axis=-1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cat.options.axis = 0
    relu = ops.like(add, (2, 1), (3,), fused_activation="NONE")
    assert relu.opcode == "ADD" and relu.options == AddOptions("NONE") and add.options.fused_activation == "RELU6"
    with pytest.raises(ValueError):
        ops.op("NO_SUCH_OP", (), ())
    t = (Tensor(0, "a", "float32", (1, 2)), Tensor(1, "b", "float32", (1, 2)), Tensor(2, "c", "float32", (1, 2)))
    g = Graph(t, (add,), (0, 1), (2,), "g")
    from tpu_pipeline.toolchain.ir.convert import standalone_model

    written = standalone_model(g).subgraphs[0].operators[0]
    assert written.builtinOptionsType == schema.BuiltinOptions.AddOptions
    assert written.builtinOptions.fusedActivationFunction == schema.ActivationFunctionType.RELU6
    assert from_model(standalone_model(g)).ops[0].options == AddOptions("RELU6")


def test_unique_tensor_names_are_given_in_the_ir_and_written_by_to_model():
    import dataclasses

    from tpu_pipeline.toolchain.ir import from_model, to_model
    from tpu_pipeline.toolchain.loader import load

    model, graph = load(FIXTURES / "chain_int8.tflite")
    t0, t1 = graph.tensors[0], graph.tensors[1]
    clashing = dataclasses.replace(graph, tensors=(t0, dataclasses.replace(t1, name=t0.name), *graph.tensors[2:]))
    fixed, renamed = clashing.with_unique_tensor_names()
    assert renamed == 1 and fixed.tensors[1].name == f"{t0.name}#1"
    assert len({t.name for t in fixed.tensors}) == len(fixed.tensors)
    again = from_model(to_model(fixed, model))
    assert [t.name for t in again.tensors] == [t.name for t in fixed.tensors]
    assert graph.with_unique_tensor_names() == (graph, 0)
