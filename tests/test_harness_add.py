"""The harness's ADD (tpu_pipeline.toolchain.ir.add, harness/tpup_add.cc): which ADDs it takes, its
requantization as TFLite Micro's Prepare computes it, its options through the file, the host's
builtin view (TFLite Micro and LiteRT), in place (read back from the plan, kept by fit's twins),
no tail and no scratch; on the emulated board (both kernel sets) bit-identical to the host's
TFLite Micro, in place and not, with RELU / RELU6, below, at and above the table threshold, on both
requantization paths of the sum."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

from helpers.cnn_builder import CnnBuilder
from helpers.firmware import exported_model, model_for_qemu, needs_arm, needs_qemu, qemu_run_as_planned, written
from tpu_pipeline.toolchain.device import CMSIS_NN, REFERENCE, load_device
from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.execute.compare import verify_models
from tpu_pipeline.toolchain.fit.realise import apply_selection
from tpu_pipeline.toolchain.fit.spans import split_spans
from tpu_pipeline.toolchain.fit.variants import as_is_variants, kernel_twins, on_harness
from tpu_pipeline.toolchain.ir import add, from_model, kernels
from tpu_pipeline.toolchain.ir.convert import builtin_view_bytes, standalone_model, to_model
from tpu_pipeline.toolchain.ir.graph import Quantization
from tpu_pipeline.toolchain.ir.kernels import HARNESS_IN_PLACE, IN_PLACE, kernel_name, with_in_place, with_kernel
from tpu_pipeline.toolchain.memory.lifetimes import lifetimes
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import get_semantics, tflm_semantics
from tpu_pipeline.toolchain.memory.tflm import plan_for_tflm
from tpu_pipeline.toolchain.memory.tflm_target import target_tail
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model
from tpu_pipeline.toolchain.tflite.metadata import read_offline_plan, with_offline_plan

BOARD = load_device("qemu-mps2-an386")


def _adds(seed=7):
    """Residual ADDs: 1,024 elements (tabled; RELU), 256 (the threshold, tabled; RELU6), 64 (AddFunc
    per element), one whose output scale makes the sum's multiplier 2/3 (no right shift: the exact
    requantization, not the fast one), and the larger input scale first and second."""
    b = CnnBuilder(seed=seed, spread=True)
    x = b.input((1, 16, 8, 8))
    d, e = b.conv(x, 8, k=1, act="RELU6"), b.conv(x, 8, k=3)
    s1 = b.add(d, e, act="RELU")
    s2 = b.add(b.conv(s1, 8, k=1), s1)
    p = b.pool(s2, k=2, stride=2)  # (1, 8, 4, 8): 256 elements
    s3 = b.add(p, b.conv(p, 8, k=1), act="RELU6")
    q = b.pool(s3, k=2, stride=2)  # (1, 4, 2, 8): 64 elements
    s4 = b.add(q, b.conv(q, 8, k=1))
    s5 = b.add(b.conv(s3, 8, k=1), s3)
    twice = 2 * max(b._scale(b.ops[-1].inputs[0]), b._scale(s3))
    b.tensors[s5] = dataclasses.replace(b.tensors[s5], quant=Quantization((twice * 1.5 / (1 << 20),), (3,)))
    return b, [s4, s5]


def _add_ops(graph):
    return [i for i, op in enumerate(graph.ops) if op.opcode == "ADD"]


def test_the_adds_cover_both_loops_and_both_requantizations():
    b, outs = _adds()
    g = b.graph(outs)
    sizes = [g.tensors[g.ops[i].outputs[0]].num_elements for i in _add_ops(g)]
    assert sizes == [1024, 1024, 256, 64, 256] and min(sizes) < add.TABLE_MIN == 128 < 256
    shifts = [add.add_params(g, g.ops[i])[9] for i in _add_ops(g)]
    assert shifts[-1] == 0 and all(s <= -1 for s in shifts[:-1])  # (0: Requant, not FastRequant)


def _tflite_term(x: int, m: int, shift: int) -> int:
    """MultiplyByQuantizedMultiplierSmallerThanOneExp(x, m, shift) in gemmlowp's own steps."""
    ab = x * m
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    n = ab + nudge
    high = n >> 31 if n >= 0 else -((-n) >> 31)  # (C's division truncates toward zero)
    e = -shift
    mask = (1 << e) - 1
    threshold = (mask >> 1) + (1 if high < 0 else 0)
    return (high >> e) + (1 if (high & mask) > threshold else 0)


