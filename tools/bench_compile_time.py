#!/usr/bin/env python3
"""Compile time (issue 25): `make demo`'s compile and ResNet152 into six segments, end to end.

    python tools/bench_compile_time.py --models models [--runs 3] [--out docs/bench/compile_time.md]

Each command runs `--runs` times as its own process (the console script, as a user runs it), into a
fresh output folder. Per run: wall seconds, CPU seconds (user + system of the process), the
partition pass's seconds (report.json) and the load average before the run. The targets are wall
seconds on an idle 2-core machine; on a shared machine the wall clock grows with the load, the
CPU seconds do not, so both are reported. `BEFORE` holds the figures measured before the issue's
work (same commands, same machine).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tpu_pipeline.toolchain.tflite.io import write_bytes_atomic  # noqa: E402

# (label, model: in the repository, or a file name in the zoo with in_zoo, arguments, target wall seconds)
CASES = [
    ("demo: randwire_small (92 ops), -n 4 --verify", "examples/randwire_small_int8.tflite", False,
     ["-n", "4", "--verify"], 1.0),
    ("ResNet152 (211 ops), -n 6", "resnet152_int8.tflite", True, ["-n", "6"], 1.0),
]
# label -> (wall s, CPU s, partition s, load average) before the changes: commit 88cdee7,
# the same commands, three runs each on this machine at the load given
BEFORE = {
    CASES[0][0]: ("4.0-4.7", "3.9-4.1", "2.6-3.0", "2.9"),
    CASES[1][0]: ("7.3-8.6", "7.1-8.3", "5.5-6.4", "2.9"),
}


def run_once(cli: str, model: Path, args: list[str], tree: Path | None = None, pycache: Path | None = None) -> dict:
    """One compile; `tree`: the checkout whose package the console script imports (PYTHONPATH);
    `pycache`: Python may write and read its bytecode cache there (as an installed package has
    its sources compiled), else the environment's setting holds."""
    out = Path(tempfile.mkdtemp(prefix="bench_compile_")) / "out"
    load = os.getloadavg()[0]
    env = {**os.environ, "PYTHONPATH": str(tree or ROOT)}
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache / (tree or ROOT).name)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([cli, "compile", str(model), *args, "-o", str(out)], cwd=ROOT, capture_output=True, text=True,
                          env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"compile failed ({proc.returncode}): {proc.stderr[-2000:]}")
    report = json.loads((out / "report.json").read_text())
    shutil.rmtree(out.parent, ignore_errors=True)
    part = next(p for p in report["passes"] if p["name"] == "partition")
    sol = report["solver"]
    return {"wall": wall, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "partition": part["seconds"], "load": load, "method": sol.get("method", ""),
            "gap": sol.get("gap"), "sim": sol.get("simulator_optimal"), "refined": sol.get("refinement_stopped_by", "")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, default=ROOT / "models")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "compile_time.md")
    ap.add_argument("--before-tree", type=Path, help="another checkout (the commit before a change) run the same "
                    "way, interleaved run by run with this one, so both see the same load")
    ap.add_argument("--before-label", default="before")
    ap.add_argument("--bytecode", action="store_true", help="also measure with Python's bytecode cache written "
                    "and read (a separate cache folder; one warm-up run first), as an installed package runs")
    a = ap.parse_args(argv)
    cli = str(Path(sys.executable).parent / "tpu-pipeline")
    # paths as the doc shows them: inside the checkout relative to it, the zoo folder as MODELS (no machine paths)
    zoo = a.models.resolve()
    rel = lambda p: (str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else  # noqa: E731
                     str(Path("MODELS") / p.relative_to(zoo)) if p.is_relative_to(zoo) else "MODELS")
    rows, missing, same_load, cached = [], [], [], []
    for label, name, in_zoo, args, target in CASES:
        model = (a.models / name if in_zoo else ROOT / name).resolve()
        if not model.exists():
            missing.append(label)
            continue
        runs, theirs = [], []
        for _ in range(a.runs):
            runs.append(run_once(cli, model, args))
            if a.before_tree:
                theirs.append(run_once(cli, model, args, a.before_tree))
        if a.bytecode:
            cache = Path(tempfile.mkdtemp(prefix="bench_pycache_"))
            run_once(cli, model, args, pycache=cache)  # writes the cache
            warm = [run_once(cli, model, args, pycache=cache) for _ in range(a.runs)]
            shutil.rmtree(cache, ignore_errors=True)
            cached.append(f"| `{rel(model)} {' '.join(args)}` | {statistics.median(r['wall'] for r in warm):.2f} "
                          f"({min(r['wall'] for r in warm):.2f}-{max(r['wall'] for r in warm):.2f}) | "
                          f"{statistics.median(r['cpu'] for r in warm):.2f} | "
                          f"{statistics.median(r['load'] for r in warm):.1f} | {target:g} |")
        for r in runs + theirs:
            print(label, {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
        med = {k: statistics.median(r[k] for r in runs) for k in ("wall", "cpu", "partition", "load")}
        if theirs:
            tm = {k: statistics.median(r[k] for r in theirs) for k in ("wall", "cpu", "partition", "load")}
            same_load.append(f"| `{rel(model)} {' '.join(args)}` | {tm['wall']:.2f} / {tm['cpu']:.2f} / "
                             f"{tm['partition']:.2f} | {med['wall']:.2f} / {med['cpu']:.2f} / {med['partition']:.2f} | "
                             f"x{tm['wall'] / med['wall']:.2f} / x{tm['cpu'] / med['cpu']:.2f} |")
        last = runs[-1]
        proof = ("proven optimal (simulated)" if last["sim"] else
                 f"within {last['gap']:.1%} of the proven bound" if last["gap"] is not None else "-")
        b = BEFORE.get(label, ("-",) * 4)
        cmd = f"tpu-pipeline compile {rel(model)} {' '.join(args)} -o DIR"
        rows.append(f"| `{cmd}` | {med['wall']:.2f} ({min(r['wall'] for r in runs):.2f}-{max(r['wall'] for r in runs):.2f}) "
                    f"| {med['cpu']:.2f} | {med['partition']:.2f} | {med['load']:.1f} | {target:g} | "
                    f"{last['method']}, {proof}, refinement: {last['refined']} | {b[0]} / {b[1]} / {b[2]} (load {b[3]}) |")
    bytecode = ("Python writes no bytecode cache here (PYTHONDONTWRITEBYTECODE is set), so every run also "
                "compiles the package's sources (~0.2 s); an installed wheel has them compiled. "
                if os.environ.get("PYTHONDONTWRITEBYTECODE") else "")
    lines = ["## Compile time", "",
             f"`python tools/bench_compile_time.py --models {rel(zoo)} --runs {a.runs}"
             + (f" --before-tree DIR --before-label '{a.before_label}'" if a.before_tree else "")
             + (" --bytecode" if a.bytecode else "") + "`", "",
             "Each command runs as its own process (the `tpu-pipeline` console script) into a fresh folder; "
             f"median of {a.runs} runs (min-max in brackets). Wall and CPU seconds are the whole process "
             "(start-up, every pass, writing the folder); *partition* is that pass alone (report.json). The "
             "targets are wall seconds on an idle 2-core machine; this machine is shared with other jobs "
             "(*load*: the 1-minute load average before each run), which stretches the wall clock but not "
             "the CPU seconds. " + bytecode + "*Before*: the same commands at commit 88cdee7 (wall / CPU / "
             "partition seconds), when the partition ran CP-SAT on the bound and then its simulation "
             "refinement to the deterministic budget.", "",
             "| command | wall s | CPU s | partition s | load | target wall s | partition | before |",
             "|---|---:|---:|---:|---:|---:|---|---|", *rows, ""]
    if cached:
        lines += ["With the bytecode cache (`--bytecode`: PYTHONDONTWRITEBYTECODE unset, a cache folder of its own "
                  "written by one warm-up run), as an installed package runs: median wall (min-max) and CPU seconds.",
                  "", "| command | wall s | CPU s | load | target wall s |", "|---|---:|---:|---:|---:|", *cached, ""]
    if same_load:
        lines += [f"Interleaved with {a.before_label} (`--before-tree`, run by run, so both see the same load): "
                  "median wall / CPU / partition seconds.", "",
                  f"| command | {a.before_label} | this checkout | speed-up wall / CPU |", "|---|---|---|---|",
                  *same_load, ""]
    if missing:
        lines.append(f"Missing (skipped; build the zoo with `make zoo`): {', '.join(missing)}.")
    write_bytes_atomic(a.out, ("\n".join(lines) + "\n").encode())
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
