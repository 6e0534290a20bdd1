#!/usr/bin/env python3
"""Benchmark `tpu-pipeline fit` (tpu_pipeline/toolchain/fit) on the zoo and write docs/bench/fit.md.

    python tools/bench_fit.py --models models [--thirdparty DIR] [--out docs/bench/fit.md] [--time-limit 30]
                              [--sections targets ablation frontier wall-time] [--only MODEL ...]

Four tables. *Targets*: `fit` with a budget, as a user runs it, every
written model checked in LiteRT and TFLite Micro and its real TFLite Micro head measured; the
whole arena (head + the persistent tail on the 32-bit target) beside the head, and the same for
the model as converted. `--thirdparty DIR` (default $THIRDPARTY_MODELS) adds MLPerf Tiny's DS-CNN
keyword spotter (`mlperf-tiny/kws_ref_model.tflite` under DIR) when it is there.
*Ablation*: per int8 model, the smallest whole arena `fit --objective memory` reaches with each
kind of variant added in turn.
*Frontier*: per int8 model, `fit --objective memory --pareto`: the smallest arena reachable (the
written model checked the same way) and, read off the frontier (each point the fastest selection
under a peak, CP-SAT), the predicted latency overhead at 1/2, 1/4 and 1/8 of today's arena
(TFLite Micro's own planner on the model as converted) and at TASO's headline memory ratio 2.2x
of the proven optimal arena of the model as it is. *Wall time*: the installed command with
`--objective memory` and its default time limit on every zoo model, timed from outside
(`--sections` reruns only the sections named and keeps the page's others as they are).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena  # noqa: E402
from tpu_pipeline.toolchain.fit import fit_model  # noqa: E402

# (model, whole-arena budget or None: half of today's, why, fit options)
TARGETS = [("mobilenet_v2_int8", 320 * 1024, "320 KiB: a SparkFun Edge's 384 KB SRAM with room for the rest",
            {"time_limit": 120}),
           ("mobilenet_v2_int8", 207_514, "8x below today's head + tail (issue 23)", {"time_limit": 600}),
           ("mobilenet_v2_int8", 207_514, "the same, the input outside the arena",
            {"input_outside_arena": True, "time_limit": 600}),
           ("mobilenet_v1_025_96_int8", None, "half of today's arena", {}),
           ("mlperf-tiny/kws_ref_model", 40_000, "MLPerf Tiny's DS-CNN at 40,000 B", {})]
# what each kind of variant contributes (fit --objective memory): the builtin kernels without and
# with patches by copies, the head alone selected (fit before issue 23), then the harness's kernels
# without and with patches (copies and stages); 1 -> 3 -> 5 add one kind each
ABLATION = [("builtin kernels, no patches", dict(harness=False, patches=False)),
            ("builtin + patch copies, head selected", dict(harness=False, head_only=True)),
            ("builtin + patch copies", dict(harness=False)),
            ("harness kernels, no patches", dict(patches=False)),
            ("harness kernels + patches (copies, stages)", {})]
FRONTIER = ["mobilenet_v1_025_96_int8", "mobilenet_v2_int8", "mobilenet_v1_int8", "resnet50_int8", "inception_v1_int8",
            "randwire_ws_cifar_int8", "randwire_ws_small_int8", "darts_v2_cifar_int8", "darts_v2_imagenet_int8",
            "nasnet_a_cifar_int8", "amoebanet_a_cifar_int8", "hrnet_small_int8", "swiftnet_hpd_int8",
            "swiftnet_cell_a_int8"]
TASO_RATIO = 2.2  # Wen et al.: 2.2x less memory for 15 % more time (GoogleNet, Cortex-A15)


def kib(n) -> str:
    return "—" if n is None else f"{n / 1024:,.1f}"


def checked(f) -> str:
    ok = all(v.bit_exact for v in f.verification if not v.skipped) and len(f.verification) == 2
    return "bit-identical" if ok else "DIFFERS"


def today(path: Path) -> int:
    """TFLite Micro's own arena head for the model as converted (no offline plan), with the CMSIS-NN
    kernels' scratch (tpu_pipeline.toolchain.memory.tflm_target: equal to the firmware's on every QEMU run); never
    below what the host's TFLite Micro (reference kernels) measures."""
    from tpu_pipeline.toolchain.loader import load_exact
    from tpu_pipeline.toolchain.device import CMSIS_NN
    from tpu_pipeline.toolchain.memory.tflm_target import target_head

    return max(measure_tflm_arena(path).head, target_head(load_exact(path)[1], CMSIS_NN)[0])


