#!/usr/bin/env python3
"""Run every command on a folder of third-party models, as a new user would, and tabulate the result.

    python tools/survey.py --models DIR [--firmware] [--only NAME ...] [--timeout S]
                           [--results DIR/survey.json] [--out docs/bench/survey.md]

DIR holds .tflite files in one subfolder per source (`DIR/<source>/<model>.tflite`) and, optionally,
`DIR/MANIFEST.json` (a list of {"file", "repo", "path", "commit", "license"}) naming where each came
from. Per model, each command runs as the installed CLI in a child process with a time limit
(`inspect`, `schedule`, `plan`, `compile -n 2 --verify`, `fit --objective memory`,
`profile --device qemu-mps2-an386`, `export-mcu --device qemu-mps2-an386`); the table gets its exit
code and last line. The TFLite Micro head `inspect` predicts is compared with the head the
`tflite_micro` wheel allocates (host, 64-bit), and with `--firmware` the 32-bit target's predicted
head + tail with the QEMU firmware's `arena_used_bytes` for both kernel sets (`run --backend qemu`).

Results are kept in `--results` (JSON, default next to the models), so `--only` reruns some models
and the table is rebuilt from all of them. Exit 0 when the survey ran (the table says what failed).
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

DEVICE = "qemu-mps2-an386"
KERNELS = ("cmsis-nn", "reference")


def commands(model: Path, tmp: Path, ops: int | None) -> list[tuple[str, list[str]]]:
    """(column, argv) of every command the survey runs on one model (compile: 2 segments, or 1
    for a one-op model, which -n 2 would only refuse as bad usage)."""
    segments = "1" if ops == 1 else "2"
    return [
        ("inspect", ["inspect", str(model)]),
        ("schedule", ["schedule", str(model), "-o", str(tmp / "scheduled.tflite"), "--time-limit", "10"]),
        ("plan", ["plan", str(model), "-o", str(tmp / "planned.tflite"), "--verify"]),
        ("compile", ["compile", str(model), "-n", segments, "--verify", "-o", str(tmp / "compiled"),
                     "--time-limit", "10"]),
        ("fit", ["fit", str(model), "--objective", "memory", "-o", str(tmp / "fitted.tflite"),
                 "--time-limit", "30"]),
        ("profile", ["profile", str(model), "--device", DEVICE, "-N", "2", "--warmup", "0"]),
        ("export-mcu", ["export-mcu", str(model), "--device", DEVICE, "-o", str(tmp / "mcu")]),
    ]


def cli(argv: list[str], timeout: float) -> dict:
    """One command in a child process: exit code (or 'timeout'), last line, seconds."""
    start = time.time()
    try:
        p = subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", *argv], capture_output=True, text=True,
                           timeout=timeout, cwd=REPO, env={**os.environ, "COLUMNS": "200"})
    except subprocess.TimeoutExpired:
        return {"exit": "timeout", "last": f"no result within {timeout:.0f} s", "s": round(time.time() - start, 1)}
    text = (p.stderr.strip() if p.returncode else p.stdout.strip()) or p.stdout.strip() or p.stderr.strip()
    lines = [ln.strip() for ln in text.splitlines() if any(ch.isalnum() for ch in ln)]  # not a table border
    last = lines[-1] if lines else ""
    # a child killed by a signal: the shell's convention (128 + signal), as a user sees it
    code = p.returncode if p.returncode >= 0 else 128 - p.returncode
    return {"exit": code, "last": last[:300], "s": round(time.time() - start, 1), "stdout": p.stdout[-20000:]}


def describe(model: Path) -> dict:
    """Op count, element types and op kinds, read from the file (no interpreter)."""
    from tpu_pipeline.toolchain.tflite.io import read_model

    try:
        m = read_model(model)
    except Exception as exc:  # noqa: BLE001 - the survey records, the commands judge
        return {"ops": None, "dtype": "?", "error": str(exc)[:200]}
    from tpu_pipeline.toolchain.tflite.names import opcode_name

    sub = m.subgraphs[0]
    types = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 9: "int8", 7: "int16"}
    seen = []
    for op in sub.operators or []:
        for t in list(op.inputs if op.inputs is not None else [])[:1]:
            if t >= 0:
                name = types.get(int(sub.tensors[t].type), str(sub.tensors[t].type))
                if name not in seen:
                    seen.append(name)
    kinds = sorted({opcode_name(m, op.opcodeIndex)[0] for op in sub.operators or []})
    return {"ops": sum(len(s.operators or []) for s in m.subgraphs), "dtype": "/".join(seen[:3]) or "-",
            "opcodes": kinds, "subgraphs": len(m.subgraphs)}


def real_head(model: Path, timeout: float) -> dict:
    """Head/tail the tflite_micro wheel allocates (host, 64-bit), in a child process."""
    code = ("import json,sys; from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena; "
            "print(json.dumps(measure_tflm_arena(sys.argv[1]).__dict__))")
    try:
        p = subprocess.run([sys.executable, "-c", code, str(model)], capture_output=True, text=True,
                           timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"error": "timeout"}
    if p.returncode:
        return {"error": ((p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1])[:200]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def firmware(model: Path, kernels: str, timeout: float) -> dict:
    # the emulated board runs a large model's inference for minutes (reference kernels): wait for it
    r = cli(["run", str(model), "--backend", "qemu", "--device", DEVICE, "--kernels", kernels, "-N", "1",
             "--warmup", "0", "--timeout", str(int(timeout / 2)), "--json"], timeout)
    out = {"exit": r["exit"], "last": r["last"]}
    try:
        d = json.loads(r.pop("stdout", "") or "{}")
    except json.JSONDecodeError:
        d = {}
    arena = d.get("arena") or {}
    out.update(used=arena.get("used"), predicted=d.get("arena_bytes_predicted"), outputs_match=d.get("outputs_match"))
    return out


def survey_one(model: Path, source: str, timeout: float, with_firmware: bool) -> dict:
    row = {"model": model.stem, "source": source, "file": str(model), **describe(model)}
    with tempfile.TemporaryDirectory(prefix="survey-") as tmp:
        for name, argv in commands(model, Path(tmp), row.get("ops")):
            r = cli(argv, timeout)
            if name == "inspect" and r["exit"] == 0:
                j = cli(["inspect", str(model), "--json"], timeout)
                try:
                    row["tflm_head_predicted"] = json.loads(j.get("stdout") or "{}").get("tflm_arena_bytes")
                except json.JSONDecodeError:
                    pass
            r.pop("stdout", None)
            row[name] = r
            print(f"  {name}: {r['exit']} {r['last'][:150]}", flush=True)
    row["tflm_real"] = real_head(model, timeout)
    if with_firmware and "head" in row["tflm_real"] and row["export-mcu"]["exit"] == 0:
        row["firmware"] = {k: firmware(model, k, 3 * timeout) for k in KERNELS}
    return row


# A refusal because one runtime cannot run the model, by the commands that need that runtime: not
# a disagreement between commands (compile needs LiteRT; the MCU commands TFLite Micro).
RUNTIME_REFUSALS = {"compile": ("LiteRT",), "plan": ("TFLite Micro cannot run this model",),
                    "fit": ("TFLite Micro cannot run this model",),
                    "profile": ("TFLite Micro cannot run this model",),
                    "export-mcu": ("TFLite Micro cannot run this model", "the harness firmware has no kernel")}


def disagreement(row: dict) -> str | None:
    """Why the commands disagree about this model, or None: one accepts (0, 3) what another
    refuses (2) for a reason other than its runtime's, or runtime refusals worded differently."""
    accepted = {c for c in COLUMNS if row.get(c) and row[c]["exit"] in (0, 3)}
    refused = {c: row[c]["last"] for c in COLUMNS if row.get(c) and row[c]["exit"] == 2}
    model_level = {c for c, last in refused.items() if not any(w in last for w in RUNTIME_REFUSALS.get(c, ()))}
    if accepted and model_level:
        return f"refused by {', '.join(sorted(model_level))}, accepted by {', '.join(sorted(accepted))}"
    tflm = {refused[c] for c in refused if c != "compile" and c not in model_level}
    if len(tflm) > 1:
        return "TFLite Micro's refusal worded differently by different commands"
    return None


