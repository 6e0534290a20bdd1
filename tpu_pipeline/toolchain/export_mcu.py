"""Export a model for the TFLite Micro harness firmware (tpu_pipeline/toolchain/data/firmware/harness).

Writes into DIR: `model.tflite` (the model with our arena plan inside as TFLM's offline plan),
`model_data.cc/.h` (that model as a 16-byte aligned C array), `op_resolver.h`
(a MicroMutableOpResolver<N> registering only the ops the model uses), `harness_config.h` (arena
size from our plan plus the measured tail, baud rate, clock, model CRC), the harness sources, and
`export.json` (every figure, for tools). The arena head is checked against TFLite Micro itself.
For a board with a `[firmware]` section it also writes the board layer (startup.c, platform.cc,
board_uart.cc, board_config.h), a linker script with the board's flash and SRAM, and a Makefile:
`make -C DIR` (or `tpu-pipeline build-firmware DIR`) then builds the ELF (tpu_pipeline/toolchain/firmware/).
"""

from __future__ import annotations

import json
import shutil
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

from tpu_pipeline.toolchain.data import HARNESS_DIR  # package data: found from any folder, in a wheel too
from tpu_pipeline.toolchain.device import KERNEL_SETS, REFERENCE, Device
from tpu_pipeline.toolchain.errors import InfeasibleError, ModelError, UsageError
from tpu_pipeline.toolchain.ir import kernels as harness
from tpu_pipeline.toolchain.tflite.io import write_bytes_atomic

# TFLite Micro plans at start-up in the arena's free space (an AllocationInfo per buffer and the greedy
# planner's lists); a firmware arena sized to arena_used_bytes alone may not leave room for that.
PLANNING_BYTES_PER_BUFFER = 48

# TFLM's MicroMutableOpResolver method names that CamelCase of the schema name gets wrong.
_ADD_EXCEPTIONS = {"PADV2": "AddPadV2", "BATCH_MATMUL": "AddBatchMatMul", "RELU_N1_TO_1": "AddReluN1To1",
                   "REDUCE_MAX": "AddReduceMax", "REDUCE_MIN": "AddReduceMin", "SPLIT_V": "AddSplitV",
                   "UNIDIRECTIONAL_SEQUENCE_LSTM": "AddUnidirectionalSequenceLSTM"}


# The harness's own kernels (tpu_pipeline/toolchain/data/firmware/harness), registered as custom ops: the op code
# the model names them by -> the registration call (tpu_pipeline.toolchain.ir.kernels).
HARNESS_CUSTOM_OPS = {
    "TPUP_CONV_2D": 'AddCustom("TPUP_CONV_2D", tpup::Register_CONV_2D())',
    "TPUP_DEPTHWISE_CONV_2D": 'AddCustom("TPUP_DEPTHWISE_CONV_2D", tpup::Register_DEPTHWISE_CONV_2D())',
    "TPUP_PATCH_STAGE": 'AddCustom("TPUP_PATCH_STAGE", tpup::Register_PATCH_STAGE())',
}


def resolver_opcode(op) -> str:
    """The op code the resolver registers `op` under: its builtin, or the harness kernel it picks."""
    return harness.custom_code(op) if harness.is_harness(op) else op.opcode


def resolver_method(opcode: str) -> str:
    if opcode in HARNESS_CUSTOM_OPS:
        return "AddCustom"
    if opcode.startswith("CUSTOM"):
        # TFLite Micro on the host may have it (its signal library's audio ops): the firmware does not
        raise ModelError(f"the harness firmware has no kernel for custom op '{opcode[len('CUSTOM:'):]}' (it "
                         "registers TFLite Micro's builtin kernels only)")
    if opcode in _ADD_EXCEPTIONS:
        return _ADD_EXCEPTIONS[opcode]
    return "Add" + "".join(w if w[:1].isdigit() else w[:1] + w[1:].lower() for w in opcode.split("_"))


@dataclass(frozen=True)
class ExportResult:
    out_dir: str
    files: tuple[str, ...]
    device: str
    ops: tuple[str, ...]  # distinct op codes the resolver registers, in first-use order
    model_bytes: int
    planned_head: int  # arena head our plan gives TFLM (scratch placed by TFLM's own rule)
    tflm_own_head: int  # what TFLM would allocate without our plan
    measured_head: int  # what TFLM allocated with the exported model
    measured_tail: int
    arena_size: int  # HARNESS_ARENA_SIZE
    sram_bytes: int
    flash_bytes: int
    planner: str
    pinned_tensors: int
    model_crc: str
    firmware: dict | None = None  # the board's [firmware] facts when a buildable project was written

    def to_json(self) -> dict:
        return asdict(self)


