#!/usr/bin/env python3
"""Benchmark patch-based execution (tpu_pipeline/toolchain/rewrite/patch.py) and write docs/bench/patch.md.

    python tools/bench_patch.py --models models [--out docs/bench/patch.md] [--time-limit 10]

For MobileNetV2 1.0 and MobileNetV1 1.0 (224x224) and MobileNetV1 0.25 (96x96), int8: the region
from the model's input to the smallest articulation tensor at 1/8 (and for MobileNetV1 1.0 also
1/16) of the input's resolution, at several grids. Per row: the scheduler's peak before and
after (proven or not, with its lower bound), the arena head real TFLite Micro allocates for the written model with our offline plan,
the MAC overhead of the halos, the scheduling seconds, and the outputs against the original
(bit-identical or not, LiteRT and TFLite Micro, two random inputs).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tpu_pipeline.toolchain.execute.compare import verify_models  # noqa: E402
from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena  # noqa: E402
from tpu_pipeline.toolchain.ir import macs  # noqa: E402
from tpu_pipeline.toolchain.loader import load  # noqa: E402
from tpu_pipeline.toolchain.ir.convert import rewritten_model  # noqa: E402
from tpu_pipeline.toolchain.memory import plan_for_tflm  # noqa: E402
from tpu_pipeline.toolchain.rewrite.patch import apply_patches, patch_regions  # noqa: E402
from tpu_pipeline.toolchain.schedule import schedule  # noqa: E402
from tpu_pipeline.toolchain.tflite import model_to_bytes, with_offline_plan  # noqa: E402

# (model, the region ends at 1/f of the input's resolution, grids)
CASES = [("mobilenet_v2_int8.tflite", 8, [(2, 2), (4, 4), (6, 6), (8, 8)]),
         ("mobilenet_v1_int8.tflite", 8, [(4, 4), (8, 8)]),
         ("mobilenet_v1_int8.tflite", 16, [(4, 4), (7, 7)]),
         ("mobilenet_v1_025_96_int8.tflite", 8, [(2, 2), (3, 3), (4, 4)])]


def kib(n: int) -> str:
    return f"{n / 1024:,.1f}"


def region_to(graph, f: int):
    """The region from the graph input to the smallest articulation tensor at 1/f of the input's
    resolution (the earliest of equal ones): the fewest bytes to assemble from tiles."""
    h = graph.tensors[graph.inputs[0]].shape[1]
    by_name = {t.name: t for t in graph.tensors}
    inp = graph.tensors[graph.inputs[0]].name
    cands = [r for r in patch_regions(graph) if r.input == inp and h // (2 * f) < by_name[r.output].shape[1] <= h // f]
    return min(cands, key=lambda r: (by_name[r.output].nbytes, len(r.ops)), default=None)


def written(model, graph, time_limit: float):
    """(schedule, bytes with the offline plan, planned head) of `graph` written into `model`."""
    s = schedule(graph, time_limit=time_limit)
    ordered = graph.reordered(s.order)
    plan = plan_for_tflm(ordered, n_tensors=len(ordered.tensors), time_limit=time_limit)
    data = model_to_bytes(with_offline_plan(rewritten_model(ordered, model), list(plan.tensor_offsets)))
    return s, data, plan.head


def total_macs(graph) -> int:
    return sum(macs(graph, i) or 0 for i in range(len(graph.ops)))


def same_text(original: bytes, data: bytes) -> str:
    parts = []
    for v in verify_models(original, data, runs=2):
        parts.append(f"{v.runtime} {'yes' if v.bit_exact else ('skipped' if v.skipped else 'NO')}")
    return ", ".join(parts)


def row(name, label, grid, s0, head0, s, head, plan_head, overhead, secs, same) -> str:
    proven = "yes" if s.proven_optimal else f"no (bound {kib(s.lower_bound)})"
    return (f"| {name} | {label} | {grid} | {kib(s0.peak)} | {kib(s.peak)} | {proven} | {kib(head0)} | "
            f"{kib(head)} | {'yes' if plan_head == s.peak else kib(plan_head)} | {overhead} | {secs:.1f} | {same} |")


def bench(models: Path, time_limit: float) -> list[str]:
    lines = ["| model | region (ops) | grid | peak before KiB | peak after KiB | proven | TFLM head before KiB | "
             "TFLM head after KiB | plan = peak | MAC overhead | schedule s | bit-identical |",
             "|---|---|---|---:|---:|---|---:|---:|---|---:|---:|---|"]
    done: dict = {}
    for file, f, grids in CASES:
        path = models / file
        if not path.exists():
            print(f"skip {file}: not in {models}", file=sys.stderr)
            continue
        model, graph = load(path)
        original = path.read_bytes()
        if file not in done:
            s0, data0, _ = written(model, graph, time_limit)
            done[file] = (s0, measure_tflm_arena(data0).head)
        s0, head0 = done[file]
        region = region_to(graph, f)
        out = graph.tensors[[t.index for t in graph.tensors if t.name == region.output][0]].shape
        label = f"input -> {out[1]}x{out[2]}x{out[3]} ({len(region.ops)})"
        m0 = total_macs(graph)
        for grid in grids:
            t0 = time.monotonic()
            patched = apply_patches(graph, region, grid)
            s, data, plan_head = written(model, patched, time_limit)
            secs = time.monotonic() - t0
            head = measure_tflm_arena(data).head
            overhead = f"{100 * (total_macs(patched) / m0 - 1):.1f} %"
            lines.append(row(file.removesuffix(".tflite"), label, f"{grid[0]}x{grid[1]}", s0, head0, s, head,
                             plan_head, overhead, secs, same_text(original, data)))
            print(lines[-1], flush=True)
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=ROOT / "models")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "patch.md")
    ap.add_argument("--time-limit", type=float, default=10.0)
    args = ap.parse_args(argv)
    table = bench(args.models, args.time_limit)
    text = "\n".join([
        "## Patch-based execution (int8, exact)",
        "",
        f"`python tools/bench_patch.py --models models --time-limit {args.time_limit:g}`",
        "",
        "The region runs from the model's input to the smallest tensor at 1/8 (or 1/16) of its resolution,",
        "as a grid of output tiles (docs/fit.md). Peaks are the scheduler's (TFLite Micro's lifetimes, 16-byte",
        "sizes); the TFLite Micro heads are measured by the real interpreter on the written model with",
        "our offline plan; \"plan = peak\" says the arena plan reached the scheduler's peak. MAC",
        "overhead: halo recomputation, from the op MAC counts. Schedule seconds include patching,",
        "scheduling and planning, wall clock on a machine shared with other jobs (2 cores, loaded).",
        "Bit-identical: outputs of two random inputs against the original model, each runtime with itself.",
        "",
        *table,
        "",
    ])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