def test_the_tables_fill_gives_tflites_terms():
    """harness/tpup_add.h AddTable's arithmetic (SMMULR of the term doubled, then one shift with
    half and the sign's -1 added), against gemmlowp's steps for every term an int8 ADD can tabulate
    (|offset + byte| <= 256, left shift 20) at multipliers and shifts across their range (the
    firmware's loop is checked against TFLite Micro in QEMU below; this checks the identity it
    rests on where a tie in the int32 term would not show in an int8 output)."""
    rng = np.random.default_rng(3)
    ms = [1 << 30, (1 << 31) - 1, 1288490189, *rng.integers(1 << 30, 1 << 31, 40).tolist()]
    for m in ms:
        for shift in (0, -1, -2, -5, -13, -20, -31):
            for k in range(-256, 257):
                x = k << 20
                h = (2 * x * m + (1 << 31)) >> 32  # SMMULR(2x, m)
                e = -shift
                mine = (h + ((1 << (e - 1)) if e else 0) + ((-1 if h < 0 else 0) if e else 0)) >> e
                assert mine == _tflite_term(x, m, shift), (m, shift, k)


def test_requantization_is_calculate_op_data_adds():
    """Equal scales: each input 1/2 (2^30, shift 0), the output 2s / (2^20 s) = 2^-19."""
    b = CnnBuilder(seed=1)
    x = b.input((1, 4, 4, 8))
    y = b.add(x, b.conv(x, 8, k=1))
    g = b.graph([y])
    a_, c_ = g.ops[-1].inputs
    s = b._scale(a_)
    g = dataclasses.replace(g, tensors=tuple(
        dataclasses.replace(t, quant=Quantization((s,), t.quant.zero_point)) if t.index in (c_,) else
        dataclasses.replace(t, quant=Quantization((s,), (5,))) if t.index == y else t for t in g.tensors))
    params = add.add_params(g, g.ops[-1])
    assert params[0] == 20 and params[2:4] == [1 << 30, 0] and params[5:7] == [1 << 30, 0]
    assert params[7] == 5 and params[8:] == [1 << 30, -18]


def test_every_add_of_equal_shapes_where_it_wins_runs_on_the_harness():
    """From TABLE_MIN elements; the 64-element ADD stays on the builtin (CMSIS-NN's is faster there)."""
    b, outs = _adds()
    g = b.graph(outs)
    moved, notes = on_harness(g)
    small = [i for i in _add_ops(g) if g.tensors[g.ops[i].outputs[0]].num_elements < add.TABLE_MIN]
    assert len(small) == 1 and kernels.can_run_harness(g, small[0])
    assert {i for i in _add_ops(moved) if moved.ops[i].kernel == "tpup"} == set(_add_ops(g)) - set(small)
    assert "4 ADD on the harness's own kernels" in notes[0]


def test_its_cost_rows_price_it_below_the_builtin_where_on_harness_takes_it():
    """[K.tpup_add] (tools/fit_harness_cost.py, QEMU counts): from TABLE_MIN elements below the
    builtin's rows under both kernel sets; below it TPUP_ADD is priced as the builtin (AddFunc)."""
    from tpu_pipeline.toolchain.cost.mcu import estimate_mcu, op_features

    b, outs = _adds()
    g = b.graph(outs)
    h = with_kernel(g, _add_ops(g), kernel_name())
    for kset in (CMSIS_NN, REFERENCE):
        builtin, harness = ({o.index: o.seconds for o in estimate_mcu(x, BOARD, kset).ops} for x in (g, h))
        for i in _add_ops(g):
            if g.tensors[g.ops[i].outputs[0]].num_elements >= add.TABLE_MIN:
                assert op_features(h, i).fit_class == "tpup_add" and harness[i] < 0.6 * builtin[i]
            else:
                assert op_features(h, i).fit_class == "add" and harness[i] == builtin[i]


