"""The MCU backend on an emulated board: the harness firmware built for a QEMU machine, booted in
`qemu-system-arm -M <machine> -nographic -serial pty -icount shift=0`, and driven through the same
serial code path as a real board (tpu_pipeline/runtime/serial_mcu.py on the pseudo-terminal QEMU opens).

    r = run_on_qemu("model.tflite", load_device("qemu-mps2-an386"), REFERENCE, iterations=3)
    r.outputs_match, r.arena_used_bytes, r.head_bytes, r.instructions, r.op_instructions, r.flash_bytes

Under `-icount shift=0` every instruction advances the virtual clock by 1 ns, so SysTick counts
(25 MHz on the MPS2 boards) convert exactly to instructions: `ticks * 1e9 / core_clock_hz`. They
are a deterministic cost measure, not the latency of a real board. Outputs are compared with
TFLite Micro on the host (the `tflite_micro` wheel, reference kernels): bit-identical expected for
the reference build; for CMSIS-NN the differences, if any, are reported exactly.
"""

from __future__ import annotations

import hashlib
import os
import re
import select
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tpu_pipeline.runtime.backends.common import Backend, RunRequest
from tpu_pipeline.runtime.measure import RunReport
from tpu_pipeline.runtime.serial_mcu import McuRunAborted, SerialMcu, stack_high_water
from tpu_pipeline.toolchain.device import DEFAULT_KERNEL_SET, REFERENCE, Device, KernelSet, require_firmware
from tpu_pipeline.toolchain.errors import DeviceError, UsageError

ICOUNT_SHIFT = 0
_PTY = re.compile(r"char device redirected to (/dev/pts/\d+)")
DEFAULT_DEVICE = "qemu-mps2-an386"  # the board `--backend qemu` boots unless told (resolved by the API)


def qemu_binary() -> str:
    found = shutil.which("qemu-system-arm")
    if not found:
        raise DeviceError("qemu-system-arm not found: install QEMU (Debian/Ubuntu: apt-get install qemu-system-arm)")
    return found


