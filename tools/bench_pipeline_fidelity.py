#!/usr/bin/env python3
"""Fit the Edge TPU pipeline model (coral-usb) and check it against measured pipelines.

    python tools/bench_pipeline_fidelity.py --models models [--write] [--out docs/bench/pipeline_fidelity.md]

Model: tpu_pipeline/toolchain/cost/pipeline.py (every TPU on one USB link and one host; parameter streaming
overlaps on-chip compute; period and latency from the discrete-event steady state).

Fit (honest split): Coral's published single-TPU `usb3_ms` latencies of the zoo models and the
ResNet101 row of Table I of the pipelined Edge TPU paper (Coral's own segmentation, 1-5 USB TPUs
behind one hub: the measured per-frame time = the pipeline's period) are the FIT set; the
ResNet152 row is the TEST set and is never looked at while fitting. Parameters: usable SRAM per
TPU (7.0-7.9 MiB grid), shared link bandwidth (190-500 MB/s), per-invoke host cost (0.2-1.5 ms),
compute efficiency (one rate, <= 1) and a cost per op. Least squares on relative errors: a coarse
grid with the closed-form lower bound for the pipeline rows, then coordinate descent with the
simulator itself. `--write` stores the fit in tpu_pipeline/toolchain/data/devices/coral-usb.toml.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import textwrap
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tpu_pipeline.toolchain.cost import EdgeTpuCostModel  # noqa: E402
from tpu_pipeline.toolchain.device import load_device  # noqa: E402
from tpu_pipeline.toolchain.cost.pipeline import StageLoad, simulate, simulate_pipelines  # noqa: E402
from tpu_pipeline.toolchain.ir import macs  # noqa: E402
from tpu_pipeline.toolchain.loader import load  # noqa: E402
from tpu_pipeline.toolchain.partition import PartitionProblem, coral_heuristic  # noqa: E402
from tpu_pipeline.toolchain.tflite.io import write_bytes_atomic  # noqa: E402
from tools.calibrate_edgetpu import DEFAULT_CSV, read_csv, zoo_models  # noqa: E402
from tools.package_toml import with_fitted_values, without_stamp  # noqa: E402

MiB = 1 << 20
PEAK = 4.0e12
# Table I of the pipelined Edge TPU paper (../shared/seeds/, FACTS.md): ms per frame, n = 1..5
TABLE_I = {"resnet101": [80.7, 68.6, 48.6, 32.8, 14.2], "resnet152": [115.1, 104.5, 84.5, 66.8, 50.4]}
FIT_ROWS, TEST_ROWS = ("resnet101",), ("resnet152",)
SRAM = np.arange(7.0, 7.9 + 1e-9, 0.0625) * MiB
BW = (190e6, 500e6)
OVERHEAD = (0.2e-3, 1.5e-3)


def stage_features(path: Path, n: int) -> list[dict]:
    """Per stage of Coral's segmentation: ops, MACs, parameter bytes, bytes in and out."""
    _, g = load(path)
    prob = PartitionProblem(g, EdgeTpuCostModel(load_device("coral-usb")))
    st = coral_heuristic(g, n).stages
    inb, outb = prob.traffic(st, n)
    out = []
    for k in range(n):
        ops = [v for v in range(len(g.ops)) if st[v] == k]
        out.append({"ops": len(ops), "macs": sum(macs(g, v) or 0 for v in ops),
                    "params": sum(prob.op_costs[v].param_bytes for v in ops), "in": inb[k], "out": outb[k]})
    return out


def loads(stages: list[dict], x: dict) -> list[StageLoad]:
    return [StageLoad(s["ops"] * x["per_op"] + s["macs"] * 2 / (PEAK * x["eff"]),
                      max(0, s["params"] - int(x["sram"])), s["in"], s["out"], x["overhead"], True)
            for s in stages]


def predict(stages: list[dict], x: dict, exact: bool = True) -> float:
    """Period in seconds: simulated (exact) or its closed-form lower bound."""
    ld = loads(stages, x)
    if exact:
        return simulate(ld, x["bw"]).period_s
    from tpu_pipeline.toolchain.cost.pipeline import period_bound
    return period_bound(ld, x["bw"])


def residuals(cases, x, exact=True) -> np.ndarray:
    return np.array([predict(st, x, exact) / y - 1 for st, y in cases])


