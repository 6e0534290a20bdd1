"""`tpu-pipeline inspect model.tflite [--plot memory.png] [--format ...]`."""

from __future__ import annotations

from tpu_pipeline.commands.options import add_report_argument, plot_path
from tpu_pipeline.output import printer



def add_arguments(p) -> None:
    p.add_argument("model", help="a .tflite file")
    p.add_argument("--plot", metavar="FILE", type=plot_path,
                   help="plot live bytes per step, peak marked (.png, .pdf, .svg, ...)")
    add_report_argument(p)


def run(args) -> int:
    from tpu_pipeline import api
    from tpu_pipeline.toolchain.report import print_summary

    r = api.inspect(args.model, plot=args.plot, report=args.report)
    out = printer(args)
    if args.json:
        out.json(r.to_json())
        return 0
    print_summary(r.summary, out)
    if args.plot:
        out.print(f"plot written to {args.plot}")
    return 0