class QemuBoard:
    """A running `qemu-system-arm` with the harness ELF; `.port` is its serial pseudo-terminal."""

    def __init__(self, elf: str | Path, machine: str, boot_timeout: float = 10.0):
        self.elf, self.machine, self.boot_timeout = Path(elf), machine, boot_timeout
        self.proc: subprocess.Popen | None = None
        self.port: str | None = None
        self._stderr = b""

    def start(self) -> "QemuBoard":
        cmd = [qemu_binary(), "-M", self.machine, "-nographic", "-monitor", "none", "-serial", "pty",
               "-icount", f"shift={ICOUNT_SHIFT}", "-kernel", str(self.elf)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.boot_timeout
        fd = self.proc.stdout.fileno()
        while self.port is None:
            left = deadline - time.monotonic()
            if left <= 0:
                self.stop()
                raise DeviceError(f"{self.elf}: QEMU ({self.machine}) did not open a serial port within "
                                  f"{self.boot_timeout:g} s")
            ready, _, _ = select.select([fd], [], [], min(left, 0.2))
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:  # QEMU exited
                    self.proc.wait()
                    why = " ".join(self._stderr.decode(errors="replace").split())[:200] or "no message"
                    raise DeviceError(f"{self.elf}: QEMU ({self.machine}) failed to boot "
                                      f"(exit {self.proc.returncode}): {why}")
                self._stderr += chunk
                m = _PTY.search(self._stderr.decode(errors="replace"))
                if m:
                    self.port = m.group(1)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """Kill QEMU at once (what a power cut does to a board)."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __del__(self):  # never leave an emulator running
        self.stop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class _Serial(SerialMcu):
    """SerialMcu that also keeps the READY line's extra keys (the firmware's head= and tail=)."""

    ready_kv: dict

    def _readline(self, deadline, waiting_for, skip_garbled=False):
        msg = super()._readline(deadline, waiting_for, skip_garbled)
        if msg.kind == "READY":
            self.ready_kv = dict(msg.kv)
        return msg


# ---- building (cached) ------------------------------------------------------------------------
def _firmware_fingerprint() -> str:
    from tpu_pipeline.toolchain.data import FIRMWARE_DIR

    h = hashlib.sha256()
    for p in sorted(FIRMWARE_DIR.rglob("*")):
        if p.is_file() and p.suffix != ".md":  # what is compiled, not its documentation
            h.update(str(p.relative_to(FIRMWARE_DIR)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def project_dir(model_bytes: bytes, device: Device) -> Path:
    from tpu_pipeline.toolchain.firmware.library import cache_root
    from tpu_pipeline.toolchain.firmware.project import harness_objects

    h = hashlib.sha256()
    # "export-5": what export-mcu writes changed (unused tensors dropped, the LSTM registered, the
    # arena sized for the 32-bit target too; the model's own plan judged under both kernel sets;
    # the arena placed in the board's banks; "export-6": the model made exact for TFLite Micro,
    # a padding SPACE_TO_BATCH_ND's pad an explicit PAD)
    # the harness objects the Makefile links come from the kernel registries, not from the files
    for part in (model_bytes, device.firmware_key.encode(), _firmware_fingerprint().encode(),
                 harness_objects().encode(), b"export-6"):
        h.update(hashlib.sha256(part).digest())
    return cache_root().parent / "firmware" / f"{device.name}-{h.hexdigest()[:16]}"


def build_for_board(model_path: str | Path, device: Device, kernels: KernelSet,
                    tflm_tree: str | None = None, arena_size: int | None = None, quiet: bool = False,
                    wait: bool = True):
    """(export result dict, FirmwareBuild): the project exported once per (model, board, harness)
    into the cache, then built with make (incremental) for `kernels`."""
    import fcntl
    import json

    from tpu_pipeline.toolchain.export_mcu import export_mcu
    from tpu_pipeline.toolchain.firmware.build import build_firmware
    from tpu_pipeline.toolchain.firmware.library import ensure_library, find_tree

    data = Path(model_path).read_bytes()
    # The library first, outside the project lock (it may take minutes, or be busy elsewhere).
    ensure_library(find_tree(kernels, tflm_tree), kernels, require_firmware(device).library_cpu,
                   quiet=quiet, wait=wait)
    out = project_dir(data, device)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(str(out) + ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "export.json").is_file():
            tmp = Path(f"{out}.tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            export_mcu(model_path, device, tmp)
            os.replace(tmp, out)
        exported = json.loads((out / "export.json").read_text())
        build = build_firmware(out, kernels, tflm_tree, arena_size, quiet=quiet, wait=wait)
    return exported, build


# ---- running ------------------------------------------------------------------------------------
@dataclass
class QemuResult:
    model: str
    board: str
    machine: str
    kernels: str  # the kernel set's name
    iterations: int
    outputs: list  # per inference: list of np.ndarray (the device's outputs)
    outputs_match: bool | None  # identical to host TFLite Micro on every inference
    outputs_agree: bool | None  # integers identical, floats within rounding (compare_outputs' policy)
    output_differences: list  # [{inference, output, elements_differing, max_abs_diff}] when not
    arena_used_bytes: int  # MicroInterpreter::arena_used_bytes() on the target
    head_bytes: int | None  # the planned (non-persistent) part of it
    tail_bytes: int | None  # persistent allocations
    arena_size: int  # HARNESS_ARENA_SIZE
    arena_bytes_predicted: int | None  # the 32-bit target model: predicted head + tail (None: an op not modelled)
    head_predicted: int  # our offline plan with the kernels' scratch placed as TFLite Micro places it
    tail_predicted: int | None  # the target's persistent allocations (tpu_pipeline.toolchain.memory.tflm_target)
    planned_head: int  # our offline plan's head (reference kernels' scratch)
    arena_bytes_host: int  # export-mcu's host figure (64-bit TFLite Micro wheel: head + tail)
    instructions: int  # per invoke (median over the inferences)
    op_instructions: list  # [{index, opcode, instructions}] (median per op)
    flash_bytes: int
    ram_bytes: int
    elf: str
    error: str | None = None
    notes: list = field(default_factory=list)
    # per RAM bank of the descriptor: [{name, bytes_predicted, bytes_measured}] (where export-mcu
    # put the arena: export.json's arena_banks, deploy/banks.harness_arena)
    banks: list = field(default_factory=list)
    stack_used_bytes: int | None = None  # the stack's high-water mark since boot (DONE's stack_used)
    stack_bytes_reserved: int | None = None  # the device file's firmware stack_bytes

    def to_json(self) -> dict:
        d = asdict(self)
        d["outputs"] = [[np.asarray(o).tolist() for o in inf] for inf in self.outputs]
        return d


def _against_host(wants, results) -> tuple[list, list, bool]:
    """(the device's outputs per inference, where they differ from host TFLite Micro's `wants`,
    whether they agree under the comparison policy)."""
    from tpu_pipeline.toolchain.execute.compare import compare_outputs

    outputs, diffs, agree = [], [], bool(results)
    for k, (want, r) in enumerate(zip(wants, results)):
        got = [np.frombuffer(b, dtype=w.dtype).reshape(w.shape) for b, w in zip(r.outputs, want)]
        outputs.append(got)
        # integers identical; floats within the comparison policy's rounding (the Cortex-M4's FPU
        # fuses multiply-adds and its libm is not the host's: trained_lstm differs by 4e-7)
        agree = agree and all(c.ok for c in compare_outputs(want, got))
        for j, (g, w) in enumerate(zip(got, want)):
            if not np.array_equal(g, w):
                delta = np.abs(g.astype(np.int64) - w.astype(np.int64)) if g.dtype.kind in "iu" else \
                    np.abs(g.astype(np.float64) - w.astype(np.float64))
                diffs.append({"inference": k, "output": j, "elements_differing": int(np.count_nonzero(g != w)),
                              "elements": int(g.size), "max_abs_diff": float(delta.max())})
    return outputs, diffs, agree


def _instructions(ticks: int, ticks_per_s: int) -> int:
    return int(round(ticks * 1e9 / (ticks_per_s * (1 << ICOUNT_SHIFT))))


def run_on_qemu(model_path: str | Path, device: Device, kernels: KernelSet,
                iterations: int = 3, seed: int = 0, timeout: float = 30.0, tflm_tree: str | None = None,
                arena_size: int | None = None, quiet: bool = True, progress=None) -> QemuResult:
    """Build (cached), boot QEMU, run `iterations` random inputs over the serial protocol, compare
    with host TFLite Micro. DeviceError (exit 4) on boot failure or a silent/garbled board;
    InfeasibleError (exit 3) when the firmware does not fit the board."""
    from tpu_pipeline.toolchain.execute.tflm import ARENA_DEPENDENT_OPS, TflmModel, reference_outputs
    from tpu_pipeline.toolchain.execute.tflm_arena import check_tflm_dtypes

    model_path = Path(model_path)
    data = model_path.read_bytes()
    check_tflm_dtypes(data, str(model_path))
    fw = require_firmware(device)
    if not fw.qemu_machine:
        raise UsageError(f"device '{fw.board}' is not an emulated board (no [firmware] qemu_machine); "
                         f"use --device {DEFAULT_DEVICE} or run the real board with --backend mcu --port")
    exported, build = build_for_board(model_path, device, kernels, tflm_tree, arena_size, quiet=quiet)
    # The firmware holds the exported model (our offline plan inside): check its CRC, and run the
    # same bytes on the host.
    data = (Path(build.project) / "model.tflite").read_bytes()
    host = TflmModel(data, 64 * 1024 * 1024, str(model_path))
    arrays = host.input_sets(data, iterations, seed)
    out_sizes = [np.dtype(dt).itemsize * int(np.prod(shape)) for dt, shape in host.outputs]
    notes = []
    baud = device.link.baud
    try:
        info, results, error, kv = _session(build.elf, fw.qemu_machine, baud, timeout, data, arrays, out_sizes, progress)
    except DeviceError as exc:
        if arena_size is not None or "AllocateTensors failed" not in str(exc) or _split(exported):
            raise
        # The exported arena is the host's figure (reference kernels); CMSIS-NN may ask for more scratch:
        # the emulated board has RAM to spare, so run once more with a larger arena, and say so.
        spare = fw.ram_bytes - fw.stack_bytes - fw.heap_bytes - 64 * 1024
        bigger = min(spare, max(2 * build.arena_size, build.arena_size + 256 * 1024))
        notes.append(f"the exported {build.arena_size:,}-byte arena was too small for the {kernels} kernels "
                     f"(AllocateTensors failed on the board); measured with a {bigger:,}-byte arena")
        exported, build = build_for_board(model_path, device, kernels, tflm_tree, bigger, quiet=quiet)
        info, results, error, kv = _session(build.elf, fw.qemu_machine, baud, timeout, data, arrays, out_sizes, progress)
    head, tail = kv.get("head"), kv.get("tail")
    predicted = _predicted_arena(data, kernels, _split(exported))
    if predicted.tail is None:  # say which op's persistent data is not modelled
        notes.append(f"arena not predicted: {', '.join(target_tail_unmodelled(data, kernels))} not modelled")
    notes += [f"{ARENA_DEPENDENT_OPS[op]}: compared with host TFLite Micro in a fresh process"
              for op in host.arena_dependent]
    outputs, diffs, agree = _against_host(reference_outputs(host, data, arrays[:len(results)]), results)
    tps = max(1, info.ticks_per_s)
    per_op: dict[tuple[int, str], list[int]] = {}
    for r in results:
        for idx, tag, ticks in r.ops:
            per_op.setdefault((idx, tag), []).append(ticks)
    used = max([r.arena_used for r in results], default=info.used)
    return QemuResult(
        model=str(model_path), board=fw.board, machine=fw.qemu_machine, kernels=kernels.name, iterations=len(results),
        outputs=outputs, outputs_match=(not diffs) if results else None, output_differences=diffs,
        outputs_agree=agree if results else None,
        arena_used_bytes=used, head_bytes=int(head) if head is not None else None,
        tail_bytes=int(tail) if tail is not None else None, arena_size=info.arena,
        arena_bytes_predicted=predicted.total, head_predicted=predicted.head, tail_predicted=predicted.tail,
        planned_head=int(exported["planned_head"]),
        arena_bytes_host=int(exported["measured_head"]) + int(exported["measured_tail"]),
        instructions=_instructions(int(np.median([r.ticks for r in results])), tps) if results else 0,
        op_instructions=[{"index": i, "opcode": tag, "instructions": _instructions(int(np.median(t)), tps)}
                         for (i, tag), t in sorted(per_op.items())],
        flash_bytes=build.flash_bytes, ram_bytes=build.ram_bytes, elf=build.elf, error=error, notes=notes,
        banks=_bank_use(device, exported.get("arena_banks"), predicted, kv, used),
        stack_used_bytes=stack_high_water(results, fw.stack_bytes, notes), stack_bytes_reserved=fw.stack_bytes)


def _split(exported: dict) -> bool:
    b = exported.get("arena_banks")
    return bool(b) and b["head"] != b["tail"]


def _bank_use(device: Device, placed: dict | None, predicted, kv: dict, used: int) -> list[dict]:
    """[{name, bytes_predicted, bytes_measured}] per bank. Predicted: the head, the tail and an
    outside input's buffer where export-mcu put them (placed None: all in the first bank).
    Measured: the board's head=, tail= and input= counted in the bank whose addresses hold
    READY's head_at=, tail_at= and input_at=."""
    first = device.memory.banks[0].name
    where = {p: (placed or {}).get(p) or first for p in ("head", "tail", "input")}
    want = {"head": predicted.head, "tail": predicted.tail, "input": (placed or {}).get("input_bytes", 0)}
    if "input" in kv and not placed:  # an outside input on a board of one bank
        want["input"] = int(kv["input"])
    got = {b.name: 0 for b in device.memory.banks}
    for part in ("head", "tail", "input"):
        at, n = kv.get(f"{part}_at"), kv.get(part)
        bank = _bank_at(device, int(at, 16)) if at is not None else None
        if bank is not None and n is not None:
            got[bank] += int(n)
    return [{"name": b.name,
             "bytes_predicted": None if predicted.tail is None else
             sum(want[p] for p in ("head", "tail", "input") if where[p] == b.name),
             "bytes_measured": got[b.name]} for b in device.memory.banks]


