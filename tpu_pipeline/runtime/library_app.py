"""Models exported as drop-in libraries (`export-mcu --library`), run by a plain application of
ours (its own `main`, no harness protocol: toolchain/deploy/app.py) on an emulated board.

    r = run_libraries_on_qemu(["kws.tflite", "vww.tflite"], load_device("qemu-mps2-an386"), CMSIS_NN,
                              work="out/app", shared=True)
    r.models[0].outputs_match, r.arenas[0].used, r.arenas[0].head_predicted

The models' library is written (one arena each, or with `shared` one for all), the application
built with CMake against the cached TFLite Micro library, booted in QEMU, and its UART read to
`END`. Every output is compared with TFLite Micro on the host (the `tflite_micro` wheel, each
model alone) on the same inputs; the arena the board reports (`arena_used_bytes()`, head and
tail apart) against the library's macros.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tpu_pipeline.runtime.backends.qemu import QemuBoard
from tpu_pipeline.toolchain.device import Device, KernelSet, require_firmware
from tpu_pipeline.toolchain.errors import DeviceError, UsageError


@dataclass
class ArenaRun:
    """One arena on the board: a model's own, or the shared one ("shared")."""
    what: str
    init_rc: int | None  # TPUP_OK = 0
    refused_small: int | None  # init on an arena 16 B too small: TPUP_ERR_ARENA_SIZE (-2) expected
    refused_misaligned: int | None  # TPUP_ERR_ARENA_ALIGN (-1) expected
    used: int | None  # arena_used_bytes() on the board
    head: int | None
    tail: int | None
    head_predicted: int
    tail_predicted: int
    arena_bytes: int  # the ARENA_BYTES macro for the kernels run (split: HEAD_ARENA_BYTES + TAIL_ARENA_BYTES)
    # head and tail in two banks: [{name, bytes_predicted, bytes_measured, address}] (head's bank first)
    banks: list | None = None


@dataclass
class LibraryModelRun:
    model: str
    name: str
    outputs_match: bool | None  # every output identical to host TFLite Micro running the model alone
    output_differences: list = field(default_factory=list)


@dataclass
class LibraryRun:
    board: str
    machine: str
    kernels: str
    elf: str
    arenas: list
    models: list
    errors: list

    def to_json(self) -> dict:
        return asdict(self)


def run_libraries_on_qemu(models, device: Device, kernels: KernelSet, work: str | Path, inferences: int = 2,
                          seed: int = 0, timeout: float = 120.0, tflm_tree: str | None = None,
                          shared: bool = False, names=None, banks: tuple[str, str] | None = None) -> LibraryRun:
    from tpu_pipeline.toolchain.deploy.app import build_app, write_app
    from tpu_pipeline.toolchain.deploy.library import export_library

    fw = require_firmware(device)
    if not fw.qemu_machine:
        raise UsageError(f"device '{fw.board}' is not an emulated board (no [firmware] qemu_machine)")
    if shared and len(models) < 2:
        raise UsageError("a shared arena needs two models or more")
    work = Path(work)
    libs = [export_library(models, device, work / "lib", names=names)] if shared or len(models) == 1 else \
        [export_library(m, device, work / f"lib{i}", names=names and [names[i]]) for i, m in enumerate(models)]
    entries = [(lib, m) for lib in libs for m in lib.models]
    hosts, inputs = [], []
    for i, (lib, m) in enumerate(entries):
        data = (Path(lib.out_dir) / f"tpup_{m.name}.tflite").read_bytes()
        host, arrays = _host_inputs(data, m.source, inferences, seed + i)
        hosts.append(host), inputs.append(arrays)
    lines = []
    for lib in libs:  # one application per library
        mine = [k for k, (owner, _) in enumerate(entries) if owner is lib]
        app = write_app(work / f"app-{Path(lib.out_dir).name}", lib.out_dir, device,
                        [[[np.ascontiguousarray(a).tobytes() for a in x] for x in inputs[k]] for k in mine], banks)
        elf = build_app(app, device, kernels, tflm_tree)
        lines += _boot_and_read(elf, fw.qemu_machine, timeout)
    arenas = [_arena_run(lines, "shared", lib.shared[kernels.name]["head"], lib.shared[kernels.name]["tail"],
                         _shared_arena_bytes(lib, kernels)) for lib in libs if lib.shared] + \
        [_arena_run(lines, m.name, m.head_bytes[kernels.name], m.tail_bytes[kernels.name], m.arena_bytes[kernels.name])
         if banks is None else _split_run(lines, m, kernels, banks)
         for lib in libs if not lib.shared for m in lib.models]
    runs = [_model_run(m, host, arrays, lines) for (_, m), host, arrays in zip(entries, hosts, inputs)]
    return LibraryRun(fw.board, fw.qemu_machine, kernels.name, str(elf), arenas, runs,
                      [ln for ln in lines if ln.startswith("ERR")])


