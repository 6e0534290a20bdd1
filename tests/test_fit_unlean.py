"""fit's unlean stage (fit/stages/unlean.py) realises its swaps with the realised selection as a
`like` (fit/realise.py `_same_answer`): a lean twin swapped for its origin poses the whole graph's
scheduler the question it was asked already, so its answer is reused and only the arena is
planned again (issue 30: TinyEngine's mcunetv2_large spent 2 s of the scheduler on each of five
swaps, each giving the realised order again)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from tpu_pipeline.toolchain.budget import Deadline
from tpu_pipeline.toolchain.fit import fit_model
from tpu_pipeline.toolchain.fit import realise as realise_mod
from tpu_pipeline.toolchain.memory.tflm_target import target_tail

UNLEAN = sys.modules["tpu_pipeline.toolchain.fit.stages.unlean"]  # (the package exports the stage function)
CHAIN = Path(__file__).parent / "fixtures" / "chain_int8.tflite"


@pytest.fixture(params=["auto", "greedy"])
def recorded(request, monkeypatch):
    """chain_int8's smallest whole arena (three lean twins there: unlean swaps them) with the
    whole graph's scheduler asked for its search ("auto": the variants at the peak not `_settled`)
    or for its cheap orders ("greedy"), every scheduler call counted and every realise call
    unlean makes kept with its answer."""
    monkeypatch.setattr(realise_mod, "_settled", lambda v: request.param == "greedy")
    calls, tries, shaped = [], [], []
    real_schedule, real_realise, real_shaped = realise_mod.schedule, UNLEAN.realise, realise_mod._shaped

    def counted(*args, **kw):
        calls.append(args[0])
        return real_schedule(*args, **kw)

    def kept(*args, **kw):
        before = len(calls)
        out = real_realise(*args, **kw)
        tries.append((args, kw, out, len(calls) - before))
        return out

    monkeypatch.setattr(realise_mod, "schedule", counted)
    monkeypatch.setattr(realise_mod, "_shaped", lambda *a: shaped.append(a[1]) or real_shaped(*a))
    monkeypatch.setattr(UNLEAN, "realise", kept)
    result = fit_model(CHAIN, objective="memory", time_limit=20, want_pareto=True).result
    UNLEAN.realise = real_realise  # (the comparisons below realise without recording)
    return result, tries, shaped


def _same(a, b) -> None:
    (ga, sa, pa), (gb, sb, pb) = a, b
    assert ga.ops == gb.ops and ga.tensors == gb.tensors
    assert sa.order == sb.order and sa.peak == sb.peak and sa.proven_optimal == sb.proven_optimal
    assert pa.head == pb.head and tuple(pa.tensor_offsets) == tuple(pb.tensor_offsets)


def test_a_swap_that_asks_the_same_question_reuses_the_answer(recorded):
    result, tries, shaped = recorded
    assert tries, "unlean tried no swap on chain_int8's smallest arena"
    assert all(kw.get("like") is not None for _, kw, _, _ in tries)
    # (of chain_int8's four tries one swaps a kernel of the same scratch: the same question; the
    # others change an op's scratch, a different one)
    assert [n for *_, n in tries].count(0) >= 1  # the scheduler was not asked again
    assert result.frontier_complete
    # the swaps change kernels only: the patch stage of the selection is built once for them all
    assert any(v.kind == "patch" for v in tries[0][0][2].variants)
    assert len(shaped) == 2  # (the realise stage's, then the first swap's)
    for args, kw, out, _ in tries:  # and the answer is what asking again gives (proven orders here)
        graph, spans, alt, sem, _, progress, t0 = args
        again = realise_mod.realise(graph, spans, alt, sem, Deadline(20.0), progress, t0)
        if out is None:  # given up before planning (`hopeless`): planned, it takes more arena indeed
            (done, _, plan), _ = kw["like"]
            assert _arena(again, sem) > _arena((done, None, plan), sem)
        else:
            _same(out, again)
    assert any(out is None for _, _, out, _ in tries) and any(out is not None for _, _, out, _ in tries)


def _arena(realised, sem) -> int:
    graph, _, plan = realised
    return plan.head + (target_tail(graph, sem).bytes or 0)


def test_a_different_question_is_asked(recorded):
    """The same swap, with a `like` whose scheduling problem differs by one activation's bytes
    (fewer: the peak, and with it the question's method and seconds, cannot rise): the scheduler is
    asked; with the `like` unlean gave it, it is not."""
    _, tries, _ = recorded
    args, kw, _, _ = next(t for t in tries if t[3] == 0)  # (the swap that asked the same question)
    (done, sched, plan), sel = kw["like"]
    t = next(t for t in done.tensors if done.is_activation(t.index) and t.index not in done.inputs
             and t.index not in done.outputs and t.shape[-1] > 1)
    shrunk = dataclasses.replace(t, shape=(*t.shape[:-1], t.shape[-1] - 1))
    other = dataclasses.replace(done, tensors=tuple(shrunk if u.index == t.index else u for u in done.tensors))
    graph, spans, alt, sem, _, progress, t0 = args
    asked = []
    for like in (((done, sched, plan), sel), ((other, sched, plan), sel)):
        calls = []
        real = realise_mod.schedule
        realise_mod.schedule = lambda *a, **k: calls.append(a[0]) or real(*a, **k)
        try:
            realise_mod.realise(graph, spans, alt, sem, Deadline(20.0), progress, t0, like=like)
        finally:
            realise_mod.schedule = real
        asked.append(len(calls))
    assert asked == [0, 1]