COLUMNS = ("inspect", "schedule", "plan", "compile", "fit", "profile", "export-mcu")


def _cell(r: dict | None) -> str:
    if not r:
        return "-"
    return str(r["exit"])


def _head_cell(row: dict) -> str:
    real = row.get("tflm_real") or {}
    pred = row.get("tflm_head_predicted")
    if "head" not in real:
        return "cannot run" if pred is None else f"{pred:,} / cannot run ✗"
    mark = "" if pred == real["head"] else " ✗"
    return f"{pred:,} / {real['head']:,}{mark}" if pred is not None else f"- / {real['head']:,}"


def _fw_cell(row: dict, kernels: str) -> str:
    fw = (row.get("firmware") or {}).get(kernels)
    if not fw:
        return "-"
    if fw.get("used") is None:
        return f"exit {fw['exit']}"
    pred = fw.get("predicted")
    mark = "" if pred == fw["used"] else " ✗"
    return f"{pred if pred is None else format(pred, ',')} / {fw['used']:,}{mark}"


def table(rows: list[dict]) -> list[str]:
    out = ["| model | source | dtype | ops | " + " | ".join(COLUMNS)
           + " | TFLM head predicted / real B | target arena predicted / QEMU B (CMSIS-NN) | (reference) |",
           "|---|---|---|---:|" + "---:|" * len(COLUMNS) + "---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['source']} | {r['dtype']} | {r['ops'] if r['ops'] is not None else '?'} | "
                   + " | ".join(_cell(r.get(c)) for c in COLUMNS)
                   + f" | {_head_cell(r)} | {_fw_cell(r, 'cmsis-nn')} | {_fw_cell(r, 'reference')} |")
    return out