def test_adds_the_harness_refuses():
    b = CnnBuilder(seed=2, spread=True)
    x = b.input((1, 6, 5, 8))
    h = b.conv(x, 8, k=1)
    col = b.conv(b.mean(x), 8, k=1)  # [1, 1, 1, 8]: a broadcast
    y = b.add(h, col)
    tiny = b.add(h, b.conv(x, 8, k=1))
    twice = 2 * max(b._scale(h), b._scale(b.ops[-1].inputs[1]))
    b.tensors[tiny] = dataclasses.replace(b.tensors[tiny], quant=Quantization((twice / (1 << 21),), (0,)))
    g = b.graph([y, tiny])
    adds = _add_ops(g)
    assert "broadcast" in kernels.mean_mul_refusal(g, g.ops[adds[0]])
    assert "below one" in kernels.mean_mul_refusal(g, g.ops[adds[1]])
    per_channel = dataclasses.replace(g, tensors=tuple(
        dataclasses.replace(t, quant=Quantization((0.1, 0.2), (0, 0))) if t.index == h else t for t in g.tensors))
    assert "per-tensor" in kernels.mean_mul_refusal(per_channel, g.ops[adds[1]])
    assert not any(kernels.can_run_harness(g, i) for i in adds)
    with pytest.raises(ValueError):
        with_kernel(g, [adds[0]], kernel_name())
    with pytest.raises(ValueError):  # no flags for it
        with_kernel(b.graph([tiny]), [adds[1]], kernel_name(kernels.DIRECT))


def test_options_round_trip_and_the_builtin_view_computes_the_same():
    """The host's TFLite Micro and LiteRT run the builtin view: the same outputs as the source."""
    b, outs = _adds()
    g = b.graph(outs)
    src = b.model_bytes(outs)
    h = with_kernel(g, _add_ops(g), kernel_name())
    data = written(h, src)
    back = from_model(read_model(data))
    assert [(op.opcode, op.inputs, op.options, op.version, op.kernel) for op in back.ops] == \
        [(op.opcode, op.inputs, op.options, op.version, op.kernel) for op in h.ops]
    codes = {bytes(c.customCode or b"").decode() for c in read_model(data).operatorCodes}
    assert "TPUP_ADD" in codes
    view = builtin_view_bytes(data)
    vm = read_model(view)
    assert not any(vm.operatorCodes[o.opcodeIndex].customCode for o in vm.subgraphs[0].operators)
    results = verify_models(src, data, runs=2)
    assert {r.runtime for r in results if not r.skipped and r.outputs} == {"litert", "tflm"}
    assert all(o.ok and o.max_abs == 0 for r in results for o in r.outputs)


@pytest.mark.parametrize("words", [[1, 2, 20, 0, 1 << 30, 0, 0, 1 << 30, 0, 0, 1 << 30, -18, -128, 127, 9],
                                   [1, 2, 21, 0, 1 << 30, 0, 0, 1 << 30, 0, 0, 1 << 30, -18, -128, 127, 0],
                                   [1, 2, 20, 0, 1 << 30, 1, 0, 1 << 30, 0, 0, 1 << 30, -18, -128, 127, 0],
                                   [1, 2, 20, 0, 1 << 30, 0, 0, 1 << 30, 0, 0, 1 << 30, -18, 5, 4, 0],
                                   [1, 2, 20]])
def test_malformed_options_are_a_model_error(words):
    b, outs = _adds()
    g = b.graph(outs)
    at = _add_ops(g)[0]
    model = to_model(with_kernel(g, [at], kernel_name()), standalone_model(g))
    model.subgraphs[0].operators[at].customOptions = list(struct.pack(f"<{len(words)}i", *words))
    with pytest.raises(ModelError, match="TPUP_ADD"):
        from_model(read_model(model_to_bytes(model)))


def test_no_tail_and_no_scratch():
    b, outs = _adds()
    g = b.graph(outs)
    h = with_kernel(g, _add_ops(g), kernel_name())
    for kset, sem_name in ((REFERENCE, "tflm"), (CMSIS_NN, "tflm-cmsis-nn")):
        assert not any(scratch_requests(h, i, get_semantics(sem_name)) for i in _add_ops(h))
        names = [what for what, _, _ in target_tail(h, kset).allocations]
        assert not any(f"op {i} " in what for i in _add_ops(h) for what in names)
        assert target_tail(g, kset).bytes - target_tail(h, kset).bytes >= 5 * 60  # (OpDataAdd each)


# ---- in place ---------------------------------------------------------------------------------
def _in_place(graph):
    """`graph` with its ADDs on TPUP_ADD, in place wherever an input dies there."""
    h = with_kernel(graph, _add_ops(graph), kernel_name())
    return with_in_place(h, [i for i in _add_ops(h) if kernels.in_place_source(h, i) is not None])


