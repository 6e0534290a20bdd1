"""`fit`'s kernel variants (tpu_pipeline.toolchain.fit.variants.kernel_twins): at a variant's peak, the op there
overlaps its output with its input, then int8 convolutions move to the harness's direct kernel (no
im2col scratch, slower) where their scratch is part of the peak."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from helpers.cnn_builder import CnnBuilder
from tpu_pipeline.toolchain.device import CMSIS_NN, REFERENCE, load_device
from tpu_pipeline.toolchain.fit import fit_model
from tpu_pipeline.toolchain.fit.variants import as_is_variants, kernel_twins, on_harness
from tpu_pipeline.toolchain.fit.spans import split_spans
from tpu_pipeline.toolchain.loader import load
from tpu_pipeline.toolchain.ir import kernel_variants
from tpu_pipeline.toolchain.ir.kernels import DIRECT, OVERLAP, flags, kernel_choices
from tpu_pipeline.toolchain.memory.lifetimes import lifetimes
from tpu_pipeline.toolchain.memory.semantics import tflm_semantics
from tpu_pipeline.toolchain.schedule.api import schedule

QEMU = load_device("qemu-mps2-an386")


def _wide_conv(tmp_path: Path) -> Path:
    """One 3x3 convolution over 64 channels between a graph input and output: its 2,304-byte im2col
    buffer (CMSIS-NN) sits on top of input + output, and no patch grid can go below input + output."""
    b = CnnBuilder(seed=5)
    x = b.input((1, 8, 8, 64))
    y = b.conv(x, 64, k=3, act="RELU")
    path = tmp_path / "wide.tflite"
    path.write_bytes(b.model_bytes([y]))
    return path


@pytest.fixture(autouse=True)
def without_window(monkeypatch):
    """These tests trade CMSIS-NN's im2col buffer against time: the "window" kernel variant, which
    reads windows in place (no buffer), would take their convolutions (test_the_window_kernel_needs_no_im2col)."""
    # it stays registered (its C is linked: tpup_conv.cc dispatches to it) but applies nowhere
    monkeypatch.setattr(kernel_variants, "REGISTRY", tuple(
        dataclasses.replace(v, applies=lambda graph, i: False) if v.flag == "window" else v
        for v in kernel_variants.REGISTRY))


def test_the_window_kernel_needs_no_im2col(tmp_path, monkeypatch):
    monkeypatch.undo()  # (the real registry)
    _, g = load(_wide_conv(tmp_path))
    g, _ = on_harness(g)
    assert _flags(g) == {"window"}
    (plain,) = as_is_variants(g, split_spans(g), QEMU, tflm_semantics(CMSIS_NN))
    assert plain.peak == 4096 + 4096  # input + output: no im2col buffer


def _flags(graph) -> set[str]:
    return {f for op in graph.ops for f in flags(op)}


def test_kernel_twins_trade_latency_for_the_bytes_at_the_peak(tmp_path):
    _, g = load(_wide_conv(tmp_path))
    g, _ = on_harness(g)
    spans = split_spans(g)
    (plain,) = as_is_variants(g, spans, QEMU, tflm_semantics(CMSIS_NN))
    assert plain.peak == 4096 + 4096 + 2304  # input + output + CMSIS-NN's im2col
    overlapped, direct = kernel_twins(plain, QEMU, tflm_semantics(CMSIS_NN))
    # in place: the output over the input, a ring of two rows (8 x 64 bytes each) besides the im2col
    assert overlapped.peak == 4096 + 2304 + 2 * 512 and _flags(overlapped.graph) == {OVERLAP}
    assert direct.peak == 4096 + 2 * 512 == direct.lower_bound and _flags(direct.graph) == {OVERLAP, DIRECT}
    assert plain.latency_s < overlapped.latency_s < direct.latency_s
    # the reference kernels ask for no im2col buffer: overlapping is the only trade
    (ref,) = as_is_variants(g, spans, QEMU, tflm_semantics(REFERENCE))
    assert ref.peak == 8192 and [t.peak for t in kernel_twins(ref, QEMU, tflm_semantics(REFERENCE))] == [4096 + 1024]


def test_fit_picks_the_slower_kernels_only_when_the_budget_needs_them(tmp_path):
    src = _wide_conv(tmp_path)
    assert schedule(load(src)[1], semantics="tflm-cmsis-nn", time_limit=5).peak == 10496
    fitted = fit_model(src, budget=6000, kernels=CMSIS_NN, time_limit=20)
    r = fitted.result
    assert r.fits and r.head == 5120
    assert _flags(r.graph) == {OVERLAP, DIRECT}
    assert b"TPUP_CONV_2D" in fitted.data  # the written model names the kernel per op
    # checked bit-identical in LiteRT and TFLite Micro (their builtin view) by fit_model itself
    assert {v.runtime for v in fitted.verification} == {"litert", "tflm"}
    assert all(o.ok for v in fitted.verification for o in v.outputs)
    # a budget the overlap alone meets keeps CMSIS-NN's faster convolution
    r = fit_model(src, budget=8000, kernels=CMSIS_NN, time_limit=20).result
    assert r.fits and r.head == 7424 and _flags(r.graph) == {OVERLAP}
    # without a budget that needs either, the fastest stays
    fast = fit_model(src, budget=20000, kernels=CMSIS_NN, time_limit=20)
    assert fast.result.fits and not _flags(fast.result.graph)


def test_fit_counts_the_kernel_sets_scratch(tmp_path):
    """The arena fit promises is the one the kernels it runs with need: under CMSIS-NN the im2col
    buffer is part of it, under the reference kernels it is not."""
    src = _wide_conv(tmp_path)
    for kernels, head in ((CMSIS_NN, 10496), (REFERENCE, 8192)):
        r = fit_model(src, budget=20000, kernels=kernels, time_limit=20).result
        assert r.fits and r.head == head and not _flags(r.graph)


def test_fitted_kernel_variants_run_on_the_emulated_cortex_m_as_predicted(tmp_path):
    """The fitted model, its convolution overlapped in place on the direct kernel, in the CMSIS-NN
    firmware on QEMU: outputs bit-identical to the host's TFLite Micro, and the firmware's head is
    fit's prediction."""
    from helpers.firmware import run_fitted_on_qemu

    fitted = fit_model(_wide_conv(tmp_path), budget=6000, kernels=CMSIS_NN, time_limit=20)
    assert _flags(fitted.result.graph) == {OVERLAP, DIRECT}
    r = run_fitted_on_qemu(tmp_path, fitted, "cmsis-nn")
    assert r.head_bytes == fitted.result.head == 5120


