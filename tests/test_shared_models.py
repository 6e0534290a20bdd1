"""Several models, one TFLite Micro arena (issue 32 item 2): `fit`, `plan` and `run --backend qemu`
take several models for one device; the shared arena is the largest head plus the stacked tails
(toolchain/deploy/shared_arena.py), fit's budget counts it (toolchain/deploy/shared_fit.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.firmware import HAVE_ARM, HAVE_QEMU, tree_or_skip
from helpers.models import stem_heavy_cnn

from tpu_pipeline.cli import main

FIX = Path(__file__).parent / "fixtures"
BOARD = "qemu-mps2-an386"


@pytest.fixture(scope="module")
def fitted_pair(tmp_path_factory):
    """A stem-heavy CNN (its head 25,600 B as is) and a builtin fixture fitted for one 20,000 B arena."""
    tmp = tmp_path_factory.mktemp("shared")
    models = [str(stem_heavy_cnn(tmp, seed=15)), str(FIX / "multi_output_int8.tflite")]
    out = tmp / "fitted"
    code = main(["fit", *models, "--device", BOARD, "--budget", "20000", "-o", str(out), "--time-limit", "5",
                 "--json"])
    return code, models, out


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_fit_of_several_models_fits_their_shared_arena(fitted_pair, capsys):
    code, models, out = fitted_pair
    assert code == 0
    capsys.readouterr()
    assert main(["profile", *models, "--device", BOARD, "--json"]) == 0
    as_is = _json(capsys)
    assert as_is["shared_arena_bytes_predicted"] > 20000  # as they are the two do not share 20,000 B
    written = [str(out / Path(m).name) for m in models]
    assert all(Path(w).is_file() for w in written)
    assert main(["profile", *written, "--device", BOARD, "--json"]) == 0
    after = _json(capsys)
    assert after["shared_arena_bytes_predicted"] == after["head"] + after["tail"] <= 20000
    # the stem model's head came down (patches); the other model's head stays under the shared head
    assert after["heads"][0] < as_is["heads"][0] and max(after["heads"]) == after["head"]


def test_fit_of_several_models_reports_the_shared_figure_and_the_objective(tmp_path, capsys):
    models = [str(FIX / "chain_int8.tflite"), str(FIX / "multi_output_int8.tflite")]
    assert main(["fit", *models, "--device", BOARD, "--budget", "60000", "-o", str(tmp_path / "o"),
                 "--time-limit", "5", "--json"]) == 0
    d = _json(capsys)
    assert d["fits"] is True and d["budget_bytes"] == 60000
    assert d["shared_arena_bytes_predicted"] == d["head"] + d["tail"] == max(d["heads"]) + d["tail"]
    assert d["head"] + sum(d["tails"]) > d["shared_arena_bytes_predicted"]  # the allocator objects once
    assert d["latency_s_predicted_total"] == pytest.approx(sum(m["latency_s_predicted"] for m in d["models"]))
    assert "least total predicted latency" in d["objective"]
    assert [m["output"] for m in d["models"]] == [str(tmp_path / "o" / Path(m).name) for m in models]
    assert all(v["runtime"] for m in d["models"] for v in m["verification"])  # each checked in the runtimes


def test_fit_of_several_models_refuses_or_writes_nothing(tmp_path):
    chain, multi = str(FIX / "chain_int8.tflite"), str(FIX / "multi_output_int8.tflite")
    out = tmp_path / "o"
    # too small for any joint choice: exit 3, nothing written
    assert main(["fit", chain, multi, "--device", BOARD, "--budget", "3000", "-o", str(out), "--time-limit", "3"]) == 3
    assert not out.exists()
    # two files of one name would land on one path; options for one model only: exit 2 before any work
    assert main(["fit", chain, chain, "--device", BOARD, "--budget", "60000", "-o", str(out)]) == 2
    assert main(["fit", chain, multi, "--device", BOARD, "--budget", "60000", "-o", str(out), "--head-only"]) == 2
    assert main(["fit", chain, multi, "--budget", "60000", "-o", str(tmp_path / "f.txt"), "--objective",
                 "memory"]) == 2
    (tmp_path / "file").write_text("x")
    assert main(["fit", chain, multi, "--device", BOARD, "--budget", "60000", "-o", str(tmp_path / "file")]) == 2
    assert not out.exists()


def test_plan_of_several_models_reports_the_shared_plan(tmp_path, capsys):
    models = [str(FIX / "chain_int8.tflite"), str(FIX / "multi_output_int8.tflite")]
    out = tmp_path / "planned"
    assert main(["plan", *models, "-o", str(out), "--device", BOARD, "--json"]) == 0
    d = _json(capsys)
    written = [m["output"] for m in d["models"]]
    # each head from the arena's first byte: the plan, and the CMSIS-NN kernels' scratch where it goes
    assert all(h >= m["planned_bytes"] for h, m in zip(d["heads"], d["models"]))
    assert main(["profile", *written, "--device", BOARD, "--json"]) == 0
    p = _json(capsys)
    assert (p["shared_arena_bytes_predicted"], p["heads"], p["tails"]) == \
        (d["shared_arena_bytes_predicted"], d["heads"], d["tails"])
    assert d["fits"] is True and d["banks"][0]["bytes_predicted"] + d["banks"][1]["bytes_predicted"] == \
        d["shared_arena_bytes_predicted"]
    assert main(["plan", *models, "-o", str(tmp_path / "p2"), "--verify"]) == 2  # one model's option
    assert not (tmp_path / "p2").exists()


def test_run_of_several_models_needs_qemu(tmp_path):
    models = [str(FIX / "chain_int8.tflite"), str(FIX / "multi_output_int8.tflite")]
    assert main(["run", *models, "--backend", "emulator"]) == 2


def test_run_several_fitted_models_on_one_arena_in_qemu(fitted_pair, capsys):
    """fit's outputs built as one library on one arena, run one at a time in QEMU: the arena
    measured = the shared prediction, each model's outputs identical to it run alone."""
    if not (HAVE_ARM and HAVE_QEMU):
        pytest.skip("ARM toolchain or qemu-system-arm not installed (.ci/run installs them)")
    tree_or_skip("cmsis-nn")
    from tpu_pipeline.toolchain.firmware.library import LibraryBusy

    code, models, out = fitted_pair
    assert code == 0
    capsys.readouterr()
    written = [str(out / Path(m).name) for m in models]
    try:
        rc = main(["run", *written, "--backend", "qemu", "--device", BOARD, "-N", "2", "--json"])
    except LibraryBusy as exc:
        pytest.skip(str(exc))
    d = _json(capsys)
    assert rc == 0
    assert d["arena_bytes_measured"] == d["shared_arena_bytes_predicted"] <= 20000
    assert d["arena_matches_prediction"] is True
    assert [m["outputs_match"] for m in d["models"]] == [True, True]
