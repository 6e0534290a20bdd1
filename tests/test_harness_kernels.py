"""The harness's convolutions (tpu_pipeline.toolchain.ir.kernels) on the host: they round-trip
through the file as custom codes, the host runtimes' builtin view computes what the model
computes, PAD folding is an identity, and the memory model gives overlapped ops one buffer.
tests/test_harness_firmware.py runs them on the emulated board."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

from helpers.cnn_builder import CnnBuilder
from tpu_pipeline.toolchain.device import CMSIS_NN, REFERENCE
from tpu_pipeline.toolchain.errors import ModelError, UsageError
from tpu_pipeline.toolchain.execute.compare import verify_models
from tpu_pipeline.toolchain.ir import kernels
from tpu_pipeline.toolchain.ir.convert import BUILTIN_CODES, builtin_view_bytes, from_model, standalone_model, to_model
from tpu_pipeline.toolchain.ir.kernels import (DIRECT, OVERLAP, can_run_direct, can_run_harness, kernel_choices,
                                               kernel_name, with_kernel)
from tpu_pipeline.toolchain.ir.overlap import overlap_schedule, ring_rows, ring_rows_for
from tpu_pipeline.toolchain.ir.requant import quantize_multiplier
from tpu_pipeline.toolchain.memory.lifetimes import lifetimes
from tpu_pipeline.toolchain.memory.planners import plan_arena
from tpu_pipeline.toolchain.memory.scratch import scratch_requests
from tpu_pipeline.toolchain.memory.semantics import get_semantics
from tpu_pipeline.toolchain.memory.tflm_target import target_tail
from tpu_pipeline.toolchain.rewrite.fold_pad import fold_pads
from tpu_pipeline.toolchain.schedule.model import build_model
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model


def _cnn(seed=1, dtype="int8"):
    b = CnnBuilder(seed=seed, dtype=dtype, spread=True)
    x = b.input((1, 12, 10, 3))
    y = b.conv(x, 8, k=3, stride=2, padding="SAME", act="RELU6")
    z = b.conv(y, 8, k=1)
    w = b.conv(b.dw(z, k=3), 6, k=3, padding="VALID", dilation=2, act="RELU")
    return b, [w]


def _convs(graph, opcode="CONV_2D"):
    return [i for i, op in enumerate(graph.ops) if op.opcode == opcode]


def _ops(graph):
    return [(op.opcode, op.inputs, op.outputs, op.version, op.kernel, op.options) for op in graph.ops]


def _written(graph, template: bytes) -> bytes:
    return model_to_bytes(to_model(graph, read_model(template)))


def test_builtin_codes_are_the_schemas():
    for name, code in kernels.BUILTIN_CODE.items():
        assert BUILTIN_CODES[name] == code


def test_quantize_multiplier_matches_tflite_on_known_values():
    assert quantize_multiplier(0.5) == (1 << 30, 0)
    assert quantize_multiplier(1.0) == (1 << 30, 1)
    assert quantize_multiplier(0.0) == (0, 0)
    assert quantize_multiplier(2.0 ** -40) == (0, 0)  # shifts under -31 flush to zero
    # rounds half away from zero: q * 2^31 = 2^30 + 0.5 -> 2^30 + 1
    q = (2 ** 30 + 0.5) / 2 ** 31
    assert quantize_multiplier(q) == (2 ** 30 + 1, 0)
    # just below 1 rounds up to 2^31, which becomes 2^30 with one more shift
    assert quantize_multiplier(1 - 2 ** -40) == (1 << 30, 1)


def test_harness_ops_round_trip_through_the_file_with_every_flag():
    b, outs = _cnn()
    g = b.graph(outs)
    src = b.model_bytes(outs)
    convs = _convs(g)
    chosen = with_kernel(g, convs[:1], kernel_name(DIRECT))
    chosen = with_kernel(chosen, convs[1:2], kernel_name())
    chosen = with_kernel(chosen, _convs(chosen, "DEPTHWISE_CONV_2D"), kernel_name(OVERLAP))
    data = _written(chosen, src)
    back = from_model(read_model(data))
    assert _ops(back) == _ops(chosen)  # options, version, operands and kernel survive
    codes = {bytes(c.customCode or b"").decode() for c in read_model(data).operatorCodes}
    assert {"TPUP_CONV_2D", "TPUP_DEPTHWISE_CONV_2D"} <= codes
    # the requantization input holds what TFLite Micro computes
    assert all(kernels.requant_tensor_ok(back, back.ops[i]) for i in kernel_choices(back))


def test_the_builtin_view_computes_what_the_model_computes_in_both_runtimes():
    b, outs = _cnn(seed=4)
    g = b.graph(outs)
    src = b.model_bytes(outs)
    harness = with_kernel(g, _convs(g), kernel_name())
    harness = with_kernel(harness, _convs(harness, "DEPTHWISE_CONV_2D"), kernel_name())
    data = _written(harness, src)
    assert builtin_view_bytes(data) != data and builtin_view_bytes(src) == src
    view = from_model(read_model(builtin_view_bytes(data)))
    assert _ops(view) == _ops(g) and len(view.tensors) == len(g.tensors)  # requantization inputs dropped
    results = verify_models(src, data, runs=2)
    assert {r.runtime for r in results} == {"litert", "tflm"}
    assert all(o.ok and o.max_abs == 0 for r in results for o in r.outputs)


def test_only_int8_convolutions_run_on_the_harness():
    b, outs = _cnn(dtype="float32")
    g = b.graph(outs)
    assert not any(can_run_harness(g, i) for i in range(len(g.ops)))
    b, outs = _cnn()
    g = b.graph(outs)
    dw = _convs(g, "DEPTHWISE_CONV_2D")[0]
    assert can_run_harness(g, dw) and can_run_direct(g, dw) and all(can_run_direct(g, i) for i in _convs(g))
    b, outs = _cnn(dtype="float32")
    g = b.graph(outs)
    with pytest.raises(ValueError):
        with_kernel(g, [_convs(g)[0]], kernel_name(DIRECT))


@pytest.mark.parametrize("words", [[], [2] + [1] * 15, [1, 1, 0x40] + [1] * 13, [1, 1, 0, -1] + [1] * 12])
def test_malformed_harness_options_are_a_model_error(words):
    b, outs = _cnn()
    g = b.graph(outs)
    model = to_model(with_kernel(g, [_convs(g)[0]], kernel_name()), standalone_model(g))
    model.subgraphs[0].operators[0].customOptions = list(struct.pack(f"<{len(words)}i", *words))
    with pytest.raises(ModelError, match="TPUP_CONV_2D"):
        from_model(read_model(model_to_bytes(model)))


def test_harness_ops_keep_nothing_in_the_tail():
    b, outs = _cnn()
    g = b.graph(outs)
    h = with_kernel(g, _convs(g), kernel_name())
    for kset in (REFERENCE, CMSIS_NN):
        before, after = target_tail(g, kset), target_tail(h, kset)
        names = [what for what, _, _ in after.allocations]
        assert not any(f"op {i} " in what for i in _convs(g) for what in names if "ScratchBuffer" not in what)
        channels = sum(g.tensors[g.ops[i].inputs[1]].shape[0] for i in _convs(g))
        assert after.bytes < before.bytes - 8 * channels  # the per-channel arrays left for flash


def test_direct_kernel_asks_for_no_scratch_where_cmsis_nn_does():
    b, outs = _cnn()
    g = b.graph(outs)
    first = _convs(g)[0]  # 3x3 over 3 channels: CMSIS-NN asks for an im2col buffer
    sem = get_semantics("tflm-cmsis-nn")
    assert scratch_requests(g, first, sem) == [2 * 28 * 2]
    assert scratch_requests(with_kernel(g, [first], kernel_name()), first, sem) == [2 * 28 * 2]
    assert scratch_requests(with_kernel(g, [first], kernel_name(DIRECT)), first, sem) == []


# ---- overlapped execution --------------------------------------------------------------------------
def _block(seed=3, c_in=8, expand=24, stride=1):
    """A MobileNetV2-style block: 1x1 expand, 3x3 depthwise, 1x1 project."""
    b = CnnBuilder(seed=seed, spread=True)
    x = b.input((1, 10, 12, c_in))
    s = b.conv(x, c_in, k=3, act="RELU6")  # the block's input must be written by an op to overlap
    e = b.conv(s, expand, k=1, act="RELU6")
    d = b.dw(e, k=3, stride=stride, act="RELU6")
    p = b.conv(d, c_in, k=1)
    return b, [p]


@pytest.mark.parametrize("stride", [1, 2])
def test_ring_rows_of_the_block_layouts(stride):
    b, outs = _block(stride=stride)
    g = with_kernel(b.graph(outs), range(1, 4), kernel_name(OVERLAP))
    expand, dw, project = 1, 2, 3
    assert ring_rows(g, g.ops[expand]) == 1  # input at the end of the output: each row free at once
    assert ring_rows(g, g.ops[dw]) == (2 if stride == 1 else 1)  # in place: row r waits for row r+1
    assert ring_rows(g, g.ops[project]) == 1
    # with no overlap at all, every row is written at once
    assert ring_rows(g, g.ops[dw], 0, 10 ** 6) == 1


def _simulate_overlap(in_rows, row_in, out_rows, row_out, pad_top, stride, span, x_at, y_at, runs=True):
    """Run `overlap_schedule` on a byte map of one buffer: every read finds its input rows
    unwritten, a run's writes spare what its own rows and all later ones read, the ring never
    holds more than `ring_rows_for`, and every output row lands once. Returns the schedule."""
    size = max(x_at + in_rows * row_in, y_at + out_rows * row_out)
    owner = np.full(size, -1)  # input row each byte still holds (-1: none, or written over)
    for j in range(in_rows):
        owner[x_at + j * row_in:x_at + (j + 1) * row_in] = j
    def reads(r):  # the input rows output row r's window reads
        return range(max(0, r * stride - pad_top), min(in_rows, r * stride - pad_top + span))
    def intact(rows):
        for r in rows:
            for j in reads(r):
                assert (owner[x_at + j * row_in:x_at + (j + 1) * row_in] == j).all(), (r, j)
    steps = overlap_schedule(in_rows, row_in, out_rows, row_out, pad_top, stride, span, x_at, y_at, runs)
    todo, held, written = set(range(out_rows)), set(), []
    ring = ring_rows_for(in_rows, row_in, out_rows, row_out, pad_top, stride, span, x_at, y_at)
    for kind, *rows in steps:
        if kind == "run":
            run = range(*rows)
            intact(run)
            for r in run:
                owner[y_at + r * row_out:y_at + (r + 1) * row_out] = -1
            intact(run)  # (the call may write its first rows before reading its last)
            intact(todo)
            todo -= set(run)
            written += list(run)
        elif kind == "ring":
            intact(rows)
            todo.discard(rows[0])
            held.add(rows[0])
            assert len(held) <= ring
        else:
            held.remove(rows[0])
            owner[y_at + rows[0] * row_out:y_at + (rows[0] + 1) * row_out] = -1
            intact(todo)
            written.append(rows[0])
    assert sorted(written) == list(range(out_rows)) and not held
    return steps


def _calls(*args) -> tuple[int, int]:
    """(kernel calls, rows through the ring) of `overlap_schedule`."""
    steps = overlap_schedule(*args)
    return sum(1 for s in steps if s[0] != "flush"), sum(1 for s in steps if s[0] == "ring")


def test_overlapped_calls_run_rows_straight_out_where_no_input_is_still_read():
    # a stride-2 depthwise in place and a 1x1 expansion over its input: a few calls, not one per row
    down = _simulate_overlap(40, 40 * 16, 20, 20 * 16, 1, 2, 3, 0, 0)
    assert sum(1 for s in down if s[0] != "flush") <= 5 and _calls(40, 640, 20, 320, 1, 2, 3, 0, 0)[1] <= 1
    up = _simulate_overlap(20, 20 * 16, 20, 20 * 48, 0, 1, 1, 0, 0)
    assert sum(1 for s in up if s[0] != "flush") <= 5 and up[0] == ("run", 7, 20)
    # in place at stride 1 every row still waits for the next: a call per row through the ring
    assert _calls(20, 20 * 48, 20, 20 * 48, 1, 1, 3, 0, 0) == (20, 20)
    assert _calls(40, 640, 20, 320, 1, 2, 3, 0, 0, False) == (20, 20)  # (dw3: a row per call)
    # dw3 reads a channel whole before writing it: laid exactly over its input, one call
    assert _calls(20, 20 * 48, 20, 20 * 48, 1, 1, 3, 0, 0, False, True) == (1, 0)
    assert _calls(40, 640, 20, 320, 1, 2, 3, 0, 0, False, True) == (20, 20)
    assert _calls(40, 640, 20, 320, 1, 2, 3, 0, 10 ** 6) == (1, 0)  # (not overlapped)


def test_overlapped_schedules_never_overwrite_input_still_read():
    rng = np.random.default_rng(5)
    for _ in range(400):
        in_rows, stride, span = int(rng.integers(1, 14)), int(rng.integers(1, 3)), int(rng.integers(1, 4))
        pad_top = int(rng.integers(0, span))
        out_rows = max(1, (in_rows + pad_top - span) // stride + 1)
        row_in, row_out = int(rng.integers(1, 9)) * 4, int(rng.integers(1, 13)) * 4
        shift = int(rng.integers(-2, 3)) * 4 if rng.random() < 0.3 else 0
        x_at, y_at = (0, max(0, shift)) if shift >= 0 else (-shift, 0)
        if y_at + out_rows * row_out > x_at + in_rows * row_in and y_at > x_at:
            continue  # (a larger output shares the input's start or ends before it: the layouts that occur)
        for runs in (True, False):
            _simulate_overlap(in_rows, row_in, out_rows, row_out, pad_top, stride, span, x_at, y_at, runs)


def test_overlapped_chain_is_one_rigid_group_in_lifetimes_the_scheduler_and_the_plan():
    b, outs = _block()
    plain = b.graph(outs)
    g = with_kernel(plain, range(1, 4), kernel_name(OVERLAP))
    lt = lifetimes(g, semantics="tflm")
    pairs = [buf for buf in lt.buffers if buf.members]
    chain = [g.ops[i].outputs[0] for i in range(4)]
    assert [buf.op for buf in pairs] == [1, 2, 3] and {buf.group for buf in pairs} == {0}
    assert all(buf.group == 0 for buf in lt.buffers if buf.tensor in chain)
    # at each overlapped op's step, its input and output take their shared extent, no more
    size = {t: -(-g.tensors[t].nbytes // 16) * 16 for t in chain}
    assert [buf.size for buf in pairs] == [max(size[a], size[c]) for a, c in zip(chain, chain[1:])]
    assert lt.peak < lifetimes(plain, semantics="tflm").peak
    assert build_model(g, "tflm").peak(list(range(len(g.ops)))) == lt.peak
    # a plan keeps the group rigid: every tensor of the chain sits where its pairs say
    plan = plan_arena(lt, "auto", 2.0)
    assert plan.size == lt.peak
    runtime, offsets, _ = lt.per_tensor(list(plan.offsets))
    at = {buf.tensor: o for buf, o in zip(runtime.buffers, offsets) if buf.tensor is not None}
    for buf, o in zip(lt.buffers, plan.offsets):
        for m in buf.members:
            assert at[m.tensor] == o + m.offset
    with pytest.raises(UsageError, match="overlapped ops"):
        plan_arena(lt, "tflm", 1.0)


def test_an_input_read_twice_is_not_overlapped():
    b = CnnBuilder(seed=5, spread=True)
    x = b.input((1, 8, 8, 8))
    s = b.conv(x, 8, k=3)
    d = b.dw(s, k=3)
    out = b.add(d, s)  # s is read by the add too: the depthwise cannot write over it
    g = with_kernel(b.graph([out]), [1], kernel_name(OVERLAP))
    assert not any(buf.members or buf.group >= 0 for buf in lifetimes(g, semantics="tflm").buffers)


# ---- PAD folding ------------------------------------------------------------------------------------
def _padded(seed=6, sym=True):
    b = CnnBuilder(seed=seed, spread=True)
    x = b.input((1, 12, 12, 4))
    s = b.conv(x, 8, k=1, act="RELU6")
    p = b.pad(s, 1, 1, 1, 1) if sym else b.pad(s, 0, 1, 0, 1)
    y = b.dw(p, k=3, stride=2, padding="VALID", act="RELU6")  # PyTorch style: not SAME's split when symmetric
    z = b.conv(b.pad(y, 1, 1, 1, 1), 6, k=3, padding="VALID")  # stride 1: equal to SAME
    return b, [z]


@pytest.mark.parametrize("sym", [True, False])
def test_pad_folding_is_an_identity_in_both_runtimes(sym):
    b, outs = _padded(sym=sym)
    g = b.graph(outs)
    src = b.model_bytes(outs)
    builtin, n = fold_pads(g, harness=False)
    assert n == (1 if sym else 2)  # the stride-2 symmetric pad needs the harness; SAME-equal ones do not
    assert not kernel_choices(builtin) and sum(op.opcode == "PAD" for op in builtin.ops) == 2 - n
    folded, n = fold_pads(g, harness=True)
    assert n == 2 and not any(op.opcode == "PAD" for op in folded.ops)
    explicit = [op for op in folded.ops if op.options is not None and getattr(op.options, "padding", "") == "EXPLICIT"]
    assert len(explicit) == (1 if sym else 0) and all(kernels.is_harness(op) for op in explicit)
    for graph in (builtin, folded):
        results = verify_models(src, _written(graph, src), runs=2)
        assert all(o.ok and o.max_abs == 0 for r in results for o in r.outputs), [r.to_json() for r in results]
    assert lifetimes(folded).peak < lifetimes(g).peak


def test_a_pad_with_another_value_is_not_folded():
    b, outs = _padded()
    g = b.graph(outs)
    pad = next(i for i, op in enumerate(g.ops) if op.opcode == "PAD")
    out_t = g.tensors[g.ops[pad].outputs[0]]
    other = dataclasses.replace(out_t, quant=dataclasses.replace(out_t.quant, zero_point=(out_t.quant.zero_point[0] + 1,)))
    changed = dataclasses.replace(g, tensors=tuple(other if t.index == out_t.index else t for t in g.tensors))
    assert fold_pads(changed, harness=True)[1] == 1  # the other PAD still folds
    assert np.asarray([op.opcode for op in fold_pads(changed, harness=True)[0].ops]).tolist().count("PAD") == 1
