"""Device descriptors and the Edge TPU cost model."""

from __future__ import annotations

import pytest

from tpu_pipeline.cli import main
from tpu_pipeline.toolchain.cost import EdgeTpuCostModel, OP_CLASSES, PS_PER_S, op_class
from tpu_pipeline.toolchain.device import available_devices, load_device
from tpu_pipeline.toolchain.errors import UsageError
from helpers.models import EDGETPU, mcu_toml


def test_every_shipped_descriptor_loads_and_validates():
    names = available_devices()
    for required in ("coral-usb", "coral-pcie", "coral-devboard", "sparkfun-edge"):
        assert required in names
    kinds = {load_device(n).kind for n in names}
    assert kinds == {"edgetpu", "mcu"}
    assert sum(load_device(n).kind == "mcu" for n in names) >= 2
    usb = load_device("coral-usb")
    assert 7 * 2**20 <= usb.memory.param_sram_bytes <= 8 * 2**20
    assert set(usb.compute.efficiency) == set(OP_CLASSES)
    edge = load_device("sparkfun-edge")
    assert edge.memory.sram_bytes == 384 * 1024 and edge.compute.clock_hz == 48e6 and edge.link.baud == 921600
    assert edge.memory.banks[0].origin == edge.firmware.ram_origin  # one bank today: the arena's


@pytest.mark.parametrize("mutation, message", [
    (lambda s: s.replace('kind = "edgetpu"', 'kind = "gpu"'), "'kind'"),
    (lambda s: s.replace("param_sram_bytes = 1000", ""), "param_sram_bytes"),
    (lambda s: s.replace("host_bandwidth_bytes_per_s = 1e9", "host_bandwidth_bytes_per_s = -1"), "must be > 0"),
    (lambda s: s.replace("conv = 0.5", "conv = 1.5"), "fraction"),
    (lambda s: s.replace("other = 1.0", "other = 1.0\nsystolic = 1.0"), "unknown op class"),
    (lambda s: s.replace("depthwise = 0.25", ""), "'depthwise'"),
    (lambda s: s.replace("param_sram_bytes = 1000", 'param_sram_bytes = "8MB"'), "must be a number"),
    (lambda s: s + "\n[[[", "not valid TOML"),
])
def test_bad_descriptors_are_refused_naming_the_file(tmp_path, mutation, message):
    p = tmp_path / "bad.toml"
    p.write_text(mutation(EDGETPU))
    with pytest.raises(UsageError) as exc:
        load_device(p)
    assert str(p) in str(exc.value) and message in str(exc.value)


def test_unknown_device_name_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown device"):
        load_device("no-such-board")


def test_cli_unknown_device_exits_2(capsys):
    from tests.conftest import FIXTURES
    assert main(["compile", str(FIXTURES / "chain_int8.tflite"), "-n", "1", "--device", "nope", "-o", "/tmp/never"]) == 2
    assert "unknown device" in capsys.readouterr().err


def test_stage_latency_formula(tmp_path):
    p = tmp_path / "toy.toml"
    p.write_text(EDGETPU)
    m = EdgeTpuCostModel(load_device(p))
    assert m.ps_per_byte == 1000  # 1 GB/s
    # 3000 parameter bytes, 1000 fit: 2000 streamed; 100 in + 50 out bytes; 1 ms compute
    s = m.stage(n_ops=2, compute_ps=10**9, param=3000, in_bytes=100, out_bytes=50)
    assert s.offchip_bytes == 2000 and s.sram_bytes == 1000
    expected_s = 1e-3 + 1e-3 + 2000 / 1e9 + 150 / 1e9
    assert s.latency_ps == round(expected_s * PS_PER_S)
    small = m.stage(1, 0, 10, 0, 0)
    assert small.offchip_bytes == 0 and small.latency_ps == m.overhead_ps
    pipe = m.pipeline([s, small])
    assert pipe.bottleneck == 0
    assert pipe.throughput_per_s == pytest.approx(1 / s.latency_s)
    assert pipe.latency_s == pytest.approx(s.latency_s + small.latency_s)
    # steady state: the fast device idles for the rest of the period
    assert pipe.energy_j == pytest.approx(2.0 * s.latency_s + 2.0 * small.latency_s + 0.5 * (s.latency_s - small.latency_s))


def test_op_classes():
    assert op_class("CONV_2D") == "conv" and op_class("DEPTHWISE_CONV_2D") == "depthwise"
    assert op_class("FULLY_CONNECTED") == "fully_connected" and op_class("ADD") == "elementwise"
    assert op_class("MAX_POOL_2D") == "other" and op_class("CUSTOM:foo") == "other"


def test_mcu_descriptor_is_not_an_edge_tpu():
    with pytest.raises(UsageError, match="not an Edge TPU"):
        EdgeTpuCostModel(load_device("sparkfun-edge"))