def _with_plan(graph, src: bytes) -> bytes:
    plan = plan_for_tflm(graph, n_tensors=len(graph.tensors))
    return model_to_bytes(with_offline_plan(to_model(graph, read_model(src)), list(plan.tensor_offsets)))


def test_in_place_stays_on_the_harness_and_is_read_back_from_the_plan():
    b, outs = _adds()
    g = b.graph(outs)
    h = _in_place(g)
    placed = [i for i in _add_ops(h) if h.ops[i].kernel == HARNESS_IN_PLACE]
    assert len(placed) >= 3 and all(kernels.is_harness(h.ops[i]) for i in placed)
    data = _with_plan(h, b.model_bytes(outs))
    back = from_model(read_model(data))
    assert [op.kernel for op in back.ops] == [op.kernel for op in h.ops]
    plan = read_offline_plan(read_model(data))
    assert all(plan[kernels.in_place_source(back, i)] == plan[back.ops[i].outputs[0]] for i in placed)
    apart = with_kernel(g, _add_ops(g), kernel_name())
    at = placed[0] + 1  # (op i runs at step i + 1): one buffer where there were two
    assert lifetimes(h, semantics="tflm").live_bytes()[at] < lifetimes(apart, semantics="tflm").live_bytes()[at]
    view = kernels.builtin_view(h)  # (for runtimes without the harness: the builtin, in place)
    assert [view.ops[i].kernel for i in placed] == [IN_PLACE] * len(placed)
    results = verify_models(b.model_bytes(outs), data, runs=2)
    assert all(o.ok and o.max_abs == 0 for r in results for o in r.outputs)


def test_fits_twins_keep_an_add_in_place_on_the_harness():
    """At a peak set by an ADD, fit's kernel twin lays its output over the dying input and keeps
    TPUP_ADD (a TPUP_MUL goes back to the builtin for that); the selection re-applies it so."""
    b = CnnBuilder(seed=4)
    x = b.input((1, 16, 16, 16))
    a = b.conv(x, 16, k=1)
    y = b.add(a, b.conv(a, 16, k=1))  # (a, its convolution and the sum: the peak)
    g, _ = on_harness(b.graph([y]))
    sem = tflm_semantics(CMSIS_NN)
    spans = split_spans(g)
    as_is = as_is_variants(g, spans, BOARD, sem)
    k, plain = next((k, v) for k, v in enumerate(as_is) if _add_ops(v.graph))
    twins = kernel_twins(plain, BOARD, sem)
    placed = [t for t in twins if "in place" in t.label]
    assert placed and placed[0].peak < plain.peak
    at = _add_ops(placed[0].graph)[0]
    assert placed[0].graph.ops[at].kernel == HARNESS_IN_PLACE
    again = apply_selection(g, [placed[0] if j == k else v for j, v in enumerate(as_is)], spans)
    assert again.ops[_add_ops(again)[0]].kernel == HARNESS_IN_PLACE


# ---- on the emulated board ---------------------------------------------------------------------
@pytest.fixture(scope="module", params=["apart", "in-place"])
def model(request, tmp_path_factory):
    b, outs = _adds()
    g = b.graph(outs)
    if request.param == "apart":
        h = with_kernel(g, _add_ops(g), kernel_name())
        data = written(h, b.model_bytes(outs))
    else:
        h = _in_place(g)
        data = _with_plan(h, b.model_bytes(outs))
    return model_for_qemu(tmp_path_factory, f"adds_{request.param.replace('-', '_')}", data), h


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_add_runs_bit_identical_in_qemu(model, kernels_set):
    path, h = model
    r = qemu_run_as_planned(path, BOARD, kernels_set, iterations=3, seed=5)
    ran = {o["index"]: o["opcode"] for o in r.op_instructions}
    assert {i for i, code in ran.items() if code == "TPUP_ADD"} == set(_add_ops(h))
    exported = from_model(exported_model(r))
    assert [op.kernel for op in exported.ops] == [op.kernel for op in h.ops]  # (in place as planned)
    per_element = {i: o["instructions"] / h.tensors[h.ops[i].outputs[0]].num_elements
                   for i, o in ((o["index"], o) for o in r.op_instructions) if i in _add_ops(h)}
    assert np.isfinite(list(per_element.values())).all()
