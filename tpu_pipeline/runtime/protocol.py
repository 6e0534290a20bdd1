"""The MCU harness's serial line protocol (documented in tpu_pipeline/toolchain/data/firmware/PROTOCOL.md).

Every line, either way, is printable ASCII: `<KIND> <field> ... *<CC>\\n`, where CC is the XOR
of all bytes before the `*`, as two upper-case hex digits (NMEA style). A line whose checksum,
kind or fields do not parse is *garbled*; the host never guesses at it.

Host -> device: `HELLO`, `SET <input> <offset> <hex>`, `RUN <seq>`, `RESET`.
Device -> host: `BOOT <harness> <version> <board>`, `READY key=value ...`, `OK ...`,
`PROF <seq> <op> <tag> <ticks>`, `OUT <seq> <output> <offset> <hex>`,
`DONE <seq> ticks=<n> arena_used=<n> [stack_used=<n>]`, `ERR <message>`, `LOG <text>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

VERSION = 1
HARNESS = "tpu-pipeline-harness"
CHUNK = 128  # payload bytes per SET/OUT line: 256 hex digits, short enough for small UART buffers

HOST_KINDS = {"HELLO", "SET", "RUN", "RESET"}
DEVICE_KINDS = {"BOOT", "READY", "OK", "PROF", "OUT", "DONE", "ERR", "LOG"}
_ARITY = {"BOOT": 3, "PROF": 4, "OUT": 4, "DONE": 1, "SET": 3, "RUN": 1, "HELLO": 0, "RESET": 0}


class ProtocolError(ValueError):
    """A line that does not parse: bad checksum, unknown kind, wrong fields."""


@dataclass(frozen=True)
class Message:
    kind: str
    fields: tuple[str, ...] = ()
    kv: dict[str, str] = field(default_factory=dict)

    def int(self, key: str) -> int:
        try:
            return int(self.kv[key])
        except (KeyError, ValueError):
            raise ProtocolError(f"{self.kind} line has no integer '{key}'") from None


def checksum(body: bytes) -> int:
    c = 0
    for b in body:
        c ^= b
    return c


def encode(kind: str, *fields, **kv) -> bytes:
    parts = [kind, *(str(f) for f in fields), *(f"{k}={v}" for k, v in kv.items())]
    body = " ".join(parts).encode("ascii")
    return body + b"*%02X\n" % checksum(body)


def parse(raw: bytes, kinds: set[str] = DEVICE_KINDS | HOST_KINDS) -> Message:
    line = raw.rstrip(b"\r\n")
    star = line.rfind(b"*")
    if star < 0 or len(line) - star != 3:
        raise ProtocolError("no checksum")
    body, cc = line[:star], line[star + 1:]
    if any(c not in b"0123456789ABCDEF" for c in cc):
        raise ProtocolError("checksum is not two upper-case hex digits")
    want = int(cc, 16)
    if checksum(body) != want:
        raise ProtocolError(f"checksum {cc.decode(errors='replace')} does not match {checksum(body):02X}")
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError("non-ASCII bytes") from None
    if not text.isprintable():
        raise ProtocolError("control characters")
    kind, *rest = text.split(" ") if text else [""]
    if kind not in kinds:
        raise ProtocolError(f"unknown kind '{kind[:20]}'")
    if kind in ("ERR", "LOG"):
        return Message(kind, (" ".join(rest),))
    fields = tuple(r for r in rest if "=" not in r)
    kv = dict(r.split("=", 1) for r in rest if "=" in r)
    if kind in _ARITY and len(fields) != _ARITY[kind]:
        raise ProtocolError(f"{kind} takes {_ARITY[kind]} fields, got {len(fields)}")
    return Message(kind, fields, kv)


def chunks(data: bytes, size: int = CHUNK):
    """(offset, hex) pieces of `data` for SET/OUT lines."""
    for off in range(0, len(data), size):
        yield off, data[off:off + size].hex().upper()
    if not data:
        yield 0, ""
