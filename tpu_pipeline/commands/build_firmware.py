"""`tpu-pipeline build-firmware DIR [--kernels KERNEL_SET] [--tflm-tree TREE] [--json]`."""

from __future__ import annotations

from tpu_pipeline.output import printer
from tpu_pipeline.toolchain import report as out
from tpu_pipeline.toolchain.device import DEFAULT_KERNEL_SET, KERNEL_SET_NAMES



def add_arguments(p) -> None:
    p.add_argument("project", metavar="DIR", help="a folder written by `tpu-pipeline export-mcu --device BOARD`")
    p.add_argument("--kernels", choices=KERNEL_SET_NAMES, default=DEFAULT_KERNEL_SET.name,
                   help="TFLite Micro kernels: CMSIS-NN (default, what deployments run) or reference")
    p.add_argument("--tflm-tree", metavar="TREE", default=None,
                   help="TFLite Micro source tree (default: $TFLM_TREE, else shared/tflm/<kernels> near the checkout)")
    p.add_argument("--arena-size", type=int, default=None, metavar="BYTES",
                   help="override HARNESS_ARENA_SIZE (default: export-mcu's)")
    p.add_argument("--jobs", "-j", type=int, default=None, help="parallel compile jobs (default: all cores)")


def run(args) -> int:
    from tpu_pipeline.toolchain.device import kernel_set
    from tpu_pipeline.toolchain.errors import UsageError
    from tpu_pipeline.toolchain.firmware.build import build_firmware

    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    # the library build's progress goes to stderr in every format (a first build takes minutes)
    b = build_firmware(args.project, kernel_set(args.kernels), args.tflm_tree, args.arena_size, args.jobs)
    if args.json:
        out.print_json(b.to_json())
        return 0
    c = printer(args)
    c.print(f"[bold]{b.elf}[/bold] for {b.board} ({b.kernels} kernels)")
    for name, r in b.regions.items():
        c.print(f"{name}: {r['used']:,} of {r['length']:,} B at 0x{r['origin']:08X} "
                f"({100.0 * r['used'] / max(1, r['length']):.1f} %)")
    c.print(f"flash {b.flash_bytes:,} B, RAM {b.ram_bytes:,} B (arena {b.arena_size:,} B, stack and heap "
            f"reservations included); map: {b.map_file}")
    return 0
