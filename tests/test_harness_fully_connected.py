"""The harness's FULLY_CONNECTED (tpu_pipeline.toolchain.ir.fully_connected, custom op
TPUP_FULLY_CONNECTED, harness/tpup_fully_connected.cc): which ops it takes, its packed constant
(the int16 pairs in the order the kernel reads them, the input offset folded into the bias), its
requantisation computed as TFLite Micro's FullyConnected computes it (not the convolution's), its
options and constant through the file, no tail and no scratch; on the emulated board (both kernel
sets) bit-identical to the host's TFLite Micro on layers with odd sizes (rows and inputs left over
from the groups of four), relu / relu6 / none, no bias, per-channel weights, batches, a cheap
requantisation refused, and on MLPerf Tiny's anomaly-detection model when TPUP_MLPERF_DIR holds it."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

from helpers.cnn_builder import CnnBuilder
from helpers.firmware import (graph_in_qemu, mlperf_on_harness, model_for_qemu, needs_arm, needs_mlperf, needs_qemu,
                              qemu_run_as_planned, written)
from tpu_pipeline.toolchain.device import load_device
from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.execute.compare import verify_models
from tpu_pipeline.toolchain.fit.variants import on_harness
from tpu_pipeline.toolchain.ir import Quantization, from_model, fully_connected as fc, kernels
from tpu_pipeline.toolchain.ir.convert import builtin_view_bytes, to_model
from tpu_pipeline.toolchain.ir.kernels import kernel_name, with_kernel
from tpu_pipeline.toolchain.ir.options import FullyConnectedOptions
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import get_semantics
from tpu_pipeline.toolchain.memory.tflm_target import target_tail
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

BOARD = load_device("qemu-mps2-an386")


def _with_bias(b: CnnBuilder, op_pos: int, values) -> None:
    t = b.tensors[b.ops[op_pos].inputs[2]]
    data = np.frombuffer(np.asarray(values, dtype="<i4").tobytes(), dtype=np.uint8).copy()
    data.flags.writeable = False
    b.tensors[t.index] = dataclasses.replace(t, data=data)


def _layers(seed=11):
    """(builder, outputs): a flattened convolution output into a chain of fully connected layers
    covering the kernel's paths: 37 inputs (a word left over), 29 / 13 / 3 outputs (rows left
    over; fewer than four rows: no group), per-channel weights, no bias, relu / relu6 / none, a
    bias past the cheap requantisation's bound (refused), two batches."""
    b = CnnBuilder(seed=seed, spread=True)
    x = b.input((1, 5, 5, 3))
    c = b.conv(x, 2, k=3, act="RELU6")  # [1, 5, 5, 2]: 50 inputs, flattened by the layer
    a = b.fc(c, 37, act="RELU6")
    d = b.fc(a, 29, act="RELU", per_channel=True)
    e = b.fc(d, 13, bias=False)
    big = b.fc(e, 8, act="RELU")
    _with_bias(b, len(b.ops) - 1, [(1 << 30) - 5] * 4 + [-(1 << 30)] * 4)
    f = b.fc(big, 3)
    two = b.input((2, 22))
    g = b.fc(two, 17, act="RELU6", batches=2)
    return b, [f, g, e]


def _graph(seed=11):
    b, outs = _layers(seed)
    return b, outs, b.graph(outs)


def test_every_fully_connected_layer_moves_to_the_harness_and_back():
    b, outs, g = _graph()
    fcs = [i for i, op in enumerate(g.ops) if op.opcode == "FULLY_CONNECTED"]
    assert len(fcs) == 6 and all(fc.refusal(g, g.ops[i]) is None for i in fcs)
    moved, _ = on_harness(g)
    assert {i for i, op in enumerate(moved.ops) if op.opcode == "FULLY_CONNECTED" and op.kernel == "tpup"} == set(fcs)
    back = with_kernel(moved, fcs, "")
    assert [op.inputs for op in back.ops] == [op.inputs[:3] if op.opcode == "FULLY_CONNECTED" else op.inputs
                                              for op in moved.ops]


