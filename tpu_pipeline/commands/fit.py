"""`tpu-pipeline fit model.tflite (--budget BYTES | --device NAME) -o out.tflite [--objective latency|memory]
[--pareto] [--plot pareto.png] [--json]`."""

from __future__ import annotations

from tpu_pipeline.output import printer, progress
from tpu_pipeline.commands.options import add_interface_arguments, add_report_argument, non_negative_int, plot_path, positive_int, seconds
from tpu_pipeline.toolchain.device import DEFAULT_KERNEL_SET, KERNEL_SET_NAMES



def add_arguments(p) -> None:
    p.add_argument("model", nargs="+", help="a .tflite file; several: fitted for one shared TFLite Micro arena, run one "
                                            "at a time (docs/deploy.md#several-models-one-arena)")
    p.add_argument("-o", "--output", required=True, help="where to write the fitted .tflite (offline plan inside); "
                                                         "several models: a folder, each under its file name")
    p.add_argument("--budget", type=non_negative_int, metavar="BYTES",
                   help="largest TFLite Micro arena allowed (bytes): head + persistent tail on the 32-bit target "
                        "(what the board's RAM must hold), or the head alone with --head-only")
    p.add_argument("--head-only", action="store_true",
                   help="the budget and the memory objective count the planned head alone (the arena's "
                        "non-persistent part), not the whole arena")
    add_interface_arguments(p, "changes the interface: opt-in", "needs the harness firmware: export-mcu")
    p.add_argument("--no-patches", action="store_true",
                   help="no patch-based execution: every layer runs whole (the other choices remain)")
    p.add_argument("--builtin-kernels", action="store_true",
                   help="only TFLite Micro's builtin kernels (a model for any TFLite Micro build); by default the "
                        "harness firmware's kernels may be chosen (requantization in flash, folded padding, "
                        "overlapped and direct convolutions, patch stages)")
    p.add_argument("--device", metavar="NAME",
                   help="MCU descriptor: the budget is its SRAM minus what the firmware needs, and latency is "
                        "predicted for it (default cost model: qemu-mps2-an386)")
    p.add_argument("--objective", choices=("latency", "memory"), default="latency",
                   help="latency: fastest variant within the budget (default); memory: smallest arena")
    p.add_argument("--kernels", choices=KERNEL_SET_NAMES, default=DEFAULT_KERNEL_SET.name,
                   help="TFLite Micro kernel set whose cost model prices the variants (and, with --device, whose "
                        f"persistent allocations count against SRAM); default {DEFAULT_KERNEL_SET.name}")
    p.add_argument("--allow-lossy", action="store_true",
                   help="also offer int8 partial-convolution splits (requantized partial sums: not bit-identical; "
                        "the deviation is measured and reported)")
    p.add_argument("--pareto", action="store_true", help="also print the arena/latency frontier")
    p.add_argument("--plot", metavar="FILE", type=plot_path, help="plot the frontier (.png, .pdf, .svg, ...)")
    p.add_argument("--time-limit", type=seconds, default=30.0, metavar="S",
                   help="seconds for the search (default 30); checks in the runtimes come on top")
    p.add_argument("--runs", type=positive_int, default=2, help="random inputs per runtime for the check (default 2)")
    add_report_argument(p)


def run(args) -> int:
    from tpu_pipeline import api

    if len(args.model) > 1:
        return _shared(args)
    args.model = args.model[0]
    with progress(args) as say:
        r = api.fit(args.model, output=args.output, budget=args.budget, device=args.device, objective=args.objective,
                    kernels=args.kernels, allow_lossy=args.allow_lossy, pareto=args.pareto, plot=args.plot,
                    time_limit=args.time_limit, runs=args.runs, progress=say, report=args.report,
                    int8_io=args.int8_io, input_outside_arena=args.input_outside_arena, head_only=args.head_only,
                    builtin_kernels=args.builtin_kernels, patches=not args.no_patches)
    if args.json:
        printer(args).json(r.to_json())
        return 0
    _print(args, r.fitted)
    return 0


def _agreement(v) -> str:
    if v.bit_exact:
        return "bit-identical"
    lsb = v.max_deviation_lsb
    return f"within {lsb} LSB (lossy)" if lsb else "within float rounding"


