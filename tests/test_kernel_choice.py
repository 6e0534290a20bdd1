"""Per-op kernel choices (tpu_pipeline.toolchain.ir.kernels): the direct convolution as a distinct op code."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from cnn_builder import CnnBuilder
from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.execute.compare import verify_models
from tpu_pipeline.toolchain.ir.convert import builtin_view_bytes, from_model, standalone_model, to_model
from tpu_pipeline.toolchain.ir.kernels import DIRECT, DIRECT_CONV_CODE, can_run_direct, kernel_choices, with_kernel
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import get_semantics
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model


def _cnn(seed=1, dtype="int8"):
    b = CnnBuilder(seed=seed, dtype=dtype)
    x = b.input((1, 12, 10, 3))
    y = b.conv(x, 8, k=3, stride=2, padding="SAME", act="RELU6")
    z = b.conv(y, 8, k=1)
    w = b.conv(b.dw(z, k=3), 6, k=3, padding="VALID", dilation=2, act="RELU")
    return b, [w]


def _ops(graph):
    return [(op.opcode, op.inputs, op.outputs, op.version, op.kernel, op.options) for op in graph.ops]


def _convs(graph):
    return [i for i in range(len(graph.ops)) if graph.ops[i].opcode == "CONV_2D"]


def test_direct_convs_round_trip_through_the_file_as_a_custom_code():
    b, outs = _cnn()
    g = b.graph(outs)
    model = standalone_model(g)
    chosen = with_kernel(g, _convs(g)[::2])
    data = model_to_bytes(to_model(chosen, model))
    back = from_model(read_model(data))
    assert kernel_choices(back) == {i: DIRECT for i in _convs(g)[::2]}
    assert _ops(back) == _ops(chosen)  # options, version and operands survive the custom options
    codes = {bytes(c.customCode or b"").decode() for c in read_model(data).operatorCodes}
    assert DIRECT_CONV_CODE in codes
    # and back to the builtin kernel: the same graph as before
    plain = from_model(read_model(model_to_bytes(to_model(dataclasses.replace(back, ops=g.ops), read_model(data)))))
    assert not kernel_choices(plain) and _ops(plain) == _ops(g)


def test_the_builtin_view_computes_what_the_model_computes_in_both_runtimes():
    b, outs = _cnn(seed=4)
    g = b.graph(outs)
    src = b.model_bytes(outs)
    data = model_to_bytes(to_model(with_kernel(g, _convs(g)), read_model(src)))
    assert builtin_view_bytes(data) != data and builtin_view_bytes(src) == src
    results = verify_models(src, data, runs=2)  # the host runtimes run the builtin view
    assert {r.runtime for r in results} == {"litert", "tflm"}
    assert all(o.ok and o.max_abs == 0 for r in results for o in r.outputs)


def test_direct_kernel_asks_for_no_scratch_where_cmsis_nn_does():
    b, outs = _cnn()
    g = b.graph(outs)
    first = _convs(g)[0]  # 3x3 over 3 channels: CMSIS-NN asks for an im2col buffer
    sem = get_semantics("tflm-cmsis-nn")
    assert scratch_requests(g, first, sem) == [2 * 28 * 2]
    assert scratch_requests(with_kernel(g, [first]), first, sem) == []


def test_only_int8_convolutions_can_run_direct():
    b, outs = _cnn(dtype="float32")
    g = b.graph(outs)
    assert not any(can_run_direct(g, i) for i in range(len(g.ops)))
    b, outs = _cnn()
    g = b.graph(outs)
    dw = next(i for i, op in enumerate(g.ops) if op.opcode == "DEPTHWISE_CONV_2D")
    assert not can_run_direct(g, dw) and all(can_run_direct(g, i) for i in _convs(g))
    with pytest.raises(ValueError):
        with_kernel(g, [dw])


@pytest.mark.parametrize("options", [b"", struct.pack("<7i", 3, 9, 1, 1, 1, 1, 0), struct.pack("<7i", 3, 1, 0, 1, 1, 1, 0)])
def test_malformed_direct_options_are_a_model_error(options):
    b, outs = _cnn()
    g = b.graph(outs)
    model = to_model(with_kernel(g, [_convs(g)[0]]), standalone_model(g))
    model.subgraphs[0].operators[0].customOptions = list(options)
    with pytest.raises(ModelError, match=DIRECT_CONV_CODE):
        from_model(read_model(model_to_bytes(model)))
