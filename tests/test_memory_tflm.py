"""The memory model predicts, to the byte, the arena head that real TFLite Micro allocates."""

from __future__ import annotations

import random

import pytest

from conftest import tflm_models
from tpu_pipeline.toolchain.device import CMSIS_NN, REFERENCE, kernel_set
from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena
from tpu_pipeline.toolchain.ir import from_model, to_model
from tpu_pipeline.toolchain.loader import load
from tpu_pipeline.toolchain.memory import check_plan, lifetimes, order_free_lower_bound, tflite_arena, tflm_greedy
from tpu_pipeline.toolchain.tflite import model_to_bytes

MODELS = tflm_models()


def _random_topological_order(graph, seed):
    rng = random.Random(seed)
    indeg = [len(p) for p in graph.preds]
    ready = [i for i, d in enumerate(indeg) if d == 0]
    order = []
    while ready:
        op = ready.pop(rng.randrange(len(ready)))
        order.append(op)
        for s in sorted(graph.succs[op]):
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    return order


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_predicted_head_equals_real_tflm(path):
    _, graph = load(path)
    lt = lifetimes(graph, semantics="tflm")
    plan = tflm_greedy(lt)
    assert check_plan(lt, plan.offsets, alignment=16) == []
    assert measure_tflm_arena(path).head == plan.size


@pytest.mark.parametrize("path", [p for p in MODELS if "irregular" in p.name or "randwire" in p.name],
                         ids=lambda p: p.name)
@pytest.mark.parametrize("seed", [1, 2])
def test_prediction_holds_for_reordered_models(path, seed):
    model, graph = load(path)
    order = _random_topological_order(graph, seed)
    reordered = graph.reordered(order)
    data = model_to_bytes(to_model(reordered, model))
    again = from_model(__import__("tpu_pipeline.toolchain.tflite", fromlist=["read_model"]).read_model(data))
    plan = tflm_greedy(lifetimes(again, semantics="tflm"))
    assert measure_tflm_arena(data).head == plan.size
    assert lifetimes(again).peak == lifetimes(graph, order).peak


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_bounds_are_ordered(path):
    _, graph = load(path)
    lt = lifetimes(graph)
    assert order_free_lower_bound(graph) <= lt.peak <= tflm_greedy(lt).size
    lt2 = lifetimes(graph, semantics="tflite")
    plan = tflite_arena(lt2)
    assert check_plan(lt2, plan.offsets) == []
    assert lt2.peak <= plan.size


# ---- the 32-bit Cortex-M target (tpu_pipeline.toolchain.memory.tflm_target) ---------------------------------
# arena_used_bytes(), head and tail that the harness firmware reported on QEMU mps2-an386 (the
# READY line) for these fixtures exported by export-mcu: (cmsis-nn, reference) each.
TARGET = {"chain_int8": ((5232, 2868), (5120, 2836)), "pool_softmax_int8": ((2928, 1204), (2816, 1140)),
          "multi_output_int8": ((6656, 1864), (6656, 1800)), "tiny_irregular_int8": ((13312, 3508), (13312, 3444)),
          # float32: the reference kernels allocate per-channel arrays for every type, cmsis_nn's only for int8/16
          "tiny_irregular_float32": ((53248, 2368), (53248, 3152))}


@pytest.mark.parametrize("name", sorted(TARGET))
def test_target_arena_equals_what_the_firmware_reported(name):
    from conftest import FIXTURES
    from tpu_pipeline.toolchain.memory.tflm_target import export_plan_offsets, target_arena

    _, graph = load(FIXTURES / f"{name}.tflite")
    offsets = export_plan_offsets(graph)
    for kernels, (head, tail) in zip((CMSIS_NN, REFERENCE), TARGET[name]):
        a = target_arena(graph, kernels, offsets)
        assert (a.head, a.tail, a.total) == (head, tail, head + tail), kernels


def test_cmsis_nn_scratch_is_what_its_kernels_request():
    from conftest import FIXTURES
    from tpu_pipeline.toolchain.memory.scratch import scratch_requests
    from tpu_pipeline.toolchain.memory.semantics import TFLM, TFLM_CMSIS_NN

    _, graph = load(FIXTURES / "chain_int8.tflite")
    # arm_convolve_s8's im2col: 2 columns x (kh*kw*cin rounded up to 4) int16; as the firmware asked
    got = [scratch_requests(graph, i, TFLM_CMSIS_NN) for i in range(len(graph.ops))]
    assert got == [[112], [288], [288], [576], [576], [576], [1152], [1152]]
    assert all(scratch_requests(graph, i, TFLM) == []
               for i in range(len(graph.ops)))
    _, pool = load(FIXTURES / "pool_softmax_int8.tflite")
    avg = [i for i, op in enumerate(pool.ops) if op.opcode == "AVERAGE_POOL_2D"][0]
    channels = pool.tensors[pool.ops[avg].inputs[0]].shape[-1]
    assert scratch_requests(pool, avg, TFLM_CMSIS_NN) == [4 * channels]  # one int32 sum per channel


