"""Benchmark the arena planners; writes docs/bench/planners.md.

    python tools/bench_planners.py [--time-limit S] [--models GLOB] [--no-verify]

1. The MiniMalloc instances in ../shared/benchmarks/minimalloc (each packs into exactly
   1,048,576 bytes): lower bound, TFLM's and TFLite's greedy placements, ours, seconds, proven.
2. Every zoo model (models/*.tflite; the committed fixtures when the zoo is absent), TFLite Micro
   semantics in the stored order: lower bound (peak live bytes), TFLite's best-fit and TFLM's
   greedy planner on the same buffers, ours (`plan_for_tflm`, auto), seconds, proven, and the head
   real TFLite Micro reports with our offline plan.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tpu_pipeline.toolchain.errors import ToolchainError  # noqa: E402
from tpu_pipeline.toolchain.loader import load  # noqa: E402
from tpu_pipeline.toolchain.memory import Lifetimes, lifetimes, live_lower_bound, plan_buffers, plan_for_tflm  # noqa: E402
from tpu_pipeline.toolchain.memory import tflite_arena, tflm_greedy  # noqa: E402
from tpu_pipeline.toolchain.memory.minimalloc import read_csv  # noqa: E402
from tpu_pipeline.toolchain.tflite import model_to_bytes, with_offline_plan  # noqa: E402
from tpu_pipeline.toolchain.tflite.metadata import total_tensor_count  # noqa: E402
from tpu_pipeline.toolchain.tflite.io import write_bytes_atomic  # noqa: E402

MINIMALLOC = ROOT.parent / "shared" / "benchmarks" / "minimalloc"


def _pct(x: int, base: int) -> str:
    return f"{100.0 * (x - base) / base:+.1f} %" if base else "-"


def bench_minimalloc(time_limit: float) -> list[str]:
    rows = ["| instance | buffers | capacity | lower bound | TFLM greedy | TFLite best fit | ours | over capacity | "
            "seconds | proven |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    files = sorted(MINIMALLOC.glob("*.csv")) if MINIMALLOC.exists() else []
    reached = total = 0
    for f in files:
        p = read_csv(f)
        lb = live_lower_bound(p.buffers)
        cap = p.capacity or lb
        lt = Lifetimes(p.buffers, max(b.last for b in p.buffers) + 1)
        tflm = tflm_greedy(lt).size
        tfl = tflite_arena(lt, alignment=1).size
        t0 = time.monotonic()
        plan = plan_buffers(p.buffers, "auto", time_limit)
        sec = time.monotonic() - t0
        total += 1
        reached += plan.size <= cap
        rows.append(f"| {f.name} | {len(p.buffers)} | {cap:,} | {lb:,} | {tflm:,} ({_pct(tflm, cap)}) | "
                    f"{tfl:,} ({_pct(tfl, cap)}) | **{plan.size:,}** | {_pct(plan.size, cap)} | {sec:.2f} | "
                    f"{'yes' if plan.proven_optimal else 'no'} ({plan.planner}) |")
        print(rows[-1], flush=True)
    rows.append("")
    rows.append(f"Capacity reached on {reached} of {total} instances (time limit {time_limit:g} s each).")
    return rows


def bench_models(paths, time_limit: float, verify: bool) -> list[str]:
    rows = ["| model | ops | buffers | lower bound | TFLite best fit | TFLM greedy | ours | ours vs TFLM | seconds | "
            "proven | TFLM measured head |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    at_bound = total = 0
    for path in paths:
        try:
            model, graph = load(path)
            lt = lifetimes(graph, semantics="tflm")
        except ToolchainError as exc:
            rows.append(f"| {Path(path).name} | skipped: {exc} |")
            continue
        t0 = time.monotonic()
        try:
            res = plan_for_tflm(graph, lt, "auto", time_limit, n_tensors=total_tensor_count(model))
        except ToolchainError as exc:  # e.g. control flow: no offline plan for several subgraphs
            rows.append(f"| {Path(path).name} | skipped: {exc} |")
            continue
        sec = time.monotonic() - t0
        tflm = tflm_greedy(lt).size
        tfl = tflite_arena(lt, alignment=16).size
        measured = "-"
        if verify:
            from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena

            try:
                head = measure_tflm_arena(model_to_bytes(with_offline_plan(model, list(res.tensor_offsets)))).head
                measured = f"{head:,}" + ("" if head == res.head else " (MISMATCH)")
            except ToolchainError as exc:
                measured = f"n/a ({str(exc)[:40]})"
        total += 1
        at_bound += res.head == lt.peak
        proven = res.head <= res.plan.lower_bound
        rows.append(f"| {Path(path).name} | {len(graph.ops)} | {len(lt.buffers)} | {lt.peak:,} | {tfl:,} | {tflm:,} | "
                    f"**{res.head:,}** | {_pct(res.head, tflm)} | {sec:.2f} | {'yes' if proven else 'no'} | {measured} |")
        print(rows[-1], flush=True)
    rows.append("")
    rows.append(f"Arena = lower bound on {at_bound} of {total} models.")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--models", default=str(ROOT / "models" / "*.tflite"))
    ap.add_argument("--no-verify", action="store_true", help="skip measuring the head in TFLite Micro")
    ap.add_argument("--output", default=str(ROOT / "docs" / "bench" / "planners.md"))
    args = ap.parse_args(argv)
    pattern = os.path.join(args.models, "*.tflite") if os.path.isdir(args.models) else args.models
    paths = sorted(glob.glob(pattern))
    source = "zoo (models/*.tflite)"
    if not paths:
        paths = sorted(str(p) for p in (ROOT / "tests" / "fixtures").glob("*.tflite") if "control_flow" not in p.name)
        example = ROOT / "examples" / "randwire_small_int8.tflite"
        if example.exists():
            paths.append(str(example))
        source = "committed fixtures (the zoo was not built when this ran)"
    cmd = "python tools/bench_planners.py" + "".join(a if a.startswith(" ") else f" {a}" for a in (argv or sys.argv[1:]))
    lines = ["## Arena planners", "", f"Made by `{cmd}` on a 2-core machine (times are wall clock, shared CPU).", "",
             "### MiniMalloc instances (../shared/benchmarks/minimalloc; each packs into exactly 1,048,576 bytes)", "",
             *bench_minimalloc(args.time_limit), "",
             f"### Models: TFLite Micro arena in the stored order, {source}", "",
             "Lower bound = most bytes live at once; TFLite best fit and TFLM greedy are the runtimes' placement "
             "algorithms on the same buffers; ours is written as the OfflineMemoryAllocation metadata and the last "
             "column is the head real TFLite Micro reports for that model.", "",
             *bench_models(paths, args.time_limit, not args.no_verify), ""]
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out, "\n".join(lines).encode())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
