"""`tpu-pipeline batch MODEL|DIR ... --command inspect|fit|profile|compile [--device D ...] [--budget B ...]
[--jobs N | --cluster ADDRESS] [--job-timeout S] [-o table.csv|table.json]`."""

from __future__ import annotations

from rich.table import Table

from tpu_pipeline.commands.options import non_negative_int, positive_int, seconds
from tpu_pipeline.toolchain.device import KERNEL_SET_NAMES
from tpu_pipeline.output import printer, progress



def add_arguments(p) -> None:
    p.add_argument("models", nargs="+", metavar="MODEL", help=".tflite files and folders of them")
    p.add_argument("--command", default="inspect", choices=("inspect", "fit", "profile", "compile"),
                   help="what to run on each (default inspect)")
    p.add_argument("--device", dest="devices", action="append", metavar="D",
                   help="a device per job row (repeat for several): fit's MCU, profile's device, compile's Edge TPU")
    p.add_argument("--budget", dest="budgets", action="append", type=non_negative_int, metavar="BYTES",
                   help="an arena budget per job row (repeat for several): fit's and compile's --budget; for "
                        "inspect the `fits` column")
    p.add_argument("-n", "--num-segments", type=int, dest="n", help="compile: number of pipeline segments")
    p.add_argument("--time-limit", type=seconds, metavar="S", help="the command's --time-limit")
    p.add_argument("--kernels", choices=KERNEL_SET_NAMES, help="fit/profile: TFLite Micro kernel set")
    p.add_argument("--iterations", "-N", type=positive_int, help="profile: timed inferences")
    p.add_argument("--jobs", "-j", type=positive_int, help="local worker processes at a time (default: the CPU count)")
    p.add_argument("--cluster", metavar="ADDRESS",
                   help="run the jobs on this Dask scheduler (tcp://host:8786) instead (needs tpu-pipeline[distributed])")
    p.add_argument("--job-timeout", type=seconds, default=600.0, metavar="S",
                   help="seconds each job may take; a job past it is stopped and its row says timeout (default 600)")
    p.add_argument("--out", metavar="DIR", help="compile: keep each job's output folder under DIR")
    p.add_argument("-o", "--output", metavar="FILE", help="also write the table to FILE (.csv or .json)")


def _options(args) -> dict:
    o = {}
    if args.time_limit is not None:
        o["time_limit"] = args.time_limit
    if args.command == "compile" and args.n is not None:
        o["n"] = args.n
    if args.kernels and args.command in ("fit", "profile"):
        o["kernels"] = args.kernels
    if args.iterations and args.command == "profile":
        o["iterations"] = args.iterations
    return o


def run(args) -> int:
    from tpu_pipeline.batch_runner import batch
    from tpu_pipeline.toolchain.errors import UsageError

    if args.output and not args.output.endswith((".csv", ".json")):
        raise UsageError(f"{args.output}: the table is written as .csv or .json (the suffix says which)")
    if args.output:
        from tpu_pipeline.commands.options import check_output

        check_output(args.output, inputs=args.models)
    with progress(args) as say:
        count = {"done": 0}

        def on_row(row) -> None:
            count["done"] += 1
            say(f"{count['done']} done: {row.model}"
                + (f" {row.device}" if row.device else "") + (f" budget {row.budget:,}" if row.budget is not None else "")
                + f": {row.status}" + (f" ({row.error})" if row.error else ""))

        result = batch(args.models, command=args.command, devices=args.devices or [None],
                       budgets=args.budgets or [None], jobs=args.jobs, cluster=args.cluster,
                       job_timeout=args.job_timeout, options=_options(args), out=args.out, on_row=on_row)
    if args.output:
        from tpu_pipeline.toolchain.tflite import write_bytes_atomic

        text = result.to_csv() if args.output.endswith(".csv") else _json_text(result)
        write_bytes_atomic(args.output, text.encode())
    out = printer(args)
    if args.json:
        out.json(result.to_json())
    elif args.format == "csv":
        print(result.to_csv(), end="")
    else:
        t = Table(title=f"batch: {args.command}, {len(result.rows)} jobs on {result.engine}, "
                        f"{len(result.failed)} failed")
        for c in result.columns:
            t.add_column(c, justify="left" if c in ("model", "device", "command", "status", "error") else "right")
        for row in result.table():
            t.add_row(*row)
        out.print(t)
    return result.failed[0].exit_code if result.failed else 0


def _json_text(result) -> str:
    import json

    return json.dumps(result.to_json(), indent=2) + "\n"
