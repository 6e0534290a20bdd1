"""fit's per-op flash guard (tpu_pipeline/toolchain/fit/flash.py): where the written model exceeds
the flash a board leaves for it, the ops whose re-laid weights save the most predicted cycles for
their bytes keep them (the exact 0/1 knapsack, checked against every subset), the others run
without them, and the written model fits."""

from __future__ import annotations

import itertools
import random

import pytest

from helpers.models import stem_heavy_cnn
from tpu_pipeline.toolchain.deploy.banks import HARNESS_CODE_BYTES
from tpu_pipeline.toolchain.device import CMSIS_NN, load_device
from tpu_pipeline.toolchain.data import DEVICES_DIR
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.fit import FitParams, fit_file, fit_model
from tpu_pipeline.toolchain.fit.flash import Relaid, choose_relaid, relaid_constants, relaid_items
from tpu_pipeline.toolchain.fit.variants import on_harness
from tpu_pipeline.toolchain.loader import load_exact

BOARD = "qemu-mps2-an386"


def _best(items: list[Relaid], room: int) -> frozenset[str]:
    """The knapsack's optimum by trying every subset (the oracle)."""
    best, value = frozenset(), 0.0
    useful = [r for r in items if r.saved > 0]
    for n in range(1, len(useful) + 1):
        for subset in itertools.combinations(useful, n):
            if sum(r.extra for r in subset) <= room and sum(r.saved for r in subset) > value:
                best, value = frozenset(r.name for r in subset), sum(r.saved for r in subset)
    return best


def test_the_choice_is_the_knapsack_optimum_where_the_best_ratio_first_is_not():
    """Most saved per byte first takes a and b (160) and then c no longer fits; b and c (220) is the
    optimum. Random instances against every subset."""
    items = [Relaid("a", "a/w", 10, 60.0), Relaid("b", "b/w", 20, 100.0), Relaid("c", "c/w", 30, 120.0)]
    choice = choose_relaid(items, 50)
    assert choice.kept == {"b", "c"} and choice.exact and choice.kept_bytes == 50 and choice.saved == 220
    rng = random.Random(7)
    for _ in range(30):
        items = [Relaid(f"op{k}", f"op{k}/w", rng.randint(100, 50_000), rng.uniform(-1e4, 1e6)) for k in range(9)]
        room = rng.randint(0, sum(r.extra for r in items))
        choice = choose_relaid(items, room)
        want = _best(items, room)
        assert choice.kept_bytes <= room and choice.exact
        assert choice.saved == pytest.approx(sum(r.saved for r in items if r.name in want), rel=1e-6)
    assert choose_relaid(items, -1).kept == frozenset()


def _board(tmp_path, room: int):
    """qemu-mps2-an386 with flash for the harness's code plus `room` bytes of model."""
    text = (DEVICES_DIR / f"{BOARD}.toml").read_text()
    assert "flash_bytes = 4194304" in text
    desc = tmp_path / f"board{room}.toml"
    desc.write_text(text.replace("flash_bytes = 4194304", f"flash_bytes = {HARNESS_CODE_BYTES + room}")
                    .replace(f'name = "{BOARD}"', f'name = "board{room}"'))
    return load_device(desc)


@pytest.fixture(scope="module")
def stem(tmp_path_factory):
    """A stem (a packed first layer, four 1x1 convolutions on re-laid int16 weights) fitted on the
    an386 with and without re-laid weights, its items, and a flash room that holds the model with
    half the re-laid bytes."""
    tmp = tmp_path_factory.mktemp("stem")
    path = stem_heavy_cnn(tmp)
    big = load_device(BOARD)
    fastest = fit_model(path, device=big, kernels=CMSIS_NN)
    used = relaid_constants(fastest.result.graph)
    assert len(used) >= 4 and fastest.to_json()["flash"]["relaid_ops_dropped"] == 0
    bare = fit_file(path, FitParams(device=big, kernels=CMSIS_NN, relaid_weights=False))
    assert not relaid_constants(bare.result.graph)
    _, graph, _ = load_exact(path, mcu=True)
    graph, _ = graph.with_unique_tensor_names()
    items = relaid_items(on_harness(graph)[0], big, CMSIS_NN)
    assert {r.constant for r in items if r.saved > 0} <= used  # (the fastest fit holds every one that pays)
    room = len(bare.data) + (len(fastest.data) - len(bare.data)) // 2
    return dict(path=path, fastest=fastest, bare=bare, used=used, items=items, room=room)


