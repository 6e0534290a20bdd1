"""Memory banks (issue 32 item 3): the head and the tail of TFLite Micro's arena in different
RAM banks, chosen by tpu_pipeline/toolchain/deploy/banks.py; fit's budget is "fits some allowed
placement", not the first bank's size."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import FIXTURES

from tpu_pipeline.cli import main
from tpu_pipeline.toolchain.deploy.banks import arena_budget, place
from tpu_pipeline.toolchain.device import load_device
from tpu_pipeline.toolchain.device.descriptor import RamBank
from tpu_pipeline.toolchain.fit.model import HARNESS_STATIC_BYTES

H7 = load_device("stm32h743").memory.banks
KIB = 1024


def test_whole_arena_goes_to_the_fastest_bank_it_fits():
    p = place(100 * KIB, 20 * KIB, H7, 30 * KIB)
    assert (p.head_bank, p.tail_bank, p.split) == ("dtcm", "dtcm", False)  # zero wait states
    p = place(300 * KIB, 20 * KIB, H7, 30 * KIB)  # AXI SRAM (482 KiB left by the firmware) holds it
    assert (p.head_bank, p.tail_bank) == ("axi_sram", "axi_sram")
    assert {b["name"]: b["bytes_predicted"] for b in p.to_json()} == {
        "axi_sram": 320 * KIB, "dtcm": 0, "sram1_3": 0, "sram4": 0}


def test_head_and_tail_split_when_no_single_bank_holds_the_arena():
    # a 480 KiB head: only the AXI SRAM's 512 KiB less the firmware holds it; the tail goes to the fastest other bank
    p = place(480 * KIB, 40 * KIB, H7, 30 * KIB)
    assert (p.head_bank, p.tail_bank, p.split) == ("axi_sram", "dtcm", True)
    assert [b["bytes_predicted"] for b in p.to_json()] == [480 * KIB, 40 * KIB, 0, 0]
    p = place(480 * KIB, 200 * KIB, H7, 30 * KIB)  # too big for the DTCM: SRAM1-3
    assert (p.head_bank, p.tail_bank) == ("axi_sram", "sram1_3")
    assert place(483 * KIB, 10 * KIB, H7, 30 * KIB) is None  # the head is one buffer: no bank holds it
    assert place(100 * KIB, 400 * KIB, H7, 30 * KIB).tail_bank == "axi_sram"
    # the budget fit gets: the AXI SRAM's room for the head plus a tail another bank holds
    assert arena_budget(H7, 30 * KIB, 40 * KIB) == 482 * KIB + 40 * KIB
    assert arena_budget(H7, 30 * KIB, 300 * KIB) == 288 * KIB + 300 * KIB  # tail in AXI, head in SRAM1-3
    assert arena_budget(H7, 30 * KIB, 490 * KIB) == 482 * KIB  # no bank holds the tail: one bank or nothing


def test_a_bank_without_an_origin_holds_nothing_but_the_first_banks_arena():
    banks = (RamBank("main", 64 * KIB, 0x20000000), RamBank("nowhere", 64 * KIB))
    assert place(40 * KIB, 30 * KIB, banks, 0) is None


def _split_tail(model) -> int:
    from tpu_pipeline.toolchain.loader import load
    from tpu_pipeline.toolchain.memory.tflm_target import split_tail, target_tail

    return split_tail(target_tail(load(model)[1]))


def _board(tmp_path, first: int, second: int):
    """An MCU without a harness (reserve: the harness's static RAM) and two banks."""
    text = f"""name = "two-banks"
kind = "mcu"
[memory]
flash_bytes = 1048576
[[memory.banks]]
name = "fast"
origin = 0x20000000
size_bytes = {HARNESS_STATIC_BYTES + first}
wait_states = 0
[[memory.banks]]
name = "slow"
origin = 0x60000000
size_bytes = {second}
wait_states = 2
[compute]
clock_hz = 100000000
cycles_per_instruction = 1.0
[compute.cycles_per_mac]
conv = 2.0
depthwise = 3.0
fully_connected = 2.0
elementwise = 5.0
other = 6.0
[link]
baud = 115200
[power]
active_w = 0.1
idle_w = 0.01
"""
    path = tmp_path / "two-banks.toml"
    path.write_text(text)
    return path


def test_fit_fits_a_model_that_no_single_bank_holds(tmp_path, capsys):
    # keyword_scrambled: a 672-byte head and a 7,540-byte tail (cmsis-nn, 32-bit target). Neither
    # bank holds both (the first leaves 7,000 B, less than the tail alone), the split does.
    model = FIXTURES / "thirdparty" / "keyword_scrambled_8bit.tflite"
    board = _board(tmp_path, 7000, 7600)
    out = tmp_path / "fitted.tflite"
    assert main(["fit", str(model), "--device", str(board), "-o", str(out), "--time-limit", "5", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    head, tail = rep["arena_head_bytes"], rep["arena_tail_bytes_target"]
    assert head + tail > 7600 and tail > 7000
    assert rep["arena_placement"] == {"head": "fast", "tail": "slow"}
    # apart from the head, the tail holds TFLite Micro's two allocator objects (16 B more here)
    apart = _split_tail(out)
    assert tail < apart <= 7600
    assert rep["banks"] == [{"name": "fast", "bytes_predicted": head}, {"name": "slow", "bytes_predicted": apart}]
    assert out.is_file()

    # a slow bank too small for the tail: nothing holds it, exit 3 and nothing written
    board = _board(tmp_path, 7000, 7000)
    out.unlink()
    assert main(["fit", str(model), "--device", str(board), "-o", str(out), "--time-limit", "5"]) == 3
    assert not out.exists()


def test_profile_json_gives_the_arena_per_bank(tmp_path, capsys):
    model = FIXTURES / "thirdparty" / "keyword_scrambled_8bit.tflite"
    board = _board(tmp_path, 7000, 7600)
    assert main(["profile", str(model), "--device", str(board), "--backend", "emulator", "-N", "1", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    head, tail = rep["arena_head_predicted"], rep["arena_tail_predicted"]
    assert rep["banks"] == [{"name": "fast", "bytes_predicted": head},
                            {"name": "slow", "bytes_predicted": _split_tail(model)}]
    board = _board(tmp_path, 7000 + tail + head, 7600)  # room for both in the faster bank: no split
    assert main(["profile", str(model), "--device", str(board), "--backend", "emulator", "-N", "1", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["banks"] == [{"name": "fast", "bytes_predicted": head + tail}, {"name": "slow", "bytes_predicted": 0}]


@pytest.mark.parametrize("board,banks", [("qemu-mps2-an386", ("psram", "ssram2_3")),
                                         ("qemu-mps2-an500", ("ssram2_3", "psram"))])
def test_head_and_tail_in_two_banks_in_qemu(tmp_path, board, banks):
    """A library's init_split on an emulated board, head and tail in different RAM regions (the
    linker script's bank sections): outputs identical to host TFLite Micro, the bytes used in
    each bank = the prediction (the tail with two allocator objects: split_tail)."""
    from helpers.firmware import HAVE_ARM, HAVE_QEMU, tree_or_skip

    if not (HAVE_ARM and HAVE_QEMU):
        pytest.skip("ARM toolchain or qemu-system-arm not installed")
    tree_or_skip("cmsis-nn")
    from tpu_pipeline.runtime.library_app import run_libraries_on_qemu
    from tpu_pipeline.toolchain.device import kernel_set
    from tpu_pipeline.toolchain.firmware.library import LibraryBusy

    dev = load_device(board)
    try:
        run = run_libraries_on_qemu([FIXTURES / "multi_output_int8.tflite"], dev, kernel_set("cmsis-nn"),
                                    tmp_path / "work", seed=3, banks=banks)
    except LibraryBusy as exc:
        pytest.skip(str(exc))
    assert run.errors == []
    (m,), (a,) = run.models, run.arenas
    assert m.outputs_match is True, m.output_differences
    assert (a.init_rc, a.refused_small, a.refused_misaligned) == (0, -2, -1), a
    assert (a.head, a.tail) == (a.head_predicted, a.tail_predicted), a
    assert [(b["name"], b["bytes_measured"]) for b in a.banks] == [(banks[0], a.head), (banks[1], a.tail)]
    assert all(b["bytes_measured"] == b["bytes_predicted"] for b in a.banks)
    regions = {b.name: (b.origin, b.origin + b.size) for b in dev.memory.banks}
    for b in a.banks:  # each buffer lies in its bank's address range
        lo, hi = regions[b["name"]]
        assert lo <= b["address"] < hi, (b, hex(lo))
    # the linker's per-bank use (build-firmware's `banks`): the other bank holds exactly its buffer
    from pathlib import Path

    from tpu_pipeline.toolchain.firmware.build import usage
    _, _, linked = usage(Path(run.elf), Path(run.elf).parent / "app.map")
    other = next(i for i, b in enumerate(banks) if b != dev.memory.banks[0].name)
    buffer = -(-max(a.head, m_planning(tmp_path)) // 16) * 16 if other == 0 else -(-a.tail // 16) * 16
    assert linked[f"BANK_{banks[other]}"]["used"] == buffer + 16  # the app's buffers carry 16 B of slack


def m_planning(tmp_path) -> int:
    import json as _json

    return _json.loads((tmp_path / "work" / "lib" / "tpup_library.json").read_text())["models"][0]["planning_bytes"]


def test_the_library_says_where_its_arena_goes(tmp_path):
    """export-mcu --library records the placement on its device: a small model whole in the
    STM32H743's DTCM (zero wait states, the fastest bank that holds it)."""
    from tpu_pipeline.toolchain.deploy.library import export_library

    r = export_library(FIXTURES / "multi_output_int8.tflite", load_device("stm32h743"), tmp_path / "lib")
    for k, p in r.placement.items():
        assert (p["head"], p["tail"]) == ("dtcm", "dtcm")
        used = {b["name"]: b["bytes_predicted"] for b in p["banks"]}
        assert used == {"axi_sram": 0, "dtcm": r.head_bytes[k] + r.tail_bytes[k], "sram1_3": 0, "sram4": 0}
    header = (tmp_path / "lib" / "tpup_multi_output_int8.h").read_text()
    assert "int tpup_multi_output_int8_init_split(void* head_arena" in header
    assert f"#define TPUP_MULTI_OUTPUT_INT8_SPLIT_TAIL_BYTES_CMSIS_NN {r.split_tail_bytes['cmsis-nn']}" in header


def test_a_tail_apart_is_counted_with_its_two_allocators():
    # the tail fits a bank alone only as the one-arena tail; apart from the head it is 16 B more
    banks = (RamBank("a", 1000, 0x20000000), RamBank("b", 500, 0x30000000))
    assert arena_budget(banks, 0, 500) == 1000 + 500
    assert arena_budget(banks, 0, 500, split_tail=516) == 1000  # the head's bank whole, nothing apart
    assert place(900, 500, banks, 0, split_tail=516) is None
    assert place(900, 480, banks, 0, split_tail=496).tail == 496


def test_build_firmware_json_gives_the_bytes_per_bank():
    from tpu_pipeline.toolchain.firmware.build import FirmwareBuild

    regions = {"FLASH": {"origin": 0, "length": 4 << 20, "used": 90000},
               "RAM": {"origin": 0x20000000, "length": 4 << 20, "used": 70000},
               "BANK_psram": {"origin": 0x21000000, "length": 16 << 20, "used": 6672}}
    b = FirmwareBuild("p", "qemu-mps2-an386", "cmsis-nn", "e", "m", 90000, 70000, regions, 0, "l", "t")
    assert b.to_json()["banks"] == [
        {"name": "RAM", "origin": 0x20000000, "length": 4 << 20, "bytes_used": 70000},
        {"name": "psram", "origin": 0x21000000, "length": 16 << 20, "bytes_used": 6672}]


OPENMV = Path(os.environ.get("TPUP_OPENMV_DIR", "/nonexistent"))  # OpenMV's lib/models (not committed)


@pytest.mark.skipif(not (OPENMV / "yolov8n_192.tflite").is_file(),
                    reason="set TPUP_OPENMV_DIR to OpenMV's lib/models (yolov8n_192.tflite)")
def test_a_real_model_split_across_the_h743s_banks_in_qemu(tmp_path, capsys):
    """OpenMV's int8 YOLOv8n (192x192), fitted for stock TFLite Micro (--builtin-kernels) on the
    stm32h743: as is, head 442,368 B + tail 71,712 B exceed the AXI SRAM's room, so fit keeps it
    as is with the head in AXI SRAM and the tail in DTCM. In QEMU (the an500's Cortex-M7 with a
    descriptor whose banks have the H743's sizes: QEMU has no H743) each bank's bytes = prediction."""
    from helpers.firmware import HAVE_ARM, HAVE_QEMU, tree_or_skip

    out = tmp_path / "yolo.tflite"
    assert main(["fit", str(OPENMV / "yolov8n_192.tflite"), "--builtin-kernels", "--device", "stm32h743", "-o",
                 str(out), "--time-limit", "60", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["arena_placement"] == {"head": "axi_sram", "tail": "dtcm"}
    assert rep["arena_head_bytes"] + rep["arena_tail_bytes_target"] > rep["arena_bytes_available"]
    if not (HAVE_ARM and HAVE_QEMU):
        pytest.skip("ARM toolchain or qemu-system-arm not installed")
    tree_or_skip("cmsis-nn")
    from tpu_pipeline.runtime.library_app import run_libraries_on_qemu
    from tpu_pipeline.toolchain.device import kernel_set

    board = Path(__file__).parent / "fixtures" / "qemu-an500-h743-banks.toml"
    run = run_libraries_on_qemu([out], load_device(str(board)), kernel_set("cmsis-nn"), tmp_path / "work",
                                inferences=1, seed=3, timeout=1800, banks=("axi_sram", "dtcm"))
    assert run.errors == [] and run.models[0].outputs_match is True
    (a,) = run.arenas
    assert [(b["name"], b["bytes_measured"]) for b in a.banks] == \
        [(b["name"], b["bytes_predicted"]) for b in rep["banks"] if b["bytes_predicted"]]
