#!/usr/bin/env python3
"""How long `tpu-pipeline fit` takes, and whether its selection finishes (issue 30 item 4).

    python tools/bench_fit_speed.py [--tinyengine DIR] [--mlperf DIR] [--models models] [--runs 3]
                                    [--max-ops 300] [--json docs/bench/fit_speed.json]
                                    [--before OLD.json] [--out docs/bench/fit.md] [--python PY --tree DIR]

Every model of the benchmark set up to `--max-ops` ops (tests/fixtures/*.tflite and
tests/fixtures/thirdparty/, TinyEngine's three assets, MLPerf Tiny's four int8 models, the zoo's
MobileNetV2 when `models/` has it), each as a user runs it, with default options, in a child
process timed from outside (the median of `--runs`):

- `fit MODEL --objective memory --pareto -o OUT --json`: wall seconds, `frontier_complete`, patch
  candidates estimated / built of those offered, the smallest whole arena and its predicted latency;
- `fit MODEL --budget B -o OUT --json` with B the middle of the frontier's arenas: wall seconds and
  whether the selection stopped at its time limit.

`--json` keeps the rows; `--before OLD.json` (the rows of an earlier tree, made with `--tree DIR`
and the same flags) adds the before/after columns. The section "### Fit speed" of `--out` is
rewritten, the page's others are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADER = "### Fit speed: does the selection finish"
TINYENGINE = ("vww", "detection", "mcunetv2_large")
MLPERF = ("kws_ref_model", "vww_96_int8", "pretrainedResnet_quant", "ad01_int8")
ZOO = ("mobilenet_v2_int8",)


def model_set(tinyengine: Path | None, mlperf: Path | None, models: Path | None) -> list[Path]:
    found = sorted((ROOT / "tests" / "fixtures").glob("*.tflite"))
    found += sorted((ROOT / "tests" / "fixtures" / "thirdparty").glob("*.tflite"))
    if tinyengine is not None:
        found += [p for p in (tinyengine / "assets" / f"{m}.tflite" for m in TINYENGINE) if p.is_file()]
    if mlperf is not None:
        found += [p for p in (mlperf / f"{m}.tflite" for m in MLPERF) if p.is_file()]
    if models is not None:
        found += [p for p in (models / f"{m}.tflite" for m in ZOO) if p.is_file()]
    return found


def ops_of(path: Path) -> int | None:
    from tpu_pipeline.toolchain.errors import ToolchainError
    from tpu_pipeline.toolchain.loader import load

    try:
        return len(load(path)[1].ops)
    except ToolchainError:
        return None


CPU_S: list[float] = []  # CPU seconds of the last fit_cli run (it and its children), next to its wall seconds


def fit_cli(python: str, tree: Path, path: Path, *args: str) -> tuple[float, int, dict | str]:
    """(wall seconds, exit code, the --json output or the last error line) of one `fit` run; its
    CPU seconds (user + system, with the checks' child processes) in CPU_S[-1]: on a shared
    machine the wall seconds grow with the load, the CPU seconds hardly."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with tempfile.TemporaryDirectory() as tmp:
        t0, r0 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run([python, "-m", "tpu_pipeline.cli", "fit", str(path), *args, "-o", f"{tmp}/out.tflite",
                            "--json"], capture_output=True, text=True, env=env, cwd=str(tree))
        secs, r1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU_S.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    if p.returncode != 0:  # (the model's folder named DIR: no machine paths in the page)
        return secs, p.returncode, (p.stderr.strip().splitlines() or ["?"])[-1].replace(str(path.parent), "DIR")
    return secs, 0, json.loads(p.stdout)


def row(python: str, tree: Path, path: Path, ops: int, runs: int, budget: int | None = None) -> dict:
    r: dict = {"model": path.stem, "ops": ops}
    walls, cpus, out = [], [], None
    for _ in range(runs):
        secs, code, out = fit_cli(python, tree, path, "--objective", "memory", "--pareto")
        walls.append(secs)
        cpus.append(CPU_S[-1])
        if code:
            r.update(error=f"exit {code}: {out}")
            return r
    d = out
    arenas = sorted({p["arena_bytes"] for p in d["frontier"]}) if d["frontier"] else [d["arena_head_bytes"]]
    r.update(wall_s=statistics.median(walls), cpu_s=statistics.median(cpus), frontier_complete=d["frontier_complete"],
             candidates=d["patch_candidates"], built=d["variants_evaluated"],
             estimated=d.get("variants_estimated"), arena=d["arena_bytes_predicted"] or d["arena_head_bytes"],
             latency_ms=d["latency_s_predicted"] * 1e3, frontier_points=len(d["frontier"]),
             cut_short=any("stopped at the time limit" in n for n in d["notes"]))
    budget = budget or arenas[len(arenas) // 2]  # (the tree before's B where it had one: like for like)
    secs, code, out = fit_cli(python, tree, path, "--budget", str(budget))
    r.update(budget=budget, budget_wall_s=secs, budget_cpu_s=CPU_S[-1],
             budget_stopped=(f"exit {code}" if code else any("stopped at the time limit" in n for n in out["notes"])),
             budget_arena=None if code else (out["arena_bytes_predicted"] or out["arena_head_bytes"]),
             budget_latency_ms=None if code else out["latency_s_predicted"] * 1e3)
    return r


def _fmt(v, spec: str = ",") -> str:
    return "—" if v is None else format(v, spec)


def section(rows: list[dict], before: dict[str, dict], command: str) -> list[str]:
    head = ("| model | ops | wall s | CPU s | complete | estimated / built / offered | arena B | latency ms | budget B | "
            "budget wall s | stopped |")
    lines = [HEADER, "",
             f"Made by {command} on this machine (2 cores, shared): every model of the benchmark set up to 300 ops, "
             "`fit MODEL --objective memory --pareto` with default options, whole-process wall seconds (median) "
             "and CPU seconds (the process and its checks' children: what the load on a shared machine hardly "
             "changes), "
             "whether the frontier is complete, patch candidates estimated / built of those offered, the smallest "
             "whole arena (head + tail, predicted; the host's real head is checked equal by the command) and its "
             "predicted latency; then `fit MODEL --budget B` at the frontier's middle arena: wall seconds and "
             "whether the selection stopped at its time limit (`exit 3`: B, a frontier point's predicted arena, "
             "was not met once realised)." + (" *Before*: the same on the tree before; the budget runs use its B, and "
                                             "the predicted latency each reached is in the last two columns."
                                             if before else ""), "",
             head + (" before: wall s | complete | arena B | latency ms | budget latency ms: now | before |"
                     if before else ""),
             "|---|---:|---:|---:|---|---|---:|---:|---:|---:|---|" + ("---:|---|---:|---:|---:|---:|" if before else "")]
    for r in rows:
        lines.append(_line(r, before.get(r["model"]) if before else None))
    done = [r for r in rows if "error" not in r]
    within = [r for r in done if r["frontier_complete"] and r["wall_s"] <= 10 and r["budget_stopped"] is False]
    lines += ["", f"Summary: {len(within)} of {len(done)} models finish their frontier within 10 s with a budget run "
                  "that does not stop at its time limit" +
              (f"; not yet: {', '.join(r['model'] for r in done if r not in within)}" if len(within) < len(done)
               else "") + "."]
    return lines


def _line(r: dict, b: dict | None) -> str:
    if "error" in r:
        return f"| {r['model']} | {r['ops']} | {r['error']} |" + " |" * (8 if b is None else 14)
    stopped = r["budget_stopped"]
    line = (f"| {r['model']} | {r['ops']} | {r['wall_s']:.1f} | {_fmt(r.get('cpu_s'), '.1f')} | "
            f"{'yes' if r['frontier_complete'] else 'NO'} | "
            f"{_fmt(r['estimated'])} / {r['built']:,} / {r['candidates']:,} | {r['arena']:,} | "
            f"{r['latency_ms']:.2f} | {r['budget']:,} | {r['budget_wall_s']:.1f} | "
            f"{'YES' if stopped is True else 'no' if stopped is False else stopped} |")
    if b is not None:
        line += (f" {_fmt(b.get('wall_s'), '.1f')} | {'yes' if b.get('frontier_complete') else 'NO'} | "
                 f"{_fmt(b.get('arena'))} | {_fmt(b.get('latency_ms'), '.2f')} | "
                 f"{_fmt(r.get('budget_latency_ms'), '.2f')} | {_fmt(b.get('budget_latency_ms'), '.2f')} |")
    return line


def write_section(out: Path, lines: list[str]) -> None:
    text = out.read_text() if out.exists() else ""
    parts = text.split("\n### ")
    kept = [parts[0]] + ["### " + p for p in parts[1:] if not ("### " + p).startswith(HEADER)]
    out.write_text("\n\n".join(p.rstrip("\n") for p in kept if p.strip()) + "\n\n" + "\n".join(lines) + "\n")


def measure(args) -> list[dict]:
    dirs = [Path(d) if d and Path(d).is_dir() else None for d in (args.tinyengine, args.mlperf, args.models)]
    before = {r["model"]: r for r in json.loads(Path(args.before).read_text())} if args.before else {}
    rows = []
    for path in model_set(*dirs):
        ops = ops_of(path)
        if ops is None or ops > args.max_ops or (args.only and path.stem not in args.only):
            continue
        rows.append(row(args.python, Path(args.tree), path, ops, args.runs, before.get(path.stem, {}).get("budget")))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tinyengine", default=os.environ.get("TINYENGINE_DIR", ROOT.parent / "peers" / "tinyengine"))
    ap.add_argument("--mlperf", default=os.environ.get("TPUP_MLPERF_DIR", ROOT.parent / "peers" / "mlperf-tiny"))
    ap.add_argument("--models", default=str(ROOT / "models"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-ops", type=int, default=300)
    ap.add_argument("--only", nargs="+", metavar="MODEL", help="only these models (file stems)")
    ap.add_argument("--json", default=str(ROOT / "docs" / "bench" / "fit_speed.json"))
    ap.add_argument("--before", help="rows of the tree before (this tool's --json of that tree)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench" / "fit.md"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--tree", default=str(ROOT), help="the checkout whose fit is timed (default this one)")
    ap.add_argument("--no-doc", action="store_true", help="only the --json rows (e.g. of the tree before)")
    ap.add_argument("--render", action="store_true", help="rewrite the section from the --json rows, run nothing")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.render:
        rows = json.loads(Path(args.json).read_text())
    else:
        rows = measure(args)
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    if not args.no_doc:
        before = {r["model"]: r for r in json.loads(Path(args.before).read_text())} if args.before else {}
        command = (f"`python tools/bench_fit_speed.py --tinyengine DIR --mlperf DIR --runs {args.runs}"
                   + (" --before BEFORE.json" if args.before else "") + "`")
        write_section(Path(args.out), section(rows, before, command))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