def _plan(model, graph):
    """(tensor offsets for all subgraphs, head, planner name) from our planner."""
    from tpu_pipeline.toolchain.memory import lifetimes, plan_for_tflm
    from tpu_pipeline.toolchain.tflite.metadata import total_tensor_count

    lt = lifetimes(graph, semantics="tflm")
    off = plan_for_tflm(graph, lt, "auto", 5.0, n_tensors=total_tensor_count(model))
    return list(off.tensor_offsets), off.head, off.plan.planner


def c_array(data: bytes, name: str) -> str:
    table = [f"0x{b:02x}" for b in range(256)]
    hexes = [table[b] for b in data]
    rows = [", ".join(hexes[i:i + 12]) for i in range(0, len(hexes), 12)]
    body = ",\n  ".join(rows)
    return (f'#include "model_data.h"\n\n// {len(data)} bytes; TFLite Micro needs the flatbuffer 16-byte aligned.\n'
            f"alignas(16) const unsigned char {name}[] = {{\n  {body}\n}};\n"
            f"const unsigned int {name}_len = {len(data)};\n")


def export_mcu(model_path: str | Path, device: Device, out_dir: str | Path, verify: bool = True,
               model_data: bytes | None = None) -> ExportResult:
    """`model_data`: the model to export when it is not the file itself (e.g. `fit`'s output)."""
    from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena, predicted_host_head
    from tpu_pipeline.toolchain.ir import from_model
    from tpu_pipeline.toolchain.memory import lifetimes, tflm_greedy
    from tpu_pipeline.toolchain.memory.tflm_target import target_arena, target_head
    from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model, with_offline_plan
    from tpu_pipeline.toolchain.tflite.extract import without_unused_tensors
    from tpu_pipeline.toolchain.tflite.metadata import read_offline_plan

    src = Path(model_path)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a directory")
    if device.kind != "mcu":
        raise UsageError(f"device '{device.name}' is not an MCU (kind = {device.kind!r})")
    sram, flash = device.memory.sram_bytes, device.memory.flash_bytes
    model = read_model(model_data, name=str(src)) if model_data is not None else read_model(src)
    # TFLite Micro's own verdict first: the same words as every MCU command for a model it cannot run
    measure_tflm_arena(model_to_bytes(model), label=str(src))
    model, _ = without_unused_tensors(model)  # TFLite Micro would give them arena bytes; nothing reads them
    graph = from_model(model)
    if len(model.subgraphs) > 1:
        raise ModelError(f"{src}: {len(model.subgraphs)} subgraphs; the harness runs single-subgraph models")
    opcodes = tuple(dict.fromkeys(resolver_opcode(op) for op in graph.ops))
    methods = [resolver_method(o) for o in opcodes]
    offsets, planned_head, planner = _plan(model, graph)
    kept = read_offline_plan(model)  # a plan the model brings (fit's): kept where it is no larger
    if kept is not None and len(kept) == len(offsets) and any(
            target_head(graph, k, kept)[0] <= target_head(graph, k, offsets)[0] for k in KERNEL_SETS):
        # under either kernel set: fit plans for the kernels it was asked for (CMSIS-NN's scratch),
        # ours for the reference kernels', so judging fit's plan by the reference head alone threw
        # away plans that are smaller on the board they were made for
        offsets, planned_head, planner = list(kept), target_head(graph, REFERENCE, kept)[0], "the model's own"
    own_head = tflm_greedy(lifetimes(graph, semantics="tflm")).size
    planned = with_offline_plan(model, offsets) if any(o >= 0 for o in offsets) else model
    data = model_to_bytes(planned)
    if flash and len(data) > flash:
        raise InfeasibleError(f"{src}: the model is {len(data):,} bytes; {device.name} has {flash:,} bytes of flash")
    measured = measure_tflm_arena(data, arena_size=max(64 * 1024 * 1024, 4 * sram))
    # the host's TFLite Micro runs the builtin view of harness kernels (no overlapped buffers): its
    # head is checked against what the same plan gives that view
    host_head = planned_head if not harness.kernel_choices(graph) else predicted_host_head(data)
    if verify and measured.head > host_head:
        raise InfeasibleError(f"{src}: TFLite Micro allocated a {measured.head:,}-byte head, our plan said "
                              f"{host_head:,} (the offline plan was not honoured)")
    # What the 32-bit target needs with either kernel set, and the host's head + tail where the host
    # ran the model itself (64-bit pointers: a larger tail); where it ran the builtin view of
    # harness kernels, room for TFLite Micro's planning temporaries at start-up instead. (CMSIS-NN's
    # LSTM keeps eight kernel-sum vectors the reference kernel does not; too small an arena made its
    # Prepare write through a null pointer.)
    on_harness = bool(harness.kernel_choices(graph) or graph.external)
    needed = [] if on_harness else [measured.head + measured.tail]
    for kernels in KERNEL_SETS:
        target = target_arena(graph, kernels, offsets).total
        if target is not None:
            needed.append(target)
    temporaries = PLANNING_BYTES_PER_BUFFER * len(lifetimes(graph, semantics="tflm").per_tensor()[0].buffers) \
        if on_harness else 0
    arena_size = -(-(max(needed or [measured.head + measured.tail]) + temporaries) // 16) * 16
    if arena_size > sram:
        raise InfeasibleError(f"{src}: needs a {arena_size:,}-byte arena; {device.name} has {sram:,} bytes of SRAM")
    crc = f"{zlib.crc32(data):08X}"
    sg = planned.subgraphs[0]
    files: dict[str, bytes] = {
        "model.tflite": data,
        "model_data.h": (b"#pragma once\n\nextern const unsigned char g_model_data[];\n"
                         b"extern const unsigned int g_model_data_len;\n"),
        "model_data.cc": c_array(data, "g_model_data").encode(),
        "op_resolver.h": _resolver_header(opcodes, methods).encode(),
    }
    firmware = device.firmware
    if firmware is not None:
        from tpu_pipeline.toolchain.firmware.project import project_files

        files.update(project_files(device))
    external = [(t, graph.tensors[t].nbytes) for t in sorted(graph.external)]  # TFLM adds them by index
    files["harness_config.h"] = _config_header(device, arena_size, measured.head, crc, len(sg.inputs), len(sg.outputs),
                                               src.name, firmware.core_clock_hz if firmware else None,
                                               external).encode()
    if HARNESS_DIR.is_dir():
        for f in sorted(HARNESS_DIR.iterdir()):
            if f.is_file():
                files[f.name] = f.read_bytes()
    result = ExportResult(str(out), tuple(sorted([*files, "export.json"])), device.name, opcodes,
                          len(data), planned_head, own_head, measured.head, measured.tail, arena_size, sram,
                          flash, planner, sum(1 for o in offsets if o >= 0), crc,
                          firmware.to_json() if firmware else None)
    files["export.json"] = (json.dumps(result.to_json(), indent=2) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        write_bytes_atomic(str(out / name), content)
    return result


def _resolver_header(opcodes, methods) -> str:
    lines = ["#pragma once", "// Generated by tpu-pipeline export-mcu: only the ops the model uses.", "",
             '#include "tpup_conv.h"',
             '#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"', "",
             f"constexpr int kHarnessNumOps = {len(opcodes)};",
             "using HarnessOpResolver = tflite::MicroMutableOpResolver<kHarnessNumOps>;", "",
             "inline TfLiteStatus RegisterHarnessOps(HarnessOpResolver& resolver) {"]
    for op, m in zip(opcodes, methods):
        call = HARNESS_CUSTOM_OPS[op] if op in HARNESS_CUSTOM_OPS else f"{m}()"
        lines.append(f"  TF_LITE_ENSURE_STATUS(resolver.{call});  // {op}")
    lines += ["  return kTfLiteOk;", "}", ""]
    return "\n".join(lines)


def _config_header(device: Device, arena: int, head: int, crc: str, n_in: int, n_out: int, model_name: str,
                   core_clock_hz: int | None = None, external=()) -> str:
    # Ticks count at the clock the board layer really runs the core at (its [firmware] section),
    # which may differ from the chip's maximum in [compute] clock_hz.
    ticks = core_clock_hz or int(device.compute.clock_hz)
    return "\n".join([
        "#pragma once", "// Generated by tpu-pipeline export-mcu.", "",
        f'#define HARNESS_BOARD "{device.name}"',
        f'#define HARNESS_MODEL_NAME "{model_name}"',
        "#ifndef HARNESS_ARENA_SIZE  // make ARENA_SIZE=N overrides it",
        f"#define HARNESS_ARENA_SIZE {arena}  // head {head} (planned, offline plan inside the model) + tail",
        "#endif",
        f"#define HARNESS_BAUD {device.link.baud}",
        f"#define HARNESS_TICKS_PER_S {ticks}u",
        f"#define HARNESS_NUM_INPUTS {n_in}",
        f"#define HARNESS_NUM_OUTPUTS {n_out}",
        f'#define HARNESS_MODEL_CRC "{crc}"',
        "// Inputs the application keeps outside the arena (the offline plan marks them EXTERNAL)",
        f"#define HARNESS_NUM_EXTERNAL {len(external)}",
        *([f"#define HARNESS_EXTERNAL_BYTES {{{', '.join(str(n) for _, n in external)}}}  "
           f"// tensors {', '.join(str(t) for t, _ in external)}",
           f"#define HARNESS_EXTERNAL_TOTAL {sum(-(-n // 16) * 16 for _, n in external)}"] if external else []),
        "",
    ])
