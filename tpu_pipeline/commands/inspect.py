"""`tpu-pipeline inspect model.tflite [--json] [--plot memory.png]`."""

from __future__ import annotations

from tpu_pipeline.output import printer
from tpu_pipeline.toolchain import report
from tpu_pipeline.toolchain.inspect import summarize
from tpu_pipeline.commands.options import check_output, plot_path
from tpu_pipeline.toolchain.ir import load

HELP = "op histogram, parameter bytes, activation peak and arena predictions"


def add_arguments(p) -> None:
    p.add_argument("model", help="a .tflite file")
    p.add_argument("--plot", metavar="FILE", type=plot_path,
                   help="plot live bytes per step, peak marked (.png, .pdf, .svg, ...)")


def run(args) -> int:
    if args.plot:
        check_output(args.plot, inputs=[args.model])
    model, graph = load(args.model)
    summary = summarize(graph, path=args.model, subgraphs=len(model.subgraphs))
    if args.plot:
        report.plot_live_bytes({"stored order": list(summary.live_bytes)}, args.plot,
                               f"{args.model}: live activation bytes (TFLite Micro semantics)")
    if args.json:
        # which memory semantics the figures use (tflite_arena_bytes is TFLite's own by definition)
        report.print_json({**summary.to_json(), "semantics": "tflm"})
    else:
        report.print_summary(summary, printer(args))
        if args.plot:
            printer(args).print(f"plot written to {args.plot}")
    return 0
