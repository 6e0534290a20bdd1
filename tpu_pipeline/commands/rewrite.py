"""`tpu-pipeline rewrite model.tflite -o out.tflite [--allow-lossy] [--verify] [--json]`."""

from __future__ import annotations

from tpu_pipeline.output import printer
from tpu_pipeline.toolchain import report
from tpu_pipeline.commands.options import check_output, positive_int, seconds
from tpu_pipeline.toolchain.loader import load_exact
from tpu_pipeline.toolchain.rewrite import LOSSY, rewrite_graph
from tpu_pipeline.toolchain.ir.convert import rewritten_model
from tpu_pipeline.toolchain.tflite import model_to_bytes, write_model



def add_arguments(p) -> None:
    p.add_argument("model", help="a .tflite file")
    p.add_argument("-o", "--output", required=True, help="where to write the rewritten .tflite")
    p.add_argument("--allow-lossy", action="store_true",
                   help="also split int8 concat->conv/fully-connected (partial sums requantized: not bit-exact; "
                        "the worst deviation in output LSBs is measured and reported)")
    p.add_argument("--semantics", choices=("tflm", "tflite"), default="tflm", help="memory model (default tflm)")
    p.add_argument("--time-limit", type=seconds, default=10.0, metavar="S", help="seconds per scheduler call (default 10)")
    p.add_argument("--budget", type=seconds, default=None, metavar="S",
                   help="seconds for the whole search (default 30 x time limit, at least 60)")
    p.add_argument("--verify", action="store_true",
                   help="run original and rewritten models in LiteRT and TFLite Micro on random inputs and compare "
                        "(always done when a lossy rewrite was applied)")
    p.add_argument("--runs", type=positive_int, default=3, help="random inputs per runtime for --verify (default 3)")


def run(args) -> int:
    check_output(args.output, inputs=[args.model])
    model, graph, notes = load_exact(args.model)  # exact for TFLite Micro: the reference for --verify too
    result = rewrite_graph(graph, time_limit=args.time_limit, semantics=args.semantics,
                           allow_lossy=args.allow_lossy, model=model, budget=args.budget)
    new_model = rewritten_model(result.graph, model)
    verification = None
    if args.verify or result.lossy:
        from tpu_pipeline.toolchain.execute.compare import check_or_raise, verify_models

        verification = verify_models(model_to_bytes(model), model_to_bytes(new_model), runs=args.runs,
                                     lossy_ok=result.lossy)
        check_or_raise(verification, args.output)
    write_model(new_model, args.output, inputs=[args.model])
    data = result.to_json()
    data.update(model=args.model, output=args.output, semantics=args.semantics)
    data["notes"] = [*data.get("notes", []), *notes]
    if verification is not None:
        data["verification"] = [v.to_json() for v in verification]
    if args.json:
        report.print_json(data)
        return 0
    out = printer(args)
    gain = result.peak_before - result.peak_after
    out.print(f"[bold]{args.model}[/bold] -> {args.output}: optimal peak {result.peak_before:,} -> "
              f"{result.peak_after:,} bytes ({gain / max(result.peak_before, 1):.1%} lower), "
              f"{result.ops_before} -> {result.ops_after} ops, {len(result.applied)} rewrite(s), "
              f"{'proven optimal' if result.proven_optimal else 'not proven optimal'} ({result.method}), "
              f"{result.seconds:.1f} s")
    if result.applied:
        out.print(f"rewrites kept ({args.semantics} semantics, optimal peak before -> after each):")
        for i, a in enumerate(result.applied, 1):
            step = ("enables the next rewrite" if a.enabling else
                    f"peak {a.peak_before:,} -> {a.peak_after:,} bytes")
            out.print(f"  {i}. {a.kind} at '{a.target}' ({a.branches} branches, {a.numerics}, "
                      f"+{a.ops_added} ops): {step}")
    else:
        out.print("no rewrite lowers the optimal peak; the model is written in its best order")
    for note in [*result.notes, *notes]:
        out.print(f"note: {note}")
    if verification is not None:
        for v in verification:
            if v.skipped:
                out.print(f"verify {v.runtime}: skipped ({v.skipped})")
                continue
            lsb = v.max_deviation_lsb
            dev = "bit-exact" if v.bit_exact else (
                f"worst deviation {lsb} LSB" if lsb is not None else
                f"worst deviation {max(o.max_abs for o in v.outputs):.3g} (float tolerance {min(o.tolerance for o in v.outputs):.3g})")
            out.print(f"verify {v.runtime}: {v.runs} random inputs, outputs match ({dev})")
    if any(a.numerics == LOSSY for a in result.applied):
        out.print("[yellow]lossy int8 rewrites applied (--allow-lossy): outputs are not bit-exact[/yellow]")
    return 0
