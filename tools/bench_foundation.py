#!/usr/bin/env python3
"""Zoo table for the foundation: ops, parameters, peak, TFLM head predicted vs measured, TFLite.

    python tools/bench_foundation.py --models models
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena  # noqa: E402
from tpu_pipeline.toolchain.errors import ToolchainError  # noqa: E402
from tpu_pipeline.toolchain.ir import total_param_bytes  # noqa: E402
from tpu_pipeline.toolchain.loader import load  # noqa: E402
from tpu_pipeline.toolchain.memory import lifetimes, order_free_lower_bound, tflite_arena, tflm_greedy  # noqa: E402


def zoo(models: Path) -> list[Path]:
    manifest = models / "MANIFEST.json"
    if manifest.exists():
        data = json.loads(manifest.read_text())
        entries = data.get("models", data) if isinstance(data, dict) else data
        files = [models / (e["file"] if isinstance(e, dict) else e) for e in
                 (entries.values() if isinstance(entries, dict) else entries)]
        return sorted({f for f in files if f.exists()})
    return sorted(models.glob("*.tflite"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="models")
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench" / "foundation.md"))
    args = ap.parse_args()
    rows = []
    for path in zoo(Path(args.models)):
        start = time.time()
        try:
            _, g = load(path)
            lt = lifetimes(g)
            head = tflm_greedy(lt).size
            tfl = tflite_arena(lifetimes(g, semantics="tflite")).size
            bound = order_free_lower_bound(g)
        except ToolchainError as exc:
            rows.append(f"| {path.name} | error: {exc} | | | | | | | |")
            continue
        predict_s = time.time() - start
        try:
            real = str(measure_tflm_arena(path).head)
        except ToolchainError:
            real = "does not load"
        same = "yes" if real == str(head) else ("-" if real == "does not load" else "**NO**")
        rows.append(f"| {path.name} | {len(g.ops)} | {total_param_bytes(g):,} | {lt.peak:,} | {bound:,} | "
                    f"{head:,} | {real if not real.isdigit() else f'{int(real):,}'} | {same} | {tfl:,} | {predict_s:.2f} |")
        print(rows[-1], flush=True)
    text = [
        "## Foundation: memory model against the real TFLite Micro",
        "",
        "Command: `python tools/bench_foundation.py --models models` (after `make zoo`).",
        "Peak = most live activation bytes at any step in the converter's order (TFLM semantics);",
        "bound = the order-free lower bound (largest single-op footprint); predicted head = our",
        "reproduction of TFLM's GreedyMemoryPlanner; measured head = `Arena allocation head` reported",
        "by the real `tflite_micro` interpreter; TFLite arena = our ArenaPlanner reproduction (tensors",
        "only: LiteRT's kernel temporaries such as im2col are not modelled).",
        "",
        "| model | ops | parameter bytes | peak | bound | predicted TFLM head | measured TFLM head | equal | TFLite arena | predict s |",
        "|---|---:|---:|---:|---:|---:|---:|:---:|---:|---:|",
        *rows,
        "",
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(text))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
