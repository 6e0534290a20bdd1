#!/usr/bin/env python3
"""TinyEngine's own models, side by side with TinyEngine's code generator, in one run.

    python tools/bench_tinyengine.py --tinyengine DIR [--time-limit S] [--only vww]

DIR is a checkout of mit-han-lab/tinyengine (default: $TINYENGINE_DIR, else ../peers/tinyengine
beside this checkout); its `code_generator/` runs in a virtual environment of its own with
numpy < 2 (made under ~/.cache/tpu-pipeline/peers on first use), on the three int8 MCUNet models
it ships in assets/ (float input and output around an int8 body). For each model:

- TinyEngine: its planned peak SRAM with whole layers (in-place depthwise), and its patch-based
  schedule (getPatchParams, PatchResizer, GeneralMemoryScheduler as in examples/vww_patchbased.py)
  for 2-4 patches per side and every split layer 1-15: the best overall, and the best in the
  range the issue quotes (split 2-11). TinyEngine counts its activation buffers only: no
  interpreter, its per-layer data compiled into flash; its patch stage reads the input image from
  the application's buffer, outside the figure.
- tpu-pipeline: `fit --int8-io --input-outside-arena` (the same counting of the input), written,
  built into the harness firmware and run on the emulated Cortex-M4F (QEMU, CMSIS-NN kernels):
  the whole arena the firmware reports (`arena_used_bytes` = head + persistent tail, both
  measured; outputs bit-identical to the host), with patches off (--no-patches) and on
  (--objective memory), the fastest that fits in TinyEngine's best figure (--budget), and the
  smallest with the input inside the arena. Latency overheads are the MCU cost model's
  predictions against the model as converted.
Writes docs/bench/tinyengine.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OUT = REPO / "docs" / "bench" / "tinyengine.md"
MODELS = ("vww", "detection", "mcunetv2_large")
DEVICE = "qemu-mps2-an386"
PEER_PACKAGES = ("numpy<2", "flatbuffers", "matplotlib", "tqdm")

# Runs inside TinyEngine's environment: prints one JSON line per (patches, split) of one model.
PEER = r"""
import contextlib, io, json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
from code_generator.CodegenUtilTFlite import GenerateSourceFilesFromTFlite
from code_generator.CodeGenerator import CodeGenerator
from code_generator.GeneralMemoryScheduler import GeneralMemoryScheduler
from code_generator.InputResizer import PatchResizer
from code_generator.PatchBasedUtil import getPatchParams
from code_generator.TfliteConvertor import TfliteConvertor

path = sys.argv[2]
def quiet(fn):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return fn()

def patched(n, split, d):
    conv = TfliteConvertor(path); conv.parseOperatorInfo(); layer = conv.layer
    pp = getPatchParams(layer, split, n)
    PatchResizer(layer).patchResize(pp["layer_cnt"], pp["grain_rf"], pp["grain_rf_height"])
    ms = GeneralMemoryScheduler(layer, False, False, outputTables=[], inplace=True,
                                mem_visual_path=os.path.join(d, "s.png"), VisaulizeTrainable=False)
    ms.USE_INPLACE = True
    ms.allocateMemory()
    first = layer[0].params
    last = [l for l in layer if l.params.get("is_patch")][-1].params
    # Does the generated patch loop tile the real image and the split tensor exactly? (It reads
    # rows of (patch width - pads) * n pixels and writes n x n tiles of the last patch op's output.)
    exact = ((first["input_w"] - pp["pad_l"] - pp["pad_r"]) * n == width
             and (first["input_h"] - pp["pad_l"] - pp["pad_r"]) * n == height
             and last["output_h"] * n == pp["output_h"] and last["output_w"] * n == pp["output_w"])
    CodeGenerator(memsche=ms, inplace=True, unsigned_input=False, patch_params=pp, FP_output=False,
                  profile_mode=False, fp_requantize=False, tflite_op=False, dummy_address=False,
                  outputTables=[]).codeGeneration()
    return ms.buffers["input_output"], exact

