"""Host side of the harness protocol over pyserial: handshake, send inputs, run, read results.

Every read has a deadline, so a silent or stuck device ends in a DeviceError, never a hang. A
garbled line, an `ERR`, or a `BOOT` in the middle of an inference (the board reset) also end the
run with a DeviceError naming the port and the inference; `run_many` keeps what was measured
before the fault (`McuRunAborted.results`).
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field

import numpy as np

from tpu_pipeline.runtime import protocol as P
from tpu_pipeline.toolchain.errors import DeviceError

DEFAULT_BAUD = 921600


@dataclass(frozen=True)
class McuInference:
    seq: int
    ticks: int
    seconds: float  # ticks / ticks_per_s: the device's own clock
    arena_used: int
    ops: tuple[tuple[int, str, int], ...]  # (op index, tag, ticks) from PROF lines
    outputs: tuple[bytes, ...]
    host_s: float  # wall time on the host, link included
    stack_used: int | None = None  # bytes of stack at the deepest since boot (the harness firmware's DONE)


@dataclass(frozen=True)
class McuInfo:
    board: str
    arena: int
    used: int
    inputs: int
    outputs: int
    ticks_per_s: int
    model_crc: str
    simulated: bool = False  # READY said simulated=1: a stand-in (the fake MCU), not a board


def stack_high_water(results: list[McuInference], reserve: int | None, notes: list[str]) -> int | None:
    """The deepest the stack went over `results` (None where the firmware does not say), and a note
    where it went past `reserve`, the stack the device file reserves (its firmware.stack_bytes):
    a board linked with that reserve would have overflowed it."""
    seen = [r.stack_used for r in results if r.stack_used is not None]
    if not seen:
        return None
    deepest = max(seen)
    if reserve is not None and deepest > reserve:
        notes.append(f"the stack reached {deepest:,} B, past the {reserve:,} B the device file reserves "
                     "(firmware stack_bytes): a board linked with that reserve would overflow it")
    return deepest


class McuRunAborted(DeviceError):
    def __init__(self, message: str, results: list[McuInference]):
        super().__init__(message)
        self.results = results


@dataclass
class SerialMcu:
    port: str
    baud: int = DEFAULT_BAUD
    timeout: float = 5.0  # seconds allowed for any one answer
    info: McuInfo | None = None
    _ser: object = field(default=None, repr=False)
    _buf: bytes = b""

    def open(self) -> "SerialMcu":
        import serial

        try:
            self._ser = serial.Serial(self.port, self.baud, timeout=0.05, write_timeout=self.timeout)
        except (serial.SerialException, OSError, ValueError) as exc:
            raise DeviceError(f"{self.port}: cannot open the serial port ({exc})") from None
        return self

    def close(self) -> None:
        if self._ser is not None:
            try:
                self._ser.close()
            except Exception:  # noqa: BLE001 - closing a dead port
                pass
            self._ser = None

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()

    # ---- lines ----------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        import serial

        try:
            self._ser.write(data)
        except (serial.SerialException, OSError) as exc:
            raise DeviceError(f"{self.port}: write failed ({exc})") from None

    def _readline(self, deadline: float, waiting_for: str, skip_garbled: bool = False) -> P.Message:
        """The next line's message. `skip_garbled`: a line that does not parse is passed over (the
        handshake's: flushing the input can cut a boot line in two, and a board's UART may send
        noise at reset) rather than an error."""
        import serial

        while True:
            while b"\n" not in self._buf:
                if time.monotonic() > deadline:
                    raise DeviceError(f"{self.port}: no answer within {self.timeout:g} s while waiting for "
                                      f"{waiting_for} (is the harness firmware running at this baud rate?)")
                try:
                    chunk = self._ser.read(4096 if self._ser.in_waiting > 4096 else max(1, self._ser.in_waiting))
                except (serial.SerialException, OSError) as exc:
                    raise DeviceError(f"{self.port}: read failed ({exc})") from None
                self._buf += chunk
            line, self._buf = self._buf.split(b"\n", 1)
            try:
                return P.parse(line, P.DEVICE_KINDS)
            except P.ProtocolError as exc:
                if not skip_garbled:
                    shown = line[:60].decode("ascii", errors="replace")
                    raise DeviceError(f"{self.port}: garbled line while waiting for {waiting_for} ({exc}): "
                                      f"{shown!r}") from None

    # ---- protocol -------------------------------------------------------------------------
    def handshake(self, model_bytes: bytes | None = None) -> McuInfo:
        """HELLO -> READY; checks the device runs `model_bytes` when given."""
        try:
            self._ser.reset_input_buffer()
        except Exception:  # noqa: BLE001
            pass
        self._buf = b""
        self._write(P.encode("HELLO"))
        deadline = time.monotonic() + self.timeout
        board = "?"
        while True:
            msg = self._readline(deadline, "READY", skip_garbled=True)
            if msg.kind == "BOOT":
                board = msg.fields[2]
            elif msg.kind == "READY":
                break
            elif msg.kind == "ERR":
                raise DeviceError(f"{self.port}: device error during handshake: {msg.fields[0]}")
        try:
            info = McuInfo(msg.kv.get("board", board), msg.int("arena"), msg.int("used"), msg.int("inputs"), msg.int("outputs"),
                           msg.int("ticks_per_s"), msg.kv.get("model_crc", ""),
                           msg.kv.get("simulated") == "1")
        except P.ProtocolError as exc:
            raise DeviceError(f"{self.port}: bad READY line ({exc})") from None
        if model_bytes is not None and info.model_crc and info.model_crc.upper() != f"{zlib.crc32(model_bytes):08X}":
            raise DeviceError(f"{self.port}: the device runs a different model (crc {info.model_crc}); "
                              "flash the firmware built by `tpu-pipeline export-mcu` for this model")
        self.info = info
        return info

    def infer(self, seq: int, inputs: list[bytes], output_sizes: list[int]) -> McuInference:
        if self.info is None:
            raise DeviceError(f"{self.port}: no handshake")
        t0 = time.perf_counter()
        for i, data in enumerate(inputs):
            for off, hx in P.chunks(data):
                self._write(P.encode("SET", i, off, hx))
                msg = self._readline(time.monotonic() + self.timeout, f"OK for input {i}")
                while msg.kind in ("LOG", "READY"):  # a late READY from the handshake
                    msg = self._readline(time.monotonic() + self.timeout, f"OK for input {i}")
                if msg.kind == "ERR":
                    raise DeviceError(f"{self.port}: device refused input {i}: {msg.fields[0]}")
                if msg.kind == "BOOT":
                    raise DeviceError(f"{self.port}: device reset while receiving input {i} of inference {seq}")
                if msg.kind != "OK":
                    raise DeviceError(f"{self.port}: expected OK, got {msg.kind}")
        self._write(P.encode("RUN", seq))
        outs = [bytearray(n) for n in output_sizes]
        ops, logs = [], []
        deadline = time.monotonic() + self.timeout
        while True:
            msg = self._readline(deadline, f"the result of inference {seq}")
            deadline = time.monotonic() + self.timeout  # progress resets the clock
            if msg.kind == "BOOT":
                raise DeviceError(f"{self.port}: device reset during inference {seq} (it printed BOOT)")
            if msg.kind == "ERR":
                said = f" (the device logged: {'; '.join(logs[-3:])})" if logs else ""
                raise DeviceError(f"{self.port}: inference {seq} failed on the device: {msg.fields[0]}{said}")
            if msg.kind == "LOG":
                logs.append(" ".join(msg.fields))
                continue
            if msg.kind in ("READY", "OK"):
                continue
            if msg.fields and msg.fields[0] != str(seq):
                raise DeviceError(f"{self.port}: {msg.kind} for inference {msg.fields[0]} while running {seq}")
            if msg.kind == "PROF":
                try:
                    ops.append((int(msg.fields[1]), msg.fields[2], int(msg.fields[3])))
                except ValueError:
                    raise DeviceError(f"{self.port}: bad PROF line in inference {seq}") from None
            elif msg.kind == "OUT":
                try:
                    j, off, data = int(msg.fields[1]), int(msg.fields[2]), bytes.fromhex(msg.fields[3])
                    if off + len(data) > len(outs[j]):
                        raise IndexError
                except (ValueError, IndexError):
                    raise DeviceError(f"{self.port}: bad OUT line in inference {seq}") from None
                outs[j][off:off + len(data)] = data
            elif msg.kind == "DONE":
                try:
                    ticks, used = msg.int("ticks"), msg.int("arena_used")
                    stack = msg.int("stack_used") if "stack_used" in msg.kv else None  # (a board may not say)
                except P.ProtocolError as exc:
                    raise DeviceError(f"{self.port}: bad DONE line ({exc})") from None
                host_s = time.perf_counter() - t0
                return McuInference(seq, ticks, ticks / max(1, self.info.ticks_per_s), used, tuple(ops),
                                    tuple(bytes(o) for o in outs), host_s, stack)

    def run_many(self, inputs: list[list[np.ndarray]], output_sizes: list[int], progress=None) -> list[McuInference]:
        """Run every input; on a fault raise McuRunAborted carrying the inferences done so far."""
        results: list[McuInference] = []
        for k, arrays in enumerate(inputs):
            try:
                results.append(self.infer(k, [np.ascontiguousarray(a).tobytes() for a in arrays], output_sizes))
            except DeviceError as exc:
                raise McuRunAborted(f"{exc} ({len(results)} of {len(inputs)} inferences completed)", results) from None
            if progress:
                progress(k + 1)
        return results