def summary(rows: list[dict]) -> list[str]:
    def count(pred):
        return sum(1 for r in rows for c in COLUMNS if r.get(c) and pred(r[c]["exit"]))

    heads = [r for r in rows if "head" in (r.get("tflm_real") or {})]
    exact = [r for r in heads if r.get("tflm_head_predicted") == r["tflm_real"]["head"]]
    lines = [f"- {len(rows)} models from {len({r['source'] for r in rows})} sources; "
             f"{len(rows) * len(COLUMNS)} command runs: exit 0 {count(lambda e: e == 0)}, "
             f"exit 1 {count(lambda e: e == 1)}, exit 2 {count(lambda e: e == 2)}, exit 3 {count(lambda e: e == 3)}, "
             f"exit 4 {count(lambda e: e == 4)}, exit >= 5 or timeout "
             f"{count(lambda e: e == 'timeout' or (isinstance(e, int) and e >= 5))}",
             f"- TFLite Micro head (host wheel): predicted = real on {len(exact)} of the {len(heads)} models it allocates"]
    for k in KERNELS:
        runs = [r["firmware"][k] for r in rows if (r.get("firmware") or {}).get(k, {}).get("used") is not None]
        if runs:
            ok = sum(1 for f in runs if f.get("predicted") == f["used"])
            lines.append(f"- target head + tail ({k}): predicted = QEMU `arena_used_bytes` on {ok} of {len(runs)} "
                         f"models whose firmware ran")
    verdicts = [f"{r['model']} ({why})" for r in rows if (why := disagreement(r))]
    lines.append(f"- models accepted by one command and refused by another (compile refusing what LiteRT cannot "
                 f"run, and the TFLite Micro commands refusing what it cannot run, in one wording, aside): "
                 f"{len(verdicts)}" + (": " + "; ".join(verdicts) if verdicts else ""))
    tflm_ok = [r for r in rows if "head" in (r.get("tflm_real") or {})]
    lines.append(f"- TFLite Micro (host wheel) runs {len(tflm_ok)} of the {len(rows)} models; the others are refused "
                 f"by name or in TFLite Micro's own words")
    return lines


