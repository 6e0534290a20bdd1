"""Real firmware: export-mcu writes a project, make builds it against the cached TFLite Micro
library, QEMU runs it, and the host drives it over the serial protocol as it drives a board.

Without the ARM toolchain, QEMU or a TFLite Micro tree the tests that need them skip with the
reason (.ci/run installs the toolchain and QEMU). The library is built once per tree and cached
(~13 CPU-minutes per tree the first time ever); each model's firmware is built once per session."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from helpers.firmware import HAVE_ARM, HAVE_QEMU, needs_arm, needs_qemu, tree_or_skip
from tpu_pipeline.toolchain.device import REFERENCE, kernel_set, load_device
from tpu_pipeline.toolchain.errors import DeviceError, InfeasibleError, UsageError

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
MODELS = ["chain_int8", "pool_softmax_int8", "multi_output_int8", "tiny_irregular_int8"]
QEMU = load_device("qemu-mps2-an386")
LINK_BOARDS = ["sparkfun-edge", "arduino-nano-33-ble", "stm32h743", "nucleo-l4r5zi"]


def cli(*args, timeout=900):
    """The installed command in a subprocess: (exit code, stdout, stderr)."""
    p = subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


def one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith(("backend:", "building", "  [",
                                                                                      "TFLite Micro library"))]
    assert len(lines) == 1, stderr
    return lines[0]


# ---- no toolchain needed ----------------------------------------------------------------------
def test_tree_not_found_is_one_clear_usage_error(tmp_path, monkeypatch):
    from tpu_pipeline.toolchain.firmware import library

    monkeypatch.delenv("TFLM_TREE", raising=False)
    monkeypatch.setattr(library, "__file__", str(tmp_path / "pkg" / "library.py"))
    with pytest.raises(UsageError, match="no TFLite Micro source tree found.*create_tflm_tree.py"):
        library.find_tree(kernel_set("cmsis-nn"), start=tmp_path)
    monkeypatch.setenv("TFLM_TREE", str(tmp_path))
    with pytest.raises(UsageError, match="not a TFLite Micro source tree"):
        library.find_tree(kernel_set("reference"))


def test_tree_found_next_to_the_checkout(tmp_path, monkeypatch):
    from tpu_pipeline.toolchain.firmware import library

    monkeypatch.delenv("TFLM_TREE", raising=False)
    tree = tmp_path / "shared" / "tflm" / "reference"
    (tree / "tensorflow" / "lite" / "micro").mkdir(parents=True)
    (tree / "tensorflow" / "lite" / "micro" / "micro_interpreter.h").write_text("")
    monkeypatch.setattr(library, "__file__", str(tmp_path / "elsewhere" / "library.py"))
    assert library.find_tree(kernel_set("reference"), start=tmp_path / "main" / "sub") == tree.resolve()
    with pytest.raises(UsageError):
        library.find_tree(kernel_set("cmsis-nn"), start=tmp_path / "main")


def test_build_firmware_without_a_tree_exits_2(tmp_path, monkeypatch):
    from tpu_pipeline.toolchain.export_mcu import export_mcu

    export_mcu(FIXTURES / "chain_int8.tflite", load_device("qemu-mps2-an386"), tmp_path / "fw")
    env = dict(os.environ, TFLM_TREE=str(tmp_path / "nothing"))
    p = subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", "build-firmware", str(tmp_path / "fw")],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    assert p.returncode == 2
    assert "not a TFLite Micro source tree" in one_line(p.stderr)


def test_export_writes_the_board_memory_map_and_makefile(tmp_path):
    from tpu_pipeline.toolchain.export_mcu import export_mcu

    r = export_mcu(FIXTURES / "chain_int8.tflite", load_device("nucleo-l4r5zi"), tmp_path)
    ld = (tmp_path / "link.ld").read_text()
    assert "ORIGIN = 0x08000000, LENGTH = 2097152" in ld and "ORIGIN = 0x20000000, LENGTH = 655360" in ld
    for f in ("Makefile", "startup.c", "platform.cc", "board_uart.cc", "board_config.h", "main.cc"):
        assert f in r.files and (tmp_path / f).is_file()
    cfg = (tmp_path / "board_config.h").read_text()
    assert "BOARD_UART_BASE 0x40008000u" in cfg and "BOARD_UART_LPUART 1" in cfg
    assert "#define HARNESS_TICKS_PER_S 4000000u" in (tmp_path / "harness_config.h").read_text()
    assert r.firmware["flash_origin"] == 0x08000000


@pytest.mark.parametrize("key,value,message", [
    ("uart", "spi", "uart must be one of"),
    ("cpu", "cortex-m0", "cpu must be one of"),
    ("init_writes", [[1]], "init_writes must be a list"),
    ("ticks", "rtc", "ticks must be one of"),
    ("stack_bytes", 12, "stack_bytes must be a whole number >= 1024"),
])
def test_bad_firmware_section_is_refused_naming_the_key(tmp_path, key, value, message):
    import tomllib


    raw = tomllib.loads((ROOT / "tpu_pipeline/toolchain/data/devices/qemu-mps2-an386.toml").read_text())
    raw["firmware"][key] = value

    def dump(v):
        return json.dumps(v) if not isinstance(v, str) else f'"{v}"'

    lines = [f'name = "bad"', 'kind = "mcu"']
    for sec in ("memory", "compute", "link", "power", "firmware"):
        lines.append(f"[{sec}]")
        # tables and the [[memory.banks]] list are left out: sram_bytes is then the one bank
        lines += [f"{k} = {dump(v)}" for k, v in raw[sec].items() if not isinstance(v, dict) and k != "banks"]
    lines.append("[compute.cycles_per_mac]")
    lines += [f"{k} = {v}" for k, v in raw["compute"]["cycles_per_mac"].items()]
    p = tmp_path / "bad.toml"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(UsageError, match=f"bad.toml: \\[firmware\\] {message}"):
        load_device(p)


def test_memory_regions_from_a_map_file():
    from tpu_pipeline.toolchain.firmware.build import memory_regions

    text = ("Memory Configuration\n\nName             Origin             Length             Attributes\n"
            "FLASH            0x08000000         0x00200000         xr\n"
            "RAM              0x20000000         0x000a0000         xrw\n"
            "*default*        0x00000000         0xffffffff\n\nLinker script and memory map\n")
    assert memory_regions(text) == {"FLASH": (0x08000000, 0x200000), "RAM": (0x20000000, 0xA0000)}


# ---- the library cache (a two-file tree: fast) -----------------------------------------------
def _tiny_tree(root: Path) -> Path:
    t = root / "tree"
    (t / "tensorflow" / "lite" / "micro").mkdir(parents=True)
    (t / "tensorflow" / "lite" / "micro" / "micro_interpreter.h").write_text("")
    (t / "a.cc").write_text("int tiny_a(int x) { return x + 1; }\n")
    (t / "b.c").write_text("int tiny_b(int x) { return x * 2; }\n")
    return t


@needs_arm
def test_library_is_built_once_and_resumes_from_its_objects(tmp_path, monkeypatch):
    from tpu_pipeline.toolchain.firmware import library

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    tree = _tiny_tree(tmp_path)
    seen = []
    lib = library.ensure_library(tree, REFERENCE, progress=lambda d, n: seen.append((d, n)))
    assert lib.path.is_file() and seen[-1] == (2, 2)
    names = subprocess.run(["arm-none-eabi-ar", "t", str(lib.path)], capture_output=True, text=True).stdout.split()
    assert sorted(names) == ["a.cc.o", "b.c.o"]
    seen.clear()
    assert library.ensure_library(tree, REFERENCE, progress=lambda d, n: seen.append(d)).path == lib.path
    assert seen == []  # cached: nothing compiled
    lib.path.unlink()  # an interrupted build: objects stay, the archive is missing
    library.ensure_library(tree, REFERENCE, progress=lambda d, n: seen.append(d))
    assert seen == [] and lib.path.is_file()  # archived again without recompiling
    (tree / "a.cc").write_text("int tiny_a(int x) { return x + 2; }\n")  # new content, new key
    assert library.ensure_library(tree, REFERENCE, quiet=True).key != lib.key


@needs_arm
def test_two_library_builds_at_once_leave_one_good_archive(tmp_path):
    tree = _tiny_tree(tmp_path)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "tpu_pipeline.toolchain.firmware.library", "--kernels", "reference", "--tflm-tree", str(tree)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    paths = {o[0].split()[1] for o in outs}
    assert len(paths) == 1
    lib = Path(paths.pop())
    ok = subprocess.run(["arm-none-eabi-ar", "t", str(lib)], capture_output=True, text=True)
    assert ok.returncode == 0 and sorted(ok.stdout.split()) == ["a.cc.o", "b.c.o"]
    assert not list(lib.parent.glob("*.tmp"))


def build_firmware_lib_ready(kernels: str, cpu: str = "cortex-m4+fp"):
    from tpu_pipeline.toolchain.firmware.library import ensure_library, find_tree

    return ensure_library(find_tree(kernel_set(kernels)), kernel_set(kernels), cpu, quiet=True, wait=False)


# ---- real builds ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built():
    """built(model, kernels) -> (export.json, FirmwareBuild): each model's harness for
    qemu-mps2-an386, built once per session and kernel set (and cached on disk across sessions)."""
    if not HAVE_ARM:
        pytest.skip("ARM toolchain not installed (.ci/run installs it)")
    from tpu_pipeline.runtime.backends.qemu import build_for_board
    from tpu_pipeline.toolchain.firmware.library import LibraryBusy

    done = {}

    def get(model: str, kernels: str):
        if (model, kernels) not in done:
            tree_or_skip(kernels)
            try:  # builds the library if nobody else is; a concurrent run skips instead of waiting
                done[(model, kernels)] = build_for_board(FIXTURES / f"{model}.tflite", QEMU, kernel_set(kernels),
                                                         quiet=True, wait=False)
            except LibraryBusy as exc:
                pytest.skip(str(exc))
        return done[(model, kernels)]

    return get


@needs_arm
@pytest.mark.parametrize("kernels", ["reference", "cmsis-nn"])
def test_harness_builds_for_the_emulated_board(built, kernels):
    for m in MODELS:
        exported, b = built(m, kernels)
        assert Path(b.elf).is_file()
        assert b.regions["FLASH"]["origin"] == 0 and b.regions["RAM"]["origin"] == 0x20000000
        assert exported["model_bytes"] < b.flash_bytes < b.regions["FLASH"]["length"]
        assert b.arena_size == exported["arena_size"] and b.arena_size < b.ram_bytes


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels", ["reference", "cmsis-nn"])
@pytest.mark.parametrize("model", MODELS)
def test_models_run_in_qemu_over_the_serial_protocol(built, model, kernels):
    from tpu_pipeline.runtime.backends.qemu import run_on_qemu
    from tpu_pipeline.toolchain.ir import from_model
    from tpu_pipeline.toolchain.tflite import read_model

    built(model, kernels)
    r = run_on_qemu(FIXTURES / f"{model}.tflite", QEMU, kernel_set(kernels), iterations=3, seed=5)
    assert r.error is None and r.iterations == 3
    if kernels == "reference":
        assert r.outputs_match is True, r.output_differences  # the wheel's kernels: bit for bit
    else:
        assert r.outputs_match is (not r.output_differences)
        for d in r.output_differences:
            assert 0 < d["elements_differing"] <= d["elements"] and d["max_abs_diff"] > 0
    assert r.head_bytes is not None and r.tail_bytes is not None
    assert r.arena_used_bytes == r.head_bytes + r.tail_bytes <= r.arena_size
    if kernels == "reference":  # our offline plan is what the firmware allocates
        assert r.head_bytes == r.planned_head
    # The 32-bit target model (tpu_pipeline.toolchain.memory.tflm_target), to the byte, for both kernel sets:
    # head = our plan + the kernels' scratch as TFLite Micro places it, tail = the persistent part.
    assert (r.head_predicted, r.tail_predicted) == (r.head_bytes, r.tail_bytes)
    assert r.arena_bytes_predicted == r.arena_used_bytes
    n_ops = len(from_model(read_model(FIXTURES / f"{model}.tflite")).ops)
    assert [o["index"] for o in r.op_instructions] == list(range(n_ops))
    assert all(o["instructions"] > 0 for o in r.op_instructions)
    ops_total = sum(o["instructions"] for o in r.op_instructions)
    assert ops_total <= 1.01 * r.instructions  # medians of 3
    assert r.instructions < 2 * ops_total + 1_000_000  # the interpreter adds little around the ops
    assert r.flash_bytes > 0 and r.ram_bytes >= r.arena_size


# Recurrent models run only here on the 32-bit target: ~35 s each (build + run), the one check of
# the variables' and the recurrent kernels' tail entries (docs/benchmarks.md's survey has the rest).
@needs_arm
@needs_qemu
@pytest.mark.parametrize("model, kernels", [("keyword_scrambled_8bit", "reference"),
                                            ("trained_lstm_int8", "cmsis-nn")])
def test_recurrent_models_arena_on_the_target(model, kernels):
    from tpu_pipeline.runtime.backends.qemu import run_on_qemu
    from tpu_pipeline.toolchain.firmware.library import LibraryBusy

    tree_or_skip(kernels)
    try:
        r = run_on_qemu(FIXTURES / "thirdparty" / f"{model}.tflite", QEMU, kernel_set(kernels), iterations=1, seed=2)
    except LibraryBusy as exc:
        pytest.skip(str(exc))
    assert r.error is None and r.outputs_agree is True, r.output_differences
    assert (r.head_predicted, r.tail_predicted) == (r.head_bytes, r.tail_bytes)
    assert r.arena_bytes_predicted == r.arena_used_bytes


@needs_arm
@needs_qemu
def test_instruction_counts_are_deterministic(built):
    from tpu_pipeline.runtime.backends.qemu import run_on_qemu

    built("chain_int8", "reference")
    a = run_on_qemu(FIXTURES / "chain_int8.tflite", QEMU, REFERENCE, iterations=2, seed=3)
    b = run_on_qemu(FIXTURES / "chain_int8.tflite", QEMU, REFERENCE, iterations=2, seed=3)
    assert a.instructions == b.instructions and a.op_instructions == b.op_instructions


@needs_arm
@needs_qemu
@needs_arm
@needs_qemu
def test_the_cortex_m7_board_runs_too():
    """qemu-mps2-an500: the harness built for the M7 (linked with the shared ARMv7E-M library)."""
    from tpu_pipeline.runtime.backends.qemu import run_on_qemu
    from tpu_pipeline.toolchain.firmware.library import LibraryBusy

    tree_or_skip("reference")
    try:
        build_firmware_lib_ready("reference")
    except LibraryBusy as exc:
        pytest.skip(str(exc))
    r = run_on_qemu(FIXTURES / "pool_softmax_int8.tflite", load_device("qemu-mps2-an500"), REFERENCE, iterations=2)
    assert r.machine == "mps2-an500" and r.outputs_match is True and r.head_bytes == r.planned_head
    ops_total = sum(o["instructions"] for o in r.op_instructions)
    assert 0 < ops_total <= r.instructions < 2 * ops_total + 1_000_000


def test_run_backend_qemu_json(built):
    built("pool_softmax_int8", "reference")
    code, out, err = cli("run", FIXTURES / "pool_softmax_int8.tflite", "--backend", "qemu", "--kernels", "reference",
                         "-N", "2", "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["outputs_match"] is True and rep["simulated"] is True and rep["kernels"] == "reference"
    for k in ("arena_bytes_measured", "arena_bytes_predicted", "instructions", "flash_bytes", "ram_bytes"):
        assert isinstance(rep[k], int) and rep[k] > 0, k
    assert rep["arena"]["head_on_target"] == rep["arena"]["planned_head"]
    assert rep["arena_bytes_predicted"] == rep["arena_bytes_measured"]
    # per RAM bank: the harness keeps the arena in the first (SSRAM), nothing in PSRAM or block RAM
    assert rep["banks"][0] == {"name": "ssram2_3", "bytes_predicted": rep["arena_bytes_predicted"],
                               "bytes_measured": rep["arena_bytes_measured"]}
    assert [b["bytes_measured"] for b in rep["banks"][1:]] == [0, 0]
    assert [o["opcode"] for o in rep["op_instructions"]][-1] == "SOFTMAX"
    assert sum(o["instructions"] for o in rep["op_instructions"]) <= rep["instructions"]


def test_kernels_needs_the_qemu_backend():
    code, _, err = cli("run", FIXTURES / "chain_int8.tflite", "--backend", "emulator", "--kernels", "reference",
                       "--device", "sparkfun-edge", "-N", "1")
    assert code == 2 and "--kernels" in one_line(err)


@needs_arm
@needs_qemu
def test_qemu_backend_refuses_a_board_it_cannot_emulate():
    code, _, err = cli("run", FIXTURES / "chain_int8.tflite", "--backend", "qemu", "--device", "sparkfun-edge")
    assert code == 2 and "not an emulated board" in one_line(err)


# ---- faults ------------------------------------------------------------------------------------
@pytest.mark.timing
@needs_arm
@needs_qemu
def test_qemu_killed_mid_run_exits_4_in_one_line(built):
    """The real-board path (--backend mcu --port) on QEMU's pty; QEMU dies mid-run."""
    from tpu_pipeline.runtime.backends.qemu import QemuBoard

    _, b = built("tiny_irregular_int8", "reference")
    with QemuBoard(b.elf, "mps2-an386") as board:
        # Between QEMU and the host: after the 5th DONE line QEMU is killed (mid-run, whatever the load).
        p = _Garbler(board.port, corrupt_line=-1, kill_after_done=5, kill=board.kill)
        try:
            t0 = time.monotonic()
            code, out, err = cli("run", Path(b.project) / "model.tflite", "--backend", "mcu", "--port", p.port,
                                 "--device", "qemu-mps2-an386", "-N", "200", "--timeout", "3", "--json")
        finally:
            p.close()
    assert code == 4, err
    line = one_line(err)
    assert p.port in line and "(5 of 200 inferences completed)" in line
    assert time.monotonic() - t0 < 120
    rep = json.loads(out)  # the partial report is printed first
    assert rep["iterations"] == 200 and rep["error"] and rep["latency"]["n"] == 5 and rep["verified"] is True


