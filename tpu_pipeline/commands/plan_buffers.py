"""`tpu-pipeline plan-buffers in.csv -o out.csv [--capacity BYTES] [--planner P] [--time-limit S]`."""

from __future__ import annotations

from tpu_pipeline.output import printer
from tpu_pipeline.toolchain import report
from tpu_pipeline.toolchain.budget import Deadline
from tpu_pipeline.toolchain.errors import InfeasibleError, UsageError
from tpu_pipeline.toolchain.memory.minimalloc import read_csv, write_csv
from tpu_pipeline.toolchain.memory.plan import arena_size, first_conflict
from tpu_pipeline.toolchain.memory.planners import PLANNERS, plan_buffers
from tpu_pipeline.toolchain.memory.preprocess import live_lower_bound
from tpu_pipeline.toolchain.memory.search import search_plan



def add_arguments(p) -> None:
    p.add_argument("csv", help="allocation problem: id,lower,upper,size (half-open [lower, upper))")
    p.add_argument("-o", "--output", required=True, help="where to write the CSV with an offset column")
    p.add_argument("--capacity", type=int, metavar="BYTES",
                   help="answer feasibility at this size (exit 3 if proven impossible or not found in time)")
    p.add_argument("--planner", default="auto", choices=[x for x in PLANNERS if x != "tflite"],
                   help="planner (default auto: greedy, then exact search and CP-SAT)")
    p.add_argument("--time-limit", type=float, default=10.0, metavar="S", help="seconds (default 10)")


def run(args) -> int:
    if args.time_limit <= 0:
        raise UsageError(f"--time-limit must be positive, got {args.time_limit}")
    deadline = Deadline(args.time_limit)  # one budget for the whole command, reading the CSV included
    problem = read_csv(args.csv)
    bufs = problem.buffers
    lb = live_lower_bound(bufs)
    if args.capacity is not None:
        if args.capacity < 0:
            raise UsageError(f"--capacity must be non-negative, got {args.capacity}")
        if lb > args.capacity:
            raise InfeasibleError(f"{args.csv}: infeasible at {args.capacity:,} bytes: "
                                  f"{lb:,} bytes are live at once")
        plan = plan_buffers(bufs, "greedy-size", None, deadline=deadline)
        if plan.size > args.capacity:
            found = search_plan(bufs, args.capacity, deadline.remaining())
            if found is None:
                raise InfeasibleError(f"{args.csv}: proven infeasible at {args.capacity:,} bytes")
            if not isinstance(found, list):
                raise InfeasibleError(f"{args.csv}: no placement within {args.capacity:,} bytes found in "
                                      f"{args.time_limit:g} s (not proven impossible)")
            offsets, planner, size = found, "search", arena_size(bufs, found)
        else:
            offsets, planner, size = list(plan.offsets), plan.planner, plan.size
        proven = size <= lb
        bound = lb
    else:
        plan = plan_buffers(bufs, args.planner, None, deadline=deadline)
        offsets, planner, size, proven, bound = list(plan.offsets), plan.planner, plan.size, plan.proven_optimal, plan.lower_bound
    if args.capacity is not None:  # plan_buffers checks its plans; search_plan's are checked here
        problem_text = first_conflict(bufs, offsets)  # O(n log n): fine for 10^5 buffers
        if problem_text:  # pragma: no cover - a planner bug
            raise AssertionError(problem_text)
    write_csv(problem, offsets, args.output)
    result = {"input": args.csv, "output": args.output, "buffers": len(bufs), "size": size,
              "lower_bound": bound, "capacity": args.capacity, "feasible": True if args.capacity is not None else None,
              "planner": planner, "proven_optimal": proven}
    if args.json:
        report.print_json(result)
    else:
        out = printer(args)
        cap = f" (capacity {args.capacity:,})" if args.capacity is not None else ""
        out.print(f"{args.csv}: {len(bufs)} buffers packed into {size:,} bytes{cap}; lower bound {bound:,}; "
                  f"planner {planner}; {'proven optimal' if proven else 'not proven optimal'}")
        out.print(f"wrote {args.output}")
    return 0