def test_what_it_refuses():
    b = CnnBuilder(seed=2, spread=True)
    x = b.input((1, 12))
    y = b.fc(x, 6)
    g = b.graph([y])
    hybrid = dataclasses.replace(g.ops[0], options=FullyConnectedOptions(asymmetric_quantize_inputs=True))
    assert "hybrid" in fc.refusal(g, hybrid)
    shuffled = dataclasses.replace(g.ops[0], options=FullyConnectedOptions(weights_format="SHUFFLED4x16INT8"))
    assert fc.refusal(g, shuffled) is not None
    _with_bias(b, 0, [(1 << 31) - 1] * 6)  # the folded bias leaves int32
    g = b.graph([y])
    assert "int32" in fc.refusal(g, g.ops[0]) and not kernels.can_run_harness(g, 0)
    with pytest.raises(ValueError):
        with_kernel(g, [0], kernel_name())
    with pytest.raises(ValueError):  # no flags
        with_kernel(b.graph([y]), [0], kernel_name(kernels.DIRECT))


def test_the_packed_constant_is_what_the_kernel_reads():
    """Bias + input offset x weight sums, TFLite Micro's FullyConnected multipliers, then per four
    rows and four inputs the int16 pairs (x0, x2) then (x1, x3) of rows 0..3; the sums the kernel
    makes from them (and the int8 weights for the leftovers) equal the reference's."""
    b, _, g = _graph()
    op = g.ops[2]  # 37 -> 29, per channel
    w = np.asarray(g.tensors[op.inputs[1]].values(), dtype=np.int64)
    bias = np.asarray(g.tensors[op.inputs[2]].values(), dtype=np.int64)
    zp = int(g.tensors[op.inputs[0]].quant.zero_point[0])
    p = fc.packed_constant(g, op).astype(np.int64)
    m, n = w.shape
    assert p.shape == (3 * m + 28 * 36 // 2,)
    assert np.array_equal(p[:m], bias - zp * w.sum(axis=1))
    assert np.array_equal(p[m:3 * m], np.concatenate(fc.fc_requant(g, op)))
    x = np.random.default_rng(1).integers(-128, 128, n)
    pairs = p[3 * m:].reshape(m // 4, n // 4, 2, 4)  # [group, input group, (x0 x2 | x1 x3), row]
    lo, hi = (pairs << 48 >> 48), (pairs << 32 >> 48)  # the int16 halves
    xs = x[:36].reshape(9, 4)
    acc = (lo[:, :, 0] * xs[None, :, 0, None] + hi[:, :, 0] * xs[None, :, 2, None]
           + lo[:, :, 1] * xs[None, :, 1, None] + hi[:, :, 1] * xs[None, :, 3, None]).sum(axis=1).reshape(-1)
    acc = acc + p[:28] + w[:28, 36:] @ x[36:]
    assert np.array_equal(acc, (w[:28] @ (x - zp)) + bias[:28])


def test_its_requantisation_is_tflites_fully_connected_one():
    """Per tensor TFLite Micro multiplies the two float32 scales in float32 (a convolution's
    requantisation multiplies them in double): on scales where the two multipliers differ, ours
    is the float32 one."""
    from tpu_pipeline.toolchain.ir.requant import quantize_multiplier

    rng = np.random.default_rng(7)
    while True:
        xs, ws, ys = (np.float32(v) for v in rng.uniform(0.001, 0.1, 3))
        single = quantize_multiplier(float(np.float32(xs * ws)) / float(ys))
        if single != quantize_multiplier(float(xs) * float(ws) / float(ys)):
            break
    b = CnnBuilder(seed=3, spread=True)
    x = b.input((1, 16))
    y = b.fc(x, 4)
    for t, s in ((x, xs), (y, ys), (b.ops[0].inputs[1], ws)):
        q = b.tensors[t].quant
        b.tensors[t] = dataclasses.replace(b.tensors[t], quant=Quantization((float(s),), q.zero_point,
                                                                            q.axis))
    g = b.graph([y])
    assert fc.fc_requant(g, g.ops[0])[0][0] == single[0]


def test_options_and_constant_survive_the_file_and_the_builtin_view_computes_the_same():
    b, outs, g = _graph()
    src = b.model_bytes(outs)
    h, _ = on_harness(g)
    data = model_to_bytes(to_model(h, read_model(src)))
    back = from_model(read_model(data))
    assert [(op.opcode, op.inputs, op.options, op.kernel) for op in back.ops] == \
        [(op.opcode, op.inputs, op.options, op.kernel) for op in h.ops]
    fcs = [i for i, op in enumerate(back.ops) if op.opcode == "FULLY_CONNECTED"]
    assert all(kernels.requant_tensor_ok(back, back.ops[i]) for i in fcs)
    words = [struct.unpack("<9i", bytes(bytearray(o.customOptions))) for o in read_model(data).subgraphs[0].operators
             if o.customOptions is not None and len(o.customOptions) == 36]
    # bit 1: the cheap requantisation (refused for the too-large bias); bit 2: one scale (per-tensor weights)
    assert [w[2] for w in words] == [3, 1, 3, 2, 3, 3]
    assert builtin_view_bytes(data) != data
    results = verify_models(src, data, runs=2)
    assert all(o.ok and o.max_abs == 0 for r in results for o in r.outputs)
    edited = dataclasses.replace(back, ops=tuple(dataclasses.replace(op, inputs=(*op.inputs[:3], op.inputs[1]))
                                                 if i == fcs[0] else op for i, op in enumerate(back.ops)))
    assert not kernels.requant_tensor_ok(edited, edited.ops[fcs[0]])


@pytest.mark.parametrize("words", [[1, 1, 4, 0, 0, -128, 127, 0, 0], [1, 1, 0, 0, 0, 5, 4, 0, 0],
                                   [1, 1, 0, 0, 0, -128, 127, 9, 0], [1, 1, 0]])
def test_malformed_options_are_a_model_error(words):
    with pytest.raises(ModelError):
        fc.decode(struct.pack(f"<{len(words)}i", *words), "operator 0")


def test_no_tail_and_no_scratch():
    _, _, g = _graph()
    h, _ = on_harness(g)
    sem = get_semantics("tflm-cmsis-nn")
    fcs = [i for i, op in enumerate(h.ops) if op.opcode == "FULLY_CONNECTED"]
    assert all(scratch_requests(h, i, sem) == [] for i in fcs)
    ours, theirs = target_tail(h, sem), target_tail(g, sem)
    assert not any("FULLY_CONNECTED" in what for what, _, _ in ours.allocations)
    assert ours.bytes < theirs.bytes


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    b, outs, g = _graph()
    return model_for_qemu(tmp_path_factory, "fc", written(on_harness(g)[0], b.model_bytes(outs)))


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_the_fully_connected_kernel_is_bit_identical_in_qemu(model, kernels_set):
    r = qemu_run_as_planned(model, BOARD, kernels_set, iterations=3, seed=9)
    ran = {o["index"]: o["opcode"] for o in r.op_instructions}
    assert sum(code == "TPUP_FULLY_CONNECTED" for code in ran.values()) == 6


@needs_arm
@needs_qemu
@needs_mlperf("ad01_int8")
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_mlperf_anomaly_detection_on_the_kernel_is_bit_identical_in_qemu(tmp_path, kernels_set):
    g, src = mlperf_on_harness("ad01_int8")
    assert [op.kernel for op in g.ops] == ["tpup"] * 10
    graph_in_qemu(tmp_path, g, src, BOARD, kernels_set, iterations=2, seed=4)


def test_fit_leaves_weights_as_they_are_where_the_board_s_flash_cannot_hold_them_re_laid(tmp_path):
    """TPUP_FULLY_CONNECTED's int16 weights double an FC model's flash (MLPerf's ad01: 277 KB ->
    827 KB): on a board whose flash holds the model but not its re-laid weights, fit keeps the
    builtin FULLY_CONNECTED and says why; with room, it takes the faster kernel."""
    from tpu_pipeline.toolchain.deploy.banks import HARNESS_CODE_BYTES
    from tpu_pipeline.toolchain.device.load import _resolve
    from tpu_pipeline.toolchain.fit.model import fit_model

    b = CnnBuilder(seed=3, spread=True)
    x = b.input((1, 1024))
    y = b.fc(b.fc(x, 128, act="RELU"), 64)
    path = tmp_path / "fc.tflite"
    path.write_bytes(b.model_bytes([y]))
    size = path.stat().st_size
    text = _resolve("sparkfun-edge").read_text()
    fits = {}
    for room in (3 * size, size + 4096):  # the model re-laid (~2x) fits; only the model as it is fits
        desc = tmp_path / f"board{room}.toml"
        desc.write_text(text.replace("flash_bytes = 983040", f"flash_bytes = {HARNESS_CODE_BYTES + room}")
                        .replace('name = "sparkfun-edge"', f'name = "board{room}"'))
        fitted = fit_model(path, device=load_device(desc))
        kinds = {op.kernel for op in fitted.result.graph.ops if op.opcode == "FULLY_CONNECTED"}
        fits[room] = (kinds, len(fitted.data), fitted.notes)
    kinds, written, notes = fits[3 * size]
    assert kinds == {"tpup"} and written > 1.8 * size and not any("flash" in n for n in notes)
    kinds, written, notes = fits[size + 4096]
    assert kinds == {""} and written <= size + 4096
    assert any("re-laid in flash" in n and "fitted without them" in n for n in notes), notes
