"""UM24C/UM25C/UM34C USB power meters: record layout, a fake meter on a pseudo-terminal, energy."""

from __future__ import annotations

import struct
import threading
import time

import pytest

from tpu_pipeline.runtime.power import (FakeUmMeter, PowerRecorder, PowerSummary, RECORD_BYTES, build_record,
                           parse_record, UmMeter)
from tpu_pipeline.toolchain.errors import DeviceError


@pytest.mark.parametrize("model, volts, amps", [("UM25C", 5.123, 0.4567), ("UM34C", 5.12, 0.456),
                                               ("UM24C", 4.98, 1.234)])
def test_record_layout(model, volts, amps):
    rec = build_record(model, volts, amps, temp_c=31)
    assert len(rec) == RECORD_BYTES
    s = parse_record(rec)
    assert (s.model, s.volts, s.amps, s.temp_c) == (model, pytest.approx(volts), pytest.approx(amps), 31)
    assert s.watts == pytest.approx(volts * amps, abs=1e-3)


def test_documented_offsets_and_scales():
    """A UM25C record by hand: 0x09C9, 5.000 V in mV, 0.1234 A in 0.1 mA, 617 mW, 25 C."""
    rec = bytearray(130)
    struct.pack_into(">HHHIH", rec, 0, 0x09C9, 5000, 1234, 617, 25)
    s = parse_record(bytes(rec))
    assert (s.model, s.volts, s.amps, s.watts, s.temp_c) == ("UM25C", 5.0, pytest.approx(0.1234), 0.617, 25)
    struct.pack_into(">HHH", rec, 0, 0x0D4C, 500, 123)  # UM34C: 10 mV and 1 mA units
    s = parse_record(bytes(rec))
    assert (s.model, s.volts, s.amps) == ("UM34C", 5.0, pytest.approx(0.123))
    with pytest.raises(ValueError, match="model id"):
        parse_record(b"\x12\x34" + bytes(128))
    with pytest.raises(ValueError, match="130 bytes"):
        parse_record(bytes(64))


def test_fake_meter_over_a_pty():
    with FakeUmMeter("UM25C", 5.05, 0.25) as fake:
        with UmMeter(fake.port, timeout=2) as m:
            s = m.sample()
        assert fake.requests == 1
    assert (s.model, s.volts, s.amps) == ("UM25C", pytest.approx(5.05), pytest.approx(0.25))


def test_recorder_average_power_and_energy_per_inference():
    with FakeUmMeter("UM34C", 5.0, 0.2) as fake, UmMeter(fake.port, timeout=2) as m:
        rec = PowerRecorder(m, interval_s=0.01).start()
        time.sleep(0.3)
        summary = rec.stop()
    assert len(summary.samples) >= 2 and summary.error is None
    assert summary.avg_power_w == pytest.approx(1.0)
    e = summary.energy_per_inference_j(10)
    assert e == pytest.approx(1.0 * summary.duration_s / 10)
    assert summary.energy_per_inference_j(10, idle_w=0.4) == pytest.approx(0.6 * summary.duration_s / 10)
    assert PowerSummary().avg_power_w is None


@pytest.mark.parametrize("kw, message", [({"silent": True}, "sent 0 of 130 bytes"),
                                         ({"truncate": True}, "sent 65 of 130 bytes")])
def test_meter_faults_end_in_clear_errors_without_hanging(kw, message):
    with FakeUmMeter("UM25C", 5.0, 0.1, **kw) as fake, UmMeter(fake.port, timeout=0.5) as m:
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("r", _catch(m.sample)), daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive()
    assert isinstance(box["r"], DeviceError) and message in str(box["r"])


def test_recorder_keeps_samples_taken_before_the_meter_fails():
    with FakeUmMeter("UM25C", 5.0, 0.1) as fake, UmMeter(fake.port, timeout=0.3) as m:
        rec = PowerRecorder(m, interval_s=0.01).start()
        time.sleep(0.15)
        fake.silent = True
        time.sleep(0.6)
        summary = rec.stop()
    assert summary.samples and summary.error and "power meter" in summary.error
    assert summary.avg_power_w == pytest.approx(0.5)


def test_no_meter():
    with pytest.raises(DeviceError, match="cannot open"):
        UmMeter("/dev/nonexistent-um25c")


def _catch(fn):
    try:
        return fn()
    except DeviceError as exc:
        return exc