def _shared_arena_bytes(lib, kernels: KernelSet) -> int:
    a = lib.shared[kernels.name]
    planning = max(m.planning_bytes for m in lib.models)
    return -(-(max(a["head"], planning) + a["tail"]) // 16) * 16


def _host_inputs(data: bytes, label: str, inferences: int, seed: int):
    from tpu_pipeline.toolchain.execute.inputs import input_stream, shape_operand_values
    from tpu_pipeline.toolchain.execute.tflm import TflmModel

    host = TflmModel(data, 64 * 1024 * 1024, label)
    specs = [(n, shape, dt) for n, (dt, shape) in zip(host.input_names, host.inputs)]
    stream = input_stream(specs, inferences, seed, shape_operand_values(data))
    return host, [[x[n] for n in host.input_names] for x in stream]


def _boot_and_read(elf: Path, machine: str, timeout: float) -> list[str]:
    """The application's UART lines up to END (DeviceError if it never gets there)."""
    import serial

    with QemuBoard(elf, machine) as board:
        text, deadline = b"", time.monotonic() + timeout
        with serial.Serial(board.port, 115200, timeout=0.2) as port:
            while b"END\n" not in text.replace(b"\r", b""):
                if time.monotonic() > deadline or not board.alive():
                    tail = text.decode(errors="replace").strip().splitlines()[-1:] or ["nothing"]
                    raise DeviceError(f"{elf}: the application did not reach END on QEMU {machine} within "
                                      f"{timeout:g} s (last line: {tail[0][:120]})")
                text += port.read(4096)
    return [ln.strip() for ln in text.decode(errors="replace").replace("\r", "").splitlines() if ln.strip()]


def _arena_run(lines, what: str, head: int, tail: int, arena_bytes: int) -> ArenaRun:
    init = next((ln.split()[2:] for ln in lines if ln.startswith(f"INIT {what} ")), None)
    v = [int(x) for x in init] if init else [None] * 6
    return ArenaRun(what, v[0], v[4], v[5], v[1], v[2], v[3], head, tail, arena_bytes)


def _split_run(lines, m, kernels: KernelSet, banks: tuple[str, str]) -> ArenaRun:
    """A model's head and tail in two banks: the INIT figures and where the BANKS line says they are."""
    head, tail = m.head_bytes[kernels.name], m.split_tail_bytes[kernels.name]
    sizes = (-(-max(head, m.planning_bytes) // 16) * 16, -(-tail // 16) * 16)
    run = _arena_run(lines, m.name, head, tail, sum(sizes))
    where = next((ln.split()[2:] for ln in lines if ln.startswith(f"BANKS {m.name} ")), [None, None])
    run.banks = [{"name": b, "bytes_predicted": p, "bytes_measured": got, "address": a and int(a, 16)}
                 for b, p, got, a in zip(banks, (head, tail), (run.head, run.tail), where)]
    return run


def _model_run(m, host, arrays, lines: list[str]) -> LibraryModelRun:
    got: dict[tuple[int, int], bytearray] = {}
    for ln in lines:
        parts = ln.split()
        if len(parts) == 6 and parts[0] == "OUT" and parts[1] == m.name:
            k, j, off = int(parts[2]), int(parts[3]), int(parts[4])
            buf = got.setdefault((k, j), bytearray())
            if off != len(buf):
                raise DeviceError(f"{m.source}: output {j} of inference {k} arrived out of order (offset {off})")
            buf += bytes.fromhex(parts[5])
    diffs, complete = [], bool(got)
    for k, x in enumerate(arrays):
        for j, want in enumerate(host.run(x)):
            data = bytes(got.get((k, j), b""))
            if len(data) != want.nbytes:
                complete = False
                continue
            g = np.frombuffer(data, dtype=want.dtype).reshape(want.shape)
            if not np.array_equal(g, want):
                diffs.append({"inference": k, "output": j, "elements_differing": int(np.count_nonzero(g != want)),
                              "max_abs_diff": float(np.abs(g.astype(np.float64) - want.astype(np.float64)).max())})
    return LibraryModelRun(m.source, m.name, (not diffs) if complete else None, diffs)