def fit(cases) -> dict:
    """Coarse grid on the bound, then coordinate descent on the simulator."""
    best = None
    for sram, bw, oh, eff, per_op in itertools.product(SRAM, np.arange(380e6, 500e6 + 1, 10e6),
                                                       np.arange(0.3e-3, 1.21e-3, 0.15e-3),
                                                       np.arange(0.5, 1.001, 0.1), np.arange(0, 40.1e-6, 8e-6)):
        x = {"sram": sram, "bw": bw, "overhead": oh, "eff": eff, "per_op": per_op}
        e = float(np.sum(residuals(cases, x, exact=False) ** 2))
        if best is None or e < best[0]:
            best = (e, x)
    x = dict(best[1])
    err = float(np.sum(residuals(cases, x) ** 2))
    steps = {"sram": MiB / 16, "bw": 5e6, "overhead": 0.05e-3, "eff": 0.02, "per_op": 1e-6}
    lo = {"sram": SRAM[0], "bw": BW[0], "overhead": OVERHEAD[0], "eff": 0.05, "per_op": 0.0}
    hi = {"sram": SRAM[-1], "bw": BW[1], "overhead": OVERHEAD[1], "eff": 1.0, "per_op": 1e-4}
    for _ in range(6):
        improved = False
        for key, d in steps.items():
            for sign in (1, -1):
                while True:
                    y = dict(x)
                    y[key] = min(hi[key], max(lo[key], x[key] + sign * d))
                    if y[key] == x[key]:
                        break
                    e = float(np.sum(residuals(cases, y) ** 2))
                    if e >= err - 1e-12:
                        break
                    x, err, improved = y, e, True
        if not improved:
            break
    return x


def write_device(x: dict, rms_fit: float, rms_test: float, n_pub: int) -> None:
    path = REPO / "tpu_pipeline" / "toolchain" / "data" / "devices" / "coral-usb.toml"
    values = {
        "memory.param_sram_bytes": f"{int(x['sram'])}",
        "link.host_bandwidth_bytes_per_s": f"{x['bw']:.6g}",
        "timing.invoke_overhead_s": f"{x['overhead']:.6g}",
        "timing.per_op_s": f"{x['per_op']:.6g}",
    }
    for cls in ("conv", "depthwise", "fully_connected", "elementwise", "other"):
        values[f"compute.efficiency.{cls}"] = f"{x['eff']:.6g}"
    overlap = {"timing.stream_overlaps_compute": (
        "1", "The TPU runs a layer while the next parameters stream in (fitted model: overlap).")}
    text = with_fitted_values(without_stamp(path.read_text(), "# Coral "), values, str(path), added=overlap)
    stamp = ("# FITTED by tools/bench_pipeline_fidelity.py --write: least squares on relative errors against "
             f"Coral's\n# published usb3_ms latencies of {n_pub} zoo models and the ResNet101 row of Table I of the "
             "pipelined\n# Edge TPU paper (periods of Coral's segmentation on 1-5 USB TPUs, simulated with the shared "
             f"link);\n# fit rms {rms_fit:.1%}; ResNet152 row held out as the test, rms {rms_test:.1%}. "
             "See docs/bench/pipeline_fidelity.md.\n")
    write_bytes_atomic(path, (stamp + text).encode())


def _co_deployment(models: dict[str, Path], x: dict) -> list[str]:
    """Several models on one host: each on its own TPUs, all on one link (per-model throughput)."""
    pick = [("resnet50", 3), ("mobilenet_v2", 1), ("inception_v1", 1)]
    if any(m not in models for m, _ in pick):
        return []
    pipes = [loads(stage_features(models[m], n), x) for m, n in pick]
    alone = [simulate(p, x["bw"]) for p in pipes]
    shared = simulate_pipelines(pipes, x["bw"])
    lines = ["### Several models on one host", "",
             "Each model on its own Edge TPUs (Coral's segmentation), all behind one USB link and host, "
             "simulated together (`tpu_pipeline.toolchain.cost.pipeline.simulate_pipelines`): the per-model throughput "
             "drops where they share the link.", "",
             "| model | TPUs | alone /s | shared /s | link utilisation (all) |", "|---|---:|---:|---:|---:|"]
    for (m, n), a, s in zip(pick, alone, shared):
        lines.append(f"| {m} | {n} | {a.throughput_per_s:.1f} | {s.throughput_per_s:.1f} | {s.link_utilisation:.0%} |")
    return lines + [""]