def cut_short(r) -> bool:
    """The selection stopped at the time limit (the best of the variants built so far)."""
    return any("stopped at the time limit" in n for n in r.notes)


def measured(f) -> str:
    """The host's TFLite Micro head for the written model, which must equal its prediction."""
    return kib(f.head_measured) + ("" if f.head_measured == f.head_predicted_host else " (NOT as predicted)")


def today_whole(path: Path) -> int:
    """Today's whole arena: TFLite Micro's own head (`today`) + the model's tail on the 32-bit target
    with the CMSIS-NN kernels."""
    from tpu_pipeline.toolchain.loader import load_exact
    from tpu_pipeline.toolchain.device import CMSIS_NN
    from tpu_pipeline.toolchain.memory.tflm_target import target_tail

    return today(path) + (target_tail(load_exact(path)[1], CMSIS_NN).bytes or 0)


def model_path(models: Path, thirdparty: Path | None, name: str) -> Path | None:
    for root in (models, thirdparty):
        if root is not None and (root / f"{name}.tflite").exists():
            return root / f"{name}.tflite"
    return None


def target_rows(models: Path, thirdparty: Path | None, time_limit: float) -> list[str]:
    rows = []
    for name, budget, why, options in TARGETS:
        path = model_path(models, thirdparty, name)
        if path is None:
            continue
        base, whole = today(path), today_whole(path)
        budget = budget or whole // 2
        t0 = time.monotonic()
        options = dict(options)
        limit = options.pop("time_limit", time_limit)
        f = fit_model(path, budget=budget, time_limit=limit, **options)
        secs = time.monotonic() - t0
        r = f.result
        over = r.selection.latency_s / r.baseline_latency_s - 1
        fitted = r.head + (f.tail_target or 0)
        larger = " (LARGER than as converted)" if fitted > whole else ""
        rows.append(f"| {path.stem} | {kib(base)} + {kib(whole - base)} | {kib(budget)} ({why}) | "
                    f"{'yes' if r.fits else 'no'}{' (t/o)' if cut_short(r) else ''} | {kib(r.head)} | {measured(f)} | {base / r.head:.2f}x | "
                    f"{kib(fitted)}{larger} | {whole / fitted:.2f}x | {over:+.1%} | {len(r.graph.ops)} | "
                    f"{'yes' if r.schedule.proven_optimal else 'no'} | {checked(f) if r.fits else '—'} | "
                    f"{secs:.0f}{f' (limit {limit:g})' if limit != time_limit else ''} |")
        print(rows[-1], flush=True)
    return rows


def ablation_rows(models: Path, time_limit: float) -> list[str]:
    rows = []
    for name in FRONTIER:
        path = models / f"{name}.tflite"
        if not path.exists():
            continue
        whole = today_whole(path)
        cells, last = [], None
        for _, options in ABLATION:
            f = fit_model(path, objective="memory", time_limit=time_limit, **options)
            r = f.result
            arena = r.head + (f.tail_target or 0)
            cells.append(f"{kib(arena)} ({whole / arena:.2f}x)" + (" LARGER" if arena > whole else "")
                         + (" t/o" if cut_short(r) else ""))
            last = r
        over = last.selection.latency_s / last.baseline_latency_s - 1
        rows.append(f"| {name} | {kib(whole)} | {' | '.join(cells)} | {over:+.1%} |")
        print(rows[-1], flush=True)
    return rows