def _bank_at(device: Device, address: int) -> str | None:
    """The bank whose addresses hold `address` (the first bank: from the firmware's ram_origin)."""
    fw = device.firmware
    for n, b in enumerate(device.memory.banks):
        origin = fw.ram_origin if n == 0 and fw is not None else b.origin
        if origin is not None and origin <= address < origin + b.size:
            return b.name
    return None


def _predicted_arena(model_bytes: bytes, kernels: KernelSet, split: bool = False):
    """The target arena model on the exact model the firmware holds (its offline plan inside);
    `split`: head and tail in two buffers (the tail then holds two allocator objects)."""
    from dataclasses import replace

    from tpu_pipeline.toolchain.ir import from_model
    from tpu_pipeline.toolchain.memory.tflm_target import split_tail, target_arena, target_tail
    from tpu_pipeline.toolchain.tflite import read_model
    from tpu_pipeline.toolchain.tflite.metadata import read_offline_plan

    model = read_model(model_bytes)
    graph = from_model(model)
    arena = target_arena(graph, kernels, read_offline_plan(model))
    return replace(arena, tail=split_tail(target_tail(graph, kernels))) if split and arena.tail is not None else arena


def target_tail_unmodelled(model_bytes: bytes, kernels: KernelSet) -> tuple[str, ...]:
    from tpu_pipeline.toolchain.ir import from_model
    from tpu_pipeline.toolchain.memory.tflm_target import target_tail
    from tpu_pipeline.toolchain.tflite import read_model

    return target_tail(from_model(read_model(model_bytes)), kernels).unmodelled


