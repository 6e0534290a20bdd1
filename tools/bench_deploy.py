#!/usr/bin/env python3
"""Several models, one arena (issue 32): TFLite Micro's shared allocation against separate arenas.

    python tools/bench_deploy.py [--models models] [--mlperf DIR] [--out docs/bench/deploy.md]

Per pair of models: `export-mcu A B --library` (one library, one arena: the heads overlap, the
tails stack) built into the plain application of toolchain/deploy/app.py, run in QEMU
(qemu-mps2-an386, CMSIS-NN kernels; runtime/library_app.py): the measured shared arena
(`arena_used_bytes()`), its prediction, the floor TFLite Micro's shared allocation allows (the
larger head plus both tails), and the sum of the two whole arenas the models take today, one
each. Every output is checked identical to host TFLite Micro running the model alone. MLPerf Tiny's
models come from --mlperf (default $TPUP_MLPERF_DIR); the TFLite Micro example pair is committed.

`--only fit` / `--only banks` rerun one section and keep the others in --out:
- fit: `fit A B --device qemu-mps2-an386 -o DIR` (several models fitted for one shared arena), then
  `run DIR/A DIR/B --backend qemu` (one library, one arena in QEMU): predicted against measured.
- banks: the harness firmware's arena split over RAM banks (`export-mcu -o`, `run --backend qemu`):
  a committed model on the an500 with its RAM cut into two small banks, and with --openmv DIR
  OpenMV's face_landmarks_192 fitted for the stm32h743 with its input outside the arena, run on the
  an500 with the H743's banks; bytes per bank predicted and measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TP = ROOT / "tests" / "fixtures" / "thirdparty"
PAIRS = [("MLPerf kws + vww", "{mlperf}/kws_ref_model.tflite", "{mlperf}/vww_96_int8.tflite"),
         ("MLPerf kws + ic", "{mlperf}/kws_ref_model.tflite", "{mlperf}/pretrainedResnet_quant.tflite"),
         ("MLPerf ad + vww", "{mlperf}/ad01_int8.tflite", "{mlperf}/vww_96_int8.tflite"),
         ("TFLM examples: micro_speech-style kws + LSTM", f"{TP}/keyword_scrambled_8bit.tflite",
          f"{TP}/trained_lstm_int8.tflite")]


def row(label, a, b, board, kernels, work) -> str:
    from tpu_pipeline.runtime.library_app import run_libraries_on_qemu

    run = run_libraries_on_qemu([a, b], board, kernels, work, shared=True)
    (arena,) = run.arenas
    lib = json.loads((Path(work) / "lib" / "tpup_library.json").read_text())
    fig = lib["shared"][kernels.name]
    floor = max(fig["heads"]) + sum(fig["tails"])
    separate = fig["separate_arena_bytes_predicted"]
    ok = all(m.outputs_match for m in run.models) and arena.used == arena.head_predicted + arena.tail_predicted
    return (f"| {label} | {fig['heads'][0]:,} + {fig['tails'][0]:,} | {fig['heads'][1]:,} + {fig['tails'][1]:,} | "
            f"{separate:,} | {floor:,} | {fig['shared_arena_bytes_predicted']:,} | {arena.used:,} | "
            f"{1 - arena.used / separate:.1%} | {'yes' if ok else 'NO'} |")


KIB = 1024
SECTIONS = ("library", "fit", "banks")
HEADINGS = ("## Several models, one arena (export-mcu --library, QEMU)",
            "## Several models: fit, plan and run on one arena (QEMU)",
            "## The arena in RAM banks: the harness firmware in QEMU")


def cli(*args) -> dict:
    """`tpu-pipeline ARGS --json` in a child (as a user types it); its JSON, or the error line."""
    out = subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", *map(str, args), "--json"], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    if out.returncode != 0:
        return {"failed": f"exit {out.returncode}: {(out.stderr.strip().splitlines() or [''])[-1][:160]}"}
    return json.loads(out.stdout)


def library_section(args) -> list[str]:
    from tpu_pipeline.toolchain.device import CMSIS_NN, load_device

    board, rows = load_device("qemu-mps2-an386"), []
    with tempfile.TemporaryDirectory(prefix="bench-deploy-") as tmp:
        for i, (label, a, b) in enumerate(PAIRS):
            a, b = a.format(mlperf=args.mlperf), b.format(mlperf=args.mlperf)
            if not (Path(a).is_file() and Path(b).is_file()):
                rows.append(f"| {label} | not run: model missing (--mlperf) | | | | | | | |")
                continue
            rows.append(row(label, a, b, board, CMSIS_NN, Path(tmp) / f"pair{i}"))
            print(rows[-1], flush=True)
    return [
        HEADINGS[0], "",
        "`python tools/bench_deploy.py --mlperf DIR` (MLPerf Tiny's int8 models in DIR). Two models in one "
        "library share one TFLite Micro arena (`tpup_shared_init`: one MicroAllocator, heads overlap, tails "
        "stack), run interleaved by a plain application on QEMU mps2-an386 with CMSIS-NN kernels. Bytes; "
        "'separate' is the two whole arenas each model takes alone today (head + tail, each measured equal to "
        "its prediction); 'floor' the larger head plus both tails; 'identical': every output equal to host "
        "TFLite Micro running the model alone, and the measured arena equal to the prediction.", "",
        "| pair | A: head + tail | B: head + tail | separate | floor | shared, predicted | shared, measured "
        "| saved | identical |",
        "|---|---|---|---|---|---|---|---|---|", *rows, ""]


def fit_section(args) -> list[str]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-deploy-fit-") as tmp:
        for i, (label, a, b) in enumerate(PAIRS[:2] + PAIRS[3:]):
            a, b = a.format(mlperf=args.mlperf), b.format(mlperf=args.mlperf)
            if not (Path(a).is_file() and Path(b).is_file()):
                rows.append(f"| {label} | not run: model missing (--mlperf) | | | | | |")
                continue
            out = Path(tmp) / f"fit{i}"
            fit = cli("fit", a, b, "--device", "qemu-mps2-an386", "-o", out, "--time-limit", "60")
            if "failed" in fit:
                rows.append(f"| {label} | fit: {fit['failed']} | | | | | |")
                continue
            run = cli("run", out / Path(a).name, out / Path(b).name, "--backend", "qemu")
            same = run.get("models") and all(m.get("outputs_match") for m in run["models"])
            rows.append(f"| {label} | {fit['separate_arena_bytes_predicted']:,} | "
                        f"{fit['shared_arena_bytes_predicted']:,} | {run.get('shared_arena_bytes_predicted', 0):,} | "
                        f"{run.get('arena_bytes_measured', 0):,} | {fit['latency_s_predicted_total'] * 1e3:.2f} / "
                        f"{fit['baseline_latency_s_predicted_total'] * 1e3:.2f} | {'yes' if same else 'NO'} |")
            print(rows[-1], flush=True)
    return [
        HEADINGS[1], "",
        "`python tools/bench_deploy.py --mlperf DIR --only fit`: per pair `tpu-pipeline fit A B --device "
        "qemu-mps2-an386 -o OUT --time-limit 60 --json` (each model fitted under one shared head, the written "
        "models' shared arena within the board's room, least total predicted latency), then `tpu-pipeline run "
        "OUT/A OUT/B --backend qemu --json` (one library, one arena, each model in turn, CMSIS-NN). Bytes; "
        "'fit: separate' the two fitted models' whole arenas one each, 'fit: shared' fit's shared arena, 'run' "
        "the shared arena run predicts for the written models and what QEMU measured; latency: fit's predicted "
        "total (both models once) against the models as given; 'identical': each model's outputs equal to host "
        "TFLite Micro running it alone.", "",
        "| pair | fit: separate | fit: shared | run: predicted | run: measured | latency ms, fitted / as given "
        "| identical |",
        "|---|---|---|---|---|---|---|", *rows, ""]


def _bank_row(label: str, run: dict) -> str:
    if "failed" in run:
        return f"| {label} | {run['failed']} | | |"
    used = [b for b in run["banks"] if b["bytes_predicted"] or b["bytes_measured"]]
    cells = ", ".join(f"{b['name']} {b['bytes_predicted']:,} / {b['bytes_measured']:,}" for b in used)
    same = all(b["bytes_predicted"] == b["bytes_measured"] for b in run["banks"])
    return f"| {label} | {cells} | {'yes' if same else 'NO'} | {'yes' if run['outputs_match'] else 'NO'} |"


def banks_section(args) -> list[str]:
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.models import qemu_board
    from tpu_pipeline.toolchain.deploy.banks import firmware_reserve
    from tpu_pipeline.toolchain.device import load_device

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-deploy-banks-") as tmp:
        reserve = firmware_reserve(load_device("qemu-mps2-an500"))
        small = qemu_board(Path(tmp), "split-an500", [("ssram", 0x20000000, reserve + 16 * KIB, 0),
                                                      ("psram", 0x60000000, 32 * KIB, 0)])
        model = ROOT / "tests" / "fixtures" / "darts_s2b_int8.tflite"
        rows.append(_bank_row("darts_s2b_int8 on the an500 cut to 16 KiB + 32 KiB",
                              cli("run", model, "--backend", "qemu", "--device", small)))
        print(rows[-1], flush=True)
        face = Path(args.openmv or "/nonexistent") / "face_landmarks_192.tflite"
        if face.is_file():
            fitted = Path(tmp) / "face.tflite"
            fit = cli("fit", face, "--device", "stm32h743", "--input-outside-arena", "-o", fitted, "--time-limit", "90")
            h743 = qemu_board(Path(tmp), "qemu-an500-h743-banks", [
                ("axi_sram", 0x20000000, 512 * KIB, None), ("dtcm", 0x60000000, 128 * KIB, 0),
                ("sram1_3", 0x20100000, 288 * KIB, None), ("sram4", 0x20180000, 64 * KIB, None)])
            run = fit if "failed" in fit else \
                cli("run", fitted, "--backend", "qemu", "--device", h743, "-N", "1", "--timeout", "1200")
            rows.append(_bank_row("OpenMV face_landmarks_192, fit --device stm32h743 --input-outside-arena, "
                                  "on the an500 with the H743's banks", run))
        else:
            rows.append("| OpenMV face_landmarks_192 | not run: --openmv DIR not given | | |")
    return [
        HEADINGS[2], "",
        "`python tools/bench_deploy.py --only banks --openmv DIR` (OpenMV's lib/models in DIR). Per model "
        "`tpu-pipeline run MODEL --backend qemu --device BOARD --json`: export-mcu places the arena (whole, or "
        "head and tail apart) and an input outside the arena in the board's banks (deploy/banks.py), the "
        "linker puts each buffer in its bank's section, the firmware reports each buffer's address and bytes. "
        "Boards: the an500 with its SSRAM cut to the firmware's reserve + 16 KiB and a 32 KiB bank on its "
        "PSRAM; the an500 with the STM32H743's four banks (sizes and stated wait states; QEMU has no H743). "
        "Per bank: bytes predicted / measured.", "",
        "| model and board | per bank, predicted / measured | = prediction | outputs identical |",
        "|---|---|---|---|", *rows, ""]


def _merge(path: Path, fresh: dict[int, list[str]]) -> str:
    """The file's sections (told apart by their `## ` headings), in SECTIONS order, the fresh ones replaced."""
    old = re.split(r"(?m)^(?=## )", path.read_text()) if path.is_file() else []
    kept = {}
    for part in old:
        heading = part.splitlines()[0] if part.strip() else ""
        for i, h in enumerate(HEADINGS):
            if heading == h:
                kept[i] = part.rstrip("\n").splitlines() + [""]
    return "\n".join(line for i in range(len(SECTIONS)) for line in fresh.get(i) or kept.get(i, []))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="models", help="unused (the zoo); bench.py passes it to every benchmark")
    ap.add_argument("--mlperf", default=os.environ.get("TPUP_MLPERF_DIR", ""), help="MLPerf Tiny's int8 models")
    ap.add_argument("--openmv", default=os.environ.get("TPUP_OPENMV_DIR", ""), help="OpenMV's lib/models")
    ap.add_argument("--only", choices=SECTIONS, help="rerun one section, keep the others in --out")
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench" / "deploy.md"))
    args = ap.parse_args()
    makers = (library_section, fit_section, banks_section)
    fresh = {i: make(args) for i, make in enumerate(makers) if args.only in (None, SECTIONS[i])}
    Path(args.out).write_text(_merge(Path(args.out), fresh))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