def _print(args, fitted) -> None:
    r, out = fitted.result, printer(args)
    over = (r.selection.latency_s / r.baseline_latency_s - 1) if r.baseline_latency_s else 0.0
    budget = f" (budget {r.budget:,} B from {fitted.budget_from})" if r.budget is not None else ""
    out.print(f"[bold]{args.model}[/bold] -> {args.output}: arena head {r.baseline_peak:,} -> {r.head:,} B{budget}")
    if fitted.tail_target is not None and r.baseline_tail is not None:
        before, after = r.baseline_peak + r.baseline_tail, r.head + fitted.tail_target
        out.print(f"whole arena on the 32-bit target (head + tail): {before:,} -> {after:,} B "
                  f"(tail {r.baseline_tail:,} -> {fitted.tail_target:,} B; {before / after:.2f}x)")
    out.print(f"predicted latency {r.baseline_latency_s * 1e3:,.2f} -> {r.selection.latency_s * 1e3:,.2f} ms "
              f"({over:+.1%}; device cost model, a prediction); {len(r.graph.ops)} ops; order "
              f"{'proven optimal' if r.schedule.proven_optimal else 'not proven optimal'}; "
              f"{r.variants_evaluated} variants over {r.spans} spans, {r.seconds:.1f} s")
    for v in r.selection.variants:
        if v.kind != "as-is":
            out.print(f"  spans {v.first}-{v.last}: {v.label}: peak {v.peak:,} B, {v.ops} ops")
    checks = ", ".join(f"{v.runtime} {_agreement(v)}" if not v.skipped else f"{v.runtime} not run ({v.skipped.split(': ')[0]})"
                       for v in fitted.verification)
    out.print(f"checked: {checks}; host TFLite Micro head {fitted.head_measured:,} B (predicted "
              f"{fitted.head_predicted_host:,} B; {r.head:,} B with the {fitted.kernels} kernels)")
    if r.frontier:
        out.print("frontier (fastest first): arena peak B, predicted latency ms, variants")
        for p in r.frontier:
            kinds = "; ".join(v.label for v in p.variants if v.kind != "as-is") or "as is"
            out.print(f"  {p.peak:>12,}  {p.latency_s * 1e3:10.2f}  {kinds}")
    for note in fitted.to_json()["notes"]:
        out.print(f"note: {note}")


def _shared(args) -> int:
    """Several models fitted for one shared arena (largest head + stacked tails) at the least total latency."""
    from tpu_pipeline import api_shared
    from tpu_pipeline.toolchain.errors import UsageError

    refused = [flag for flag, on in (("--head-only", args.head_only), ("--objective memory", args.objective != "latency"),
                                     ("--pareto", args.pareto), ("--plot", args.plot), ("--report", args.report),
                                     ("--input-outside-arena", args.input_outside_arena)) if on]
    if refused:
        raise UsageError(f"fit of several models: {', '.join(refused)} not supported (fit each model alone for those)")
    with progress(args) as say:
        d = api_shared.fit_shared(args.model, args.output, budget=args.budget, device=args.device, kernels=args.kernels,
                                  time_limit=args.time_limit, runs=args.runs, progress=say, int8_io=args.int8_io,
                                  builtin_kernels=args.builtin_kernels, patches=not args.no_patches,
                                  allow_lossy=args.allow_lossy)
    out = printer(args)
    if args.json:
        out.json(d)
        return 0
    for m in d["models"]:
        kinds = "; ".join(m["variants"]) or "as is"
        out.print(f"[bold]{m['model']}[/bold] -> {m['output']}: head {m['arena_head_predicted']:,} B + tail "
                  f"{m['arena_tail_predicted']:,} B, predicted {m['latency_s_predicted'] * 1e3:,.2f} ms "
                  f"(as is {m['baseline_latency_s_predicted'] * 1e3:,.2f} ms); {kinds}")
    out.print(f"one shared arena ({d['kernels']}): head {d['head']:,} B + stacked tails {d['tail']:,} B = "
              f"{d['shared_arena_bytes_predicted']:,} B of a {d['budget_bytes']:,} B budget (from {d['budget_from']}); "
              f"separate arenas {d['separate_arena_bytes_predicted']:,} B; total predicted latency "
              f"{d['latency_s_predicted_total'] * 1e3:,.2f} ms")
    for note in d["notes"]:
        out.print(f"note: {note}")
    return 0