def _table_ii(x: dict) -> list[str]:
    """Table II's choices IV and V: the only pair whose boundary tensors the paper's text gives."""
    d_stream = (0.993 - 0.738) * MiB            # IV streams 0.255 MiB more on stage 0
    d_comm = 2 * 14 * 14 * (1024 - 256)          # V moves a 4x larger tensor out of stage 0 and into stage 1
    ms = lambda b: b / x["bw"] * 1e3  # noqa: E731
    return ["### Table II (ResNet50V2, nine 3-stage cuts)", "",
            "The nine cuts are drawn only in the paper's Figure 3, which the text copy does not contain; the "
            "table gives per-stage DRAM/cache MiB but not the boundary tensors or stage 2, so the nine choices "
            "cannot be rebuilt and their ranking is not checked. For the one pair the text describes (IV: a "
            "14x14x256 boundary tensor, V: 14x14x1024; IV streams 0.255 MiB more): on the shared link the "
            f"model charges V {ms(d_comm):.2f} ms more transfer and IV {ms(d_stream):.2f} ms more streaming, "
            f"so it predicts IV {'faster' if d_comm > d_stream else 'slower'} than V, as measured "
            "(10.5 vs 11.5 ms); a model without the link term would rank them the other way.", ""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, nargs="+", default=[REPO / "models"])
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    ap.add_argument("--write", action="store_true", help="store the fit in tpu_pipeline/toolchain/data/devices/coral-usb.toml")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "pipeline_fidelity.md")
    a = ap.parse_args(argv)
    table = read_csv(a.csv)
    coral = {n: p for n, p in zoo_models(a.models).items() if n in table}
    files = {p.name.removesuffix("_int8.tflite"): p for d in a.models for p in sorted(d.glob("*_int8.tflite"))}
    if any(m not in files for m in TABLE_I) or len(coral) < 4:
        print("need resnet101, resnet152 and >= 4 Coral-published models in --models", file=sys.stderr)
        return 1
    pub = {n: (stage_features(p, 1), float(table[n]["usb3_ms"]) / 1e3) for n, p in sorted(coral.items())}
    rows = {(m, k + 1): (stage_features(files[m], k + 1), ms / 1e3) for m, v in TABLE_I.items() for k, ms in enumerate(v)}
    fit_cases = list(pub.values()) + [rows[(m, n)] for m in FIT_ROWS for n in range(1, 6)]
    x = fit(fit_cases)
    err = {key: predict(st, x) / y - 1 for key, (st, y) in {**pub, **rows}.items()}
    rms = lambda keys: float(np.sqrt(np.mean([err[k] ** 2 for k in keys])))  # noqa: E731
    fit_keys = list(pub) + [(m, n) for m in FIT_ROWS for n in range(1, 6)]
    test_keys = [(m, n) for m in TEST_ROWS for n in range(1, 6)]
    if a.write:
        write_device(x, rms(fit_keys), rms(test_keys), len(pub))
    rel = lambda p: str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)  # noqa: E731
    lines = ["## Edge TPU pipeline model fidelity (Table I, fit/test split)", "",
             f"`python tools/bench_pipeline_fidelity.py --models {' '.join(rel(m) for m in a.models)}"
             + (" --write" if a.write else "") + "`", "",
             "Model: `tpu_pipeline/toolchain/cost/pipeline.py`, a discrete-event simulator of the steady state (one USB link "
             "and one host shared by every TPU, queues of one, parameter streaming overlapping compute). Table I "
             "of the pipelined Edge TPU paper measures the average per-frame time over many inferences of a "
             "pipeline with Coral's own segmentation: that is the period (1 / throughput), compared here with the "
             "simulated period of libcoral's parameter-count segmentation of our zoo model (random weights, the "
             "same architecture). FIT: Coral's published single-TPU table and the ResNet101 row; TEST: the "
             "ResNet152 row, never used in the fit.", "",
             f"Fitted (coral-usb): usable SRAM {x['sram'] / MiB:.4f} MiB, shared link {x['bw'] / 1e6:.0f} MB/s, "
             f"per-invoke host cost {x['overhead'] * 1e3:.3f} ms, compute efficiency {x['eff']:.3f}, per op "
             f"{x['per_op'] * 1e6:.1f} us. Fit rms {rms(fit_keys):.1%}, test rms {rms(test_keys):.1%}, test max "
             f"|error| {max(abs(err[k]) for k in test_keys):.1%}.", "",
             "### Table I (ms per frame)", "",
             "| model | set | TPUs | measured | predicted (simulated) | bound | limited by | error |",
             "|---|---|---:|---:|---:|---:|---|---:|"]
    for (m, n), (st, y) in rows.items():
        ld = loads(st, x)
        sim = simulate(ld, x["bw"])
        from tpu_pipeline.toolchain.cost.pipeline import period_bound, uncontended_s
        link = sum((s.stream_bytes + s.in_bytes + s.out_bytes) for s in ld) / x["bw"]
        limit = "link" if link >= max(uncontended_s(s, x["bw"]) for s in ld) else "a stage"
        lines.append(f"| {m} | {'fit' if m in FIT_ROWS else '**test**'} | {n} | {y * 1e3:.1f} | {sim.period_s * 1e3:.1f} | "
                     f"{period_bound(ld, x['bw']) * 1e3:.1f} | {limit} | {err[(m, n)]:+.1%} |")
    lines += ["", "### Coral's published single-TPU latencies (USB 3, fit set)", "",
              "| model | published ms | predicted ms | error |", "|---|---:|---:|---:|"]
    for n, (st, y) in sorted(pub.items(), key=lambda kv: kv[1][1]):
        lines.append(f"| {n} | {y * 1e3:.1f} | {predict(st, x) * 1e3:.1f} | {err[n]:+.1%} |")
    lines += [""] + _table_ii(x) + _co_deployment(files, x)
    write_bytes_atomic(a.out, ("\n".join(lines) + "\n").encode())
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
