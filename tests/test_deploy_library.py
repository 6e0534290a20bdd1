"""`export-mcu --library`: a model as a drop-in library for the user's own TFLite Micro firmware
(tpu_pipeline/toolchain/deploy/library.py), built into a plain application of ours
(toolchain/deploy/app.py: its own main, no harness protocol) and run in QEMU
(runtime/library_app.py): outputs identical to host TFLite Micro, arena = the library's macros."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from helpers.firmware import HAVE_ARM, HAVE_QEMU, tree_or_skip
from helpers.models import stem_heavy_cnn

from tpu_pipeline.cli import main
from tpu_pipeline.toolchain.deploy.library import MARKER, export_library
from tpu_pipeline.toolchain.device import KERNEL_SETS, kernel_set, load_device
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.ir import from_model
from tpu_pipeline.toolchain.memory.tflm_target import target_arena, target_tail
from tpu_pipeline.toolchain.tflite import read_model, read_offline_plan

FIX = Path(__file__).parent / "fixtures"
BOARD = load_device("qemu-mps2-an386")
# MLPerf Tiny's four int8 models, where a folder of them is given (not committed: their licence)
MLPERF = Path(os.environ.get("TPUP_MLPERF_DIR", "/nonexistent"))
MLPERF_MODELS = ("kws_ref_model", "vww_96_int8", "ad01_int8", "pretrainedResnet_quant")


@pytest.fixture(scope="module")
def staged_model(tmp_path_factory) -> Path:
    """fit's output with a patch stage (TPUP_PATCH_STAGE) and the harness convolutions."""
    from tpu_pipeline.toolchain.fit import fit_model

    tmp = tmp_path_factory.mktemp("staged")
    fitted = fit_model(stem_heavy_cnn(tmp, seed=15), budget=6400, time_limit=20, head_only=True)
    assert fitted.result.fits
    out = tmp / "stem_fitted.tflite"
    out.write_bytes(fitted.data)
    return out


def _macros(header: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"#define (\w+) (\d+)\b", header)}


def test_a_builtin_model_gets_its_ops_and_exact_arena_macros_and_no_kernels(tmp_path):
    r = export_library(FIX / "chain_int8.tflite", BOARD, tmp_path / "lib")
    lib = Path(r.out_dir)
    assert r.name == "chain_int8" and r.custom_ops == ()
    assert not (lib / "tpup_conv.cc").exists() and not (lib / "tpup_stage.cc").exists()
    assert sorted(p.name for p in lib.iterdir()) == sorted(r.files)
    model = read_model((lib / "tpup_chain_int8.tflite").read_bytes())
    graph, plan = from_model(model), read_offline_plan(model)
    assert plan is not None and any(o >= 0 for o in plan)  # the offline plan travels with the model
    macros = _macros((lib / "tpup_chain_int8.h").read_text())
    for k in KERNEL_SETS:
        a = target_arena(graph, k, plan)
        suffix = k.name.upper().replace("-", "_")
        assert (macros[f"TPUP_CHAIN_INT8_HEAD_BYTES_{suffix}"], macros[f"TPUP_CHAIN_INT8_TAIL_BYTES_{suffix}"]) == \
            (a.head, a.tail) == (r.head_bytes[k.name], r.tail_bytes[k.name])
    ops = (lib / "tpup_chain_int8_ops.h").read_text()
    assert ops.count("resolver.Add") == len(r.ops) == macros["TPUP_CHAIN_INT8_NUM_OPS"]
    assert "tpup_conv.h" not in ops
    meta = json.loads((lib / MARKER).read_text())
    assert meta["kind"] == "tpu-pipeline library" and meta["models"][0]["name"] == "chain_int8"
    cmake = (lib / "CMakeLists.txt").read_text()
    assert "add_library(tpup_chain_int8 STATIC tpup_chain_int8.cc tpup_chain_int8_model_data.cc)" in cmake


def test_a_fitted_model_gets_only_the_kernels_it_uses(tmp_path, staged_model):
    r = export_library(staged_model, BOARD, tmp_path / "lib", names="stem")
    lib = Path(r.out_dir)
    assert set(r.custom_ops) == {"TPUP_ADD", "TPUP_CONV_2D", "TPUP_DEPTHWISE_CONV_2D", "TPUP_PATCH_STAGE"}
    for f in ("tpup_conv.h", "tpup_add.h", "tpup_conv.cc", "tpup_stage.cc", "tpup_add.cc"):
        assert (lib / f).is_file(), f
    ops = (lib / "tpup_stem_ops.h").read_text()
    assert 'AddCustom("TPUP_PATCH_STAGE", tpup::Register_PATCH_STAGE())' in ops
    assert "tpup_stage.cc" in (lib / "CMakeLists.txt").read_text()
    assert "TPUP_PATCH_STAGE" in (lib / "README.md").read_text()