class _Garbler:
    """A pseudo-terminal between QEMU and the host that corrupts the device's Nth line."""

    def __init__(self, upstream: str, corrupt_line: int, kill_after_done: int = 0, kill=None):
        import pty
        import tty

        self.master, slave = pty.openpty()
        tty.setraw(slave)
        self.port = os.ttyname(slave)
        self._slave = slave
        self.up = os.open(upstream, os.O_RDWR | os.O_NOCTTY)
        tty.setraw(self.up)
        self.corrupt_line, self.lines, self.stop = corrupt_line, 0, False
        self.kill_after_done, self.kill, self.done, self._line = kill_after_done, kill, 0, bytearray()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        import select

        while not self.stop:
            r, _, _ = select.select([self.master, self.up], [], [], 0.1)
            if self.master in r:
                try:
                    os.write(self.up, os.read(self.master, 4096))
                except OSError:
                    return
            if self.up in r:
                try:
                    data = bytearray(os.read(self.up, 4096))
                except OSError:
                    return
                # Forward whole lines: a bit flipped "before the checksum" must not land on the
                # edge of a read (it used to flip the previous chunk's last byte, or none).
                for c in data:
                    self._line.append(c)
                    if c != ord("\n"):
                        continue
                    line, self._line = self._line, bytearray()
                    if self.lines == self.corrupt_line and b"*" in line:
                        line[line.rindex(b"*") - 1] ^= 0x01  # one flipped bit before the checksum
                    self.lines += 1
                    self.done += line.startswith(b"DONE ")
                    os.write(self.master, bytes(line))
                    if self.kill is not None and self.done == self.kill_after_done:
                        self.kill()  # the board dies: nothing more comes
                        return

    def close(self):
        self.stop = True
        for fd in (self.master, self._slave, self.up):
            try:
                os.close(fd)
            except OSError:
                pass