def test_patch_estimates_are_floors_of_the_measured_variants_under_both_kernel_sets(tmp_path):
    """The lazy search is only optimal if every stage bounds the next from below: the tile-geometry
    estimate (scratch included) never exceeds the built variant's peak or latency."""
    from helpers.models import stem_heavy_cnn

    from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
    from tpu_pipeline.toolchain.fit.variants import patch_candidates, upgrade

    _, g = load(stem_heavy_cnn(tmp_path, seed=23))
    spans = split_spans(g)
    for kernels in (CMSIS_NN, REFERENCE):
        sem = tflm_semantics(kernels)
        as_is = as_is_variants(g, spans, QEMU, sem)
        secs = {o.index: o.seconds for o in estimate_mcu(g, QEMU, kernels).ops}
        cands = patch_candidates(g, spans, as_is)
        assert len(cands) >= 4
        for v in cands:
            est = upgrade(g, spans, v, secs, QEMU, sem)
            built = upgrade(g, spans, est, secs, QEMU, sem)
            assert v.peak <= est.peak <= built.peak, (kernels, v.label)
            assert est.latency_s <= built.latency_s * (1 + 1e-9), (kernels, v.label)


def test_harness_patch_estimates_are_floors_of_peak_tail_and_latency(tmp_path):
    """The selection estimates every candidate and builds only the ones it picks, so an estimate
    above its built variant could hide the best selection. On the harness form, for copies,
    square stages and streamed stripes under both kernel sets: no estimate exceeds the built
    variant's peak, tail or latency; and the stripes' peaks are estimated to their buffers'
    alignment (their stream buffers hold a few rows of every layer: left out, the floor is far
    below)."""
    from helpers.models import stem_heavy_cnn

    from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
    from tpu_pipeline.toolchain.fit.variants import patch_candidates, upgrade

    _, g = load(stem_heavy_cnn(tmp_path, seed=23))
    g = on_harness(g)[0]
    spans = split_spans(g)
    for kernels in (CMSIS_NN, REFERENCE):
        sem = tflm_semantics(kernels)
        as_is = as_is_variants(g, spans, QEMU, sem)
        secs = {o.index: o.seconds for o in estimate_mcu(g, QEMU, kernels).ops}
        cands = patch_candidates(g, spans, as_is, harness=True)
        forms, regions, stripes = set(), {}, 0
        for v in cands:
            est = upgrade(g, spans, v, secs, QEMU, sem, regions)
            built = est and upgrade(g, spans, est, secs, QEMU, sem)
            if built is None:
                continue
            forms.add((v.form, v.grid[1] == 1, v.recompute))
            assert v.peak <= est.peak <= built.peak, (kernels, v.label, est.peak, built.peak)
            assert v.tail <= est.tail <= built.tail, (kernels, v.label, est.tail, built.tail)
            assert est.latency_s <= built.latency_s * (1 + 1e-9), (kernels, v.label)
            if v.form == "stage" and v.grid[1] == 1:  # within the buffers' 4-byte alignment
                assert built.peak - est.peak <= 64, (kernels, v.label, est.peak, built.peak)
                stripes += 1
        assert {("copies", False, False), ("stage", False, False), ("stage", True, False)} <= forms
        assert ("stage", False, True) in forms or not any(v.recompute for v in cands)
        assert stripes >= 10