def _cell(p, r) -> str:
    if p is None:
        return "—"
    if isinstance(p, str):
        return "t/o"
    return f"{p.latency_s / r.baseline_latency_s - 1:+.1%}"


def fit_model_optimum(path: Path) -> int:
    """The proven optimal peak of the model as it is (the baseline every fit reports)."""
    from tpu_pipeline.toolchain.loader import load_exact
    from tpu_pipeline.toolchain.schedule import schedule

    return schedule(load_exact(path)[1], time_limit=10).peak


def frontier_rows(models: Path, time_limit: float) -> list[str]:
    rows = []
    for name in FRONTIER:
        path = models / f"{name}.tflite"
        if not path.exists():
            continue
        base, whole = today(path), today_whole(path)
        optimum = fit_model_optimum(path)
        probes = (whole // 2, whole // 4, whole // 8, int((optimum + whole - base) / TASO_RATIO))
        t0 = time.monotonic()
        f = fit_model(path, objective="memory", want_pareto=True, probe_budgets=probes, time_limit=time_limit)
        secs = time.monotonic() - t0
        r = f.result
        over = [r.probes.get(b) for b in probes]
        cells = [_cell(p, r) for p in over]
        taso_cell = cells.pop()
        arena = r.head + (f.tail_target or 0)
        rows.append(f"| {name} | {kib(base)} + {kib(whole - base)} | {kib(r.baseline_peak)} | {kib(arena)} "
                    f"({whole / arena:.2f}x; head {kib(r.head)}) | {measured(f)} | {checked(f)} | {' | '.join(cells)} | {taso_cell} | {len(r.frontier)} | "
                    f"{r.variants_evaluated} / {r.candidates} | {'yes' if r.frontier_complete else 'no'} | "
                    f"{secs:.0f} |")
        print(rows[-1], flush=True)
    return rows


def wall_time_rows(models: Path) -> list[str]:
    """`tpu-pipeline fit MODEL --objective memory` as a user runs it (the installed command, default
    time limit, the runtime checks included), timed from outside, on every model of the zoo."""
    import json
    import subprocess
    import tempfile

    command = Path(sys.executable).parent / "tpu-pipeline"
    rows = []
    for path in sorted(models.glob("*.tflite")):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.monotonic()
            p = subprocess.run([str(command), "fit", str(path), "--objective", "memory",
                                "-o", str(Path(tmp) / "out.tflite"), "--json"], capture_output=True, text=True)
            secs = time.monotonic() - t0
        if p.returncode != 0:
            last = (p.stderr.strip().splitlines() or ["?"])[-1]
            rows.append(f"| {path.stem} | — | — | — | — | exit {p.returncode}: {last} | — | {secs:.0f} |")
        else:
            d = json.loads(p.stdout)
            checks = [v for v in d["verification"] if not v["skipped"]]
            agree = "bit-identical" if all(v["bit_exact"] for v in checks) else \
                "within float rounding" if all(v["ok"] for v in checks) else "DIFFERS"
            rows.append(f"| {path.stem} | {d['ops']} | {kib(d['baseline_peak_bytes'])} | "
                        f"{kib(d['arena_head_bytes'])} | {'yes' if d['head_matches_prediction'] else 'NO'} | "
                        f"{agree} | {d['seconds']:.0f} | {secs:.0f} |")
        print(rows[-1], flush=True)
    return rows


WALL_TIME_HEADER = "### Wall time on every zoo model, `tpu-pipeline fit MODEL --objective memory -o OUT --json`"


def wall_time_section(rows: list[str]) -> list[str]:
    return [
        WALL_TIME_HEADER,
        "",
        "The installed command as a user runs it, with the default time limit (30 s for the search), timed from "
        "outside: start-up, search, scheduling and planning the chosen graph, writing, and the checks in LiteRT "
        "and TFLite Micro (refresh with `python tools/bench_fit.py --models models --sections wall-time`). Target (issue "
        "12): at most 60 s on every model. *Ops*: of the written model; *as is*: the peak of the best order found for the model as it is (KiB; "
        "proven optimal except on the three large RandWire stages, issue 15); *head*: the CMSIS-NN arena head of "
        "the smallest selection (KiB); *as "
        "predicted*: the host TFLite Micro's measured head equals our prediction; *fit*: the seconds of the "
        "search, scheduling and planning (what `--time-limit` bounds); *total*: the command, checks included "
        "(they run each model twice per runtime, and TFLite Micro's reference kernels take seconds per run on "
        "the large models).",
        "",
        "| model | ops | as is | head | as predicted | checked | fit s | total s |",
        "|---|---:|---:|---:|---|---|---:|---:|",
        *rows,
        "",
        _wall_time_summary(rows),
    ]


def _wall_time_summary(rows: list[str]) -> str:
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    timed = [(c[0], int(c[-2]), int(c[-1])) for c in cells if c[-2].isdigit()]
    failed = [c[0] for c in cells if not c[-2].isdigit()]
    over = [f"{m} ({total} s, fit {fit} s)" for m, fit, total in timed if total > 60]
    return (f"Summary: {len(cells)} models; fit at most {max(f for _, f, _ in timed)} s; total at most 60 s on "
            f"{len(timed) - len(over)} of {len(timed)}" + (f"; over 60 s: {', '.join(over)}" if over else "") +
            (f"; failed: {', '.join(failed)}" if failed else "") + ".")


INTRO = " ".join([
    "## Fitting a model into an arena budget (`tpu-pipeline fit`)\n\n"
    "The zoo's int8 models (docs/fit.md explains the method); each section names the command that made it. "
    "Heads are for the CMSIS-NN kernels, their im2col buffers included. *Today* = the arena head TFLite "
    "Micro's own planner gives the model as converted (+ its persistent tail on the 32-bit target: the "
    "*whole* arena a board needs); *optimum* = the proven optimal peak of the model as it is (our schedule "
    "and plan, no rewrite). KiB. Budgets and the memory objective count the whole arena (head + tail).",
    "Latency is the device cost model's prediction for qemu-mps2-an386 with CMSIS-NN kernels (fitted to QEMU "
    "instruction counts; see the MCU section): a prediction, not a measurement. *Checked*: the written model "
    "against the input on 2 random inputs, LiteRT and TFLite Micro. *Measured* = the head the host's TFLite "
    "Micro (reference kernels) allocates for the written model with our offline plan; it must equal our "
    "prediction for those kernels (the CMSIS-NN firmware's head is checked against the prediction on QEMU in "
    "the tests)."])


def targets_section(rows: list[str], command: str) -> list[str]:
    return [
        "### Targets (issues 12 and 23), `fit --budget`",
        "",
        f"{command}. *Today*: head + tail as converted. *Vs today*: the head's saving; *whole*: the fitted "
        "model's head + tail, and its saving (a whole arena above today's would say LARGER). A target's own "
        "time limit, where it has one, is in its row; (t/o): the selection stopped at the time limit.",
        "",
        "| model | today (head + tail) | budget (whole) | fits | head | measured | vs today | whole | whole vs today "
        "| latency | ops | order proven | checked | seconds |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
        *rows,
    ]


def ablation_section(rows: list[str], command: str) -> list[str]:
    return [
        "### What each kind of variant contributes, `fit --objective memory` (ablation)",
        "",
        f"{command}. The smallest whole arena (head + tail, KiB, and the saving against today's head + tail) "
        "with each kind of variant: the builtin kernels without patches, with patches by copies (selected on "
        "the head alone, as fit did before the whole arena counted, and on the whole arena), the harness's "
        "kernels without patches (requantization in flash, folded PADs, overlapped, in-place and direct "
        "variants), and with patches (by copies and as stages). Columns 1, 3 and 5 add one kind each; "
        "t/o: that selection stopped at the time limit. Latency: the last column's predicted overhead.",
        "",
        "| model | today (whole) | " + " | ".join(label for label, _ in ABLATION) + " | latency |",
        "|---|---:|" + "---:|" * len(ABLATION) + "---:|",
        *rows,
    ]


def frontier_section(rows: list[str], command: str) -> list[str]:
    return [
        "### The frontier per model, `fit --objective memory --pareto`",
        "",
        f"{command}. Smallest = the smallest whole arena (head + tail) `fit` reaches (written and checked), its "
        "saving against today's head + tail, and its head (*measured*: the host's check of that head). 1/2, "
        "1/4, 1/8: the predicted latency overhead of the fastest selection within that fraction of today's "
        "whole arena (the same search, asked for that budget); — = not reachable; t/o = none found within the "
        f"time limit. TASO: the fastest selection within (optimum + today's tail) / {TASO_RATIO} (TASO's "
        f"headline: {TASO_RATIO}x less memory for 15 % more time). Points: frontier points found; complete: the "
        "sweep reached the smallest arena within the time limit. Built = variants built and measured / patch "
        "candidates (the rest were priced by floors or estimates only, see docs/fit.md).",
        "",
        "| model | today (head + tail) | optimum | smallest (whole) | measured | checked | 1/2 | 1/4 | 1/8 | TASO 2.2x "
        "| points | built | complete | seconds |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|",
        *rows,
    ]


SECTIONS = ("targets", "ablation", "frontier", "wall-time")


def page_sections(text: str) -> dict[str, str]:
    """The page's sections by name (the intro under "intro"), to keep the ones not rerun."""
    out, names = {}, dict(zip(("### Targets", "### What each kind", "### The frontier", WALL_TIME_HEADER), SECTIONS))
    parts = text.split("\n### ")
    out["intro"] = parts[0]
    for part in parts[1:]:
        part = "### " + part
        name = next((name for head, name in names.items() if part.startswith(head)), None)
        # a section another tool writes (tools/bench_fit_speed.py) is kept under its heading
        out[name or part.splitlines()[0]] = part.rstrip("\n")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="models")
    ap.add_argument("--thirdparty", default=os.environ.get("THIRDPARTY_MODELS"),
                    help="a folder of third-party models (mlperf-tiny/kws_ref_model.tflite: MLPerf Tiny's DS-CNN)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench" / "fit.md"))
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                    help="rerun only these sections; the page's others are kept as they are (default: all)")
    ap.add_argument("--only", nargs="+", metavar="MODEL", help="only these models (file stems)")
    args = ap.parse_args()
    models = Path(args.models)
    thirdparty = Path(args.thirdparty) if args.thirdparty else None
    if args.only:
        global TARGETS, FRONTIER
        TARGETS = [t for t in TARGETS if Path(t[0]).name in args.only]
        FRONTIER = [m for m in FRONTIER if m in args.only]
    out = Path(args.out)
    kept = page_sections(out.read_text()) if out.exists() else {}
    command = (f"`python tools/bench_fit.py --models models --thirdparty DIR --time-limit {args.time_limit:g}"
               + (f" --sections {' '.join(args.sections)}" if args.sections != list(SECTIONS) else "")
               + (f" --only {' '.join(args.only)}" if args.only else "") + "`")
    fresh = {}
    if "targets" in args.sections:
        fresh["targets"] = "\n".join(targets_section(target_rows(models, thirdparty, args.time_limit), command))
    if "ablation" in args.sections:
        fresh["ablation"] = "\n".join(ablation_section(ablation_rows(models, args.time_limit), command))
    if "frontier" in args.sections:
        fresh["frontier"] = "\n".join(frontier_section(frontier_rows(models, args.time_limit), command))
    if "wall-time" in args.sections:
        fresh["wall-time"] = "\n".join(wall_time_section(wall_time_rows(models)))
    page = [INTRO] + [fresh.get(name) or kept.get(name) for name in SECTIONS] + \
        [text for name, text in kept.items() if name not in SECTIONS and name != "intro"]
    out.write_text("\n\n".join(part for part in page if part) + "\n")
    print(f"wrote {out}")
    return 0

    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
