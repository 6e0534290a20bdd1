"""`fit`'s rewrite variants: the identity rewrites (partial-convolution and depthwise splits,
commutes) of one or two spans, spliced into the model when chosen."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpu_pipeline.toolchain.device import REFERENCE, load_device
from tpu_pipeline.toolchain.execute.compare import verify_models
from tpu_pipeline.toolchain.fit.spans import split_spans
from tpu_pipeline.toolchain.fit.variants import as_is_variants, rewrite_variants, splice
from tpu_pipeline.toolchain.ir.convert import rewritten_model
from tpu_pipeline.toolchain.loader import load_exact
from tpu_pipeline.toolchain.memory.semantics import tflm_semantics
from tpu_pipeline.toolchain.schedule.api import schedule
from tpu_pipeline.toolchain.tflite import model_to_bytes

FIX = Path(__file__).parent / "fixtures"
DEVICE = load_device("qemu-mps2-an386")
SEM = tflm_semantics(REFERENCE)


def _setup(name):
    model, g, _ = load_exact(FIX / name)
    g, _ = g.with_unique_tensor_names()
    spans = split_spans(g)
    return model, g, spans, as_is_variants(g, spans, DEVICE, SEM)


def _spliced(model, g, spans, v):
    whole = splice(g, v, spans)
    sched = schedule(whole, time_limit=10)
    assert sched.peak == v.peak  # the variant's peak is the spliced graph's optimum
    return model_to_bytes(rewritten_model(whole.reordered(sched.order), model))


def test_float_splits_are_variants_and_splice_into_the_model():
    model, g, spans, as_is = _setup("concat_conv_float32.tflite")
    (v,) = rewrite_variants(g, spans, as_is, DEVICE, SEM)
    assert v.kind == "rewrite" and v.rewrites and v.peak < max(a.peak for a in as_is[v.first:v.last + 1])
    assert v.latency_s > sum(a.latency_s for a in as_is[v.first:v.last + 1])  # more, smaller ops
    res = verify_models(model_to_bytes(model), _spliced(model, g, spans, v), runs=2)
    assert {r.runtime for r in res} == {"litert", "tflm"} and all(r.ok and not r.skipped for r in res)


def test_int8_partial_sums_only_with_allow_lossy_calibrated_on_the_whole_model():
    model, g, spans, as_is = _setup("concat_conv_int8.tflite")
    assert rewrite_variants(g, spans, as_is, DEVICE, SEM) == []  # lossy: not offered by default
    (v,) = rewrite_variants(g, spans, as_is, DEVICE, SEM, allow_lossy=True, model=model)
    assert any(r.numerics == "lossy-int8" for r in v.rewrites)
    res = verify_models(model_to_bytes(model), _spliced(model, g, spans, v), runs=2, lossy_ok=True)
    for r in res:
        assert r.ok and r.max_deviation_lsb is not None
        assert r.max_deviation_lsb <= 16  # calibrated on what the model feeds the span, not noise


def test_splice_refuses_nothing_silently():
    model, g, spans, as_is = _setup("concat_conv_float32.tflite")
    (v,) = rewrite_variants(g, spans, as_is, DEVICE, SEM)
    whole = splice(g, v, spans)
    assert whole.is_topological(list(range(len(whole.ops))))
    names = [whole.tensors[op.outputs[0]].name for op in whole.ops]
    assert len(names) == len(set(names))
    with pytest.raises(ValueError, match="does not splice"):
        splice(g, v, spans[:1])  # spans that do not hold the variant's ops


def test_calibration_of_a_part_feeds_it_what_the_whole_model_gives_it():
    """A tensor a rewrite made inside a span is calibrated by running the span on the values the
    whole model feeds it (not on random activations)."""
    import dataclasses

    import numpy as np

    from tpu_pipeline.toolchain.fit.spans import span_graph
    from tpu_pipeline.toolchain.rewrite.numerics import calibration_values, calibration_values_within

    model, g, spans, _ = _setup("concat_conv_int8.tflite")
    part = span_graph(g, [spans[1]])
    out = part.outputs[0]
    renamed = dataclasses.replace(part, tensors=tuple(dataclasses.replace(t, name="made_by_a_rewrite")
                                                      if t.index == out else t for t in part.tensors))
    got = calibration_values_within(renamed, [out], g, model=model)[out]
    want = calibration_values(g, [out], model=model)[out]
    assert len(got) == len(want) == 4 and all(np.array_equal(a, b) for a, b in zip(got, want))
