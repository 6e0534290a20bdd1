#!/usr/bin/env python3
"""Benchmark the harness firmware on the emulated Cortex-M4F (QEMU mps2-an386).

    python tools/bench_mcu.py --models models [--force] [--out docs/bench/mcu.md]

Per int8 model that fits the board (the committed fixtures, the example, the zoo's int8 models
that fit, tools/build_mcu_sweep.py's small models) and kernel set (CMSIS-NN, reference): the firmware's flash and RAM (the linker's), the
arena the 32-bit target model predicts (tpu_pipeline.toolchain.memory.tflm_target) against what the firmware
reports, its head against our offline plan, instructions per invoke (SysTick under -icount
shift=0) measured and predicted by the fitted cost model, whether the outputs equal host TFLite
Micro's; then the per-op rms error of the cost model (fitted and held-out models apart) and the
predicted latency on nucleo-l4r5zi and sparkfun-edge. The QEMU runs are stored in
docs/bench/mcu_ops.json (tools/fit_mcu_cost.py fits from the same file) and reused unless
--force. Needs the ARM toolchain, QEMU and a TFLite Micro tree; without them it writes why not.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

import fit_mcu_cost as fit  # noqa: E402  (tools/ is not a package)

BOARDS = ("nucleo-l4r5zi", "sparkfun-edge")


def _outputs(run: dict) -> str:
    if run.get("outputs_match"):
        return "identical"
    diffs = run.get("output_differences") or []
    if diffs:
        worst = max(d["max_abs_diff"] for d in diffs)
        return f"{sum(d['elements_differing'] for d in diffs)} elements differ (max {worst:g})"
    return f"not compared ({run.get('error')})"


def _graph(run: dict, dirs):
    from tpu_pipeline.toolchain.loader import load

    path = REPO / run["model"]
    if not path.exists():
        path = next((Path(d) / path.name for d in dirs if (Path(d) / path.name).exists()), None)
    return load(path)[1] if path else None


def arena_table(data: dict, dirs) -> list[str]:
    from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
    from tpu_pipeline.toolchain.device import kernel_set, load_device

    rows = ["| model | kernels | flash B | RAM B | arena predicted / measured B | head predicted / measured B "
            "(offline plan) | tail predicted / measured B | instructions measured / predicted | outputs |",
            "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for key, run in data["runs"].items():
        name, kernels = key.split("/")
        if run.get("error") and not run.get("ops"):
            rows.append(f"| {name} | {kernels} | | | | | | | {run['error'].replace('|', '/')[:140]} |")
            continue
        g = _graph(run, dirs)
        pred = estimate_mcu(g, load_device("qemu-mps2-an386"), kernel_set(kernels)).instructions if g else None
        eq = "**=**" if run["arena_bytes_predicted"] == run["arena_used_bytes"] else "≠"
        rows.append(f"| {name} | {kernels} | {run['flash_bytes']:,} | {run['ram_bytes']:,} | "
                    f"{run['arena_bytes_predicted']:,} {eq} {run['arena_used_bytes']:,} | "
                    f"{run['head_predicted']:,} / {run['head_bytes']:,} ({run['planned_head']:,}) | "
                    f"{run['tail_predicted']:,} / {run['tail_bytes']:,} | {run['instructions']:,} / "
                    f"{'?' if pred is None else f'{pred:,.0f}'} | {_outputs(run)} |")
    return rows


def error_table(data: dict, dirs) -> list[str]:
    from tpu_pipeline.toolchain.cost.mcu import fitted_table, predict_instructions

    rows = fit.samples(data, dirs)
    table = fitted_table()
    out = ["| kernels | models | ops | rms relative error per op | median abs. relative error | "
           "whole-model instructions, predicted / measured |", "|---|---|---:|---:|---:|---|"]
    for kernels in fit.KERNEL_SETS:
        for label, held in (("fitted", False), ("held out", True)):
            sel = [r for r in rows if r[1] == kernels and (r[0] in fit.HELD_OUT) == held]
            if not sel:
                continue
            rel = [(predict_instructions(f, table[kernels]) - y) / y for _, _, f, y in sel]
            rms = math.sqrt(sum(e * e for e in rel) / len(rel))
            med = sorted(abs(e) for e in rel)[len(rel) // 2]
            per_model: dict[str, list[float]] = {}
            for (m, _, f, y) in sel:
                acc = per_model.setdefault(m, [0.0, 0.0])
                acc[0] += predict_instructions(f, table[kernels])
                acc[1] += y
            ratios = ", ".join(f"{m} {p / y:.2f}" for m, (p, y) in sorted(per_model.items()))
            out.append(f"| {kernels} | {label} ({len(per_model)}) | {len(sel)} | {rms:.3f} | {med:.3f} | {ratios} |")
    return out


def latency_table(data: dict, dirs) -> list[str]:
    from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
    from tpu_pipeline.toolchain.device import kernel_set, load_device
    from tpu_pipeline.toolchain.device import kernel_set, load_device

    head = "| model | " + " | ".join(f"{b} {k} ms" for b in BOARDS for k in fit.KERNEL_SETS) + " |"
    out = [head, "|---|" + "---:|" * (len(BOARDS) * len(fit.KERNEL_SETS))]
    seen = []
    for key, run in data["runs"].items():
        name = key.split("/")[0]
        if name in seen or not run.get("ops"):
            continue
        seen.append(name)
        g = _graph(run, dirs)
        if g is None:  # the model file is not here (e.g. models/mcu_sweep not built)
            continue
        size = (REPO / run["model"]).stat().st_size if (REPO / run["model"]).exists() else 0
        cells = []
        for b in BOARDS:
            mem = load_device(b).memory
            # flash: the model alone (the code adds ~0.1-0.2 MB); SRAM: the predicted arena alone
            fits = size <= mem.flash_bytes and run["arena_bytes_predicted"] <= mem.sram_bytes
            for k in fit.KERNEL_SETS:
                ms = f"{estimate_mcu(g, load_device(b), kernel_set(k)).latency_s * 1e3:,.1f}"
                cells.append(ms if fits else f"({ms}: does not fit)")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    cpis = ", ".join(f"{b}: {load_device(b).compute.cycles_per_instruction} cycles per instruction at "
                     f"{load_device(b).compute.clock_hz / 1e6:g} MHz" for b in BOARDS)
    return out + ["", f"Boards ({cpis}; the figures and their sources are in the device files): a prediction, "
                      "not measured on a board."]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, nargs="+", default=[REPO / "models"])
    ap.add_argument("--force", action="store_true", help="run every model in QEMU again")
    ap.add_argument("--device", default="qemu-mps2-an386")
    ap.add_argument("--measurements", type=Path, default=fit.MEASUREMENTS)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "mcu.md")
    args = ap.parse_args(argv)
    head = ["## MCU firmware on an emulated Cortex-M4F (QEMU)", "",
            f"`python tools/bench_mcu.py --models {' '.join(map(str, args.models))}`: the harness firmware built "
            f"for `{args.device}` with each kernel set, run in `qemu-system-arm -icount shift=0` over the serial "
            "protocol (one inference per model and kernel set, stored in docs/bench/mcu_ops.json). Flash and RAM "
            "are the linker's (RAM includes the arena, a 32 KiB stack and 4 KiB heap reservation). Arena: "
            "*predicted* is the 32-bit target model (tpu_pipeline/toolchain/memory/tflm_target.py: head with the firmware's "
            "offline plan and the kernels' scratch placed as TFLite Micro places it, plus the persistent tail "
            "allocation by allocation), *measured* is `arena_used_bytes()` and the head/tail split the firmware "
            "reports; in brackets our offline plan's head. Instructions per invoke: SysTick ticks x 40 (25 MHz "
            "SysTick, 1 ns per instruction), a deterministic count, not a board's latency; *predicted* by the "
            "fitted cost model (tpu_pipeline/toolchain/data/mcu_cost.toml). *outputs* compares with the host's `tflite_micro` "
            "wheel on the same random input.", ""]
    missing = [t for t in ("arm-none-eabi-g++", "qemu-system-arm") if not shutil.which(t)]
    if missing and not args.measurements.exists():
        args.out.write_text("\n".join(head + [f"Not run on this machine: {', '.join(missing)} missing."]) + "\n")
        print(f"wrote {args.out}")
        return 1
    if not missing:
        data = fit.collect(fit.model_paths(args.models), args.device, args.measurements, args.force)
    else:
        data = fit.load_measurements(args.measurements)
        head.append(f"({', '.join(missing)} missing here: the stored measurements are shown.)")
    fitted = sorted({k.split('/')[0] for k, r in data["runs"].items() if r.get("ops")} - set(fit.HELD_OUT))
    body = arena_table(data, args.models) + [
        "", "### Cost model: predicted vs QEMU-measured instructions per op", "",
        f"Fitted (`python tools/fit_mcu_cost.py --models models`) on {', '.join(fitted)}; held out as the test "
        f"set: {', '.join(fit.HELD_OUT)}. Relative error = (predicted - measured) / measured per op.", ""]
    body += error_table(data, args.models)
    body += ["", "### Predicted latency of one inference on real boards", ""] + latency_table(data, args.models)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(head + body) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
