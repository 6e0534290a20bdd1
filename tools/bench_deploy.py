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
"""

from __future__ import annotations

import argparse
import json
import os
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


def main() -> int:
    from tpu_pipeline.toolchain.device import CMSIS_NN, load_device

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="models", help="unused (the zoo); bench.py passes it to every benchmark")
    ap.add_argument("--mlperf", default=os.environ.get("TPUP_MLPERF_DIR", ""), help="MLPerf Tiny's int8 models")
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench" / "deploy.md"))
    args = ap.parse_args()
    board = load_device("qemu-mps2-an386")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-deploy-") as tmp:
        for i, (label, a, b) in enumerate(PAIRS):
            a, b = a.format(mlperf=args.mlperf), b.format(mlperf=args.mlperf)
            if not (Path(a).is_file() and Path(b).is_file()):
                rows.append(f"| {label} | not run: model missing (--mlperf) | | | | | | | |")
                continue
            rows.append(row(label, a, b, board, CMSIS_NN, Path(tmp) / f"pair{i}"))
            print(rows[-1], flush=True)
    text = "\n".join([
        "## Several models, one arena (export-mcu --library, QEMU)", "",
        "`python tools/bench_deploy.py --mlperf DIR` (MLPerf Tiny's int8 models in DIR). Two models in one "
        "library share one TFLite Micro arena (`tpup_shared_init`: one MicroAllocator, heads overlap, tails "
        "stack), run interleaved by a plain application on QEMU mps2-an386 with CMSIS-NN kernels. Bytes; "
        "'separate' is the two whole arenas each model takes alone today (head + tail, each measured equal to "
        "its prediction); 'floor' the larger head plus both tails; 'identical': every output equal to host "
        "TFLite Micro running the model alone, and the measured arena equal to the prediction.", "",
        "| pair | A: head + tail | B: head + tail | separate | floor | shared, predicted | shared, measured "
        "| saved | identical |",
        "|---|---|---|---|---|---|---|---|---|", *rows, ""])
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
