"""Worked example: a new kernel variant is one module plus one registration.

`PROBE` is what a variant's module declares (here: 3x3 stride-1 convolutions, costed as the
builtin until its rows are fitted, source tpup_probe.cc). Registering it is appending it to
`kernel_variants.REGISTRY` (here ahead of the real ones); nothing else is edited, and every room that handles a variant takes it:
kernel names, the custom options' flag bits through a written file, fit's model on the harness, the
scratch model, the cost model and the drop-in library's sources. The real variants' firmware is
checked in QEMU by their own tests (test_harness_depthwise.py for "fast")."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

from helpers.cnn_builder import CnnBuilder
from tpu_pipeline.toolchain.cost import mcu
from tpu_pipeline.toolchain.deploy import library
from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.fit.variants import on_harness
from tpu_pipeline.toolchain.ir import from_model, kernel_variants, kernels
from tpu_pipeline.toolchain.ir.convert import to_model
from tpu_pipeline.toolchain.ir.kernel_variants.record import KernelVariant
from tpu_pipeline.toolchain.memory.semantics import get_semantics
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model


def _three_by_three(graph, i):
    o, w = graph.ops[i].options, graph.tensors[graph.ops[i].inputs[1]].shape
    return w[1] == w[2] == 3 and o.stride_h == o.stride_w == 1


PROVEN = 0x1000  # a bit the writer derives from the op's constants (as "pointwise" marks its exact cheap requant)
PROBE = KernelVariant(flag="probe", bit=0x40, opcode="CONV_2D", applies=_three_by_three, wins=lambda g, i: True,
                      cost_class="tpup_probe_conv", cost_fallback="conv", source="tpup_probe.cc",
                      derived_bits=lambda g, op: PROVEN, derived_mask=PROVEN,
                      constant_input=lambda g, op: np.arange(6, dtype=np.int32))  # (as "packed" re-lays weights)


@pytest.fixture
def registered(monkeypatch):
    # (first: "window" takes the same convolutions, and the first registered variant that wins is taken)
    monkeypatch.setattr(kernel_variants, "REGISTRY", (PROBE, *kernel_variants.REGISTRY))


def _model():
    b = CnnBuilder(seed=5, spread=True)
    x = b.input((1, 8, 8, 8))
    point = b.conv(x, 8, k=1, act="RELU6")
    three = b.conv(point, 8, k=3, act="RELU6")
    strided = b.conv(three, 8, k=3, stride=2, act="RELU6")
    depth = b.dw(strided, k=5, act="RELU6")
    return b.graph([depth]), b.model_bytes([depth])


def test_an_unregistered_variant_is_unknown():
    with pytest.raises(ValueError, match="unknown harness kernel flags"):
        kernels.kernel_name(PROBE.flag)


def test_fit_takes_a_registered_variant_where_it_wins_and_nowhere_else(registered):
    graph, _ = _model()
    g, _ = on_harness(graph)
    assert [op.kernel for op in g.ops] == ["tpup+pointwise", "tpup+probe", "tpup+window", "tpup+fast"]  # (1x1: "pointwise")
    with pytest.raises(ValueError, match="cannot run"):
        kernels.with_kernel(g, [2], kernels.kernel_name(PROBE.flag))  # stride 2: not what it applies to


def test_its_flag_bit_survives_the_file(registered):
    graph, data = _model()
    g, _ = on_harness(graph)
    back = from_model(read_model(model_to_bytes(to_model(g, read_model(data)))))
    assert [op.kernel for op in back.ops] == [op.kernel for op in g.ops]
    words = [struct.unpack("<16i", kernels.encode_options(g, op))[2] for op in g.ops]
    assert [bool(w & PROVEN) for w in words] == [False, True, False, False]
    stray = struct.pack("<16i", *(w | PROVEN if k == 2 else w
                                  for k, w in enumerate(struct.unpack("<16i", kernels.encode_options(g, g.ops[0])))))
    with pytest.raises(ModelError, match="invalid options"):  # a derived bit without its variant's flag
        kernels.decode_options("TPUP_CONV_2D", stray, "operator 0")


def test_its_constant_input_is_written_checked_and_dropped_for_other_runtimes(registered):
    graph, _ = _model()
    g, _ = on_harness(graph)
    probe = g.ops[1]
    assert len(probe.inputs) == 5 and list(g.tensors[probe.inputs[4]].values()) == list(range(6))
    assert kernels.requant_tensor_ok(g, probe)
    stale = g.tensors[probe.inputs[4]]
    data = np.frombuffer(np.zeros(6, "<i4").tobytes(), np.uint8).copy()
    edited = dataclasses.replace(g, tensors=tuple(dataclasses.replace(t, data=data) if t is stale else t
                                                  for t in g.tensors))
    assert not kernels.requant_tensor_ok(edited, probe)
    assert len(g.ops[3].inputs) == 4  # "fast" reads no constant of its own
    view = kernels.builtin_view(g)
    assert len(view.tensors) == len(graph.tensors) and all(len(op.inputs) <= 3 for op in view.ops)


def test_memory_cost_and_library_follow_the_record(registered):
    graph, _ = _model()
    g, _ = on_harness(graph)
    cmsis = get_semantics("tflm-cmsis-nn")
    from tpu_pipeline.toolchain.memory.scratch import scratch_requests

    assert scratch_requests(g, 1, cmsis) == []  # a variant asks no kernel buffer
    assert scratch_requests(kernels.with_kernel(g, [1], kernels.kernel_name()), 1, cmsis)  # CMSIS-NN's im2col does
    assert mcu.op_features(g, 1).fit_class == PROBE.cost_class
    table = mcu.fitted_table()["cmsis-nn"]
    assert mcu.coefficients(table, PROBE.cost_class) == mcu.coefficients(table, "conv")  # until fitted
    assert PROBE.source in library.kernel_sources()
    assert PROBE.source in library._kernel_files(["TPUP_CONV_2D"])
