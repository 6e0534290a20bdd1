"""Memory banks (issue 32 item 3): the head and the tail of TFLite Micro's arena in different
RAM banks, chosen by tpu_pipeline/toolchain/deploy/banks.py; fit's budget is "fits some allowed
placement", not the first bank's size."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import FIXTURES
from helpers.models import mcu_toml, qemu_board

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
    path = tmp_path / "two-banks.toml"
    path.write_text(mcu_toml("two-banks", [("fast", 0x20000000, HARNESS_STATIC_BYTES + first, 0),
                                          ("slow", 0x60000000, second, 2)]))
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
    # apart from the head, the tail holds TFLite Micro's two allocator objects in place of one (12 B
    # more, which an allocation aligned to 16 after them may absorb: the fitted model's FCs on the
    # harness's own kernel leave 7,172 B both ways; the model as given, 7,540 -> 7,556 B)
    apart = _split_tail(out)
    assert tail <= apart <= 7600 and _split_tail(model) == 7556
    assert rep["banks"] == [{"name": "fast", "bytes_predicted": head}, {"name": "slow", "bytes_predicted": apart}]
    assert out.is_file()

    # a slow bank too small for the tail: nothing holds it, exit 3 and nothing written
    board = _board(tmp_path, 7000, 7000)
    out.unlink()
    assert main(["fit", str(model), "--device", str(board), "-o", str(out), "--time-limit", "5"]) == 3
    assert not out.exists()


def test_the_memory_objective_counts_head_and_tail_on_a_board_that_splits_them(tmp_path, capsys):
    """A board only a split holds bounds fit's head by its bank (the tail goes apart), but the
    memory objective still asks for the least RAM, head + tail: the same arena as without the
    board (counting the head alone, a tied head took a larger tail: mcunetv2_large on the an386,
    251,476 -> 264,420 B)."""
    model = FIXTURES / "thirdparty" / "keyword_scrambled_8bit.tflite"
    board = _board(tmp_path, 7000, 7600)
    reports = []
    for device in (["--device", str(board)], []):
        out = tmp_path / f"fitted{len(device)}.tflite"
        assert main(["fit", str(model), "--objective", "memory", *device, "-o", str(out), "--time-limit", "5",
                     "--json"]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    on_board, alone = reports
    assert on_board["budget_counts"] == alone["budget_counts"] == "whole"
    assert on_board["arena_bytes_predicted"] == alone["arena_bytes_predicted"]
    assert on_board["arena_placement"] == {"head": "fast", "tail": "slow"}


def test_the_memory_objective_asks_again_head_alone_where_no_bank_holds_its_head(tmp_path, capsys, monkeypatch):
    """Where the least whole arena cannot be placed (its head in no bank), the memory objective
    asks again counting the head alone, as a budgeted fit does. (No small model has such an
    arena: the first placement is refused here.)"""
    import tpu_pipeline.toolchain.fit.model as fit_model

    placed, refused = fit_model.place, []

    def refuse_once(*args):
        if not refused:
            refused.append(args[:2])
            return None
        return placed(*args)

    monkeypatch.setattr(fit_model, "place", refuse_once)
    model = FIXTURES / "thirdparty" / "keyword_scrambled_8bit.tflite"
    out = tmp_path / "fitted.tflite"
    assert main(["fit", str(model), "--objective", "memory", "--device", str(_board(tmp_path, 7000, 7600)),
                 "-o", str(out), "--time-limit", "5", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert len(refused) == 1 and rep["budget_counts"] == "head" and rep["fits"] and out.is_file()


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


def _split_board(tmp_path, first_room: int, second: int) -> Path:
    """The an500 in QEMU with its SSRAM cut to the firmware's reserve + `first_room` and a
    `second`-byte bank on its PSRAM."""
    from tpu_pipeline.toolchain.deploy.banks import firmware_reserve

    reserve = firmware_reserve(load_device("qemu-mps2-an500"))
    return qemu_board(tmp_path, "split-an500", [("ssram", 0x20000000, reserve + first_room, 0),
                                                ("psram", 0x60000000, second, 0)])


def test_the_harness_places_its_arena_whole_or_split():
    from tpu_pipeline.toolchain.deploy.banks import firmware_reserve, harness_arena

    dev = load_device("stm32h743")
    # whole in the fastest bank that holds it (DTCM: zero wait states)
    assert harness_arena(100 * KIB, 80 * KIB, 21 * KIB, dev) == \
        {"head": "dtcm", "tail": "dtcm", "input": None, "head_bytes": 100 * KIB, "tail_bytes": 0, "input_bytes": 0}
    # no bank holds it whole: the head in the AXI SRAM beside the firmware, the tail apart in the DTCM
    room = 512 * KIB - firmware_reserve(dev)
    assert harness_arena(room + 16, room - 32 * KIB, 40 * KIB, dev) == \
        {"head": "axi_sram", "tail": "dtcm", "input": None, "head_bytes": room - 32 * KIB, "tail_bytes": 40 * KIB,
         "input_bytes": 0}
    # an input outside the arena: its own bank widens what fits (here the head takes SRAM1-3 whole)
    assert harness_arena(room + 300 * KIB, 288 * KIB, 20 * KIB, dev, 440 * KIB) == \
        {"head": "sram1_3", "tail": "dtcm", "input": "axi_sram", "head_bytes": 288 * KIB, "tail_bytes": 20 * KIB,
         "input_bytes": 440 * KIB}
    assert harness_arena(room + 16, room - 32 * KIB, None, dev) is None  # a tail not predicted is not split
    assert harness_arena(100 * KIB, 80 * KIB, 21 * KIB, load_device("nucleo-l4r5zi")) is None  # one bank


def test_the_harness_firmware_splits_its_arena_across_banks_in_qemu(tmp_path, capsys):
    """export-mcu -o on a board whose banks hold the arena only apart: the head (23,552 B) in the
    32 KiB PSRAM bank, the tail (10 KB) in the SSRAM beside the firmware (16 KiB left). The
    linker puts each buffer in its bank; in QEMU each bank's bytes = prediction, outputs identical."""
    from helpers.firmware import HAVE_ARM, HAVE_QEMU, tree_or_skip

    board = _split_board(tmp_path, 16 * KIB, 32 * KIB)
    model = FIXTURES / "darts_s2b_int8.tflite"
    fw = tmp_path / "fw"
    assert main(["export-mcu", str(model), "--device", str(board), "-o", str(fw), "--json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    placed = exported["arena_banks"]
    assert (placed["head"], placed["tail"]) == ("psram", "ssram")
    assert exported["arena_size"] > 32 * KIB  # no bank holds the arena whole
    config = (fw / "harness_config.h").read_text()
    assert '#define HARNESS_HEAD_SECTION __attribute__((section(".bank_psram")))' in config
    # --arena-size sets a one-buffer arena: refused on a split one, one line, exit 2
    assert main(["build-firmware", str(fw), "--arena-size", "65536"]) == 2
    assert "--arena-size sets a one-buffer arena" in capsys.readouterr().err
    if not (HAVE_ARM and HAVE_QEMU):
        pytest.skip("ARM toolchain or qemu-system-arm not installed")
    tree_or_skip("cmsis-nn")
    # the linker's verdict: the PSRAM bank holds the head buffer and nothing else
    assert main(["build-firmware", str(fw), "--kernels", "cmsis-nn", "--json"]) == 0
    linked = {b["name"]: b["bytes_used"] for b in json.loads(capsys.readouterr().out)["banks"]}
    assert linked["psram"] == placed["head_bytes"]

    assert main(["run", str(model), "--backend", "qemu", "--device", str(board), "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["outputs_match"] is True and run["error"] is None
    banks = {b["name"]: (b["bytes_predicted"], b["bytes_measured"]) for b in run["banks"]}
    assert banks == {"psram": (run["arena_head_measured"],) * 2,
                     "ssram": (run["arena"]["tail_on_target"],) * 2}, banks
    assert run["arena_bytes_measured"] == run["arena_bytes_predicted"] == sum(p for p, _ in banks.values())


# QEMU's an500 (Cortex-M7) with the STM32H743's banks (QEMU has no H743): their sizes and stated
# wait states (so the same placement), the AXI SRAM, SRAM1-3 and SRAM4 on the SSRAM, the DTCM on the PSRAM
H743_ON_AN500 = [("axi_sram", 0x20000000, 512 * KIB, None), ("dtcm", 0x60000000, 128 * KIB, 0),
                 ("sram1_3", 0x20100000, 288 * KIB, None), ("sram4", 0x20180000, 64 * KIB, None)]
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

    board = qemu_board(tmp_path, "qemu-an500-h743-banks", H743_ON_AN500)
    run = run_libraries_on_qemu([out], load_device(str(board)), kernel_set("cmsis-nn"), tmp_path / "work",
                                inferences=1, seed=3, timeout=1800, banks=("axi_sram", "dtcm"))
    assert run.errors == [] and run.models[0].outputs_match is True
    (a,) = run.arenas
    assert [(b["name"], b["bytes_measured"]) for b in a.banks] == \
        [(b["name"], b["bytes_predicted"]) for b in rep["banks"] if b["bytes_predicted"]]


def test_a_bank_with_wait_states_is_avoided_and_priced(tmp_path, capsys):
    """Bank speed in the cost model: with both banks able to hold the arena, the head goes to the
    bank without wait states (listed second); where only the slow bank holds it, fit's predicted
    latency grows by its wait states on every activation word read and written."""
    from tpu_pipeline.toolchain.loader import load

    model = FIXTURES / "chain_int8.tflite"

    def fit_on(fast_bytes: int):
        board = tmp_path / f"ws-{fast_bytes}.toml"
        board.write_text(mcu_toml("wait-states", [("slow", 0x20000000, HARNESS_STATIC_BYTES + 64 * KIB, 3),
                                                  ("fast", 0x30000000, fast_bytes, 0)]))
        out = tmp_path / f"fit-{fast_bytes}.tflite"
        assert main(["fit", str(model), "--device", str(board), "-o", str(out), "--time-limit", "5", "--json"]) == 0
        return json.loads(capsys.readouterr().out), out

    fast, _ = fit_on(64 * KIB)
    assert fast["arena_placement"] == {"head": "fast", "tail": "fast"}
    assert fast["bank_wait_latency_s_predicted"] == 0
    slow, out = fit_on(1 * KIB)  # the fast bank holds neither the arena nor its head
    assert slow["arena_placement"] == {"head": "slow", "tail": "slow"}
    g = load(out)[1]
    words = sum(-(-g.tensors[t].nbytes // 4) for op in g.ops for t in (*op.inputs, *op.outputs)
                if t >= 0 and not g.tensors[t].is_constant)
    assert slow["bank_wait_latency_s_predicted"] == pytest.approx(3 * words / 100e6)
    assert slow["latency_s_predicted"] == pytest.approx(fast["latency_s_predicted"] + 3 * words / 100e6)
    # profile prices the same banks the same way, on the model it is given
    board = tmp_path / f"ws-{1 * KIB}.toml"
    assert main(["profile", str(out), "--device", str(board), "--json"]) == 0
    prof = json.loads(capsys.readouterr().out)
    assert prof["bank_wait_latency_s_predicted"] == pytest.approx(3 * words / 100e6)


@pytest.mark.skipif(not (OPENMV / "face_landmarks_192.tflite").is_file(),
                    reason="set TPUP_OPENMV_DIR to OpenMV's lib/models (face_landmarks_192.tflite)")
def test_a_model_no_bank_holds_fits_with_its_input_in_a_bank_of_its_own(tmp_path, capsys):
    """OpenMV's face_landmarks_192 (float input, 442,368 B) on the stm32h743: its smallest arena
    exceeds what any bank or head/tail split holds (exit 3). With the input outside the arena, the
    input takes the AXI SRAM, the head SRAM1-3 and the tail the DTCM: fit fits it, and in QEMU
    (the an500 with the H743's banks) each bank holds what was predicted; outputs identical."""
    from helpers.firmware import HAVE_ARM, HAVE_QEMU, tree_or_skip

    model, out = OPENMV / "face_landmarks_192.tflite", tmp_path / "face.tflite"
    assert main(["fit", str(model), "--device", "stm32h743", "-o", str(out), "--time-limit", "90"]) == 3
    assert "smallest reachable" in capsys.readouterr().err and not out.exists()
    assert main(["fit", str(model), "--device", "stm32h743", "--input-outside-arena", "-o", str(out),
                 "--time-limit", "90", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["fits"] is True
    assert rep["arena_placement"] == {"head": "sram1_3", "tail": "dtcm", "input": "axi_sram"}
    predicted = {b["name"]: b["bytes_predicted"] for b in rep["banks"]}
    assert predicted["axi_sram"] == 192 * 192 * 3 * 4 and predicted["sram1_3"] == rep["arena_head_bytes"]
    if not (HAVE_ARM and HAVE_QEMU):
        pytest.skip("ARM toolchain or qemu-system-arm not installed")
    tree_or_skip("cmsis-nn")
    board = qemu_board(tmp_path, "qemu-an500-h743-banks", H743_ON_AN500)
    assert main(["run", str(out), "--backend", "qemu", "--device", str(board), "-N", "1", "--timeout", "1200",
                 "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["outputs_match"] is True
    assert {b["name"]: b["bytes_measured"] for b in run["banks"]} == predicted