def failures(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        for c in COLUMNS:
            x = r.get(c)
            if x and x["exit"] != 0:
                out.append(f"| {r['model']} | {c} | {x['exit']} | {x['last'].replace('|', '/')[:220]} |")
    return ["| model | command | exit | last line |", "|---|---|---:|---|", *out] if out else ["(none)"]


def write(rows: list[dict], manifest: dict, out: Path, argv: str, before: tuple | None = None,
          folder: Path | None = None) -> None:
    sources = {}
    for m in manifest.values():
        sources.setdefault(m["source"], (m["repo"], m["commit"][:12], m["license"]))
    lines = ["## Survey: every command on real third-party models", "",
             f"`python tools/survey.py {argv}` (models outside the repository: `DIR/<source>/*.tflite` with "
             "`DIR/MANIFEST.json`; see the tool's docstring)", "",
             *summary(rows), "",
             *([f"Before ({before[1]}), the same models and commands:", "", *summary(before[0]), ""] if before else []),
             "Exit codes per command (0 ok, 2 refused with a reason, 3 does not fit, 1/>= 5 a failure). Heads: "
             "`inspect`'s predicted TFLite Micro head against the `tflite_micro` wheel's; target arena: "
             "head + tail predicted for the 32-bit target against the QEMU firmware's `arena_used_bytes`.", "",
             *table(rows), "", "Sources:", "",
             "| source | repository | commit | license |", "|---|---|---|---|",
             *[f"| {s} | {repo} | {c} | {lic} |" for s, (repo, c, lic) in sorted(sources.items())], "",
             "Every non-zero exit, with the command's last line:", "", *failures(rows), ""]
    text = "\n".join(lines)
    if folder is not None:  # the commands' messages name the files: say DIR, as the command line does
        text = text.replace(str(folder.resolve()) + "/", "DIR/").replace(str(folder) + "/", "DIR/")
    out.write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True, help="folder of <source>/<model>.tflite")
    ap.add_argument("--results", help="JSON of all results so far (default MODELS/survey.json)")
    ap.add_argument("--out", default=str(REPO / "docs" / "bench" / "survey.md"))
    ap.add_argument("--only", nargs="+", metavar="NAME", help="rerun only models whose stem contains NAME")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per command (default 240)")
    ap.add_argument("--firmware", action="store_true", help="also build and run the QEMU firmware (slow)")
    ap.add_argument("--table-only", action="store_true", help="rebuild the table from --results")
    ap.add_argument("--firmware-only", action="store_true",
                    help="only the QEMU firmware runs (models TFLite Micro runs), into --results; run it next to "
                         "a commands-only survey and join them with --firmware-results")
    ap.add_argument("--firmware-results", help="take the firmware runs from this results file")
    ap.add_argument("--before", nargs=2, metavar=("RESULTS", "LABEL"),
                    help="also summarise an earlier survey's results (e.g. of an earlier commit) above the table")
    args = ap.parse_args()
    folder = Path(args.models)
    results_path = Path(args.results or folder / "survey.json")
    manifest = {}
    if (folder / "MANIFEST.json").exists():
        manifest = {m["file"]: m for m in json.loads((folder / "MANIFEST.json").read_text())}
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    models = sorted(folder.glob("*/*.tflite"))
    if not args.table_only:
        for path in models:
            key = str(path.relative_to(folder))
            if args.only and not any(n in path.stem for n in args.only):
                continue
            print(f"{key}", flush=True)
            if args.firmware_only:
                real = real_head(path, args.timeout)
                row = {"model": path.stem, "source": path.parent.name, "tflm_real": real}
                if "head" in real:
                    row["firmware"] = {k: firmware(path, k, 3 * args.timeout) for k in KERNELS}
                    print(f"  firmware: {row['firmware']}", flush=True)
                results[key] = row
                results_path.write_text(json.dumps(results, indent=1))
                continue
            row = survey_one(path, path.parent.name, args.timeout, args.firmware)
            if not args.firmware and "firmware" in results.get(key, {}):
                row["firmware"] = results[key]["firmware"]  # keep the last firmware run
            results[key] = row
            results_path.write_text(json.dumps(results, indent=1))
    if args.firmware_only:
        return 0
    if args.firmware_results:
        for k, fw in json.loads(Path(args.firmware_results).read_text()).items():
            if k in results and "firmware" in fw:
                results[k]["firmware"] = fw["firmware"]
    rows = [results[k] for k in sorted(results) if (folder / k).exists()]
    cmd = "--models DIR" + (" --firmware" if any(r.get("firmware") for r in rows) else "")
    before = None
    if args.before:
        earlier = json.loads(Path(args.before[0]).read_text())
        before = ([earlier[k] for k in sorted(earlier) if (folder / k).exists()], args.before[1])
    write(rows, manifest, Path(args.out), cmd, before, folder)
    print("\n".join(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