def _session(elf, machine, baud, timeout, model_bytes, arrays, out_sizes, progress):
    """Boot, handshake, run every input: (McuInfo, inferences, error or None, READY's extra keys)."""
    results, error = [], None
    with QemuBoard(elf, machine) as board:
        mcu = _Serial(board.port, baud, timeout)
        mcu.ready_kv = {}
        with mcu:
            info = mcu.handshake(model_bytes)
            try:
                results = mcu.run_many(arrays, out_sizes, progress)
            except McuRunAborted as exc:
                results, error = exc.results, str(exc)
    return info, results, error, mcu.ready_kv


# ---- the backend ------------------------------------------------------------------------------
@dataclass
class QemuRunReport(RunReport):
    """RunReport plus the emulated board's own figures (named as issue 13 asks)."""

    outputs_match: bool | None = None
    output_differences: list = field(default_factory=list)
    arena_bytes_measured: int | None = None
    arena_bytes_predicted: int | None = None
    arena_head_measured: int | None = None
    instructions: int | None = None
    op_instructions: list = field(default_factory=list)  # [{index, opcode, instructions}]
    flash_bytes: int | None = None
    ram_bytes: int | None = None
    kernels: str | None = None
    # [{name, bytes_predicted, bytes_measured}] per RAM bank: where export-mcu put the arena (the
    # whole of it in one bank, or its head and tail apart: docs/deploy.md#memory-banks)
    banks: list = field(default_factory=list)


