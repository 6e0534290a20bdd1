"""`tpu-pipeline schedule model.tflite -o out.tflite [--method] [--time-limit] [--semantics]`."""

from __future__ import annotations

from tpu_pipeline.output import printer
from tpu_pipeline.toolchain import report
from tpu_pipeline.commands.options import check_output, seconds
from tpu_pipeline.toolchain.ir import load, to_model
from tpu_pipeline.toolchain.ir.convert import load_exact
from tpu_pipeline.toolchain.memory import lifetimes, tflm_greedy
from tpu_pipeline.toolchain.schedule import METHODS, schedule

HELP = "reorder ops for the smallest peak activation memory, with a proof of optimality"


def add_arguments(p) -> None:
    p.add_argument("model", help="a .tflite file")
    p.add_argument("-o", "--output", help="write the reordered model here")
    p.add_argument("--method", choices=METHODS, default="auto", help="search method (default auto)")
    p.add_argument("--time-limit", type=seconds, default=10.0, metavar="S", help="seconds (default 10)")
    p.add_argument("--semantics", choices=("tflm", "tflite"), default="tflm",
                   help="memory model of the target runtime (default tflm)")


def run(args) -> int:
    if args.output:
        check_output(args.output, inputs=[args.model])
    # a model that is written is made exact for TFLite Micro first (its outputs then cannot depend on order)
    model, graph, notes = load_exact(args.model) if args.output else (*load(args.model), [])
    result = schedule(graph, method=args.method, time_limit=args.time_limit, semantics=args.semantics)
    new_graph = graph.reordered(result.order)
    head_before = tflm_greedy(lifetimes(graph, semantics="tflm")).size
    head_after = tflm_greedy(lifetimes(new_graph, semantics="tflm")).size
    if args.output:
        from tpu_pipeline.toolchain.tflite import write_model

        write_model(to_model(new_graph, model), args.output, inputs=[args.model])
    if args.json:
        d = result.to_json()
        d.update(model=args.model, output=args.output, tflm_head_before=head_before, tflm_head_after=head_after)
        d["notes"] = [*d.get("notes", []), *notes]
        report.print_json(d)
        return 0
    out = printer(args)
    hb = report.human_bytes
    status = "proven optimal" if result.proven_optimal else f"not proven (gap {result.peak - result.lower_bound:,} B)"
    out.print(f"[bold]{args.model}[/bold]: {result.ops} ops -> {result.units} units after fusion, "
              f"{result.pieces} pieces (largest {result.largest_piece} units)")
    out.print(f"peak ({result.semantics}): {result.stored_peak:,} B ({hb(result.stored_peak)}) stored order -> "
              f"{result.peak:,} B ({hb(result.peak)})")
    out.print(f"lower bound: {result.lower_bound:,} B ({hb(result.lower_bound)}); {status}; "
              f"method {result.method}; {result.seconds:.2f} s")
    out.print(f"TFLite Micro arena head (its greedy planner): {head_before:,} B -> {head_after:,} B")
    for note in [*result.notes, *notes]:
        out.print(f"note: {note}")
    if args.output:
        out.print(f"written to {args.output}")
    return 0
