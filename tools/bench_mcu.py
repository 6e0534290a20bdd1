#!/usr/bin/env python3
"""Benchmark the harness firmware on the emulated Cortex-M4F (QEMU mps2-an386).

    python tools/bench_mcu.py --models models [--iterations 2] [--out docs/bench/mcu.md]

Per int8 model (the committed fixtures, the example, and the zoo's small int8 models when
present) and kernel set (CMSIS-NN, reference): the firmware's flash and RAM (the linker's
figures), the arena our export predicts (host TFLite Micro: planned head + tail) against what the
firmware reports (`arena_used_bytes`, and its head against our offline plan), instructions per
invoke (SysTick under `-icount shift=0`), and whether the outputs equal host TFLite Micro's.
Needs the ARM toolchain, QEMU and a TFLite Micro tree; without them it writes why it could not run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ZOO = ["randwire_ws_cifar", "darts_v2_cifar", "nasnet_a_cifar", "amoebanet_a_cifar", "hrnet_small",
       "swiftnet_hpd", "swiftnet_cell_a", "mobilenet_v2"]
FIXTURES = ["chain_int8", "pool_softmax_int8", "multi_output_int8", "tiny_irregular_int8", "concat_conv_int8",
            "darts_s2b_int8"]


def models(dirs: list[Path]) -> list[Path]:
    out = [REPO / "tests" / "fixtures" / f"{m}.tflite" for m in FIXTURES]
    out.append(REPO / "examples" / "randwire_small_int8.tflite")
    for name in ZOO:
        for d in dirs:
            p = d / f"{name}_int8.tflite"
            if p.exists():
                out.append(p)
                break
    return [p for p in out if p.exists()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, nargs="+", default=[REPO / "models"])
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--device", default="qemu-mps2-an386")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "mcu.md")
    args = ap.parse_args(argv)
    from runtime.backends.qemu import run_on_qemu
    from toolchain.errors import ToolchainError

    head = ["## MCU firmware on an emulated Cortex-M4F (QEMU)", "",
            f"`python tools/bench_mcu.py --models {' '.join(map(str, args.models))}`: the harness firmware built "
            f"for `{args.device}` with each kernel set, run in `qemu-system-arm -icount shift=0` over the serial "
            "protocol. Flash and RAM are the linker's (RAM includes the arena, a 32 KiB stack and 4 KiB heap "
            "reservation). Arena: *predicted* is export-mcu's figure (host TFLite Micro, 64-bit: planned head + "
            "tail), *measured* is `arena_used_bytes()` on the 32-bit target, *head* is the target's "
            "non-persistent part next to our offline plan. Instructions per invoke: SysTick ticks x 40 (25 MHz "
            "SysTick, 1 ns per instruction); a deterministic cost, not a board's latency. *outputs* compares with "
            "the host's `tflite_micro` wheel on the same random inputs.", ""]
    missing = [t for t in ("arm-none-eabi-g++", "qemu-system-arm") if not shutil.which(t)]
    rows = ["| model | kernels | flash B | RAM B | arena predicted B | arena measured B | head planned / measured B "
            "| instructions / invoke | outputs |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    failed = 0
    if missing:
        head.append(f"Not run on this machine: {', '.join(missing)} missing.")
    else:
        for path in models(args.models):
            for kernels in ("cmsis-nn", "reference"):
                t0 = time.time()
                try:
                    r = run_on_qemu(path, args.device, kernels, iterations=args.iterations, quiet=False, timeout=120)
                except ToolchainError as exc:
                    rows.append(f"| {path.stem} | {kernels} | | | | | | | {type(exc).__name__}: "
                                f"{str(exc).replace('|', '/')[:120]} |")
                    failed += 1
                    continue
                if r.outputs_match:
                    outs = "identical"
                elif r.output_differences:
                    worst = max(d["max_abs_diff"] for d in r.output_differences)
                    n = sum(d["elements_differing"] for d in r.output_differences)
                    outs = f"{n} elements differ (max {worst:g})"
                else:
                    outs = f"not compared ({r.error})"
                rows.append(f"| {path.stem} | {kernels} | {r.flash_bytes:,} | {r.ram_bytes:,} | "
                            f"{r.arena_bytes_predicted:,} | {r.arena_used_bytes:,} | {r.planned_head:,} / "
                            f"{r.head_bytes:,} | {r.instructions:,} | {outs} |")
                print(f"{path.stem} {kernels}: {time.time() - t0:.0f} s", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(head + (rows if not missing else [])) + "\n")
    print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
