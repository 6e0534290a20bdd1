"""Worked example: a new kernel variant is one module plus one registration.

`PROBE` is what a variant's module declares (here: 3x3 stride-1 convolutions, costed as the
builtin until its rows are fitted, source tpup_probe.cc). Registering it is appending it to
`kernel_variants.REGISTRY` (here ahead of the real ones); nothing else is edited, and every room that handles a variant takes it:
kernel names, the custom options' flag bits through a written file, fit's model on the harness, the
scratch model, TFLite Micro's tail, the cost model, export's custom-op table and op resolver, the
firmware project's objects and the drop-in library's sources. A harness custom op that is not a
variant is registered the same way (`PROBE_OP`, in ir/harness_ops.py's REGISTRY). The real
variants' firmware is checked in QEMU by their own tests (test_harness_depthwise.py for "fast")."""

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
from tpu_pipeline.toolchain.device import CMSIS_NN, load_device
from tpu_pipeline.toolchain.export.sources import harness_custom_ops, resolver_header, resolver_method, resolver_opcode
from tpu_pipeline.toolchain.firmware import project
from tpu_pipeline.toolchain.ir import from_model, harness_ops, kernel_variants, kernels
from tpu_pipeline.toolchain.ir.convert import to_model
from tpu_pipeline.toolchain.ir.kernel_variants.record import HarnessOp, KernelVariant
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import get_semantics
from tpu_pipeline.toolchain.memory.tflm_target import target_tail
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
    assert [op.kernel for op in g.ops] == ["tpup+pointwise16", "tpup+probe", "tpup+window", "tpup+fast"]  # (1x1: "pointwise16")
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
    assert scratch_requests(g, 1, cmsis) == []  # a variant asks no kernel buffer
    assert scratch_requests(kernels.with_kernel(g, [1], kernels.kernel_name()), 1, cmsis)  # CMSIS-NN's im2col does
    assert mcu.op_features(g, 1).fit_class == PROBE.cost_class
    table = mcu.fitted_table()["cmsis-nn"]
    assert mcu.coefficients(table, PROBE.cost_class) == mcu.coefficients(table, "conv")  # until fitted
    assert PROBE.source in library.kernel_sources()
    assert PROBE.source in library._kernel_files(["TPUP_CONV_2D"])


def test_its_scratch_and_its_constant_count_in_the_arena(monkeypatch):
    """The record's `scratch` is what the scratch model asks for it; its constant input is a tensor of
    the model, so TFLite Micro's tail counts that tensor's 16-byte entry."""
    cmsis = get_semantics("tflm-cmsis-nn")
    tails, real = {}, kernel_variants.REGISTRY
    for name, probe in (("plain", PROBE), ("buffered", dataclasses.replace(PROBE, scratch=lambda g, op: 100)),
                        ("no constant", dataclasses.replace(PROBE, constant_input=None))):
        monkeypatch.setattr(kernel_variants, "REGISTRY", (probe, *real))
        g, _ = on_harness(_model()[0])
        assert g.ops[1].kernel == "tpup+probe"
        tails[name] = (scratch_requests(g, 1, cmsis), target_tail(g, CMSIS_NN))
    assert tails["plain"][0] == [] and tails["buffered"][0] == [100]
    assert ("ScratchBufferHandle[]", 4, 4) in tails["buffered"][1].allocations
    assert ("ScratchBufferHandle[]", 4, 4) not in tails["plain"][1].allocations
    assert tails["plain"][1].bytes - tails["no constant"][1].bytes == 16


def test_export_and_the_firmware_take_it_from_the_record(registered):
    g, _ = on_harness(_model()[0])
    code = resolver_opcode(g.ops[1])
    assert code == kernels.custom_code(g.ops[1]) == "TPUP_CONV_2D"  # a variant runs under its op's custom op
    assert resolver_method(code) == "AddCustom"
    assert harness_custom_ops()[code] in resolver_header([code], [resolver_method(code)])
    assert "$(BUILD)/tpup_probe.o" in project.harness_objects().split()
    makefile = project.project_files(load_device("qemu-mps2-an386"))["Makefile"].decode()
    assert "$(BUILD)/tpup_probe.o" in makefile and "@HARNESS_OBJS@" not in makefile


def test_an_unregistered_variant_reaches_no_room():
    """The probe of the rule: without its registration line no room knows the module's variant."""
    g, _ = on_harness(_model()[0])
    assert "tpup+probe" not in [op.kernel for op in g.ops]
    assert PROBE.source not in library.kernel_sources() and PROBE.source not in library._kernel_files(["TPUP_CONV_2D"])
    assert "tpup_probe" not in project.harness_objects()
    assert PROBE.cost_class not in harness_ops.cost_fallbacks()


PROBE_OP = HarnessOp("TPUP_PROBE", "PROBE", "tpup::Register_PROBE", ("tpup_probe_op.cc",), "tpup_probe", "softmax")


def test_a_registered_harness_op_reaches_export_the_firmware_the_library_and_the_cost(monkeypatch):
    assert "TPUP_PROBE" not in harness_custom_ops() and "tpup_probe_op.cc" not in harness_ops.sources()
    monkeypatch.setattr(harness_ops, "REGISTRY", (*harness_ops.REGISTRY, PROBE_OP))
    assert harness_custom_ops()["TPUP_PROBE"] == 'AddCustom("TPUP_PROBE", tpup::Register_PROBE())'
    assert resolver_method("TPUP_PROBE") == "AddCustom"
    assert kernels.custom_codes()["PROBE"] == "TPUP_PROBE" and kernels.builtin_of()["TPUP_PROBE"] == "PROBE"
    assert harness_ops.sources({"TPUP_PROBE"}) == [*harness_ops.COMMON_SOURCES, *harness_ops.variant_sources(),
                                                   "tpup_probe_op.cc"]
    assert "tpup_probe_op.cc" in library.kernel_sources() and "$(BUILD)/tpup_probe_op.o" in project.harness_objects()
    table = mcu.fitted_table()["cmsis-nn"]
    assert mcu.coefficients(table, "tpup_probe") == mcu.coefficients(table, "softmax")  # until fitted