@needs_arm
@needs_qemu
def test_garbage_on_the_line_exits_4_in_one_line(built):
    from tpu_pipeline.runtime.backends.qemu import QemuBoard

    _, b = built("chain_int8", "reference")
    with QemuBoard(b.elf, "mps2-an386") as board:
        g = _Garbler(board.port, corrupt_line=3)  # READY is line 0; OK SET, then the run's lines
        try:
            code, out, err = cli("run", Path(b.project) / "model.tflite", "--backend", "mcu", "--port", g.port,
                                 "--device", "qemu-mps2-an386", "-N", "3", "--timeout", "5")
        finally:
            g.close()
    assert code == 4, err
    assert "garbled line" in one_line(err)


@pytest.mark.timing
@needs_qemu
def test_qemu_that_cannot_boot_or_a_silent_board_is_a_device_error(tmp_path):
    from tpu_pipeline.runtime.backends.qemu import QemuBoard
    from tpu_pipeline.runtime.serial_mcu import SerialMcu

    bad = tmp_path / "firmware.elf"
    # A raw image whose reset vector points at `b .`: it boots and never says a word.
    bad.write_bytes((0x20001000).to_bytes(4, "little") + (0x9).to_bytes(4, "little") + b"\xfe\xe7" + bytes(54))
    with pytest.raises(DeviceError, match="QEMU \\(no-such-board\\) failed to boot"):
        QemuBoard(bad, "no-such-board").start()
    with QemuBoard(bad, "mps2-an386") as board:
        t0 = time.monotonic()
        with SerialMcu(board.port, 115200, timeout=1.0) as mcu:
            with pytest.raises(DeviceError, match="no answer within 1 s while waiting for READY"):
                mcu.handshake()
        assert time.monotonic() - t0 < 10
    assert not board.alive()