def test_fit_keeps_the_re_laid_weights_that_save_most_per_byte_where_flash_holds_only_some(tmp_path, stem):
    """On a board whose flash holds the stem with half its re-laid bytes some ops keep them, the
    others go without, the written model fits the flash, and the ops kept are the knapsack's
    optimum (every subset tried) in the room the flash leaves beside the model without them,
    predicted before the fit."""
    fastest, bare, used, items, room = (stem[k] for k in ("fastest", "bare", "used", "items", "room"))
    fitted = fit_model(stem["path"], device=_board(tmp_path, room), kernels=CMSIS_NN)
    flash = fitted.to_json()["flash"]
    assert len(fitted.data) <= room and flash["fits"] and flash["model_bytes"] == len(fitted.data)
    kept = relaid_constants(fitted.result.graph)
    assert 0 < len(kept) < len(used) and flash["relaid_ops_kept"] == len(kept)
    assert flash["relaid_ops_dropped"] == len(items) - len(kept) and flash["relaid_choice_exact"] is True
    assert len(fastest.data) <= flash["model_bytes_all_relaid"] <= 1.1 * len(fastest.data)  # (predicted)
    # the room: the flash less the model without re-laid weights, as fit predicts it before fitting
    # (its harness form written, the offline plan's bytes and a margin): within 1 KB of the truth
    relaid_room = flash["relaid_room_bytes"]
    assert room - len(bare.data) - 1024 <= relaid_room <= room - len(bare.data)
    best = _best(items, relaid_room)
    assert kept == {r.constant for r in items if r.name in best}
    assert any(f"{len(kept)} of {len(items)} ops keep them" in n for n in fitted.notes), fitted.notes
    assert fitted.to_json()["latency_s_predicted"] < bare.to_json()["latency_s_predicted"]  # (what they buy)


@pytest.mark.parametrize("optimism, short, tries", [(3000, 0, 3), (10**6, 0, 3), (0, 600, 3), (3000, 0, 0)])
def test_where_the_prediction_is_short_fit_drops_more_until_the_model_fits(tmp_path, stem, monkeypatch, optimism,
                                                                          short, tries):
    """The safety net: with the model without re-laid weights predicted `optimism` bytes too small,
    or each op's re-laid weights `short` bytes too small, the fit overshoots the flash (3 KB: the
    choice made before it; 1 MB: the prediction says every re-laid weight fits; 600 B each: every
    choice made again overshoots too); fit then makes the room what the choice took less the
    overshoot (or takes it from the model it wrote) and fits again, so some ops still keep them,
    or, out of tries, goes without any: the written model fits whenever the model without them
    does."""
    from tpu_pipeline.toolchain.fit import flash as flash_module, model as fit_model_module

    margin = fit_model_module._flash_margin
    monkeypatch.setattr(fit_model_module, "_flash_margin", lambda g, f: margin(g, f) - optimism)
    monkeypatch.setattr(flash_module, "ENTRY_BYTES", flash_module.ENTRY_BYTES - short)
    monkeypatch.setattr(fit_model_module, "MAX_FLASH_TRIES", tries)
    fitted = fit_model(stem["path"], device=_board(tmp_path, stem["room"]), kernels=CMSIS_NN)
    flash = fitted.to_json()["flash"]
    assert len(fitted.data) <= stem["room"] and flash["fits"]
    assert (flash["relaid_ops_kept"] > 0) == (tries > 0)
    if not tries:
        assert len(fitted.data) == len(stem["bare"].data)
        assert any("re-laid in flash" in n and "fitted without them" in n for n in fitted.notes), fitted.notes


def test_each_overshoot_makes_the_next_choice_another():
    """Where a choice left slack in its room and the written model still overshoots (the fit's
    bytes are not quite additive: alignment, the plan), the next room is what that choice took
    less the overshoot, never the old room less it (which would make the same choice again until
    the tries run out and every re-laid weight went): here two of the three ops keep theirs."""
    from tpu_pipeline.toolchain.fit.model import _within_flash

    items = [Relaid(f"op{k}", f"op{k}/w", 300, 100.0 - k) for k in range(3)] + [Relaid("free", "free/w", 50, 0.0)]
    base, flash = 10_000, 10_902
    fits = []

    def refit(relaid):  # the written model: 4 bytes more than the items' estimates
        kept = relaid or frozenset()
        fits.append(kept)
        return None, bytes(base + sum(r.extra for r in items if r.name in kept) + 4 * bool(kept))

    first = choose_relaid(items, 1000)  # the choice before the fit: 900 of 1,000 B
    assert first.kept == {"op0", "op1", "op2"}
    _, data, choice = _within_flash(None, refit(first.kept)[1], refit, items, flash, first)
    assert len(data) <= flash and choice.kept == {"op0", "op1"} and fits == [first.kept, choice.kept]


def test_relaid_weights_takes_a_set_of_op_names_only():
    assert FitParams(relaid_weights=frozenset({"a"})).relaid_weights == {"a"}
    for bad in ({"a"}, ["a"], frozenset({1}), "a", None):
        with pytest.raises(UsageError):
            FitParams(relaid_weights=bad)
