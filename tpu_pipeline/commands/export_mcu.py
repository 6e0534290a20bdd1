"""`tpu-pipeline export-mcu model.tflite --device sparkfun-edge -o DIR`."""

from __future__ import annotations

from pathlib import Path

from tpu_pipeline.output import printer
from tpu_pipeline.toolchain import report as out
from tpu_pipeline.commands.options import add_interface_arguments, check_output_folder, positive_int, seconds
from tpu_pipeline.toolchain.device import DEFAULT_KERNEL_SET, KERNEL_SET_NAMES



def add_arguments(p) -> None:
    p.add_argument("model", nargs="+", help="a .tflite file (several, with --library: one shared arena)")
    p.add_argument("--device", default="sparkfun-edge", help="MCU descriptor (default sparkfun-edge)")
    p.add_argument("-o", "--out", metavar="DIR", help="output directory (the harness firmware project)")
    p.add_argument("--library", metavar="DIR",
                   help="instead of the harness project: a drop-in library for your own TFLite Micro application "
                        "(C API, the model with its plan, only the kernels it uses, CMakeLists.txt; docs/deploy.md)")
    p.add_argument("--name", help="with --library: the C name of the model, or names comma-separated "
                                  "(default: the files' stems)")
    p.add_argument("--budget", type=positive_int, metavar="BYTES",
                   help="first fit the TFLite Micro arena (head + tail; --head-only: the head) into BYTES "
                        "(`tpu-pipeline fit`), then export that")
    p.add_argument("--head-only", action="store_true", help="with --budget: the budget counts the head alone")
    add_interface_arguments(p, "implies a fit", "implies a fit")
    p.add_argument("--builtin-kernels", action="store_true",
                   help="with a fit: only TFLite Micro's builtin kernels")
    p.add_argument("--fit", action="store_true",
                   help="first fit the model to what the device's SRAM leaves for the arena (`fit --device`)")
    p.add_argument("--kernels", choices=KERNEL_SET_NAMES, default=DEFAULT_KERNEL_SET.name,
                   help=f"with --fit/--budget: the kernel set the fit prices variants for (default {DEFAULT_KERNEL_SET.name})")
    p.add_argument("--time-limit", type=seconds, default=30.0, metavar="S",
                   help="with --fit/--budget: seconds for the fit's search (default 30)")


def run(args) -> int:
    from tpu_pipeline.toolchain.device import kernel_set, load_device
    from tpu_pipeline.toolchain.export_mcu import export_mcu

    if (args.out is None) == (args.library is None):
        from tpu_pipeline.toolchain.errors import UsageError

        raise UsageError("export-mcu: give -o DIR (the harness firmware project) or --library DIR, one of them")
    models = args.model
    if len(models) > 1 and (args.library is None or args.fit or args.budget is not None or args.int8_io
                            or args.input_outside_arena):
        from tpu_pipeline.toolchain.errors import UsageError

        raise UsageError("export-mcu: several models only with --library (one shared arena) and without a fit; "
                         "fit each model first")
    args.model = models[0]
    if args.library is not None:
        from tpu_pipeline.toolchain.deploy.library import check_library_folder

        check_library_folder(Path(args.library))  # before any work
    else:
        check_output_folder(args.out, inputs=[args.model])
    device = load_device(args.device)  # resolved once: everything below takes the objects
    kernels = kernel_set(args.kernels)
    fitted = None
    if args.fit or args.budget is not None or args.int8_io or args.input_outside_arena:
        from tpu_pipeline.toolchain.errors import InfeasibleError
        from tpu_pipeline.toolchain.fit import FitParams, fit_file

        fitted = fit_file(args.model, FitParams(budget=args.budget, device=device, kernels=kernels,
                                                time_limit=args.time_limit, int8_io=args.int8_io,
                                                input_outside_arena=args.input_outside_arena,
                                                harness=not args.builtin_kernels, head_only=args.head_only))
        if not fitted.result.fits:
            what = "arena head" if args.head_only else "arena (head + tail)"
            raise InfeasibleError(f"{args.model}: no variant fits {fitted.result.budget:,} B of {what} "
                                  f"({fitted.budget_from}); the smallest reachable head is {fitted.result.head:,} B")
    if args.library is not None:
        return _library(args, models, device, fitted)
    r = export_mcu(args.model, device, args.out, model_data=fitted.data if fitted else None)
    if args.json:
        out.print_json({**r.to_json(), **({"fit": fitted.to_json()} if fitted else {})})
        return 0
    c = printer(args)
    c.print(f"[bold]{args.model}[/bold] -> {r.out_dir} for {r.device}")
    if fitted:
        f = fitted.result
        c.print(f"fit: arena head {f.baseline_peak:,} -> {f.head:,} B (budget {f.budget:,} B from "
                f"{fitted.budget_from}), predicted latency {f.selection.latency_s / f.baseline_latency_s - 1:+.1%}; "
                "bit-identical in LiteRT and TFLite Micro")
    c.print(f"ops ({len(r.ops)}, MicroMutableOpResolver<{len(r.ops)}>): {', '.join(r.ops)}")
    c.print(f"arena head: planned {r.planned_head:,} B ({r.planner}, {r.pinned_tensors} tensors pinned), "
            f"measured {r.measured_head:,} B (TFLite Micro on the host), "
            f"TFLite Micro's own planner {r.tflm_own_head:,} B (predicted)")
    c.print(f"HARNESS_ARENA_SIZE {r.arena_size:,} B (measured head + tail {r.measured_tail:,} B) of "
            f"{r.sram_bytes:,} B SRAM; model {r.model_bytes:,} B of {r.flash_bytes:,} B flash; crc {r.model_crc}")
    for note in r.notes:
        c.print(f"note: {note}")
    c.print("files: " + ", ".join(r.files))
    if r.firmware:  # a board layer was written: the project builds as it is
        c.print(f"build: make -C {r.out_dir}  (or: tpu-pipeline build-firmware {r.out_dir} [--kernels reference])")
    return 0


def _library(args, models, device, fitted) -> int:
    from tpu_pipeline.toolchain.deploy.library import export_library

    names = args.name.split(",") if args.name else None
    r = export_library(models, device, args.library, names=names, model_data=fitted.data if fitted else None)
    if args.json:
        out.print_json({**r.to_json(), **({"fit": fitted.to_json()} if fitted else {})})
        return 0
    c = printer(args)
    c.print(f"[bold]{', '.join(models)}[/bold] -> library {r.target} in {r.out_dir} (for {r.device})")
    for m in r.models:
        c.print(f"{m.name}: ops ({len(m.ops)}): {', '.join(m.ops)}"
                + (f"; tpu-pipeline kernels included: {', '.join(m.custom_ops)}" if m.custom_ops else ""))
        for k in m.head_bytes:
            c.print(f"  arena with {k}: head {m.head_bytes[k]:,} B + tail {m.tail_bytes[k]:,} B "
                    f"(TPUP_{m.name.upper()}_ARENA_BYTES {m.arena_bytes[k]:,} B)")
        for note in m.notes:
            c.print(f"  note: {note}")
    for k, a in (r.shared or {}).items():
        c.print(f"one shared arena with {k}: head {a['head']:,} B + stacked tails {a['tail']:,} B = "
                f"{a['shared_arena_bytes_predicted']:,} B (separate arenas: {a['separate_arena_bytes_predicted']:,} B)")
    c.print("files: " + ", ".join(r.files))
    c.print(f"use: add_subdirectory({r.out_dir}) and target_link_libraries(app PRIVATE {r.target}); README.md there")
    return 0
