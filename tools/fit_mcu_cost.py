#!/usr/bin/env python3
"""Fit the MCU cost model (tpu_pipeline/toolchain/data/mcu_cost.toml) to per-op instruction counts from QEMU.

    python tools/fit_mcu_cost.py --collect --models models   # QEMU, both kernel sets (slow, once)
    python tools/fit_mcu_cost.py                              # fit from the collected counts

`--collect` runs every int8 model that fits the emulated Cortex-M4F (the fixtures, the example
and the zoo's small int8 models) through the harness firmware in `qemu-system-arm -icount
shift=0`, once per kernel set, and stores the per-op instruction counts (SysTick under -icount)
in docs/bench/mcu_ops.json; models already there are kept unless --force. The fit then reads
that file and the models: per (kernel set, fit class) a non-negative least-squares fit of
instructions = per_unit x work + per_output x output elements + overhead, weighted so that
every op counts by its relative error. The held-out models (HELD_OUT) are not fitted; their
error is the test error reported in docs/bench/mcu.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.package_toml import tables_text  # noqa: E402

MEASUREMENTS = REPO / "docs" / "bench" / "mcu_ops.json"
OUT = REPO / "tpu_pipeline" / "toolchain" / "data" / "mcu_cost.toml"
FIXTURES = ["chain_int8", "pool_softmax_int8", "multi_output_int8", "tiny_irregular_int8", "concat_conv_int8",
            "darts_s2b_int8"]
ZOO = ["swiftnet_cell_a", "swiftnet_hpd", "hrnet_small", "darts_v2_cifar", "nasnet_a_cifar", "amoebanet_a_cifar",
       "randwire_ws_cifar", "darts_v2_cifar_s2b", "mobilenet_v2", "darts_v2_imagenet", "randwire_ws_small",
       "mobilenet_v1"]
HELD_OUT = ("amoebanet_a_cifar_int8", "swiftnet_hpd_int8", "sweep_24x24x48_int8")  # the test set: never fitted
KERNEL_SETS = ("cmsis-nn", "reference")


def model_paths(dirs: list[Path]) -> list[Path]:
    out = [REPO / "tests" / "fixtures" / f"{m}.tflite" for m in FIXTURES]
    out.append(REPO / "examples" / "randwire_small_int8.tflite")
    for name in ZOO:
        for d in dirs:
            p = Path(d) / f"{name}_int8.tflite"
            if p.exists():
                out.append(p)
                break
    for d in dirs:  # tools/build_mcu_sweep.py: small ops across sizes, PAD included
        out.extend(sorted((Path(d) / "mcu_sweep").glob("sweep_*_int8.tflite")))
    return [p for p in out if p.exists()]


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return f"models/{p.name}"


def load_measurements(path: Path = MEASUREMENTS) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"runs": {}}


def collect(paths: list[Path], device: str, out: Path, force: bool = False, iterations: int = 1) -> dict:
    """Run each model with each kernel set in QEMU; store the per-op counts (one run at a time)."""
    from tpu_pipeline.runtime.backends.qemu import run_on_qemu
    from tpu_pipeline.toolchain.device import kernel_set, load_device
    from tpu_pipeline.toolchain.errors import ToolchainError

    data = load_measurements(out)
    runs = data.setdefault("runs", {})
    data["device"] = device
    for p in paths:
        for kernels in KERNEL_SETS:
            key = f"{p.stem}/{kernels}"
            if key in runs and not force:
                continue
            t0 = time.time()
            try:
                r = run_on_qemu(p, load_device(device), kernel_set(kernels), iterations=iterations, quiet=True, timeout=1800)
            except ToolchainError as exc:
                runs[key] = {"model": _rel(p), "kernels": kernels, "error": f"{type(exc).__name__}: {exc}"}
                print(f"{key}: {exc}", flush=True)
            else:
                runs[key] = {"model": _rel(p), "kernels": kernels, "instructions": r.instructions,
                             "ops": [[o["index"], o["opcode"], o["instructions"]] for o in r.op_instructions],
                             "arena_used_bytes": r.arena_used_bytes, "arena_bytes_predicted": r.arena_bytes_predicted,
                             "head_bytes": r.head_bytes, "head_predicted": r.head_predicted,
                             "tail_bytes": r.tail_bytes, "tail_predicted": r.tail_predicted,
                             "planned_head": r.planned_head, "arena_bytes_host": r.arena_bytes_host,
                             "flash_bytes": r.flash_bytes, "ram_bytes": r.ram_bytes,
                             "outputs_match": r.outputs_match, "output_differences": r.output_differences,
                             "notes": r.notes, "error": r.error}
                print(f"{key}: {r.instructions:,} instructions, {time.time() - t0:.0f} s", flush=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(dump(data))  # after every run: resumable
    return data


def dump(data: dict) -> str:
    """The measurements as JSON with one line per run (diffable, compact)."""
    runs = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(data["runs"].items()))
    rest = {k: v for k, v in data.items() if k != "runs"}
    head = json.dumps(rest, sort_keys=True)[1:-1]
    return "{" + (head + ", " if head else "") + '"runs": {\n' + runs + "\n}}\n"


def samples(data: dict, models_dirs: list[Path]):
    """(model stem, kernels, features, measured instructions) per measured op."""
    from tpu_pipeline.toolchain.cost.mcu import op_features
    from tpu_pipeline.toolchain.loader import load

    out = []
    for key, run in sorted(data["runs"].items()):
        if run.get("error") or not run.get("ops"):
            continue
        path = REPO / run["model"]
        if not path.exists():
            path = next((Path(d) / Path(run["model"]).name for d in models_dirs
                         if (Path(d) / Path(run["model"]).name).exists()), None)
            if path is None:
                continue
        _, graph = load(path)
        for idx, opcode, instr in run["ops"]:
            f = op_features(graph, idx)
            out.append((Path(run["model"]).stem, run["kernels"], f, int(instr)))
    return out


def fit(rows) -> dict:
    """{kernels: {fit class: {per_unit, per_output, overhead, n}}} by non-negative least squares on
    relative error."""
    import numpy as np

    from tpu_pipeline.toolchain.cost.mcu import DATA_MOVEMENT, OpFeatures

    unions = {"data_movement": DATA_MOVEMENT, "elementwise": ("add", "mul", "relu", "quantize"),
              "pool": ("max_pool", "average_pool")}
    groups: dict[tuple[str, str], list] = {}
    for _, kernels, f, y in rows:
        groups.setdefault((kernels, f.fit_class), []).append((f, y))
        for name, members in unions.items():  # the fallbacks of classes never measured
            if f.fit_class in members:
                groups.setdefault((kernels, name), []).append((f, y))
        # "other": any op, by its output elements alone
        groups.setdefault((kernels, "other"), []).append((OpFeatures("other", f.outputs, f.outputs), y))
    out: dict[str, dict] = {}
    for (kernels, cls), items in sorted(groups.items()):
        a = np.array([[f.work, f.outputs, 1.0] for f, _ in items], dtype=float)
        y = np.array([y for _, y in items], dtype=float)
        w = 1.0 / np.maximum(y, 1.0)
        if np.allclose(a[:, 0], a[:, 1]):  # work is output elements: one rate only
            a[:, 1] = 0.0
        coef = nnls(a * w[:, None], y * w)
        out.setdefault(kernels, {})[cls] = {"per_unit": float(coef[0]), "per_output": float(coef[1]),
                                            "overhead": float(coef[2]), "n": len(items)}
    return out


def nnls(a, b):
    """Non-negative least squares for a few columns: the best of the unconstrained fits over
    every subset of columns whose coefficients come out non-negative (exact for 3 columns)."""
    import itertools

    import numpy as np

    n = a.shape[1]
    best, best_res = np.zeros(n), float(np.sum(b * b))
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            sub = a[:, cols]
            if not np.any(sub):
                continue
            x, *_ = np.linalg.lstsq(sub, b, rcond=None)
            if np.any(x < 0):
                continue
            res = float(np.sum((sub @ x - b) ** 2))
            if res < best_res - 1e-12:
                best = np.zeros(n)
                best[list(cols)] = x
                best_res = res
    return best


def rms_relative(rows, table) -> dict:
    """{kernels: (rms relative error of the per-op prediction, ops)}."""
    import math

    from tpu_pipeline.toolchain.cost.mcu import predict_instructions

    acc: dict[str, list[float]] = {}
    for _, kernels, f, y in rows:
        p = predict_instructions(f, table[kernels])
        acc.setdefault(kernels, []).append(((p - y) / max(y, 1)) ** 2)
    return {k: (math.sqrt(sum(v) / len(v)), len(v)) for k, v in acc.items()}


def _six_digits(v: float) -> float | int:
    """A fitted coefficient to 6 significant digits, a whole number as an int (as `:.6g` prints it)."""
    v = float(f"{v:.6g}")
    return int(v) if v.is_integer() else v


def write_toml(table: dict, fitted: list[str], held: list[str], errors: dict, out: Path) -> None:
    """The fitted tables into `out` through tomli_w, under a header saying how they were fitted. The
    tables this tool does not fit (fit_harness_cost.py's [K.overlap], [K.patch_stage]) stay, with
    the header lines that follow this tool's own."""
    header = ["MCU cost model: QEMU instructions per op, per kernel set and fit class. Generated by",
              "  python tools/fit_mcu_cost.py --models models",
              "from the per-op counts in docs/bench/mcu_ops.json (harness firmware on qemu-mps2-an386,",
              "-icount shift=0). instructions = per_unit x work + per_output x output elements + overhead;",
              "work is MACs for conv/depthwise/fully_connected, window reads for pooling, input elements",
              "for reductions, contiguous runs copied for data movement, output elements otherwise",
              "(tpu_pipeline/toolchain/cost/mcu.py: op_features).",
              f"fitted on: {', '.join(fitted)}", f"held out (test set): {', '.join(held)}"]
    header += [f"rms relative error per op, {k}: fitted {train:.3f}, held out {test:.3f}"
               for k, (train, test) in errors.items()]
    data: dict = {}
    if out.exists():
        old = out.read_text()
        data = tomllib.loads(old)
        comments = [line[2:] for line in old.splitlines() if line.startswith("# ")]
        mine = [k for k, line in enumerate(comments) if line.startswith("rms relative error per op")]
        header += comments[mine[-1] + 1:] if mine else []
    for kernels in sorted(table):
        for cls in sorted(table[kernels]):
            c = table[kernels][cls]
            data.setdefault(kernels, {})[cls] = {"per_unit": _six_digits(c["per_unit"]),
                                                 "per_output": _six_digits(c["per_output"]),
                                                 "overhead": _six_digits(c["overhead"]), "ops": c["n"]}
    out.write_text(tables_text(header, {k: dict(sorted(v.items())) for k, v in sorted(data.items())}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, nargs="+", default=[REPO / "models"])
    ap.add_argument("--collect", action="store_true", help="run the models in QEMU first (slow)")
    ap.add_argument("--force", action="store_true", help="with --collect: measure again what is stored")
    ap.add_argument("--only", nargs="*", help="with --collect: only these model stems")
    ap.add_argument("--device", default="qemu-mps2-an386")
    ap.add_argument("--measurements", type=Path, default=MEASUREMENTS)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    if args.collect:
        paths = [p for p in model_paths(args.models) if not args.only or p.stem in args.only]
        collect(paths, args.device, args.measurements, args.force)
    data = load_measurements(args.measurements)
    rows = samples(data, args.models)
    if not rows:
        print(f"no measurements in {args.measurements}: run with --collect first")
        return 1
    train = [r for r in rows if r[0] not in HELD_OUT]
    test = [r for r in rows if r[0] in HELD_OUT]
    table = fit(train)
    tr, te = rms_relative(train, table), rms_relative(test, table)
    errors = {k: (tr[k][0], te.get(k, (float("nan"), 0))[0]) for k in tr}
    fitted = sorted({r[0] for r in train})
    held = sorted({r[0] for r in test})
    write_toml(table, fitted, held, errors, args.out)
    for k, (a, b) in errors.items():
        print(f"{k}: rms relative error per op: fitted {a:.3f} ({tr[k][1]} ops), held out {b:.3f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
