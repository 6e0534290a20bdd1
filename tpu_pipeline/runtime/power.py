"""USB power meters over serial: the RDTech UM24C / UM25C / UM34C family.

Protocol (reverse-engineered by the community; sigrok wiki "RDTech UM series", rdserialtool):
9600 baud 8N1 (the Bluetooth SPP bridge shows up as a serial port). The host sends one byte 0xF0;
the meter answers with a 130-byte record, big-endian:

    offset size  field
    0      2     model id: 0x0963 UM24C, 0x09C9 UM25C, 0x0D4C UM34C
    2      2     voltage    (UM25C: mV; UM24C/UM34C: 10 mV)
    4      2     current    (UM25C: 0.1 mA; UM24C/UM34C: mA)
    6      4     power      mW
    10     2     temperature, Celsius        12  2  temperature, Fahrenheit
    14     2     selected data group         16  80 ten groups of (mAh u32, mWh u32)
    96     2     D+ voltage, 10 mV           98  2  D- voltage, 10 mV
    100    2     charging mode               102 4  recorded mAh     106 4  recorded mWh
    110    2     record threshold, 10 mA     112 4  recorded seconds 116 2  recording on
    118    2     screen timeout, minutes     120 2  backlight        122 4  resistance, 0.1 ohm
    126    2     screen shown                128 2  end / checksum (not checked)

`PowerRecorder` samples the meter on a thread while inferences run and gives average power and
energy per inference (optionally above an idle baseline).
"""

from __future__ import annotations

import struct
import threading
import time
from dataclasses import dataclass, field

from tpu_pipeline.runtime.fake_pty import PtyDevice
from tpu_pipeline.toolchain.errors import DeviceError

REQUEST = b"\xf0"
RECORD_BYTES = 130
BAUD = 9600
MODELS = {0x0963: "UM24C", 0x09C9: "UM25C", 0x0D4C: "UM34C"}
# (volts per count, amps per count) by model
_SCALE = {"UM24C": (0.01, 0.001), "UM25C": (0.001, 0.0001), "UM34C": (0.01, 0.001)}


@dataclass(frozen=True)
class PowerSample:
    t: float  # time.monotonic() when the record arrived
    model: str
    volts: float
    amps: float
    watts: float  # the meter's own power field
    temp_c: int


def parse_record(data: bytes, t: float = 0.0) -> PowerSample:
    if len(data) != RECORD_BYTES:
        raise ValueError(f"a UM record has {RECORD_BYTES} bytes, got {len(data)}")
    model_id, v, a, w, temp_c = struct.unpack_from(">HHHIH", data, 0)
    model = MODELS.get(model_id)
    if model is None:
        raise ValueError(f"unknown meter model id 0x{model_id:04X}")
    sv, sa = _SCALE[model]
    return PowerSample(t, model, v * sv, a * sa, w / 1000.0, temp_c)


def build_record(model: str, volts: float, amps: float, temp_c: int = 25) -> bytes:
    """A record as the meter sends it (for fakes and tests)."""
    model_id = {v: k for k, v in MODELS.items()}[model]
    sv, sa = _SCALE[model]
    rec = bytearray(RECORD_BYTES)
    struct.pack_into(">HHHIHH", rec, 0, model_id, round(volts / sv), round(amps / sa),
                     round(volts * amps * 1000), temp_c, round(temp_c * 9 / 5 + 32))
    struct.pack_into(">H", rec, 128, 0xFFF1)
    return bytes(rec)


class UmMeter:
    """A UM-series meter on a serial port; `sample()` asks for one record."""

    def __init__(self, port: str, timeout: float = 2.0, baud: int = BAUD):
        import serial

        self.port = port
        self.timeout = timeout
        try:
            self._ser = serial.Serial(port, baud, timeout=0.05, write_timeout=timeout)
        except (serial.SerialException, OSError, ValueError) as exc:
            raise DeviceError(f"{port}: cannot open the power meter's serial port ({exc})") from None

    def sample(self) -> PowerSample:
        import serial

        try:
            self._ser.reset_input_buffer()
            self._ser.write(REQUEST)
            data = b""
            deadline = time.monotonic() + self.timeout
            while len(data) < RECORD_BYTES:
                if time.monotonic() > deadline:
                    raise DeviceError(f"{self.port}: the power meter sent {len(data)} of {RECORD_BYTES} bytes "
                                      f"within {self.timeout:g} s (is it a UM24C/UM25C/UM34C at {BAUD} baud?)")
                data += self._ser.read(RECORD_BYTES - len(data))
        except (serial.SerialException, OSError) as exc:
            raise DeviceError(f"{self.port}: power meter I/O failed ({exc})") from None
        try:
            return parse_record(data, time.monotonic())
        except ValueError as exc:
            raise DeviceError(f"{self.port}: bad power meter record ({exc})") from None

    def close(self) -> None:
        try:
            self._ser.close()
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass
class PowerSummary:
    samples: list[PowerSample] = field(default_factory=list)
    duration_s: float = 0.0
    error: str | None = None

    @property
    def avg_power_w(self) -> float | None:
        return sum(s.watts for s in self.samples) / len(self.samples) if self.samples else None

    def energy_per_inference_j(self, inferences: int, idle_w: float = 0.0) -> float | None:
        p = self.avg_power_w
        if p is None or inferences <= 0:
            return None
        return max(0.0, p - idle_w) * self.duration_s / inferences

    def to_json(self, inferences: int = 0, idle_w: float = 0.0) -> dict:
        return {"meter": self.samples[0].model if self.samples else None, "samples": len(self.samples),
                "duration_s": self.duration_s, "avg_power_w": self.avg_power_w, "idle_w": idle_w,
                "energy_per_inference_j": self.energy_per_inference_j(inferences, idle_w), "error": self.error}


class PowerRecorder:
    """Samples a meter on a background thread between start() and stop()."""

    def __init__(self, meter: UmMeter, interval_s: float = 0.0):
        self.meter = meter
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.summary = PowerSummary()

    def _loop(self):
        while not self._stop.is_set():
            try:
                self.summary.samples.append(self.meter.sample())
            except DeviceError as exc:
                self.summary.error = str(exc)
                return
            if self.interval_s:
                self._stop.wait(self.interval_s)

    def start(self) -> "PowerRecorder":
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="power-meter", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> PowerSummary:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.meter.timeout + 1.0)
        self.summary.duration_s = time.monotonic() - self._t0
        return self.summary


class FakeUmMeter(PtyDevice):
    """A UM meter on a pseudo-terminal answering 0xF0 with `build_record(model, volts, amps)`.

    `silent=True` never answers; `truncate=True` sends half a record."""

    def __init__(self, model: str = "UM25C", volts: float = 5.0, amps: float = 0.1,
                 silent: bool = False, truncate: bool = False):
        self.model, self.volts, self.amps = model, volts, amps
        self.silent, self.truncate = silent, truncate
        self.requests = 0
        super().__init__("fake-um-meter")

    def _serve(self):
        import os
        import select

        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self._master], [], [], 0.05)
                if not ready:
                    continue
                data = os.read(self._master, 64)
            except OSError:
                return
            for b in data:
                if b != REQUEST[0] or self.silent:
                    continue
                self.requests += 1
                rec = build_record(self.model, self.volts, self.amps)
                os.write(self._master, rec[: RECORD_BYTES // 2] if self.truncate else rec)
