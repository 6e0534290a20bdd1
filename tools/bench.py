#!/usr/bin/env python3
"""Run every benchmark (tools/bench_*.py) and assemble docs/benchmarks.md.

    python tools/bench.py --models models --out docs/benchmarks.md [--only foundation schedule]

Each tools/bench_<topic>.py is run as `python tools/bench_<topic>.py --models DIR` and writes
docs/bench/<topic>.md (a `## Title`, the command that made it, the table). This script adds the
machine description on top and concatenates the sections in a fixed order.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ORDER = ["foundation", "schedule", "planners", "planners_large", "rewrite", "partition", "compile_time", "coral",
         "pipeline_fidelity", "calibration", "runtime", "mcu", "patch", "fit", "fit_speed", "tinyengine",
         "mcu_latency", "harness_kernels", "deploy", "scale", "fuzz", "survey"]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem = int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024
        mem_s = f"{mem:.0f} GiB"
    except (OSError, ValueError, IndexError):
        mem_s = "?"
    versions = []
    for pkg in ("ai-edge-litert", "tflite-micro", "ortools", "numpy", "tensorflow-cpu"):
        try:
            versions.append(f"{pkg} {metadata.version(pkg)}")
        except metadata.PackageNotFoundError:
            pass
    return (f"- machine: {cpu}, {os.cpu_count()} cores, {mem_s} RAM, {platform.system()} {platform.release()}\n"
            f"- Python {platform.python_version()}; {', '.join(versions)}\n"
            f"- generated {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="models", help="the zoo directory (tools/build_zoo.py --out)")
    ap.add_argument("--out", default="docs/benchmarks.md")
    ap.add_argument("--only", nargs="+", metavar="TOPIC", help="run only these benchmarks")
    args = ap.parse_args()
    scripts = sorted((ROOT / "tools").glob("bench_*.py"))
    topics = [s.stem[len("bench_"):] for s in scripts]
    failed = []
    for script, topic in zip(scripts, topics):
        if args.only and topic not in args.only:
            continue
        print(f"== {topic}", flush=True)
        start = time.time()
        proc = subprocess.run([sys.executable, str(script), "--models", args.models], cwd=ROOT)
        print(f"== {topic}: exit {proc.returncode} after {time.time() - start:.0f} s", flush=True)
        if proc.returncode:
            failed.append(topic)
    sections = sorted((ROOT / "docs" / "bench").glob("*.md"),
                      key=lambda p: (ORDER.index(p.stem) if p.stem in ORDER else len(ORDER), p.stem))
    body = [
        "# Benchmarks",
        "",
        "Regenerate everything with `make bench` (builds the zoo with `tools/build_zoo.py`, then runs",
        "`tools/bench.py`, which runs every `tools/bench_*.py`). Each section names the command that",
        "made it; sections are rewritten only by their own benchmark.",
        "",
        machine(),
        "",
    ]
    for s in sections:  # (a section's images are beside it in docs/bench/: their links follow it here)
        text = re.sub(r"(!\[[^\]]*\]\()(?![a-z]+:|/)", lambda m: m.group(1) + "bench/", s.read_text())
        body.append(text.rstrip() + "\n")
    (ROOT / args.out).write_text("\n".join(body))
    print(f"wrote {args.out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
