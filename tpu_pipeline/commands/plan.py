"""`tpu-pipeline plan model.tflite -o out.tflite [--planner P] [--time-limit S] [--onchip BYTES]`."""

from __future__ import annotations

from tpu_pipeline.output import printer
from rich.table import Table

from tpu_pipeline.toolchain import report
from tpu_pipeline.commands.options import check_output, non_negative_int, seconds
from tpu_pipeline.toolchain.errors import VerificationError
from tpu_pipeline.toolchain.ir.convert import load_exact
from tpu_pipeline.toolchain.memory import PLANNERS, lifetimes, plan_for_tflm, tflite_arena, tflm_greedy
from tpu_pipeline.toolchain.memory.offchip import offchip_traffic
from tpu_pipeline.toolchain.tflite import with_offline_plan, write_model
from tpu_pipeline.toolchain.tflite.metadata import total_tensor_count

HELP = "plan arena offsets (down to the live-bytes bound) and write them as TFLite Micro's offline plan"


def add_arguments(p) -> None:
    p.add_argument("model", help="a .tflite file")
    p.add_argument("-o", "--output", required=True, help="the model with the OfflineMemoryAllocation metadata")
    p.add_argument("--planner", default="auto", choices=[x for x in PLANNERS if x != "tflite"],
                   help="auto (default) | search | cpsat | greedy-size | greedy-conflicts | tflm")
    p.add_argument("--time-limit", type=seconds, default=5.0, metavar="S", help="planner seconds (default 5)")
    p.add_argument("--onchip", type=non_negative_int, metavar="BYTES",
                   help="also report off-chip traffic (Belady) for an on-chip memory of this size")
    p.add_argument("--verify", action="store_true",
                   help="load the written model in TFLite Micro and check its arena head equals the plan")


def run(args) -> int:
    check_output(args.output, inputs=[args.model])
    model, graph, notes = load_exact(args.model)  # exact for TFLite Micro: no plan can change its outputs
    lt = lifetimes(graph, semantics="tflm")
    result = plan_for_tflm(graph, lt, args.planner, args.time_limit, n_tensors=total_tensor_count(model))
    plan = result.plan
    out_model = with_offline_plan(model, list(result.tensor_offsets), label=args.model)
    write_model(out_model, args.output, inputs=[args.model])
    tflm_own = tflm_greedy(lt).size
    data = {
        "model": args.model, "output": args.output, "buffers": len(lt.buffers), "semantics": "tflm",
        "lower_bound": plan.lower_bound, "planned_bytes": result.head,
        "tflm_planner_bytes": tflm_own, "tflite_planner_bytes": tflite_arena(lifetimes(graph, semantics="tflite")).size,
        "planner": plan.planner, "proven_optimal": result.head <= plan.lower_bound or plan.proven_optimal,
        "seconds": round(plan.seconds, 3),
        "pinned_tensors": sum(1 for o in result.tensor_offsets if o >= 0), "notes": notes,
    }
    if args.verify:
        from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena
        from tpu_pipeline.toolchain.tflite import model_to_bytes

        head = measure_tflm_arena(model_to_bytes(out_model)).head
        data["tflm_measured_head"] = head
        if head != result.head:
            raise VerificationError(f"{args.output}: TFLite Micro allocates {head:,} bytes, the plan says {result.head:,}")
    if args.onchip is not None:
        data["offchip"] = {"converter_order": offchip_traffic(graph, None, args.onchip).to_json()}
    if args.json:
        report.print_json(data)
        return 0
    out = printer(args)
    t = Table(title=f"{args.model}: TFLite Micro arena head (tflm semantics)")
    t.add_column("figure")
    t.add_column("B", justify="right")
    t.add_column("KiB/MiB", justify="right")
    t.add_row("lower bound = peak (most live bytes at one step)", f"{plan.lower_bound:,}",
              report.human_bytes(plan.lower_bound))
    t.add_row("head, TFLite Micro's own planner (predicted)", f"{tflm_own:,}", report.human_bytes(tflm_own))
    t.add_row(f"head, our plan ({plan.planner}, {plan.seconds:.2f} s)", f"{result.head:,}",
              report.human_bytes(result.head))
    if "tflm_measured_head" in data:
        t.add_row("head with our plan, measured (TFLite Micro on the host)", f"{data['tflm_measured_head']:,}",
                  "verified")
    out.print(t)
    out.print(("proven optimal" if data["proven_optimal"] else "not proven optimal")
              + f"; {data['pinned_tensors']} tensors pinned; wrote {args.output}")
    if args.onchip is not None:
        tr = data["offchip"]["converter_order"]
        if tr["feasible"]:
            out.print(f"off-chip traffic with {args.onchip:,} bytes on chip (stored order, Belady): "
                      f"{tr['total_bytes']:,} bytes ({tr['spill_bytes']:,} spilled, {tr['reload_bytes']:,} reloaded)")
        else:
            out.print(f"{args.onchip:,} bytes on chip cannot run this order: one op needs {tr['min_onchip_bytes']:,}")
    for note in notes:
        out.print(f"note: {note}")
    return 0
