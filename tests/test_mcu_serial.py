"""The MCU backend over a serial line, against a fake harness on a pseudo-terminal that runs the
model in TFLite Micro: the happy path, and every fault ending in a clear error without a hang and
without losing the inferences already measured."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_pipeline.toolchain.device import load_device
from tpu_pipeline.runtime import protocol as P
from tpu_pipeline.runtime.fake_mcu import FakeMcu
from tpu_pipeline.runtime.serial_mcu import McuInference, McuRunAborted, SerialMcu, stack_high_water
from tpu_pipeline.toolchain.execute.tflm import TflmModel
from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena
from tpu_pipeline.cli import main
from tpu_pipeline.toolchain.cost.mcu import estimate_mcu
from tpu_pipeline.toolchain.errors import DeviceError
from tpu_pipeline.toolchain.ir import from_model
from tpu_pipeline.toolchain.tflite import read_model

MODEL = Path(__file__).parent / "fixtures" / "tiny_irregular_int8.tflite"
DATA = MODEL.read_bytes()


def bounded(fn, seconds=30):
    """Run fn in a thread; fail the test if it has not returned in `seconds` (a hang)."""
    box = {}

    def go():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "hung"
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture(scope="module")
def host():
    return TflmModel(DATA, 1 << 20, "host")


def inputs(host, n):
    rng = np.random.default_rng(1)
    return [[rng.integers(-128, 128, size=shape, dtype=np.int64).astype(dt) for dt, shape in host.inputs]
            for _ in range(n)]


def out_sizes(host):
    return [np.dtype(dt).itemsize * int(np.prod(s)) for dt, s in host.outputs]


def test_protocol_round_trip_and_checksum():
    line = P.encode("DONE", 3, ticks=1234, arena_used=20576)
    m = P.parse(line)
    assert (m.kind, m.fields, m.int("ticks"), m.int("arena_used")) == ("DONE", ("3",), 1234, 20576)
    with pytest.raises(P.ProtocolError, match="checksum"):
        P.parse(line.replace(b"1234", b"1235"))
    with pytest.raises(P.ProtocolError, match="unknown kind"):
        P.parse(P.encode("NOPE", 1))
    with pytest.raises(P.ProtocolError):
        P.parse(b"DONE 3 ticks=1")
    assert P.parse(P.encode("ERR", "invoke failed")).fields == ("invoke failed",)


def test_the_stack_high_water_mark_is_the_deepest_and_named_past_the_reserve():
    """DONE's stack_used (the harness firmware's; a board may not send it): the deepest over the
    inferences, and a note where it passed the stack the device file reserves."""
    done = P.parse(P.encode("DONE", 3, ticks=1234, arena_used=20576, stack_used=3864))
    assert done.int("stack_used") == 3864

    def ran(stack):
        return McuInference(0, 1, 0.0, 0, (), (), 0.0, stack)

    notes = []
    assert stack_high_water([ran(None)], 1024, notes) is None and not notes
    assert stack_high_water([ran(900), ran(1000), ran(None)], 1024, notes) == 1000 and not notes
    assert stack_high_water([ran(2000)], 1024, notes) == 2000 and "past the 1,024 B" in notes[0]


@settings(max_examples=60, deadline=None)
@given(seq=st.integers(0, 10**6), payload=st.binary(min_size=1, max_size=128), pos=st.integers(0, 10**6),
       bit=st.integers(0, 6))
def test_any_single_bit_flip_is_detected(seq, payload, pos, bit):
    line = bytearray(P.encode("OUT", seq, 0, 0, payload.hex().upper()))
    assert P.parse(bytes(line)).fields[3] == payload.hex().upper()
    i = pos % (len(line) - 1)  # not the newline
    line[i] ^= 1 << bit
    with pytest.raises(P.ProtocolError):
        P.parse(bytes(line))


def test_happy_path_device_figures_and_outputs(host):
    graph = from_model(read_model(DATA))
    est = estimate_mcu(graph, load_device("sparkfun-edge"))
    xs = inputs(host, 3)
    with FakeMcu(DATA, arena_used=12345) as dev, SerialMcu(dev.port, timeout=5) as mcu:
        info = mcu.handshake(DATA)
        assert (info.board, info.arena, info.used, info.ticks_per_s) == ("sparkfun-edge", 393216, 12345, 48_000_000)
        results = bounded(lambda: mcu.run_many(xs, out_sizes(host)))
    assert len(results) == 3
    for x, r in zip(xs, results):
        want = host.run(x)
        assert [np.ascontiguousarray(w).tobytes() for w in want] == list(r.outputs)  # bit-exact vs TFLM
        assert r.ticks == sum(round(o.cycles) for o in est.ops)
        assert r.seconds == pytest.approx(est.latency_s, rel=1e-6)
        assert [(i, tag) for i, tag, _ in r.ops] == [(o.index, o.opcode) for o in est.ops]


def test_fake_device_reports_the_real_tflm_arena():
    with FakeMcu(DATA) as dev, SerialMcu(dev.port, timeout=10) as mcu:
        info = mcu.handshake(DATA)
    assert info.used == measure_tflm_arena(DATA, arena_size=393216).total


def test_wrong_model_on_the_device_is_refused():
    other = (Path(__file__).parent / "fixtures" / "multi_output_int8.tflite").read_bytes()
    with FakeMcu(other, arena_used=1) as dev, SerialMcu(dev.port, timeout=5) as mcu:
        with pytest.raises(DeviceError, match="different model"):
            mcu.handshake(DATA)


def test_no_device():
    with pytest.raises(DeviceError, match="cannot open the serial port"):
        SerialMcu("/dev/nonexistent-tpu-pipeline-port").open()


@pytest.mark.timing
def test_silent_device_times_out():
    with FakeMcu(DATA, arena_used=1, fault="silent") as dev, SerialMcu(dev.port, timeout=0.5) as mcu:
        with pytest.raises(DeviceError, match="no answer within 0.5 s while waiting for READY"):
            bounded(lambda: mcu.handshake(DATA))


def test_the_handshake_passes_over_a_cut_boot_line():
    """Flushing the input at the handshake can cut the board's boot line in two (seen in CI with
    QEMU: 'T tpu-pipeline-harness 1 qemu-mps2-an386*66'): the handshake reads on to READY."""
    with (FakeMcu(DATA, arena_used=1, fault="noise", announce_boot=False) as dev,
          SerialMcu(dev.port, timeout=5) as mcu):
        assert bounded(lambda: mcu.handshake(DATA)).simulated


@pytest.mark.parametrize("fault, message", [
    ("hang", "no answer within"),
    ("garble", "garbled line"),
    ("reset", "device reset during inference 2"),
    ("error", "failed on the device: invoke failed"),
])
@pytest.mark.timing
def test_faults_mid_run_keep_results_already_measured(host, fault, message):
    xs = inputs(host, 4)
    with FakeMcu(DATA, arena_used=1, fault=fault, fault_at=2) as dev, SerialMcu(dev.port, timeout=0.5) as mcu:
        mcu.handshake(DATA)
        with pytest.raises(McuRunAborted, match=message) as exc:
            bounded(lambda: mcu.run_many(xs, out_sizes(host)))
    assert len(exc.value.results) == 2 and "2 of 4 inferences completed" in str(exc.value)
    for x, r in zip(xs, exc.value.results):
        assert [np.ascontiguousarray(w).tobytes() for w in host.run(x)] == list(r.outputs)


def test_run_cli_over_serial(capsys):
    with FakeMcu(DATA, arena_used=20576) as dev:
        code = bounded(lambda: main(["run", str(MODEL), "--backend", "mcu", "--port", dev.port,
                                     "--device", "sparkfun-edge", "-N", "3", "--json"]))
    assert code == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["backend"] == "mcu" and rep["verified"] is True and rep["latency"]["n"] == 3
    assert rep["arena"]["used"] == 20576
    est = estimate_mcu(from_model(read_model(DATA)), load_device("sparkfun-edge"))
    assert rep["latency"]["median_s"] == pytest.approx(est.latency_s, rel=1e-6)
    assert len(rep["ops"]) == len(est.ops)


def test_run_cli_reset_mid_run_prints_partial_report_and_exits_4(capsys):
    with FakeMcu(DATA, arena_used=1, fault="reset", fault_at=1) as dev:
        code = bounded(lambda: main(["run", str(MODEL), "--backend", "mcu", "--port", dev.port,
                                     "-N", "3", "--timeout", "1", "--json"]))
    assert code == 4
    cap = capsys.readouterr()
    rep = json.loads(cap.out)
    assert rep["latency"]["n"] == 1 and "device reset" in rep["error"]
    assert "device reset during inference 1" in cap.err


def test_run_cli_no_device_exits_4(capsys):
    assert main(["run", str(MODEL), "--backend", "mcu", "--port", "/dev/nonexistent-tpu-pipeline-port"]) == 4
    assert "cannot open the serial port" in capsys.readouterr().err


def test_run_cli_with_a_power_meter(capsys):
    from tpu_pipeline.runtime.power import FakeUmMeter

    with FakeMcu(DATA, arena_used=1) as dev, FakeUmMeter("UM25C", 5.0, 0.02) as meter:
        code = bounded(lambda: main(["run", str(MODEL), "--backend", "mcu", "--port", dev.port,
                                     "--power-meter", meter.port, "-N", "5", "--json"]))
    assert code == 0
    e = json.loads(capsys.readouterr().out)["energy"]
    assert e["meter"] == "UM25C" and e["samples"] >= 1 and e["error"] is None
    assert e["avg_power_w"] == pytest.approx(0.1)
    assert e["energy_per_inference_j"] == pytest.approx((0.1 - e["idle_w"]) * e["duration_s"] / 5)
