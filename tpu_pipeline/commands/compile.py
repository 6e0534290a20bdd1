"""`tpu-pipeline compile model.tflite [more.tflite ...] -n N [-o DIR] [--device D] [--strategy S]
[--time-limit S] [--verify] [--json]`."""

from __future__ import annotations

import argparse

from rich.table import Table

from tpu_pipeline.output import printer, progress

from tpu_pipeline.toolchain import report
from tpu_pipeline.commands.options import (add_interface_arguments, add_report_argument, fraction, non_negative_int,
                                           positive_int, seconds)
from tpu_pipeline.toolchain.partition import STRATEGY_NAMES



def segments_or_auto(text: str):
    """argparse type of -n: a whole number or 'auto' (the range is checked against the model)."""
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of segments or 'auto', got {text!r}") from None


def add_arguments(p) -> None:
    p.add_argument("models", nargs="+", metavar="model.tflite",
                   help="a .tflite file; give several to co-deploy them in one pipeline")
    p.add_argument("-n", "--num-segments", type=segments_or_auto, dest="n",
                   help="number of pipeline segments (Edge TPUs), or 'auto': partition every n from 1 to --max-n and "
                        "keep the fewest TPUs within --knee of the best throughput per TPU (required unless --cuts)")
    p.add_argument("--max-n", type=positive_int, default=8, metavar="K", help="-n auto: the largest n tried (default 8)")
    p.add_argument("--knee", type=fraction, default=0.05, metavar="TOL",
                   help="-n auto: choose the fewest TPUs whose throughput per TPU is within TOL of the best "
                        "(a fraction or a percentage; default 5%%)")
    p.add_argument("--cuts", metavar="CUTS",
                   help="your own cut points, in pipeline order: tensor names or op indices of the model as given, "
                        "comma-separated (join tensors of one boundary with '+'), or @FILE with one per line; "
                        "checked (exit 2 with one line per violation), written and verified like ours, and "
                        "compared with ours and Coral's in the report")
    p.add_argument("--mix", metavar="A=3,B=1",
                   help="several models: the invocation mix (model file stems and weights; default equal) for which "
                        "the co-compilation order (which model's parameters get the cache first) is chosen")
    p.add_argument("--profile", metavar="RUN.json",
                   help="re-partition with the per-stage times measured by `tpu-pipeline run DIR --backend "
                        "coral|emulator --json` (DIR: an earlier compile of this model) in place of the predictions")
    p.add_argument("-o", "--out", metavar="DIR", help="output directory (default: out/<stem>)")
    p.add_argument("--device", default="coral-usb", help="device descriptor name or .toml path (default coral-usb)")
    p.add_argument("--strategy", default="latency", choices=STRATEGY_NAMES,
                   help="latency: minimise the slowest predicted stage (default); 1-3, 1-2-3, 2-1-3: the "
                        "paper's lexicographic objectives (1 max stage parameters, 2 off-chip bytes, "
                        "3 max stage communication); coral: libcoral's heuristic only")
    p.add_argument("--time-limit", type=seconds, default=10.0, metavar="S", help="seconds each search may take (default 10); the whole compile stays within 4x this, "
                        "plus --verify's runs and file I/O; the partition simulates at most 4 candidates per second of it")
    p.add_argument("--gap", type=fraction, default=0.01, metavar="TOL",
                   help="the partition stops when its period is proven optimal or within TOL of its proven lower "
                        "bound (a fraction or a percentage; default 1%%; 0: search for a proof until the budget), "
                        "or after its candidate budget")
    p.add_argument("--colocate", action="store_true",
                   help="keep all consumers of a tensor in one segment (the paper's data-dependency constraint)")
    p.add_argument("--no-schedule", action="store_true", help="skip the operator-reordering pass")
    p.add_argument("--no-rewrite", action="store_true", help="skip the graph-rewrite pass")
    p.add_argument("--no-plan", action="store_true", help="skip the arena-planning pass (no offline plan is written)")
    p.add_argument("--semantics", default="tflite", choices=("tflite", "tflm"),
                   help="whose memory model the rewrite and schedule passes minimise (default tflite: the Coral "
                        "host runs the segments in LiteRT; tflm for a whole model bound for an MCU)")
    p.add_argument("--budget", type=non_negative_int, metavar="BYTES",
                   help="fit the TFLite Micro arena head into BYTES at the least predicted latency (the fit pass, "
                        "see `tpu-pipeline fit`; replaces the rewrite pass and implies --semantics tflm)")
    add_interface_arguments(p, "changes the interface: opt-in; the checks compare against the model with that "
                               "change", "in the whole model's offline plan, for the harness firmware and export-mcu; "
                               "the segments are unchanged")
    p.add_argument("--verify", action="store_true",
                   help="chain the segments in LiteRT against the original model: outputs must be bit-identical")
    add_report_argument(p)