def test_inspect_and_fit_name_the_custom_ops_and_the_library(tmp_path, staged_model, capsys):
    assert main(["inspect", str(staged_model), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["custom_ops"] == ["TPUP_ADD", "TPUP_CONV_2D", "TPUP_DEPTHWISE_CONV_2D", "TPUP_PATCH_STAGE"]
    assert "Failed to get registration from op code CUSTOM" in d["custom_ops_note"]
    assert "--library" in d["custom_ops_note"]
    assert main(["inspect", str(FIX / "chain_int8.tflite"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["custom_ops"] == [] and d["custom_ops_note"] is None


def test_fit_json_names_the_custom_ops(tmp_path, capsys):
    src = stem_heavy_cnn(tmp_path, seed=15)
    assert main(["fit", str(src), "--budget", "9000", "--head-only", "-o", str(tmp_path / "f.tflite"),
                 "--time-limit", "20", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["custom_ops"] and all(o.startswith("TPUP_") for o in d["custom_ops"])
    assert any("--library" in n for n in d["notes"])


def test_a_folder_that_is_not_ours_is_refused_and_left_alone(tmp_path, capsys):
    foreign = tmp_path / "app"
    foreign.mkdir()
    (foreign / "main.c").write_text("int main(){}")
    rc = main(["export-mcu", str(FIX / "chain_int8.tflite"), "--device", "qemu-mps2-an386", "--library", str(foreign)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "not a tpu-pipeline library" in err[0]
    assert sorted(p.name for p in foreign.iterdir()) == ["main.c"]
    assert [p.name for p in tmp_path.iterdir()] == ["app"]  # no temporary left beside it
    with pytest.raises(UsageError):
        export_library(FIX / "chain_int8.tflite", BOARD, foreign / "main.c")  # a file
    assert main(["export-mcu", str(FIX / "chain_int8.tflite"), "--device", "qemu-mps2-an386"]) == 2  # neither -o nor --library
    assert main(["export-mcu", str(FIX / "chain_int8.tflite"), "-o", str(tmp_path / "a"),
                 "--library", str(tmp_path / "b")]) == 2
    assert main(["export-mcu", str(FIX / "chain_int8.tflite"), "--library", str(tmp_path / "c"), "--name", "9x"]) == 2


def test_a_library_of_ours_is_replaced_whole(tmp_path):
    out = tmp_path / "lib"
    export_library(FIX / "chain_int8.tflite", BOARD, out, names="first")
    r = export_library(FIX / "multi_output_int8.tflite", BOARD, out, names="second")
    assert sorted(p.name for p in out.iterdir()) == sorted(r.files)  # nothing of the first is left
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def _run_app(tmp_path, models, board: str, kernels: str, shared: bool = False):
    if not (HAVE_ARM and HAVE_QEMU):
        pytest.skip("ARM toolchain or qemu-system-arm not installed (.ci/run installs them)")
    tree_or_skip(kernels)
    from tpu_pipeline.runtime.library_app import run_libraries_on_qemu
    from tpu_pipeline.toolchain.firmware.library import LibraryBusy

    try:
        return run_libraries_on_qemu(models, load_device(board), kernel_set(kernels), tmp_path / "work", seed=7,
                                     shared=shared)
    except LibraryBusy as exc:
        pytest.skip(str(exc))


def _check(run, n_models: int):
    assert run.errors == []
    assert len(run.models) == n_models
    for a in run.arenas:
        assert (a.init_rc, a.refused_small, a.refused_misaligned) == (0, -2, -1), a
        assert (a.head, a.tail) == (a.head_predicted, a.tail_predicted), a  # arena used = prediction
        assert a.used == a.head + a.tail <= a.arena_bytes
    for m in run.models:
        assert m.outputs_match is True, (m.model, m.output_differences)


@pytest.mark.parametrize("board,kernels", [("qemu-mps2-an386", "cmsis-nn"), ("qemu-mps2-an500", "cmsis-nn"),
                                           ("qemu-mps2-an386", "reference")])
def test_a_plain_application_runs_the_libraries_in_qemu(tmp_path, staged_model, board, kernels):
    """Two libraries, each on its own arena: a builtin model and fit's patch-stage output."""
    run = _run_app(tmp_path, [FIX / "multi_output_int8.tflite", staged_model], board, kernels)
    _check(run, 2)
    assert len(run.arenas) == 2


@pytest.mark.parametrize("kernels", ["cmsis-nn", "reference"])
def test_two_models_share_one_arena_in_qemu(tmp_path, staged_model, kernels):
    """One library, one arena: the heads overlap, the tails stack; run interleaved, each model's
    outputs are those of the model alone, and the arena is the prediction to the byte."""
    run = _run_app(tmp_path, [FIX / "multi_output_int8.tflite", staged_model], "qemu-mps2-an386", kernels, shared=True)
    _check(run, 2)
    (a,) = run.arenas
    lib = json.loads((tmp_path / "work" / "lib" / MARKER).read_text())
    figures = lib["shared"][kernels]
    assert a.head == max(figures["heads"]) and a.used == figures["shared_arena_bytes_predicted"]
    assert a.used < figures["separate_arena_bytes_predicted"]


def test_shared_arena_prediction_is_the_largest_head_and_the_stacked_tails(tmp_path):
    from tpu_pipeline.toolchain.deploy.shared_arena import SHARED_OBJECTS, shared_arena

    r = export_library([FIX / "chain_int8.tflite", FIX / "multi_output_int8.tflite"], BOARD, tmp_path / "lib")
    assert r.target == "tpup_shared" and (tmp_path / "lib" / "tpup_shared.h").is_file()
    planned = []
    for m in r.models:
        model = read_model((tmp_path / "lib" / f"tpup_{m.name}.tflite").read_bytes())
        planned.append((from_model(model), read_offline_plan(model)))
    for k in KERNEL_SETS:
        a = shared_arena(planned, k)
        assert a.head == max(m.head_bytes[k.name] for m in r.models)
        once = sum(size for _, size, _ in target_tail(planned[1][0], k).allocations[:SHARED_OBJECTS])
        assert sum(a.tails) - once - 16 <= a.tail <= sum(a.tails) - once + 16  # the allocator objects once
        macros = _macros((tmp_path / "lib" / "tpup_shared.h").read_text())
        suffix = k.name.upper().replace("-", "_")
        assert (macros[f"TPUP_SHARED_HEAD_BYTES_{suffix}"], macros[f"TPUP_SHARED_TAIL_BYTES_{suffix}"]) == (a.head, a.tail)


def test_several_models_need_distinct_names_and_the_library(tmp_path):
    chain = str(FIX / "chain_int8.tflite")
    assert main(["export-mcu", chain, chain, "--device", "qemu-mps2-an386", "--library", str(tmp_path / "l")]) == 2
    assert main(["export-mcu", chain, chain, "--device", "qemu-mps2-an386", "--library", str(tmp_path / "l"),
                 "--name", "a"]) == 2
    assert main(["export-mcu", chain, chain, "--device", "qemu-mps2-an386", "-o", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "l").exists() and not (tmp_path / "o").exists()
    assert main(["export-mcu", chain, chain, "--device", "qemu-mps2-an386", "--library", str(tmp_path / "l"),
                 "--name", "a,b"]) == 0


@pytest.mark.skipif(not MLPERF.is_dir(), reason="set TPUP_MLPERF_DIR to a folder of MLPerf Tiny's int8 models")
@pytest.mark.parametrize("board", ["qemu-mps2-an386", "qemu-mps2-an500"])
def test_mlperf_tiny_models_as_libraries_in_qemu(tmp_path, board):
    models = [MLPERF / f"{m}.tflite" for m in MLPERF_MODELS if (MLPERF / f"{m}.tflite").is_file()]
    _check(_run_app(tmp_path, models, board, "cmsis-nn"), len(models))


@pytest.mark.skipif(not MLPERF.is_dir(), reason="set TPUP_MLPERF_DIR to a folder of MLPerf Tiny's int8 models")
def test_mlperf_kws_and_vww_share_one_arena_in_qemu(tmp_path):
    run = _run_app(tmp_path, [MLPERF / "kws_ref_model.tflite", MLPERF / "vww_96_int8.tflite"], "qemu-mps2-an386",
                   "cmsis-nn", shared=True)
    _check(run, 2)


def test_profile_of_several_models_predicts_their_shared_arena(capsys):
    chain, multi = str(FIX / "chain_int8.tflite"), str(FIX / "multi_output_int8.tflite")
    assert main(["profile", chain, multi, "--device", "qemu-mps2-an386", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    heads = [m["arena_head_predicted"] for m in d["models"]]
    tails = [m["arena_tail_predicted"] for m in d["models"]]
    assert d["head"] == max(heads) and d["heads"] == heads and d["tails"] == tails
    assert d["shared_arena_bytes_predicted"] == d["head"] + d["tail"] < max(heads) + sum(tails)
    assert d["separate_arena_bytes_predicted"] == sum(heads) + sum(tails) and d["fits"] is True
    assert main(["profile", chain, multi, "--device", "coral-usb"]) == 2