def test_axis_needs_agree_with_region_needs_on_every_grid(tmp_path):
    """The estimate reads every tile's needed rows and columns off one vectorised walk per axis
    (ir.geometry.AxisNeeds); the builds walk each tile (region_needs). They must agree box for
    box, and on which grids are too fine."""
    from helpers.models import stem_heavy_cnn

    from tpu_pipeline.toolchain.ir.geometry import AxisNeeds, region_needs, splits
    from tpu_pipeline.toolchain.rewrite.patch import patch_regions

    _, g = load(stem_heavy_cnn(tmp_path, seed=23))
    by_name = {t.name: t.index for t in g.tensors}
    first_out = {g.tensors[op.outputs[0]].name: op for op in g.ops}
    checked = 0
    for r in patch_regions(g):
        ops, tout = [first_out[n] for n in r.ops], by_name[r.output]
        oh, ow = g.tensors[tout].shape[1:3]
        rows, cols = AxisNeeds(g, ops, tout, 0), AxisNeeds(g, ops, tout, 1)
        for p in range(1, oh + 2):
            runs = splits(oh, min(p, oh))
            got = rows.runs([a for a, _ in runs], [b for _, b in runs])
            want = [region_needs(g, ops, tout, (a, b, 0, ow)) for a, b in runs]
            assert (got is None) == any(w is None for w in want), (r.output, p)
            if got is not None:
                for k, w in enumerate(want):
                    assert {t: (int(got[t][0][k]), int(got[t][1][k])) for t in got} == \
                        {t: (box[0], box[1]) for t, box in w.items()}
                checked += 1
        assert cols.runs([0], [ow]) is not None
    assert checked >= 10