def run(args) -> int:
    from tpu_pipeline import api

    with progress(args) as say:  # one line per pass with the elapsed time (a status line on a terminal)
        r = api.compile(args.models, args.n, out=args.out, device=args.device, strategy=args.strategy,
                        time_limit=args.time_limit, gap=args.gap, colocate=args.colocate, no_schedule=args.no_schedule,
                        no_rewrite=args.no_rewrite, no_plan=args.no_plan, semantics=args.semantics,
                        budget=args.budget, verify=args.verify, progress=say, report=args.report,
                        int8_io=args.int8_io, input_outside_arena=args.input_outside_arena, max_n=args.max_n,
                        knee=args.knee, cuts=args.cuts, profile=args.profile, mix=args.mix)
    if args.json:
        printer(args).json(r.to_json())
        return 0
    print_report(r.compiled, printer(args))
    return 0


def _ms(s: float) -> str:
    return f"{s * 1e3:,.3f}"


def print_report(res, con) -> None:
    r = res.report
    hb = report.human_bytes
    con.print(f"[bold]{r['model']}[/bold] -> {res.out_dir}/  ({r['num_segments']} segment(s), device {r['device']}, "
              f"strategy {r['strategy']})")
    t = Table(title="segments (predicted)", show_header=True)
    # in/out: bytes each segment receives from and hands to the host; peak: tflite semantics (LiteRT runs segments)
    for col in ("#", "ops", "params B", "off-chip B", "in B", "out B", "act. peak B (tflite)", "ms"):
        t.add_column(col, justify="right", no_wrap=True)
    for s in r["segments"]:
        t.add_row(str(s["index"]), str(s["ops"]), hb(s["parameter_bytes"]), hb(s["offchip_bytes"]),
                  hb(s["in_bytes"]), hb(s["out_bytes"]), hb(s["activation_peak_bytes"]), _ms(s["predicted_latency_s"]))
    con.print(t)
    con.print("files: " + ", ".join([r["model"]] + [s["file"] for s in r["segments"]] + ["report.json"]))
    p = r["predicted"]
    s = Table(title="pipeline (predicted)", show_header=True)
    s.add_column("", no_wrap=True)
    for col in ("latency ms", "per s", "mJ", "slowest"):
        s.add_column(col, justify="right", no_wrap=True)
    s.add_row(f"ours ({r['strategy']})", _ms(p["latency_s"]), f"{p['throughput_per_s']:,.1f}",
              f"{p['energy_j'] * 1e3:,.3f}", str(p["bottleneck_stage"]))
    if r.get("baseline"):
        b = r["baseline"]["predicted"]
        s.add_row("Coral heuristic", _ms(b["latency_s"]), f"{b['throughput_per_s']:,.1f}",
                  f"{b['energy_j'] * 1e3:,.3f}", str(b["bottleneck_stage"]))
    con.print(s)
    _print_choices(r, con)
    sol = r["solver"]
    if r.get("gain_throughput") is not None:
        con.print(f"throughput gain over Coral's heuristic: x{r['gain_throughput']:.3f}")
    con.print(f"solver: {_solver_status(sol)} in {sol['seconds']:.2f} s")
    v = r.get("verification")
    if v:
        con.print(f"verified: {v['outputs_compared']} output(s) over {v['samples']} random input(s) bit-identical "
                  f"({v['runtime']})")
        tflm = v.get("whole_vs_source_tflm")
        if tflm and tflm.get("skipped"):
            con.print(f"TFLite Micro check of the optimised model skipped: {tflm['skipped']}")
        elif tflm:
            con.print(f"TFLite Micro: the optimised model matches the input "
                      f"({'bit-exact' if tflm['bit_exact'] else 'within float rounding'}, {tflm['runs']} inputs)")
    for pr in r["passes"]:
        line = _pass_line(pr)
        if line:
            con.print(line)
    for note in r["notes"]:
        con.print(f"note: {note}")


