#!/usr/bin/env python3
"""Benchmark the runtime harness: emulated Edge TPU pipelines (n = 1..6) and MCU emulation.

    python tools/bench_runtime.py --models models [--iterations 10] [--out docs/bench/runtime.md]

Edge TPU: each int8 zoo model is compiled with `compile_models` (partition only, `latency`
strategy, coral-usb, 5 s solver limit) into n = 1..6 segments, then run by the emulator backend:
LiteRT per segment on the host, sequential pass (host latency) and pipelined pass (host
throughput, one thread per segment, 1-item queues), outputs checked bit-exactly against the whole
model; beside them the cost model's predicted Edge TPU latency, throughput and energy.
MCU: TFLite Micro with the SparkFun Edge's 384 KiB as the arena (fits or not, measured head and
tail, our predicted head), host time, the MCU cost model's device latency, and the head of the
exported model (our offline plan) next to TFLite Micro's own.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tpu_pipeline.toolchain.device import load_device  # noqa: E402
from tpu_pipeline.toolchain.tflite.io import write_bytes_atomic  # noqa: E402
from bench_partition import find  # noqa: E402  (tools/ is the script's directory)

EDGETPU_MODELS = ["mobilenet_v2", "inception_v1", "resnet50", "densenet121", "nasnet_mobile", "xception",
                  "randwire_ws_small", "darts_v2_imagenet", "randwire_ws_cifar", "darts_v2_cifar",
                  "nasnet_a_cifar", "amoebanet_a_cifar", "hrnet_small", "swiftnet_hpd"]
MCU_MODELS = ["randwire_ws_cifar", "darts_v2_cifar", "nasnet_a_cifar", "amoebanet_a_cifar", "hrnet_small",
              "swiftnet_hpd", "swiftnet_cell_a", "mobilenet_v2"]
EXTRA = [REPO / "examples" / "randwire_small_int8.tflite"]




def edgetpu_rows(path: Path, stages: list[int], iterations: int, time_limit: float) -> list[str]:
    from tpu_pipeline.runtime.backends.emulator import run_edgetpu_emulation
    from tpu_pipeline.runtime.deployment import load_deployment
    from tpu_pipeline.toolchain.compile import compile_models
    from tpu_pipeline.toolchain.errors import ToolchainError
    from tpu_pipeline.toolchain.loader import load

    _, g = load(path)
    rows = []
    for n in stages:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                compile_models(path, n, Path(tmp) / "c", time_limit=time_limit, passes=())
                rep = run_edgetpu_emulation(load_deployment(Path(tmp) / "c"), iterations, 1, 0, load_device("coral-usb"))
            except ToolchainError as exc:
                rows.append(f"| {path.stem} | {len(g.ops)} | {n} | - | - | - | - | - | - | {str(exc)[:60]} |")
                continue
        p = rep.predicted
        slowest = max(s.latency.median_s for s in rep.stages)
        ok = "yes" if rep.verified else ("no" if rep.verified is False else "n/a")
        if rep.error:
            ok = f"error: {rep.error[:40]}"
        rows.append(f"| {path.stem} | {len(g.ops)} | {n} | {rep.latency.median_s * 1e3:.2f} | "
                    f"{slowest * 1e3:.2f} | {rep.throughput_per_s:.1f} | {p['latency_s'] * 1e3:.2f} | "
                    f"{p['throughput_per_s']:.1f} | {p['energy_j'] * 1e3:.2f} | {ok} |")
        print(rows[-1], flush=True)
    return rows


def mcu_row(path: Path, iterations: int) -> str:
    from tpu_pipeline.runtime.backends.emulator import run_mcu_emulation
    from tpu_pipeline.toolchain.errors import ToolchainError

    rep = run_mcu_emulation(path, load_device("sparkfun-edge"), iterations, 1)
    a = rep.arena
    kib = lambda b: "-" if b is None else f"{b / 1024:,.1f}"  # noqa: E731
    exported = "-"
    if a["fits"]:
        from tpu_pipeline.toolchain.export_mcu import export_mcu

        with tempfile.TemporaryDirectory() as tmp:
            try:
                e = export_mcu(path, load_device("sparkfun-edge"), Path(tmp) / "fw")
                exported = f"{kib(e.measured_head)} ({kib(e.tflm_own_head)})"
            except ToolchainError as exc:
                exported = "flash too small" if "flash" in str(exc) else str(exc).split(": ", 1)[-1][:40]
    host = f"{rep.latency.median_s * 1e3:.2f}" if rep.latency else "-"
    fits = {True: "yes", False: "**no**", None: "TFLM cannot run it"}[a["fits"]]
    if a["fits"] is False:
        why = [w for w, bad in (("SRAM", a["total"] is None or a["total"] > a["configured"]),
                                ("flash", a.get("fits_flash") is False)) if bad]
        fits = f"**no** ({', '.join(why)})"
    row = (f"| {path.stem} | {len(rep.ops)} | {fits} | {kib(a['head'])} | "
           f"{kib(a['predicted_head'])} | {kib(a['tail'])} | {exported} | {a['model_bytes'] / 1024:,.0f} | "
           f"{host} | {rep.predicted['latency_s'] * 1e3:,.1f} | {rep.predicted['energy_j'] * 1e3:.3f} |")
    print(row, flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, nargs="+", default=[REPO / "models"])
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    ap.add_argument("--time-limit", type=float, default=5.0)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "runtime.md")
    a = ap.parse_args(argv)
    rel = lambda p: str(p.resolve().relative_to(REPO)) if p.resolve().is_relative_to(REPO) else str(p)  # noqa: E731
    cmd = f"python tools/bench_runtime.py --models {' '.join(rel(m) for m in a.models)} --iterations {a.iterations}"
    t0 = time.time()
    tpu_rows, missing = [], []
    for name in EDGETPU_MODELS:
        path = find(a.models, name)
        if path is None:
            missing.append(name)
            continue
        tpu_rows += edgetpu_rows(path, a.stages, a.iterations, a.time_limit)
    for path in EXTRA:
        if path.exists():
            tpu_rows += edgetpu_rows(path, a.stages, a.iterations, a.time_limit)
    mcu_rows = []
    for name in MCU_MODELS:
        path = find(a.models, name)
        if path is not None:
            mcu_rows.append(mcu_row(path, max(1, a.iterations // 2)))
    for path in EXTRA:
        if path.exists():
            mcu_rows.append(mcu_row(path, max(1, a.iterations // 2)))
    lines = [
        "## Runtime: emulated Edge TPU pipelines and MCU emulation", "", f"`{cmd}`", "",
        "Edge TPU pipelines (`tpu-pipeline compile -n N` partition only, coral-usb, then `tpu-pipeline run "
        "--backend emulator`): *host* columns are LiteRT on this machine's CPU, one interpreter and one thread "
        "per segment (2 shared cores, so host throughput cannot scale past ~2 busy stages); *predicted* columns "
        "are the Edge TPU cost model (devices/coral-usb.toml) for n USB Accelerators. Host latency = median of "
        "one inference through all segments in turn; slowest stage = median of the slowest segment; host "
        "throughput = inferences / wall time with all segments pipelined. *exact* = pipeline outputs "
        "bit-identical to the whole model in LiteRT, for every inference.", "",
        "| model | ops | n | host latency ms | host slowest stage ms | host /s | predicted latency ms | "
        "predicted /s | predicted energy mJ | exact |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|", *tpu_rows, "",
        "MCU (`tpu-pipeline profile MODEL --device sparkfun-edge`, TFLite Micro on the host with 384 KiB "
        "as the arena): head and tail are what TFLite Micro allocated (measured); *predicted head* is our "
        "model of its planner; *exported head* is TFLite Micro's head for the model written by `tpu-pipeline "
        "export-mcu` (our arena plan inside as the offline plan), TFLite Micro's own plan in brackets; "
        "device ms and energy are the MCU cost model (48 MHz Cortex-M4F, order-of-magnitude cycles per MAC, "
        "not fitted to hardware).", "",
        "| model | ops | fits | head KiB | predicted head KiB | tail KiB | exported head KiB (TFLM own) | "
        "model KiB | host TFLM ms | device ms (predicted) | energy mJ (predicted) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|", *mcu_rows, "",
        f"Wall time of this benchmark: {time.time() - t0:.0f} s.",
    ]
    if missing:
        lines.append(f"Missing from the zoo (skipped): {', '.join(missing)}.")
    if any(not m.resolve().is_relative_to(REPO) for m in a.models):
        lines.append("Run on a partial zoo outside the repository (the directories in the command); "
                     "`make bench` regenerates this section from `models/`.")
    write_bytes_atomic(a.out, ("\n".join(lines) + "\n").encode())
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