def test_export_mcu_keeps_the_plan_fit_made_for_cmsis_nn(tmp_path):
    """fit plans the arena for the kernels it is asked for; export-mcu plans its own for the
    reference kernels and keeps the model's plan where that is no larger. Judged by the reference
    head alone, fit's CMSIS-NN plan (12,048 B under both kernel sets here) lost to a plan 112 B
    smaller under the reference kernels and 6,336 B larger under CMSIS-NN's, and the board got the
    larger arena. The exported plan must give the CMSIS-NN head fit promised."""
    from helpers.models import stem_heavy_cnn

    from tpu_pipeline.toolchain.export_mcu import export_mcu
    from tpu_pipeline.toolchain.ir import from_model
    from tpu_pipeline.toolchain.memory.tflm_target import target_head
    from tpu_pipeline.toolchain.tflite import read_model
    from tpu_pipeline.toolchain.tflite.metadata import read_offline_plan

    src = stem_heavy_cnn(tmp_path, seed=17)
    optimum = schedule(load(src)[1], time_limit=10).peak
    fitted = fit_model(src, budget=optimum // 2, kernels=CMSIS_NN, time_limit=20)
    assert fitted.result.fits
    export_mcu(src, QEMU, tmp_path / "fw", model_data=fitted.data)
    exported = read_model((tmp_path / "fw" / "model.tflite").read_bytes())
    graph = from_model(exported)
    assert target_head(graph, CMSIS_NN, read_offline_plan(exported))[0] == fitted.result.head


@pytest.mark.parametrize("name, kept", [("pool_softmax_int8", False), ("chain_int8", True)])
def test_the_memory_objective_pays_no_tail_bytes_for_a_variant_constant(monkeypatch, name, kept):
    """packed (ir/kernel_variants/packed.py) reads its re-laid weights as a constant input 4: 16
    bytes of TFLite Micro's tail (an eval tensor and an input slot). Where bytes count, fit drops it
    (lean_twins): the smallest whole arena equals the one without the variant registered (it was
    16 B above on pool_softmax, kws, vww_96 and ResNet-8); where the real tail's alignment absorbs
    those bytes (chain_int8) the variant is kept (stages/unlean.py), faster at the same arena. The
    fastest point keeps the variant."""
    from tpu_pipeline.toolchain.ir import kernel_variants
    from tpu_pipeline.toolchain.ir.kernels import variant_of

    src = Path(__file__).parent / "fixtures" / f"{name}.tflite"

    def smallest():
        r = fit_model(src, objective="memory", time_limit=20, want_pareto=True).result
        assert r.frontier_complete
        return r

    def on_packed(ops) -> int:
        return sum(variant_of(op) is not None and variant_of(op).flag == "packed" for op in ops)

    with_packed = smallest()
    assert on_packed(op for v in with_packed.frontier[0].variants if v.graph is not None for op in v.graph.ops)
    assert bool(on_packed(with_packed.graph.ops)) == kept  # (before packed is unregistered: variant_of reads it)
    monkeypatch.setattr(kernel_variants, "REGISTRY", tuple(v for v in kernel_variants.REGISTRY if v.flag != "packed"))
    without = smallest()
    assert with_packed.head + with_packed.tail == without.head + without.tail
    if kept:
        assert with_packed.selection.latency_s < without.selection.latency_s


def test_a_kernel_variant_that_lowers_the_peak_costs_no_arena_and_no_speed(monkeypatch):
    """Issue 30: with the window variant registered (3x3 convolutions without CMSIS-NN's im2col
    buffer), chain_int8's smallest whole arena went 4,004 -> 4,052 B at twice the latency. Its last
    two layers as one stage save tail bytes (one op node), but were no longer offered once the
    window kernel brought their peak down to the stage's own floor (patch_candidates looked at the
    peak alone); and three lean twins then stood at that arena, which unlean swapped all or none
    (all together their 16 B each pass the real tail's alignment; one at a time they do not)."""
    from tpu_pipeline.toolchain.ir import kernel_variants

    monkeypatch.undo()  # (the real registry)
    src = Path(__file__).parent / "fixtures" / "chain_int8.tflite"

    def smallest():
        r = fit_model(src, objective="memory", time_limit=20, want_pareto=True).result
        assert r.frontier_complete
        return r

    with_window = smallest()
    # it stays registered (its C is linked: tpup_conv.cc dispatches to it) but applies nowhere
    monkeypatch.setattr(kernel_variants, "REGISTRY", tuple(
        dataclasses.replace(v, applies=lambda graph, i: False) if v.flag == "window" else v
        for v in kernel_variants.REGISTRY))
    without = smallest()
    assert with_window.head + with_window.tail <= without.head + without.tail
    assert with_window.selection.latency_s <= without.selection.latency_s


def test_a_dw3_op_at_the_peak_leaves_its_buffer_for_the_direct_kernel(tmp_path):
    """dw3's sums and int16 buffer are arena scratch: where they sit on the peak, the direct twin
    takes the op off dw3 (on dw3 the flag alone would keep the buffer) onto CMSIS-NN's generic
    depthwise kernel, which asks for none."""
    b = CnnBuilder(seed=9)
    y = b.dw(b.input((1, 12, 6, 32)), k=3, act="RELU6")
    path = tmp_path / "dw3.tflite"
    path.write_bytes(b.model_bytes([y]))
    _, g = load(path)
    g, _ = on_harness(g)
    assert _flags(g) == {"dw3"}
    (plain,) = as_is_variants(g, split_spans(g), QEMU, tflm_semantics(CMSIS_NN))
    own = kernel_variants.registered()["dw3"].scratch(g, g.ops[0])
    assert own > 0 and plain.peak == 2 * 12 * 6 * 32 + -(-own // 16) * 16
    twins = kernel_twins(plain, QEMU, tflm_semantics(CMSIS_NN))
    direct = next(t for t in twins if DIRECT in _flags(t.graph))
    assert "dw3" not in _flags(direct.graph) and direct.peak < plain.peak and direct.latency_s > plain.latency_s


def test_streamed_stripes_are_estimated_with_their_kernels_set_up_per_call(tmp_path):
    """A stage's layers pay their kernel's set-up (`per_channel`, fast depthwise's and dw3's) on
    every call, a call per stripe: the estimate counts it (left out, the floor fell 2-11 % below
    these stripes as built, and the frontier sweep built hundreds of stages to learn it). Every
    stage form stays a floor; streamed stripes of a pointwise16 + fast depthwise block, whose
    estimate leaves out nothing, are priced as built."""
    from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
    from tpu_pipeline.toolchain.fit.variants import patch_candidates, upgrade

    b = CnnBuilder(seed=9)
    x = b.conv(b.input((1, 48, 24, 3)), 16, k=3, stride=2, act="RELU6")
    y = b.pool(b.conv(b.dw(b.conv(x, 64, k=1, act="RELU6"), k=3, act="RELU6"), 16, k=1), "AVERAGE_POOL_2D", k=3,
               stride=3)
    g, _ = on_harness(b.graph([y]))
    assert {"fast", "pointwise16"} <= _flags(g)
    spans = split_spans(g)
    sem = tflm_semantics(CMSIS_NN)
    as_is = as_is_variants(g, spans, QEMU, sem)
    secs = {o.index: o.seconds for o in estimate_mcu(g, QEMU, CMSIS_NN).ops}
    regions, stripes = {}, 0
    for v in patch_candidates(g, spans, as_is, harness=True):
        if v.form != "stage":
            continue
        est = upgrade(g, spans, v, secs, QEMU, sem, regions)
        built = est and upgrade(g, spans, est, secs, QEMU, sem)
        if built is None:
            continue
        assert est.latency_s <= built.latency_s * (1 + 1e-9), v.label
        body = built.graph.ops[0].options.body
        if v.grid[1] == 1 and any("fast" in op.kernel for op in body.ops):
            assert est.latency_s >= built.latency_s * (1 - 1e-6), (v.label, est.latency_s / built.latency_s)
            stripes += 1
    assert stripes >= 10
