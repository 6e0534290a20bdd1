"""A fake MCU on a pseudo-terminal: runs the model in TFLite Micro and speaks the harness protocol.

It stands in for the SparkFun Edge harness firmware in tests and demos (`python -m
tpu_pipeline.runtime.fake_mcu model.tflite` prints the port to use). Latency in ticks comes from the MCU cost
model (one tick = one cycle at the device clock), per-op `PROF` lines likewise, so what the host
measures over the wire equals what the cost model predicts. Faults can be injected:

- `silent`: never answers anything;
- `hang`: answers the handshake, then stops answering at inference `fault_at`;
- `garble`: corrupts one line of inference `fault_at` (the checksum no longer matches);
- `reset`: reboots in the middle of inference `fault_at` (prints BOOT and READY again);
- `error`: answers inference `fault_at` with `ERR invoke failed`;
- `noise`: answers HELLO with the tail of a boot line first (what the host sees when flushing its
  input cut a line in two, or when a board's UART sends noise at reset), then READY.
"""

from __future__ import annotations

import os
import select
import zlib

import numpy as np

from tpu_pipeline.runtime import protocol as P
from tpu_pipeline.runtime.fake_pty import PtyDevice
from tpu_pipeline.toolchain.device import DEFAULT_KERNEL_SET, Device, load_device

FAULTS = ("silent", "hang", "garble", "reset", "error", "noise")


class FakeMcu(PtyDevice):
    def __init__(self, model_bytes: bytes, arena_size: int = 393216, device: str | Device = "sparkfun-edge",
                 fault: str | None = None, fault_at: int = 0, arena_used: int | None = None,
                 board: str = "sparkfun-edge", announce_boot: bool = True):
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        from tpu_pipeline.toolchain.ir import from_model
        from tpu_pipeline.toolchain.predict import mcu_prediction
        from tpu_pipeline.toolchain.tflite import read_model

        self.model_bytes = bytes(model_bytes)
        self.arena_size = arena_size
        self.fault, self.fault_at = fault, fault_at
        self.board = board
        # a stand-in's entry point (tests, demos): the board is resolved here, once
        est = mcu_prediction(from_model(read_model(self.model_bytes)), load_device(device), DEFAULT_KERNEL_SET)
        self.clock_hz = int(est.clock_hz)
        self.op_ticks = [(o.index, o.opcode, int(round(o.cycles))) for o in est.ops]
        if arena_used is None:
            from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena

            arena_used = measure_tflm_arena(self.model_bytes, arena_size=arena_size).total
        self.arena_used = arena_used
        self.runs = 0  # inferences started
        self._announce = announce_boot
        super().__init__("fake-mcu")

    # ---- device side --------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self._stop.is_set():
            try:
                n = os.write(self._master, view)
            except BlockingIOError:
                continue
            except OSError:
                return
            view = view[n:]

    def _boot(self) -> None:
        from tpu_pipeline.toolchain.execute.tflm import TflmModel

        self.interp = TflmModel(self.model_bytes, self.arena_size, "fake device model")
        self.inputs = [bytearray(np.dtype(dt).itemsize * int(np.prod(shape))) for dt, shape in self.interp.inputs]
        self._send(P.encode("BOOT", P.HARNESS, P.VERSION, self.board))
        self._ready()

    def _ready(self) -> None:
        self._send(P.encode("READY", arena=self.arena_size, used=self.arena_used,
                            inputs=len(self.interp.inputs), outputs=len(self.interp.outputs),
                            ticks_per_s=self.clock_hz, model_crc=f"{zlib.crc32(self.model_bytes):08X}",
                            board=self.board, simulated=1))  # the host must not mistake it for a board

    def _serve(self) -> None:
        if self.fault != "silent":
            from tpu_pipeline.toolchain.execute.tflm import TflmModel

            if self._announce:
                self._boot()
            else:
                self.interp = TflmModel(self.model_bytes, self.arena_size, "fake device model")
                self.inputs = [bytearray(np.dtype(dt).itemsize * int(np.prod(shape)))
                               for dt, shape in self.interp.inputs]
        buf = b""
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self._master], [], [], 0.05)
            except (OSError, ValueError):
                return
            if not ready:
                continue
            try:
                data = os.read(self._master, 4096)
            except OSError:
                return
            if self.fault == "silent":
                continue
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if not self._handle(line):
                    return

    def _handle(self, line: bytes) -> bool:
        """Answer one host line; False when the device goes quiet for good."""
        try:
            msg = P.parse(line, P.HOST_KINDS)
        except P.ProtocolError as exc:
            self._send(P.encode("ERR", f"bad line: {exc}"))
            return True
        if msg.kind == "HELLO":
            if self.fault == "noise":
                self._send(P.encode("BOOT", P.HARNESS, P.VERSION, self.board)[3:])  # "T tpu-pipeline-harness ..."
            self._ready()
        elif msg.kind == "RESET":
            self._boot()
        elif msg.kind == "SET":
            try:
                i, off, data = int(msg.fields[0]), int(msg.fields[1]), bytes.fromhex(msg.fields[2])
                target = self.inputs[i]
                if off + len(data) > len(target):
                    raise IndexError
            except (ValueError, IndexError):
                self._send(P.encode("ERR", "bad SET"))
                return True
            target[off:off + len(data)] = data
            self._send(P.encode("OK", "SET", i, off + len(data)))
        elif msg.kind == "RUN":
            return self._run(msg.fields[0])
        return True

    def _run(self, seq: str) -> bool:
        k = self.runs
        self.runs += 1
        faulty = self.fault is not None and k == self.fault_at
        if faulty and self.fault == "hang":
            return False
        if faulty and self.fault == "error":
            self._send(P.encode("ERR", "invoke failed"))
            return True
        arrays = [np.frombuffer(bytes(b), dtype=dt).reshape(shape)
                  for b, (dt, shape) in zip(self.inputs, self.interp.inputs)]
        outs = self.interp.run(arrays)
        lines = [P.encode("PROF", seq, i, tag, ticks) for i, tag, ticks in self.op_ticks]
        for j, out in enumerate(outs):
            for off, hx in P.chunks(np.ascontiguousarray(out).tobytes()):
                lines.append(P.encode("OUT", seq, j, off, hx))
        lines.append(P.encode("DONE", seq, ticks=sum(t for _, _, t in self.op_ticks), arena_used=self.arena_used))
        if faulty and self.fault == "reset":
            for line in lines[: max(1, len(self.op_ticks) // 2)]:
                self._send(line)
            self._boot()
            return True
        if faulty and self.fault == "garble":
            victim = len(lines) - 1
            bad = bytearray(lines[victim])
            bad[2] ^= 0x20  # flip a bit; the checksum no longer matches
            lines[victim] = bytes(bad)
        for line in lines:
            self._send(line)
        return True


def main(argv=None) -> int:  # pragma: no cover - manual use
    import argparse
    import sys
    import time
    from pathlib import Path

    ap = argparse.ArgumentParser(description="fake MCU harness on a pseudo-terminal")
    ap.add_argument("model")
    ap.add_argument("--arena", type=int, default=393216)
    ap.add_argument("--fault", choices=FAULTS)
    ap.add_argument("--fault-at", type=int, default=0)
    args = ap.parse_args(argv)
    with FakeMcu(Path(args.model).read_bytes(), args.arena, fault=args.fault, fault_at=args.fault_at) as dev:
        print(dev.port, flush=True)  # stdout: the port alone, for scripts
        print(f"fake MCU (simulated): {Path(args.model).name} on {dev.port}; Ctrl-C stops it", file=sys.stderr)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
