"""`tpu-pipeline fit model.tflite (--budget BYTES | --device NAME) -o out.tflite [--objective latency|memory]
[--pareto] [--plot pareto.png] [--json]`."""

from __future__ import annotations

from tpu_pipeline.output import printer, progress
from tpu_pipeline.toolchain import report
from tpu_pipeline.toolchain.errors import InfeasibleError
from tpu_pipeline.commands.options import check_output, non_negative_int, plot_path, positive_int, seconds

HELP = "make a model fit an arena budget at the least predicted latency (patch-based execution, TASO's selection)"


def add_arguments(p) -> None:
    p.add_argument("model", help="a .tflite file")
    p.add_argument("-o", "--output", required=True, help="where to write the fitted .tflite (offline plan inside)")
    p.add_argument("--budget", type=non_negative_int, metavar="BYTES",
                   help="largest TFLite Micro arena head allowed (bytes)")
    p.add_argument("--device", metavar="NAME",
                   help="MCU descriptor: the budget is its SRAM minus what the firmware needs, and latency is "
                        "predicted for it (default cost model: qemu-mps2-an386)")
    p.add_argument("--objective", choices=("latency", "memory"), default="latency",
                   help="latency: fastest variant within the budget (default); memory: smallest arena")
    p.add_argument("--kernels", choices=("cmsis-nn", "reference"), default="cmsis-nn",
                   help="TFLite Micro kernel set whose cost model prices the variants (and, with --device, whose "
                        "persistent allocations count against SRAM); default cmsis-nn")
    p.add_argument("--allow-lossy", action="store_true",
                   help="also offer int8 partial-convolution splits (requantized partial sums: not bit-identical; "
                        "the deviation is measured and reported)")
    p.add_argument("--pareto", action="store_true", help="also print the arena/latency frontier")
    p.add_argument("--plot", metavar="FILE", type=plot_path, help="plot the frontier (.png, .pdf, .svg, ...)")
    p.add_argument("--time-limit", type=seconds, default=30.0, metavar="S",
                   help="seconds for the search (default 30); checks in the runtimes come on top")
    p.add_argument("--runs", type=positive_int, default=2, help="random inputs per runtime for the check (default 2)")


def run(args) -> int:
    from tpu_pipeline.toolchain.fit import fit_model
    from tpu_pipeline.toolchain.tflite import write_bytes_atomic

    check_output(args.output, inputs=[args.model])
    if args.plot:
        check_output(args.plot, inputs=[args.model, args.output])
    with progress(args) as say:
        fitted = fit_model(args.model, budget=args.budget, device=args.device, objective=args.objective,
                           kernels=args.kernels, time_limit=args.time_limit, want_pareto=args.pareto or bool(args.plot),
                           verify_runs=args.runs, progress=say, allow_lossy=args.allow_lossy)
    r = fitted.result
    if not r.fits:
        raise InfeasibleError(f"{args.model}: no variant fits {r.budget:,} B of arena head; the smallest reachable "
                              f"is {r.head:,} B ({len(r.graph.ops)} ops)")
    write_bytes_atomic(args.output, fitted.data, inputs=[args.model])
    if args.plot:
        plot_frontier(r, args.plot, args.model)
    if args.json:
        data = fitted.to_json()
        data.update(model=args.model, output=args.output)
        report.print_json(data)
        return 0
    _print(args, fitted)
    return 0


def _agreement(v) -> str:
    if v.bit_exact:
        return "bit-identical"
    lsb = v.max_deviation_lsb
    return f"within {lsb} LSB (lossy)" if lsb else "within float rounding"


def _print(args, fitted) -> None:
    r, out = fitted.result, printer(args)
    over = (r.selection.latency_s / r.baseline_latency_s - 1) if r.baseline_latency_s else 0.0
    out.print(f"[bold]{args.model}[/bold] -> {args.output}: arena head {r.baseline_peak:,} -> {r.head:,} B "
              f"(budget {r.budget:,} B from {fitted.budget_from})" if r.budget is not None else
              f"[bold]{args.model}[/bold] -> {args.output}: arena head {r.baseline_peak:,} -> {r.head:,} B")
    out.print(f"predicted latency {r.baseline_latency_s * 1e3:,.2f} -> {r.selection.latency_s * 1e3:,.2f} ms "
              f"({over:+.1%}; device cost model, a prediction); {len(r.graph.ops)} ops; order "
              f"{'proven optimal' if r.schedule.proven_optimal else 'not proven optimal'}; "
              f"{r.variants_evaluated} variants over {r.spans} spans, {r.seconds:.1f} s")
    for v in r.selection.variants:
        if v.kind != "as-is":
            out.print(f"  spans {v.first}-{v.last}: {v.label}: peak {v.peak:,} B, {v.ops} ops")
    checks = ", ".join(f"{v.runtime} {_agreement(v)}" for v in fitted.verification if not v.skipped)
    out.print(f"checked: {checks}; host TFLite Micro head {fitted.head_measured:,} B (predicted "
              f"{fitted.head_predicted_host:,} B; {r.head:,} B with the {fitted.kernels} kernels)")
    if r.frontier:
        out.print("frontier (fastest first): arena peak B, predicted latency ms, variants")
        for p in r.frontier:
            kinds = "; ".join(v.label for v in p.variants if v.kind != "as-is") or "as is"
            out.print(f"  {p.peak:>12,}  {p.latency_s * 1e3:10.2f}  {kinds}")
    for note in fitted.to_json()["notes"]:
        out.print(f"note: {note}")


def plot_frontier(r, path: str, title: str) -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tpu_pipeline.toolchain.tflite import write_bytes_atomic

    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [p.peak / 1024 for p in r.frontier]
    ys = [p.latency_s * 1e3 for p in r.frontier]
    ax.step(xs, ys, where="post", color="tab:blue", linewidth=1)
    ax.scatter(xs, ys, color="tab:blue", zorder=3, label="frontier (CP-SAT optimum per budget)")
    ax.scatter([r.baseline_peak / 1024], [r.baseline_latency_s * 1e3], marker="x", color="black", zorder=4,
               label="model as it is (proven optimal order)")
    if r.budget is not None:
        ax.axvline(r.budget / 1024, color="tab:red", linestyle="--", linewidth=1, label="budget")
    ax.set_xlabel("arena peak (KiB)")
    ax.set_ylabel("predicted latency (ms)")
    ax.set_title(f"{title}: arena vs predicted latency")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=path.rsplit(".", 1)[-1], dpi=110)
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())
