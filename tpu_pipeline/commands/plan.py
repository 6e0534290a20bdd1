"""`tpu-pipeline plan model.tflite -o out.tflite [--planner P] [--time-limit S] [--onchip BYTES]`."""

from __future__ import annotations

from rich.table import Table

from tpu_pipeline.commands.options import add_report_argument, non_negative_int, seconds
from tpu_pipeline.output import printer
from tpu_pipeline.toolchain.device import DEFAULT_KERNEL_SET, KERNEL_SET_NAMES
from tpu_pipeline.toolchain.memory import PLANNERS



def add_arguments(p) -> None:
    p.add_argument("model", nargs="+", help="a .tflite file; several: each planned for one shared TFLite Micro arena "
                                            "(docs/deploy.md#several-models-one-arena)")
    p.add_argument("-o", "--output", required=True, help="the model with the OfflineMemoryAllocation metadata; "
                                                         "several models: a folder, each under its file name")
    p.add_argument("--kernels", choices=KERNEL_SET_NAMES, default=None,
                   help="several models: the TFLite Micro kernel set whose tails the shared arena stacks "
                        f"(default {DEFAULT_KERNEL_SET.name})")
    p.add_argument("--device", metavar="NAME", help="several models: also whether the shared arena fits this MCU")
    p.add_argument("--planner", default="auto", choices=[x for x in PLANNERS if x != "tflite"],
                   help="auto (default) | search | cpsat | greedy-size | greedy-conflicts | tflm")
    p.add_argument("--time-limit", type=seconds, default=5.0, metavar="S", help="planner seconds (default 5)")
    p.add_argument("--onchip", type=non_negative_int, metavar="BYTES",
                   help="also report off-chip traffic (Belady) for an on-chip memory of this size")
    p.add_argument("--verify", action="store_true",
                   help="load the written model in TFLite Micro and check its arena head equals the plan")
    add_report_argument(p)


def run(args) -> int:
    from tpu_pipeline import api
    from tpu_pipeline.toolchain.errors import UsageError
    from tpu_pipeline.toolchain.report import human_bytes

    if len(args.model) > 1:
        return _shared(args)
    if args.kernels or args.device:
        raise UsageError("plan: --kernels and --device are for several models (one shared arena)")
    args.model = args.model[0]
    r = api.plan(args.model, output=args.output, planner=args.planner, time_limit=args.time_limit,
                 onchip=args.onchip, verify=args.verify, report=args.report)
    out, data = printer(args), r.data
    if args.json:
        out.json(r.to_json())
        return 0
    t = Table(title=f"{args.model}: TFLite Micro arena head (tflm semantics)")
    t.add_column("figure")
    t.add_column("B", justify="right")
    t.add_column("KiB/MiB", justify="right")
    t.add_row("lower bound = peak (most live bytes at one step)", f"{r.lower_bound:,}", human_bytes(r.lower_bound))
    t.add_row("head, TFLite Micro's own planner (predicted)", f"{r.tflm_planner_bytes:,}",
              human_bytes(r.tflm_planner_bytes))
    t.add_row(f"head, our plan ({r.planner}, {data['seconds']:.2f} s)", f"{r.planned_bytes:,}",
              human_bytes(r.planned_bytes))
    if "tflm_measured_head" in data:
        t.add_row("head with our plan, measured (TFLite Micro on the host)", f"{data['tflm_measured_head']:,}",
                  "verified")
    out.print(t)
    out.print(("proven optimal" if r.proven_optimal else "not proven optimal")
              + f"; {data['pinned_tensors']} tensors pinned; wrote {args.output}")
    if args.onchip is not None:
        tr = data["offchip"]["converter_order"]
        if tr["feasible"]:
            out.print(f"off-chip traffic with {args.onchip:,} bytes on chip (stored order, Belady): "
                      f"{tr['total_bytes']:,} bytes ({tr['spill_bytes']:,} spilled, {tr['reload_bytes']:,} reloaded)")
        else:
            out.print(f"{args.onchip:,} bytes on chip cannot run this order: one op needs {tr['min_onchip_bytes']:,}")
    for note in data["notes"]:
        out.print(f"note: {note}")
    return 0


def _shared(args) -> int:
    """Several models, each planned from the head's first byte: the shared arena they make."""
    from tpu_pipeline import api_shared
    from tpu_pipeline.toolchain.errors import InfeasibleError, UsageError

    if args.verify or args.onchip is not None or args.report or args.planner != "auto":
        raise UsageError("plan of several models: --verify, --onchip, --report and --planner are for one model")
    d = api_shared.plan_shared_models(args.model, args.output, kernels=args.kernels, device=args.device)
    out = printer(args)
    if args.json:
        out.json(d)
    else:
        for m in d["models"]:
            out.print(f"{m['model']} -> {m['output']}: head {m['arena_head_predicted']:,} B (lower bound "
                      f"{m['lower_bound']:,} B) + tail {m['arena_tail_predicted']:,} B")
        out.print(f"one shared arena ({d['kernels']}): every head from the arena's first byte, the largest "
                  f"{d['head']:,} B + stacked tails {d['tail']:,} B = {d['shared_arena_bytes_predicted']:,} B "
                  f"(separate arenas {d['separate_arena_bytes_predicted']:,} B)"
                  + (f"; {d['arena_bytes_available']:,} B available on {d['device']}" if "device" in d else ""))
    if "fits" in d and not d["fits"]:
        raise InfeasibleError(f"the shared arena of {d['shared_arena_bytes_predicted']:,} B exceeds the "
                              f"{d['arena_bytes_available']:,} B {d['device']} leaves for one arena")
    return 0