class QemuBackend(Backend):
    name = "qemu"
    kinds = ("mcu",)
    power_meter = False
    power_meter_why_not = "an emulated board draws no power"

    def readiness(self, port=None, deployment=None) -> tuple[bool, str]:
        # Never chosen by --backend auto: emulation is asked for by name.
        return False, "the qemu backend runs only when asked for (--backend qemu)"

    def check(self, request: RunRequest) -> None:
        if request.port:
            raise UsageError("--backend qemu boots its own emulated board: drop --port "
                             "(or drive a board's serial port with --backend mcu --port)")
        if request.device.firmware is None or request.device.firmware.qemu_machine is None:
            raise UsageError(f"--backend qemu: device '{request.device.label}' is not an emulated board "
                             f"(use --device {DEFAULT_DEVICE} or qemu-mps2-an500)")

    def progress_total(self, request: RunRequest) -> int:
        return request.iterations

    def run(self, request: RunRequest, progress=None, power=None) -> RunReport:
        kernels = request.kernels or DEFAULT_KERNEL_SET
        r = run_on_qemu(request.deployment.segments[0].path, request.device, kernels, request.iterations,
                        request.seed, request.timeout, quiet=False, progress=progress)
        rep = QemuRunReport("qemu", f"{r.board} (QEMU {r.machine}, {kernels} kernels)", r.model, request.iterations)
        rep.simulated = True  # emulated: instruction counts, not a board's latency
        rep.kernels = kernels.name
        rep.outputs_match = r.outputs_match
        rep.output_differences = r.output_differences
        rep.arena_bytes_measured = r.arena_used_bytes
        rep.arena_bytes_predicted = r.arena_bytes_predicted
        rep.arena_head_measured = r.head_bytes
        rep.stack_bytes_measured = r.stack_used_bytes
        rep.banks = r.banks
        rep.instructions = r.instructions
        rep.flash_bytes, rep.ram_bytes = r.flash_bytes, r.ram_bytes
        # Keys of the target's own figures: "head"/"tail" in RunReport.arena mean the host's.
        rep.arena = {"configured": r.arena_size, "used": r.arena_used_bytes, "head_on_target": r.head_bytes,
                     "tail_on_target": r.tail_bytes, "planned_head": r.planned_head, "fits": True, "board": r.board}
        rep.op_instructions = list(r.op_instructions)  # not `ops`: those are times
        rep.latency = None  # emulated time is no board's latency
        rep.error = r.error
        # Reference kernels must match the host bit for bit; CMSIS-NN may round differently:
        # its differences are reported (output_differences) rather than failing the run.
        rep.verified = r.outputs_agree if kernels == REFERENCE else (True if r.outputs_match else None)
        rep.notes.extend(r.notes)
        rep.notes.append(f"{r.instructions:,} instructions per invoke (QEMU -icount shift={ICOUNT_SHIFT}); "
                         f"flash {r.flash_bytes:,} B, RAM {r.ram_bytes:,} B; arena used {r.arena_used_bytes:,} B "
                         f"(head {r.head_bytes}, predicted {r.arena_bytes_predicted} B: head {r.head_predicted} "
                         f"+ tail {r.tail_predicted})"
                         + (f"; stack {r.stack_used_bytes:,} B at the deepest of the {r.stack_bytes_reserved:,} B "
                            "reserved" if r.stack_used_bytes is not None else ""))
        top = sorted(r.op_instructions, key=lambda o: -o["instructions"])[:5]
        if top:
            rep.notes.append("most instructions: " + ", ".join(f"op {o['index']} {o['opcode']} {o['instructions']:,}"
                                                              for o in top))
        if r.output_differences:
            rep.notes.append(f"{len(r.output_differences)} output tensor(s) differ from host TFLite Micro: "
                             f"{r.output_differences[:3]}")
        return rep