conv = TfliteConvertor(path); conv.parseOperatorInfo()
height, width = conv.layer[0].params["input_h"], conv.layer[0].params["input_w"]
with tempfile.TemporaryDirectory() as d:
    os.chdir(d)
    print(json.dumps({"whole": quiet(lambda: GenerateSourceFilesFromTFlite(path, life_cycle_path=None))}), flush=True)
    for n in (2, 3, 4):
        for split in range(1, 16):
            try:
                peak, exact = quiet(lambda: patched(n, split, d))
            except Exception as exc:
                peak, exact = None, False
            print(json.dumps({"patches": n, "split": split, "peak": peak, "exact": bool(exact)}), flush=True)
"""


def find_tinyengine(given: str | None) -> Path | None:
    for cand in (given, os.environ.get("TINYENGINE_DIR"), REPO.parent / "peers" / "tinyengine"):
        if cand and (Path(cand) / "code_generator" / "CodegenUtilTFlite.py").is_file():
            return Path(cand).resolve()
    return None


def peer_python() -> Path:
    """TinyEngine's own environment (numpy < 2: its code generator overflows int8 under numpy 2)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tpu-pipeline" / "peers" / "tinyengine-venv"
    py = cache / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(cache)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
    return py


def run_peer(te: Path, model: Path) -> dict:
    proc = subprocess.run([str(peer_python()), "-c", PEER, str(te), str(model)], capture_output=True, text=True,
                          timeout=3600)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if not rows:
        raise RuntimeError(f"TinyEngine failed on {model.name}: {proc.stderr.strip().splitlines()[-1:]}")
    whole = rows[0]["whole"]
    patched = [r for r in rows[1:] if r["peak"]]
    best = min(patched, key=lambda r: (r["peak"], r["patches"], r["split"]))
    quoted = min((r for r in patched if 2 <= r["split"] <= 11), key=lambda r: (r["peak"], r["patches"], r["split"]))
    # The smallest plan whose generated loop tiles the image exactly (the others read and write
    # past their tensors: their peak is a figure, not a program that computes the model).
    exact = min((r for r in patched if r.get("exact")), key=lambda r: (r["peak"], r["patches"], r["split"]),
                default=None)
    return {"whole": whole, "best": best, "quoted": quoted, "best_exact": exact}


def ours(model: Path, tmp: Path, label: str, time_limit: float, **options) -> dict:
    """fit with `options`, written and measured in the CMSIS-NN firmware on QEMU."""
    from tpu_pipeline.runtime.backends.qemu import run_on_qemu
    from tpu_pipeline.toolchain.device import CMSIS_NN, load_device
    from tpu_pipeline.toolchain.fit import fit_model

    t0 = time.time()
    fitted = fit_model(model, kernels=CMSIS_NN, time_limit=time_limit, **options)
    r = fitted.result
    out = {"label": label, "fits": r.fits, "head": r.head, "tail": fitted.tail_target,
           "predicted": r.head + (fitted.tail_target or 0), "baseline": r.baseline_peak + (r.baseline_tail or 0),
           "overhead": r.selection.latency_s / r.baseline_latency_s - 1 if r.baseline_latency_s else None,
           "ops": len(r.graph.ops), "variants": [v.label for v in r.selection.variants if v.kind != "as-is"],
           "fit_s": round(time.time() - t0, 1)}
    if not r.fits:
        return out
    path = tmp / f"{model.stem}_{label}.tflite"
    path.write_bytes(fitted.data)
    q = run_on_qemu(path, load_device(DEVICE), CMSIS_NN, iterations=1, quiet=True, timeout=1800)
    out.update(measured=q.arena_used_bytes, head_measured=q.head_bytes, tail_measured=q.tail_bytes,
               outputs_match=q.outputs_match, error=q.error)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="models", help="(unused: TinyEngine's models come with it)")
    ap.add_argument("--tinyengine", help="a checkout of mit-han-lab/tinyengine")
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds for each fit's search (default 120)")
    ap.add_argument("--only", nargs="+", choices=MODELS)
    args = ap.parse_args()
    te = find_tinyengine(args.tinyengine)
    cmd = "python tools/bench_tinyengine.py --tinyengine DIR" + (f" --time-limit {args.time_limit:g}"
                                                                  if args.time_limit != 120 else "")
    if te is None:
        print("TinyEngine not found: pass --tinyengine DIR (a checkout of mit-han-lab/tinyengine) or set "
              "TINYENGINE_DIR; the section is left as it is", file=sys.stderr)
        return 0
    results = json.loads(OUT.with_suffix(".json").read_text()) if OUT.with_suffix(".json").exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or MODELS:
            model = te / "assets" / f"{name}.tflite"
            print(f"== {name}: TinyEngine", flush=True)
            row = {"tinyengine": run_peer(te, model)}
            best = row["tinyengine"]["best"]["peak"]
            for label, options in (
                    ("whole layers", dict(objective="memory", int8_io=True, input_outside_arena=True, patches=False)),
                    ("smallest", dict(objective="memory", int8_io=True, input_outside_arena=True)),
                    ("fastest within TinyEngine's best", dict(budget=best, int8_io=True, input_outside_arena=True)),
                    ("smallest, input in the arena", dict(objective="memory", int8_io=True))):
                print(f"== {name}: {label}", flush=True)
                row[label] = ours(model, Path(tmp), label.split(",")[0].replace(" ", "_").replace("'", ""),
                                  args.time_limit, **options)
                print(json.dumps(row[label]), flush=True)
            results[name] = row
            OUT.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    OUT.write_text(render(results, cmd))
    return 0


