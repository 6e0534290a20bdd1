"""`fit`'s kernel variants: int8 convolutions moved to the harness's direct kernel (no im2col
scratch, slower) where their scratch is part of the peak (tpu_pipeline.toolchain.fit.variants.direct_twins)."""

from __future__ import annotations

from pathlib import Path

from cnn_builder import CnnBuilder
from tpu_pipeline.toolchain.fit import fit_model
from tpu_pipeline.toolchain.fit.variants import as_is_variants, direct_twins
from tpu_pipeline.toolchain.fit.spans import split_spans
from tpu_pipeline.toolchain.ir.convert import load
from tpu_pipeline.toolchain.ir.kernels import DIRECT, kernel_choices
from tpu_pipeline.toolchain.memory.lifetimes import lifetimes
from tpu_pipeline.toolchain.schedule.api import schedule


def _wide_conv(tmp_path: Path) -> Path:
    """One 3x3 convolution over 64 channels between a graph input and output: its 2,304-byte im2col
    buffer (CMSIS-NN) sits on top of input + output, and no patch grid can go below input + output."""
    b = CnnBuilder(seed=5)
    x = b.input((1, 8, 8, 64))
    y = b.conv(x, 64, k=3, act="RELU")
    path = tmp_path / "wide.tflite"
    path.write_bytes(b.model_bytes([y]))
    return path


def test_direct_twins_trade_latency_for_the_scratch_at_the_peak(tmp_path):
    _, g = load(_wide_conv(tmp_path))
    spans = split_spans(g)
    (plain,) = as_is_variants(g, spans, "qemu-mps2-an386", "cmsis-nn")
    assert plain.peak == 4096 + 4096 + 2304
    (twin,) = direct_twins(plain, "qemu-mps2-an386", "cmsis-nn")
    assert twin.peak == 8192 == twin.lower_bound and twin.latency_s > plain.latency_s
    assert kernel_choices(twin.graph) == {0: DIRECT} and len(twin.direct) == 1
    # the reference kernels ask for no im2col buffer: nothing to trade
    (ref,) = as_is_variants(g, spans, "qemu-mps2-an386", "reference")
    assert ref.peak == 8192 and direct_twins(ref, "qemu-mps2-an386", "reference") == []


def test_fit_picks_the_direct_kernel_when_only_it_meets_the_budget(tmp_path):
    src = _wide_conv(tmp_path)
    assert schedule(load(src)[1], semantics="tflm-cmsis-nn", time_limit=5).peak == 10496
    fitted = fit_model(src, budget=9000, kernels="cmsis-nn", time_limit=20)
    r = fitted.result
    assert r.fits and r.head == 8192
    assert kernel_choices(r.graph) == {0: DIRECT}
    assert b"TPUP_CONV_2D_DIRECT" in fitted.data  # the written model names the kernel per op
    # checked bit-identical in LiteRT and TFLite Micro (their builtin view) by fit_model itself
    assert {v.runtime for v in fitted.verification} == {"litert", "tflm"}
    assert all(o.ok for v in fitted.verification for o in v.outputs)
    # without a budget that needs it, the faster CMSIS-NN kernel stays
    fast = fit_model(src, budget=20000, kernels="cmsis-nn", time_limit=20)
    assert fast.result.fits and not kernel_choices(fast.result.graph)


def test_fit_counts_the_kernel_sets_scratch(tmp_path):
    """The arena fit promises is the one the kernels it runs with need: under CMSIS-NN the im2col
    buffer is part of it, under the reference kernels it is not."""
    src = _wide_conv(tmp_path)
    for kernels, head in (("cmsis-nn", 10496), ("reference", 8192)):
        r = fit_model(src, budget=20000, kernels=kernels, time_limit=20).result
        assert r.fits and r.head == head and not kernel_choices(r.graph)


def test_fitted_direct_kernels_run_on_the_emulated_cortex_m_as_predicted(tmp_path):
    """The fitted model, with its direct convolution, in the CMSIS-NN firmware on QEMU: outputs
    bit-identical to the host's TFLite Micro, and the firmware's head is fit's prediction."""
    from test_fit import run_fitted_on_qemu

    fitted = fit_model(_wide_conv(tmp_path), budget=9000, kernels="cmsis-nn", time_limit=20)
    assert kernel_choices(fitted.result.graph) == {0: DIRECT}
    r = run_fitted_on_qemu(tmp_path, fitted, "cmsis-nn")
    assert r.head_bytes == fitted.result.head == 8192


def test_patch_estimates_are_floors_of_the_measured_variants_under_both_kernel_sets(tmp_path):
    """The lazy search is only optimal if every stage bounds the next from below: the tile-geometry
    estimate (scratch included) never exceeds the built variant's peak or latency."""
    from test_fit import _stem_heavy_cnn

    from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
    from tpu_pipeline.toolchain.fit.variants import patch_candidates, upgrade

    _, g = load(_stem_heavy_cnn(tmp_path, seed=23))
    spans = split_spans(g)
    for kernels in ("cmsis-nn", "reference"):
        as_is = as_is_variants(g, spans, "qemu-mps2-an386", kernels)
        secs = {o.index: o.seconds for o in estimate_mcu(g, "qemu-mps2-an386", kernels=kernels).ops}
        cands = patch_candidates(g, spans, as_is)
        assert len(cands) >= 4
        for v in cands:
            est = upgrade(g, spans, v, secs, "qemu-mps2-an386", kernels)
            built = upgrade(g, spans, est, secs, "qemu-mps2-an386", kernels)
            assert v.peak <= est.peak <= built.peak, (kernels, v.label)
            assert est.latency_s <= built.latency_s * (1 + 1e-9), (kernels, v.label)