# ---- other boards: build and link only ----------------------------------------------------------
@needs_arm
@pytest.mark.parametrize("board", LINK_BOARDS)
def test_harness_links_for_real_boards(tmp_path, board):
    from tpu_pipeline.toolchain.export_mcu import export_mcu
    from tpu_pipeline.toolchain.firmware.build import build_firmware

    from tpu_pipeline.toolchain.firmware.library import LibraryBusy

    # The reference kernels: the link check is about the board layer and memory map, and this
    # library is the smaller of the two (CMSIS-NN builds the same way, see the QEMU runs).
    tree_or_skip("reference")
    export_mcu(FIXTURES / "chain_int8.tflite", load_device(board), tmp_path)
    # A cached project outlives the interpreter that exported it (another checkout's venv): the
    # build runs the library step with its own interpreter, not the one written in the Makefile.
    makefile = tmp_path / "Makefile"
    text = makefile.read_text()
    assert "PYTHON ?= " in text
    makefile.write_text(re.sub(r"PYTHON \?= .*", "PYTHON ?= /nonexistent/venv/bin/python", text))
    try:
        b = build_firmware(tmp_path, REFERENCE, quiet=True, wait=False)
    except LibraryBusy as exc:
        pytest.skip(str(exc))
    fw = load_device(board).firmware
    assert b.regions["FLASH"]["origin"] == fw.flash_origin and b.regions["RAM"]["origin"] == fw.ram_origin
    assert b.regions["RAM"]["length"] == load_device(board).memory.sram_bytes
    assert 0 < b.flash_bytes <= b.regions["FLASH"]["length"] and 0 < b.ram_bytes <= b.regions["RAM"]["length"]


@needs_arm
def test_a_firmware_that_does_not_fit_exits_3_naming_the_region(tmp_path):
    from tpu_pipeline.toolchain.export_mcu import export_mcu

    from tpu_pipeline.toolchain.firmware.library import LibraryBusy

    tree_or_skip("reference")
    export_mcu(FIXTURES / "chain_int8.tflite", load_device("sparkfun-edge"), tmp_path)
    try:
        build_firmware_lib_ready("reference")
    except LibraryBusy as exc:
        pytest.skip(str(exc))
    code, _, err = cli("build-firmware", tmp_path, "--kernels", "reference", "--arena-size", 400 * 1024)  # 384 KiB
    assert code == 3, err
    line = one_line(err)
    assert "region `RAM' overflowed by" in line and "sparkfun-edge" in line
    code, out, err = cli("build-firmware", tmp_path, "--kernels", "reference", "--json")
    assert code == 0, err
    assert json.loads(out)["ram_bytes"] < 384 * 1024