def _print_choices(r: dict, con) -> None:
    """-n auto's table, the partitions side by side, and what streams off chip."""
    hb = report.human_bytes
    if r.get("n_candidates"):
        t = Table(title=f"n = 1..{r['n_auto']['max_n']} (predicted)", show_header=True)
        for col in ("n", "period ms", "per s", "per s per TPU", "cached", "streamed", "proven"):
            t.add_column(col, justify="right", no_wrap=True)
        for c in r["n_candidates"]:
            t.add_row(("*" if c["n"] == r["n_chosen"] else "") + str(c["n"]), _ms(c["period_s"]),
                      f"{c['throughput_per_s']:,.1f}", f"{c['throughput_per_tpu']:,.1f}", hb(c["cached_bytes"]),
                      hb(c["streamed_bytes"]),
                      "yes" if c["proven"] else "pruned" if c.get("pruned") else "no")
        con.print(t)
        con.print(f"chose n={r['n_chosen']}: {r['n_chosen_reason']}" + (f" ({r['n_auto']['skipped']})"
                                                                       if r["n_auto"].get("skipped") else ""))
    if r.get("compared"):
        t = Table(title="partitions side by side (predicted, same cost model)", show_header=True)
        for col in ("partition", "n", "period ms", "per s", "cached", "streamed", "stage ms"):
            t.add_column(col, justify="right", no_wrap=True)
        for c in r["compared"]:
            t.add_row(c["label"], str(c["n"]), _ms(c["period_s"]), f"{c['throughput_per_s']:,.1f}", hb(c["cached_bytes"]),
                      hb(c["streamed_bytes"]), " / ".join(f"{x * 1e3:,.2f}" for x in c["stage_latency_s"]))
        con.print(t)
    co = r.get("co_compile")
    if co:
        best = co["orders"][0]
        others = "; ".join(f"{', '.join(o['order'])}: {_ms(o['mean_period_s'])} ms" for o in co["orders"][1:])
        con.print(f"co-compile order for the mix {co['mix']}: {', '.join(best['order'])} (mean period "
                  f"{_ms(best['mean_period_s'])} ms)" + (f"; other orders: {others}" if others else ""))
    for s in r["segments"]:
        c = s.get("caching")
        if c and c["streamed_bytes"]:
            ops = ", ".join(str(o["op"]) for o in c["streamed_ops"][:8]) + (", ..." if len(c["streamed_ops"]) > 8 else "")
            con.print(f"off-chip: {c['advice']} (cache full at byte {c['cache_full_at_byte']:,}; streaming ops, in "
                      f"caching order: {ops})")


def _solver_status(sol: dict) -> str:
    """What is proven about the partition: the simulated period (what the tables show), and the
    solver's bound P behind it."""
    gap, limit = sol.get("gap"), sol.get("gap_limit") or 0.0
    if sol.get("simulator_optimal"):
        period = "period proven optimal (simulated)"
    elif gap is not None:
        period = (f"period within {gap:.1%} of its proven lower bound"
                  + (f" (tolerance {limit:.1%})" if gap <= limit else ""))
        if sol.get("refinement_stopped_by") == "candidates":
            period += f" after {sol.get('simulated_candidates', 0)} simulated candidates (the budget)"
    else:
        period = "period not bounded"
    how = {"downsets": "down-set DP", "cpsat": "CP-SAT"}.get(sol.get("method", ""), "solver")
    if sol["proven_optimal"]:
        steps = f"the bound and its tie-break proven optimal ({how})"
    elif sol.get("primary_proven"):
        steps = f"the bound proven optimal, its tie-break not ({how})"
    else:
        steps = f"the bound not proven ({how}: " + ", ".join(dict.fromkeys(sol.get("stopped_by") or ["time limit"])) + ")"
    return f"{period}; {steps}"


def _pass_line(pr: dict) -> str | None:
    d, name = pr["detail"], pr["name"]
    if pr["status"] == "skipped":
        reason = d.get("reason", "")
        return None if reason in ("switched off", "not on PATH") else f"{name}: skipped, {reason}"
    if name == "rewrite":
        if not d.get("applied"):
            return f"rewrite: no identity rewrite lowers the optimal peak ({d['semantics']} semantics, {pr['seconds']:.2f} s)"
        return (f"rewrite: {len(d['applied'])} rewrite(s), optimal peak ({d['semantics']}) {d['peak_before']:,} -> {d['peak_after']:,} B "
                f"({pr['seconds']:.2f} s)")
    if name == "fit":
        return (f"fit: TFLite Micro arena head {d['baseline_peak_bytes']:,} -> {d['arena_head_bytes']:,} B "
                f"(budget {d['budget_bytes']:,} B), predicted latency {d['latency_overhead_predicted']:+.1%} on "
                f"{d['cost_device']}, {d['ops']} ops ({pr['seconds']:.2f} s)")
    if name == "schedule":
        proof = "proven optimal" if d["proven_optimal"] else f"lower bound {d['lower_bound']:,} B"
        return (f"schedule: activation peak ({d['semantics']} semantics) {d['peak_before']:,} -> {d['peak']:,} B, {proof} "
                f"({d['method']}, {pr['seconds']:.2f} s)")
    if name == "plan":
        proof = "proven optimal" if d["proven_optimal"] else f"lower bound {d['lower_bound']:,} B"
        return (f"plan: TFLite Micro arena head {d['tflm_head_bytes']:,} B with our offline plan "
                f"(its own planner: {d['tflm_own_planner_bytes']:,} B), {proof} ({pr['seconds']:.2f} s)")
    return None
