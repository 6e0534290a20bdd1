"""The harness's depthwise 3x3 kernel for narrow maps (flag "dw3", harness/tpup_depthwise3x3.cc):
which convolutions it takes (its buffer's bound), its buffer in the arena model, the flag
through the file; on the emulated board (both kernel sets) bit-identical to the host's TFLite
Micro on odd narrow maps, strides 1 and 2, SAME, VALID and folded asymmetric padding, relu /
relu6 / none, per-channel and per-tensor weights, channel counts not a multiple of four, no bias,
a bias too large for the cheap requantisation, maps of one column or row, an output overlapped
over its input (rows through a ring), and on MLPerf Tiny's kws model when its checkout is here
(TPUP_MLPERF_DIR)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers.cnn_builder import CnnBuilder
from helpers.firmware import (graph_in_qemu, mlperf_on_harness, model_for_qemu, needs_arm, needs_mlperf, needs_qemu,
                              qemu_run_as_planned, written)
from tpu_pipeline.toolchain.device import load_device
from tpu_pipeline.toolchain.fit.variants import on_harness
from tpu_pipeline.toolchain.ir import Quantization, from_model, kernels
from tpu_pipeline.toolchain.ir.convert import to_model
from tpu_pipeline.toolchain.ir.kernel_variants import depthwise3x3
from tpu_pipeline.toolchain.ir.kernels import FAST, OVERLAP, can_run_variant, kernel_name, with_kernel
from tpu_pipeline.toolchain.ir import overlap
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import get_semantics
from tpu_pipeline.toolchain.rewrite.fold_pad import fold_pads
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

BOARD = load_device("qemu-mps2-an386")
DW3 = depthwise3x3.VARIANT.flag


def _replace_data(b: CnnBuilder, t: int, values, dtype) -> None:
    data = np.frombuffer(np.asarray(values, dtype=dtype).tobytes(), dtype=np.uint8).copy()
    data.flags.writeable = False
    b.tensors[t] = dataclasses.replace(b.tensors[t], data=data)


def _per_tensor(b: CnnBuilder, op_pos: int) -> None:
    w = b.tensors[b.ops[op_pos].inputs[1]]
    scale = float(np.mean(w.quant.scale))
    b.tensors[w.index] = dataclasses.replace(w, quant=Quantization((scale,), (0,), 3))
    bias = b.tensors[b.ops[op_pos].inputs[2]]
    b.tensors[bias.index] = dataclasses.replace(bias, quant=Quantization((b._scale(b.ops[op_pos].inputs[0]) * scale,), (0,), 0))


def _dws(seed=71):
    """(graph with every depthwise convolution on the dw3 kernel, model bytes, outputs)."""
    b = CnnBuilder(seed=seed, spread=True)
    x = b.input((1, 13, 5, 6))
    e = b.conv(x, 13, k=1, act="RELU6")
    d1 = b.dw(e, k=3, act="RELU6")  # 13 x 5 x 13, SAME, stride 1: odd width (a last output alone)
    d2 = b.dw(d1, k=3, stride=2, act="RELU")  # stride 2 SAME on odd sizes: 7 x 3
    _per_tensor(b, len(b.ops) - 1)
    d3 = b.dw(b.conv(d2, 10, k=1), k=3, padding="VALID")  # VALID: 5 x 1, 10 channels, one column
    b.ops[-1] = dataclasses.replace(b.ops[-1], inputs=(*b.ops[-1].inputs[:2], -1))  # no bias
    d4 = b.dw(b.pad(d3, 1, 0, 2, 2), k=3, padding="VALID", act="RELU6")  # folds: explicit asymmetric, 4 x 3
    d5 = b.dw(d4, k=3, stride=2, padding="VALID")  # VALID stride 2: 1 x 1 (one row, one column)
    big = b.dw(b.conv(d1, 7, k=1), k=3, act="RELU6")  # sums past 2^30: the exact requantisation
    bias = b.ops[-1].inputs[2]
    _replace_data(b, bias, [((1 << 30) + (1 << 28)) * (-1) ** k - 7 * k for k in range(7)], "<i4")
    wide = b.dw(b.conv(d2, 9, k=1), k=3, stride=2)  # 7 x 3 -> 4 x 2, 9 channels
    outs = [d5, big, wide]
    g, folded = fold_pads(b.graph(outs), harness=True)
    assert folded == 1
    dws = [i for i, op in enumerate(g.ops) if op.opcode == "DEPTHWISE_CONV_2D"]
    g = with_kernel(g, [i for i, op in enumerate(g.ops) if op.opcode == "CONV_2D"], kernel_name())
    g = with_kernel(g, dws, kernel_name(DW3))
    g = with_kernel(g, [dws[0]], kernel_name(DW3, OVERLAP))  # in place: rows through a ring
    return g, model_to_bytes(to_model(g, read_model(b.model_bytes(outs))))


def test_what_the_dw3_kernel_takes():
    b = CnnBuilder(seed=2, spread=True)
    x = b.input((1, 8, 8, 8))
    plain = b.dw(x, k=3)
    five = b.dw(plain, k=5)
    dilated = b.dw(five, k=3, dilation=2)
    conv = b.conv(dilated, 8, k=3)
    s3 = b.dw(conv, k=3, stride=3)
    g = b.graph([s3])
    assert [can_run_variant(g, i, DW3) for i in range(5)] == [True, False, False, False, False]
    with pytest.raises(ValueError):
        with_kernel(g, [1], kernel_name(DW3))
    # the buffer's bound: kws's 25 x 5 maps fit (transposed: 7 rows of 26), a 26 x 11 map does not
    assert depthwise3x3.buffer_shape(1, 1, 5, 25, 1, 25) == (7, 26, 26, 186)
    assert depthwise3x3.buffer_shape(2, 2, 3, 3, 0, 6) == (7, 8, 8, 58)  # 6 x 6 -> 3 x 3 at stride 2, SAME
    b = CnnBuilder(seed=3, spread=True)
    y = b.dw(b.dw(b.input((1, 24, 7, 4)), k=3), k=3, stride=2)
    big = b.dw(b.dw(b.input((1, 26, 11, 4)), k=3), k=3, stride=2)
    g = b.graph([y, big])
    assert [can_run_variant(g, i, DW3) for i in range(4)] == [True, True, False, False]


def test_the_dw3_kernel_asks_for_its_buffer_in_the_arena_and_its_flag_survives_the_file():
    """Its sums and int16 buffer are arena scratch (harness Depthwise3x3BufferBytes), as large as
    the op's plan needs, in both kernel sets; overlapped, the ring follows it 16-aligned. The
    QEMU runs below check the arena these predict against the board's."""
    g, data = _dws()
    by_shape = {}
    for sem in (get_semantics("tflm-cmsis-nn"), get_semantics("tflm")):
        plain = [i for i, op in enumerate(g.ops) if kernels.flags(op) == {DW3}]
        assert len(plain) == 6
        for i in plain:
            own = depthwise3x3.scratch(g, g.ops[i])
            assert 0 < own <= 4 * (depthwise3x3.MAX_RUN + 2) + 2 * depthwise3x3.MAX_BUFFER
            assert scratch_requests(g, i, sem) == [own]
            by_shape[tuple(g.tensors[g.ops[i].outputs[0]].shape)] = own
        ring = next(i for i, op in enumerate(g.ops) if OVERLAP in kernels.flags(op))
        y = g.tensors[g.ops[ring].outputs[0]].shape
        own = depthwise3x3.scratch(g, g.ops[ring])
        assert scratch_requests(g, ring, sem) == [-(-own // 16) * 16 + overlap.ring_rows(g, g.ops[ring]) * y[2] * y[3]]
    # 13 x 5 x 7, SAME, stride 1, taller than wide: transposed, 7 rows of 14 int16s (run 14), so 4
    # buffer rows of sums a pass, 3 x 14 + 13 = 55 -> 56 sums (224 bytes); the buffer reads 4 x 14 +
    # 12 + 2 x 14 + 6 = 102 int16s (204 bytes)
    assert by_shape[(1, 13, 5, 7)] == 224 + 204
    back = from_model(read_model(data))
    assert [op.kernel for op in back.ops] == [op.kernel for op in g.ops]


def test_the_model_on_the_harness_takes_dw3_where_it_won_and_the_cost_model_agrees():
    """fit's on_harness: narrow 3x3 layers at stride 1 on dw3 (before "fast", which also runs
    them), at stride 2 not (CMSIS-NN's was faster on most maps), a map too wide for the buffer on
    "fast"; the fitted cost rows (from layers of 40 to 256 channels) price dw3 below "fast" where it
    took the layer."""
    from tpu_pipeline.toolchain.cost.mcu import estimate_mcu

    b = CnnBuilder(seed=4, spread=True)
    wide = b.dw(b.input((1, 20, 20, 16)), k=3)  # 20 x 20: no buffer fits
    narrow = b.dw(b.dw(b.input((1, 25, 5, 64)), k=3, stride=2), k=3)  # kws's maps: 25 x 5 -> 13 x 3 -> 13 x 3
    g, _ = on_harness(b.graph([wide, narrow]))
    assert [op.kernel for op in g.ops] == ["tpup+fast", "tpup", "tpup+dw3"]
    board = load_device("qemu-mps2-an386")
    dw3 = [i for i, op in enumerate(g.ops) if DW3 in kernels.flags(op)]
    assert estimate_mcu(g, board).instructions < estimate_mcu(with_kernel(g, dw3, kernel_name(FAST)),
                                                              board).instructions


def test_on_small_maps_fit_leaves_3x3_layers_on_cmsis_nn_where_qemu_measured_it_faster():
    """3 x 3 maps at stride 1: CMSIS-NN's 3x3 kernel beat both dw3 and "fast" in QEMU
    (docs/bench/harness_kernels.md), so on_harness keeps it there, and the cost rows (dw3's
    per-channel set-up) price it below both; from 4 x 4 (a tie) dw3, from 5 x 5 priced below too."""
    from tpu_pipeline.toolchain.cost.mcu import estimate_mcu

    b = CnnBuilder(seed=12, spread=True)
    tiny = b.dw(b.input((1, 3, 3, 256)), k=3, act="RELU6")
    small = b.dw(b.input((1, 5, 5, 96)), k=3, act="RELU6")
    g, _ = on_harness(b.graph([tiny, small]))
    assert [op.kernel for op in g.ops] == ["tpup", "tpup+dw3"]
    board = load_device("qemu-mps2-an386")

    def priced(i, *flags):
        one = with_kernel(g, [i], kernel_name(*flags))
        return estimate_mcu(one, board).instructions
    assert priced(0) < min(priced(0, DW3), priced(0, FAST))
    assert priced(1, DW3) < min(priced(1), priced(1, FAST))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return model_for_qemu(tmp_path_factory, "dw3", _dws()[1])


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_the_dw3_kernel_is_bit_identical_in_qemu(model, kernels_set):
    qemu_run_as_planned(model, BOARD, kernels_set, iterations=3, seed=9)


@needs_arm
@needs_qemu
@needs_mlperf("kws_ref_model")
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_mlperf_kws_on_the_dw3_kernel_is_bit_identical_in_qemu(tmp_path, kernels_set):
    g, src = mlperf_on_harness("kws_ref_model")
    assert sum(DW3 in kernels.flags(op) for op in g.ops) == 4
    graph_in_qemu(tmp_path, g, src, BOARD, kernels_set, iterations=2, seed=4)


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
@pytest.mark.parametrize("ring", [False, True])
def test_the_dw3_buffer_is_counted_in_the_arena_in_qemu(tmp_path, kernels_set, ring):
    """One dw3 op, whole or through a ring: its scratch is at the arena's peak (input, output or
    ring, and the buffer), so the arena predicted with the modelled buffer must equal the board's."""
    b = CnnBuilder(seed=83, spread=True)
    y = b.dw(b.input((1, 14, 6, 20)), k=3, act="RELU6")  # taller than wide: the transposed buffer
    g = with_kernel(b.graph([y]), [0], kernel_name(DW3, *((OVERLAP,) if ring else ())))
    assert depthwise3x3.scratch(g, g.ops[0]) > 0
    path = tmp_path / "one.tflite"
    path.write_bytes(written(g, b.model_bytes([y])))
    qemu_run_as_planned(path, BOARD, kernels_set, iterations=2, seed=6)