# docs/architecture.md's worked example: a new board is one descriptor file, nothing else.
MY_BOARD = mcu_toml("my-board", [("axi", 0x24000000, 262144, 1), ("dtcm", 0x20000000, 131072, 0)],
                    clock_hz=200_000_000, description="a Cortex-M7 with a tightly coupled data RAM and an AXI SRAM",
                    power=(0.25, 0.01), firmware="""cpu = "cortex-m7+fp"
library_cpu = "cortex-m4+fp"
flash_origin = 0x08000000
ram_origin = 0x24000000
stack_bytes = 8192
heap_bytes = 2048
uart = "stm32-usart"
uart_base = 0x40004800
uart_clock_hz = 64000000
core_clock_hz = 64000000
""")  # the first bank holds the arena


def test_a_new_board_is_one_descriptor_file(tmp_path, capsys):
    import json

    from conftest import FIXTURES

    from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
    from tpu_pipeline.toolchain.device import CMSIS_NN
    from tpu_pipeline.toolchain.fit.model import HARNESS_STATIC_BYTES
    from tpu_pipeline.toolchain.loader import load

    board = tmp_path / "my-board.toml"
    board.write_text(MY_BOARD)
    dev = load_device(board)
    assert [(b.name, b.size, b.origin, b.wait_states) for b in dev.memory.banks] == [
        ("axi", 262144, 0x24000000, 1), ("dtcm", 131072, 0x20000000, 0)]
    assert dev.memory.sram_bytes == 262144 and dev.firmware.ram_bytes == 262144
    model = FIXTURES / "chain_int8.tflite"

    # profile: TFLite Micro on the host with the arena bank as the arena, the cost model for the board
    assert main(["profile", str(model), "--device", str(board), "--backend", "emulator", "-N", "1", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["device"].startswith("my-board") and rep["arena"]["configured"] == 262144
    est = estimate_mcu(load(model)[1], dev, CMSIS_NN)
    assert rep["latency_s_predicted"] == pytest.approx(est.instructions * 1.0 / 200e6)

    # fit: the budget is the arena bank less the firmware's stack, heap and static RAM
    out = tmp_path / "fitted.tflite"
    assert main(["fit", str(model), "--device", str(board), "-o", str(out), "--time-limit", "5", "--json"]) == 0
    fitted = json.loads(capsys.readouterr().out)
    assert fitted["budget_from"] == str(board)
    assert fitted["arena_bytes_available"] == 262144 - 8192 - 2048 - HARNESS_STATIC_BYTES

    # export-mcu: the board layer and linker script from the descriptor
    assert main(["export-mcu", str(model), "--device", str(board), "-o", str(tmp_path / "fw"), "--json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["device"] == "my-board" and exported["sram_bytes"] == 262144
    link = (tmp_path / "fw" / "link.ld").read_text()
    assert "ORIGIN = 0x24000000, LENGTH = 262144" in link


@pytest.mark.parametrize("change, message", [
    (lambda s: s.replace('name = "dtcm"', 'name = "axi"'), "needs a name of its own"),
    (lambda s: s.replace("size_bytes = 131072", "size_bytes = 0"), "size_bytes must be > 0"),
    (lambda s: s.replace("flash_bytes = 1048576", "flash_bytes = 1048576\nsram_bytes = 4096"),
     "is not the size of the first bank"),
    (lambda s: s.replace("ram_origin = 0x24000000", "ram_origin = 0x20000000"), "is not the first"),
    (lambda s: s.replace("wait_states = 0", "speed = 0"), "unknown key 'speed'"),
    (lambda s: s.replace("origin = 0x20000000", "origin = 0x2403FFFF"), "'dtcm' .* overlaps bank 'axi'"),
    (lambda s: s.replace("origin = 0x20000000", "origin = 0xFFFF0000"), "ends past the 32-bit address space"),
])
def test_bad_memory_banks_are_refused_naming_the_bank(tmp_path, change, message):
    board = tmp_path / "bad.toml"
    board.write_text(change(MY_BOARD))
    with pytest.raises(UsageError, match=message):
        load_device(board)


def test_a_bad_bank_list_is_one_line_and_exit_2(tmp_path, capsys):
    board = tmp_path / "bad.toml"
    board.write_text(MY_BOARD.replace("origin = 0x20000000", "origin = 0x24000000"))
    assert main(["profile", str(__import__("conftest").FIXTURES / "chain_int8.tflite"), "--device", str(board), "--backend", "emulator", "-N", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "overlaps bank 'axi'" in err[0]


def test_shipped_bank_lists():
    h7 = load_device("stm32h743").memory.banks
    assert [(b.name, b.origin, b.size) for b in h7] == [
        ("axi_sram", 0x24000000, 512 * 1024), ("dtcm", 0x20000000, 128 * 1024),
        ("sram1_3", 0x30000000, 288 * 1024), ("sram4", 0x38000000, 64 * 1024)]
    an386 = {b.name: (b.origin, b.size) for b in load_device("qemu-mps2-an386").memory.banks}
    an500 = {b.name: (b.origin, b.size) for b in load_device("qemu-mps2-an500").memory.banks}
    assert an386["psram"] == (0x21000000, 16 << 20) and an500["psram"] == (0x60000000, 16 << 20)
    assert an386["ssram2_3"] == an500["ssram2_3"] == (0x20000000, 4 << 20)
