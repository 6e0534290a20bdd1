"""`tpu-pipeline schedule model.tflite -o out.tflite [--method] [--time-limit] [--semantics]`."""

from __future__ import annotations

from tpu_pipeline.commands.options import add_report_argument, seconds
from tpu_pipeline.output import printer
from tpu_pipeline.toolchain.schedule import METHODS



def add_arguments(p) -> None:
    p.add_argument("model", help="a .tflite file")
    p.add_argument("-o", "--output", help="write the reordered model here")
    p.add_argument("--method", choices=METHODS, default="auto", help="search method (default auto)")
    p.add_argument("--time-limit", type=seconds, default=10.0, metavar="S", help="seconds (default 10)")
    p.add_argument("--semantics", choices=("tflm", "tflite"), default="tflm",
                   help="memory model of the target runtime (default tflm)")
    add_report_argument(p)


def run(args) -> int:
    from tpu_pipeline import api
    from tpu_pipeline.toolchain.report import human_bytes as hb

    r = api.schedule(args.model, output=args.output, method=args.method, time_limit=args.time_limit,
                     semantics=args.semantics, report=args.report)
    out = printer(args)
    if args.json:
        out.json(r.to_json())
        return 0
    s = r.schedule
    status = "proven optimal" if s.proven_optimal else f"not proven (gap {s.peak - s.lower_bound:,} B)"
    out.print(f"[bold]{args.model}[/bold]: {s.ops} ops -> {s.units} units after fusion, "
              f"{s.pieces} pieces (largest {s.largest_piece} units)")
    out.print(f"peak ({s.semantics}): {s.stored_peak:,} B ({hb(s.stored_peak)}) stored order -> "
              f"{s.peak:,} B ({hb(s.peak)})")
    out.print(f"lower bound: {s.lower_bound:,} B ({hb(s.lower_bound)}); {status}; "
              f"method {s.method}; {s.seconds:.2f} s")
    out.print(f"TFLite Micro arena head (its greedy planner): {r.tflm_head_before:,} B -> {r.tflm_head_after:,} B")
    for note in r.data["notes"]:
        out.print(f"note: {note}")
    if args.output:
        out.print(f"written to {args.output}")
    return 0