def _b(x) -> str:
    return "-" if x is None else f"{x:,}"


def render(results: dict, cmd: str) -> str:
    lines = ["## TinyEngine's own models, side by side with TinyEngine", "", f"Command: `{cmd}` (see the script's "
             "docstring; TinyEngine's code generator runs in its own environment in the same run).", "",
             "Bytes. TinyEngine: its planned peak SRAM (activation buffers; no interpreter, per-layer data in flash, "
             "its patch stage reads the input image from the application's buffer). tpu-pipeline: `fit --int8-io "
             "--input-outside-arena` (the same counting of the input), **measured** in the harness firmware on the "
             "emulated Cortex-M4F with CMSIS-NN kernels: `arena_used_bytes` = head + persistent tail (TFLite Micro's "
             "node structs, eval tensors, scratch handles), outputs bit-identical to the host's TFLite Micro. "
             "Every figure measured equals fit's prediction unless the cell says otherwise. Latency: the MCU cost "
             "model's prediction against the model as converted.", "",
             "| model | TinyEngine whole layers | TinyEngine best patched (patches, split) | TinyEngine best, split 2-11 "
             "| ours, whole layers: arena (head + tail), latency | ours, smallest: arena (head + tail), latency "
             "| ours within TinyEngine's best: arena, latency | ours smallest, input in the arena | as converted "
             "(head + tail) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    within = "fastest within TinyEngine's best"
    for name, row in results.items():
        t = row["tinyengine"]

        def cell(r):
            if not r.get("fits"):
                return f"does not fit (smallest head {_b(r.get('head'))})"
            m = r.get("measured")
            ok = "" if r.get("outputs_match") else " (outputs differ!)"
            ok += "" if m == r.get("predicted") else f" (NOT the predicted {_b(r.get('predicted'))})"
            return (f"**{_b(m)}** ({_b(r.get('head_measured'))} + {_b(r.get('tail_measured'))}), "
                    f"{r['overhead']:+.1%}{ok}")

        lines.append(
            f"| {name} | {_b(t['whole'])} | {_b(t['best']['peak'])} ({t['best']['patches']}, {t['best']['split']}) "
            f"| {_b(t['quoted']['peak'])} ({t['quoted']['patches']}, {t['quoted']['split']}) "
            f"| {cell(row['whole layers'])} | {cell(row['smallest'])} | {cell(row[within])} "
            f"| {cell(row['smallest, input in the arena'])} | {_b(row['smallest']['baseline'])} |")
    lines += ["", "What each of ours chose (patch stages and copies, beyond the harness's kernels on every "
              "convolution):", ""]
    for name, row in results.items():
        for label in ("whole layers", "smallest"):
            r = row[label]
            lines.append(f"- {name}, {label}: predicted {_b(r['predicted'])} B (head {_b(r['head'])} + tail "
                         f"{_b(r['tail'])}), {r['ops']} ops, fit {r['fit_s']} s; "
                         + ("; ".join(r["variants"]) if r["variants"] else "no patches"))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
