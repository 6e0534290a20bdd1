"""Read and write .tflite flatbuffers through LiteRT's generated object API.

Reading validates what the generated code does not: the file identifier, the schema version,
buffers that point outside the file, and models whose buffers live outside the flatbuffer
(the > 2 GiB format). Writing packs with constant buffers aligned to 16 bytes (the schema's
`force_align: 16`, which Python's generated `BufferT.Pack` ignores) and replaces the target
atomically.
"""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

from toolchain.errors import DeviceError, ModelError

FILE_IDENTIFIER = b"TFL3"
SCHEMA_VERSION = 3
BUFFER_ALIGNMENT = 16


def read_model(source: str | os.PathLike | bytes | bytearray, name: str | None = None) -> schema.ModelT:
    """Parse a .tflite file (a path or its bytes) into a `ModelT`, or raise `ModelError`."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        label = name or "<bytes>"
    else:
        label = name or str(source)
        try:
            data = Path(source).read_bytes()
        except FileNotFoundError:
            raise ModelError(f"{label}: no such file") from None
        except IsADirectoryError:
            raise ModelError(f"{label}: is a directory, not a .tflite file") from None
        except OSError as exc:
            raise ModelError(f"{label}: cannot read ({exc.strerror})") from None
    _check_header(data, label)
    root = schema.Model.GetRootAs(data, 0)
    try:
        version = root.Version()
    except (struct.error, IndexError, ValueError):
        raise ModelError(f"{label}: truncated or corrupt flatbuffer") from None
    if version != SCHEMA_VERSION:
        raise ModelError(f"{label}: unknown TFLite schema version {version} (expected {SCHEMA_VERSION})")
    _check_buffers(root, data, label)
    try:
        model = schema.ModelT.InitFromObj(root)
    except (struct.error, IndexError, ValueError, TypeError, UnicodeDecodeError, OverflowError):
        raise ModelError(f"{label}: truncated or corrupt flatbuffer") from None
    if not model.subgraphs:
        raise ModelError(f"{label}: the model has no subgraphs")
    return model


def _check_header(data: bytes, label: str) -> None:
    if len(data) == 0:
        raise ModelError(f"{label}: empty file")
    if len(data) < 8:
        raise ModelError(f"{label}: truncated file ({len(data)} bytes)")
    if data[4:8] != FILE_IDENTIFIER:
        raise ModelError(f"{label}: not a TFLite model (no {FILE_IDENTIFIER.decode()} file identifier)")
    (root_offset,) = struct.unpack_from("<I", data, 0)
    if root_offset + 4 > len(data):
        raise ModelError(f"{label}: truncated file (root table at {root_offset}, file is {len(data)} bytes)")


def _check_buffers(root, data: bytes, label: str) -> None:
    """Every buffer's bytes must lie inside the file; external (> 2 GiB format) buffers are refused."""
    try:
        count = root.BuffersLength()
        for i in range(count):
            buf = root.Buffers(i)
            if buf is None:
                raise ModelError(f"{label}: buffer {i} is missing")
            if buf.Offset() > 1 or buf.Size() > 0:
                raise ModelError(
                    f"{label}: buffer {i} is stored outside the flatbuffer (the > 2 GiB model format), "
                    "which edge models do not use and this tool does not read"
                )
            length = buf.DataLength()
            if length:
                field = buf._tab.Offset(4)
                start = buf._tab.Vector(field)
                if start < 0 or start + length > len(data):
                    raise ModelError(f"{label}: buffer {i} points outside the file")
    except (struct.error, IndexError, ValueError):
        raise ModelError(f"{label}: truncated or corrupt flatbuffer") from None


class _AlignedBufferT(schema.BufferT):
    """A BufferT whose data vector is packed at a 16-byte boundary, as the schema demands."""

    def Pack(self, builder):  # noqa: N802 - the generated API's name
        data_offset = None
        if self.data is not None and len(self.data) > 0:
            raw = np.asarray(self.data, dtype=np.uint8).tobytes()
            builder.StartVector(1, len(raw), BUFFER_ALIGNMENT)
            builder.head = builder.head - len(raw)
            builder.Bytes[builder.head : builder.head + len(raw)] = raw
            data_offset = builder.EndVector()
        elif self.data is not None:
            builder.StartVector(1, 0, 1)
            data_offset = builder.EndVector()
        schema.BufferStart(builder)
        if data_offset is not None:
            schema.BufferAddData(builder, data_offset)
        schema.BufferAddOffset(builder, self.offset)
        schema.BufferAddSize(builder, self.size)
        return schema.BufferEnd(builder)


def model_to_bytes(model: schema.ModelT) -> bytes:
    """Serialise a `ModelT` with 16-byte aligned constant buffers."""
    original = model.buffers
    aligned = []
    for buf in original or []:
        copy = _AlignedBufferT()
        copy.data, copy.offset, copy.size = buf.data, buf.offset, buf.size
        aligned.append(copy)
    total = sum(len(b.data) for b in aligned if b.data is not None)
    builder = flatbuffers.Builder(total + 1024 * 1024)
    model.buffers = aligned
    try:
        builder.Finish(model.Pack(builder), file_identifier=FILE_IDENTIFIER)
    finally:
        model.buffers = original
    return bytes(builder.Output())


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename: a failed write leaves nothing behind."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise DeviceError(f"{target}: cannot write ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise DeviceError(f"{target}: cannot write ({exc.strerror})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_model(model: schema.ModelT, path: str | os.PathLike) -> bytes:
    """Serialise and write atomically; returns the bytes written."""
    data = model_to_bytes(model)
    write_bytes_atomic(path, data)
    return data