def test_every_op_the_rewrites_emit_has_a_modelled_tail():
    """fit selects on each variant's tail, and a variant whose ops the tail model does not know gets
    none at all: swiftnet_hpd's patch copies wrote PADV2 (before SAME max-pools), were selected at
    26 KiB and realised at 623 KiB. Every op the rewrites build (tpu_pipeline.toolchain.ir.ops)
    must be in the tail model."""
    import re
    from dataclasses import replace
    from pathlib import Path

    from conftest import FIXTURES
    from tpu_pipeline.toolchain.ir import ops
    from tpu_pipeline.toolchain.memory.tflm_target import target_tail

    emitted = set(re.findall(r'\bop\("([A-Z0-9_]+)"', Path(ops.__file__).read_text()))
    assert {"PAD", "PADV2", "STRIDED_SLICE"} <= emitted
    _, graph = load(FIXTURES / "chain_int8.tflite")
    for opcode in sorted(emitted):
        g = replace(graph, ops=(replace(graph.ops[0], opcode=opcode),) + graph.ops[1:])
        for kernels in (CMSIS_NN, REFERENCE):
            assert opcode not in target_tail(g, kernels).unmodelled, (opcode, kernels)


def test_target_tail_names_an_op_it_does_not_model():
    from dataclasses import replace

    from conftest import FIXTURES
    from tpu_pipeline.toolchain.errors import UsageError
    from tpu_pipeline.toolchain.memory.scratch import scratch_requests
    from tpu_pipeline.toolchain.memory.semantics import TFLM_CMSIS_NN
    from tpu_pipeline.toolchain.memory.tflm_target import target_arena, target_tail

    _, graph = load(FIXTURES / "chain_int8.tflite")
    odd = replace(graph, ops=(replace(graph.ops[0], opcode="CUMSUM"),) + graph.ops[1:])
    t = target_tail(odd, CMSIS_NN)
    assert t.bytes is None and t.unmodelled == ("CUMSUM",)
    assert target_arena(odd, REFERENCE).total is None
    # TANH's parser allocates nothing, but its kernel's OpData is not in the table: still refused
    tanh = replace(graph, ops=(replace(graph.ops[0], opcode="TANH"),) + graph.ops[1:])
    assert target_tail(tanh, REFERENCE).unmodelled == ("TANH",)
    # CMSIS-NN's int16 convolution is modelled (its im2col with a 64-bit bias; the reference path,
    # no buffer, with this 32-bit one); its int16 depthwise buffers are not: said so, not guessed
    x = graph.ops[0].inputs[0]
    s16 = replace(graph, tensors=tuple(replace(t, dtype="int16") if t.index == x else t for t in graph.tensors))
    assert target_tail(s16, CMSIS_NN).unmodelled == ()
    assert scratch_requests(s16, 0, TFLM_CMSIS_NN) == []
    dw16 = replace(s16, ops=(replace(s16.ops[0], opcode="DEPTHWISE_CONV_2D"),) + s16.ops[1:])
    assert target_tail(dw16, CMSIS_NN).unmodelled == ("DEPTHWISE_CONV_2D (int16)",)
    assert target_tail(s16, REFERENCE).bytes is not None
    with pytest.raises(UsageError, match="kernel set"):
        target_tail(graph, "arm-nn")


def test_arena_measured_in_a_forked_child_as_in_a_new_process(monkeypatch):
    """measure_tflm_arena reads TFLite Micro's report in a forked child (no interpreter start-up):
    the figures and a refusal's words are those a new Python process gives; a forked child that
    dies falls back to the new process, whose figures then stand."""
    import os
    import signal

    from tpu_pipeline.toolchain.errors import ModelError
    from tpu_pipeline.toolchain.execute import tflm_arena

    forked = measure_tflm_arena(MODELS[0])
    refused = MODELS[0].parent / "thirdparty" / "planestrike_tf_agents.tflite"
    with pytest.raises(ModelError) as forked_refusal:
        measure_tflm_arena(refused)
    monkeypatch.setattr(tflm_arena, "_captured", lambda *a: os.kill(os.getpid(), signal.SIGKILL))
    assert measure_tflm_arena(MODELS[0]) == forked  # (the child died: the new process answered)
    with pytest.raises(ModelError) as new_refusal:
        measure_tflm_arena(refused)
    assert str(new_refusal.value) == str(forked_refusal.value)
