"""`tpu-pipeline export-mcu model.tflite --device sparkfun-edge -o DIR`."""

from __future__ import annotations

from toolchain import report as out
from tpu_pipeline.commands.options import check_output_folder

HELP = "write what the TFLite Micro harness firmware is built from: C array, op resolver, arena size, offline plan"


def add_arguments(p) -> None:
    p.add_argument("model", help="a .tflite file")
    p.add_argument("--device", default="sparkfun-edge", help="MCU descriptor (default sparkfun-edge)")
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--json", action="store_true", help="print the export summary as JSON")


def run(args) -> int:
    from toolchain.export_mcu import export_mcu

    check_output_folder(args.out, inputs=[args.model])
    r = export_mcu(args.model, args.device, args.out)
    if args.json:
        out.print_json(r.to_json())
        return 0
    c = out.console()
    c.print(f"[bold]{args.model}[/bold] -> {r.out_dir} for {r.device}")
    c.print(f"ops ({len(r.ops)}, MicroMutableOpResolver<{len(r.ops)}>): {', '.join(r.ops)}")
    c.print(f"arena head: planned {r.planned_head:,} B ({r.planner}, {r.pinned_tensors} tensors pinned), "
            f"measured {r.measured_head:,} B (TFLite Micro on the host), "
            f"TFLite Micro's own planner {r.tflm_own_head:,} B (predicted)")
    c.print(f"HARNESS_ARENA_SIZE {r.arena_size:,} B (measured head + tail {r.measured_tail:,} B) of "
            f"{r.sram_bytes:,} B SRAM; model {r.model_bytes:,} B of {r.flash_bytes:,} B flash; crc {r.model_crc}")
    c.print("files: " + ", ".join(r.files))
    if r.firmware:  # a board layer was written: the project builds as it is
        c.print(f"build: make -C {r.out_dir}  (or: tpu-pipeline build-firmware {r.out_dir} [--kernels reference])")
    return 0
