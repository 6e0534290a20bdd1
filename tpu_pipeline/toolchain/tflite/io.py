"""Read and write .tflite flatbuffers through LiteRT's generated object API.

Reading validates what the generated code does not: a regular file under 2 GiB, the file
identifier, the schema version, every table, vector and string inside the file (`verify.py`,
before anything is unpacked), models whose buffers live outside the flatbuffer (the > 2 GiB
format), and then the unpacked model's indices, enums, buffer sizes and quantization arrays;
an Edge TPU-compiled model is refused by name. Every failure is one ModelError line.

Writing packs with constant buffers aligned to 16 bytes (the schema's `force_align: 16`, which
Python's generated `BufferT.Pack` ignores), the large ones after the tables straight from the
model's arrays (`model_to_chunks`: no copy through the builder), and replaces the target atomically; it never
replaces an input model (exit 2) or anything but a regular file (exit 4).
"""

from __future__ import annotations

import os
import stat
import struct
import tempfile
from pathlib import Path

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

from tpu_pipeline.toolchain import interrupts
from tpu_pipeline.toolchain.errors import DeviceError, ModelError, UsageError
from tpu_pipeline.toolchain.tflite.verify import unpack_errors, validate_model, verify_flatbuffer

FILE_IDENTIFIER = b"TFL3"
SCHEMA_VERSION = 3
BUFFER_ALIGNMENT = 16
MAX_MODEL_BYTES = 2**31 - 1  # the flatbuffer format's limit; larger models use external buffers


def read_bytes(source: str | os.PathLike, label: str | None = None) -> bytes:
    """The bytes of a model file, or ModelError naming it (missing, a folder, a device, unreadable)."""
    label = label or str(source)
    path = Path(source)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ModelError(f"{label}: no such file") from None
    except OSError as exc:
        raise ModelError(f"{label}: cannot read ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ModelError(f"{label}: is a directory, not a .tflite file")
    if not stat.S_ISREG(st.st_mode):
        # A fifo or a device would block or never end; a model is a regular file.
        raise ModelError(f"{label}: is not a regular file")
    if st.st_size > MAX_MODEL_BYTES:
        raise ModelError(f"{label}: {st.st_size:,} bytes; models over 2 GiB keep their weights outside the "
                         "flatbuffer, which edge models do not do and this tool does not read")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ModelError(f"{label}: cannot read ({exc.strerror})") from None


def read_model(source: str | os.PathLike | bytes | bytearray, name: str | None = None) -> schema.ModelT:
    """Parse a .tflite file (a path or its bytes) into a `ModelT`, or raise `ModelError`.

    Every model returned has passed the structural walk (`verify_flatbuffer`) and the content
    checks (`validate_model`); an Edge TPU-compiled model is refused by name.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        label = name or "<bytes>"
    else:
        label = name or str(source)
        data = read_bytes(source, label)
    _check_header(data, label)
    verify_flatbuffer(data, label)
    root = schema.Model.GetRootAs(data, 0)
    try:
        version = root.Version()
    except unpack_errors():
        raise ModelError(f"{label}: truncated or corrupt flatbuffer") from None
    if version != SCHEMA_VERSION:
        raise ModelError(f"{label}: unknown TFLite schema version {version} (expected {SCHEMA_VERSION})")
    _check_buffers(root, data, label)
    try:
        model = schema.ModelT.InitFromObj(root)
    except unpack_errors():
        raise ModelError(f"{label}: truncated or corrupt flatbuffer") from None
    if not model.subgraphs:
        raise ModelError(f"{label}: the model has no subgraphs")
    validate_model(model, label)
    return model


def checked_as_written(model: schema.ModelT, data: bytes, label: str = "<written model>") -> schema.ModelT:
    """`model` once `data`, its serialisation, passes every check `read_model` makes (header,
    tables, buffers, the content checks): what reading `data` back would give, without
    unpacking it again."""
    _check_header(data, label)
    verify_flatbuffer(data, label)
    _check_buffers(schema.Model.GetRootAs(data, 0), data, label)
    validate_model(model, label)
    return model


def _read_checked(data: bytes, label: str = "<bytes>") -> bytes:
    """`data` once its header and every table, vector and string in it are checked (read_model's
    first steps), for the readers below that read a few fields through the flatbuffer accessors."""
    _check_header(data, label)
    verify_flatbuffer(data, label)
    return data


def main_io_counts(data: bytes) -> tuple[int, int]:
    """(inputs, outputs) of the main subgraph, without unpacking the model."""
    sg = schema.Model.GetRootAs(_read_checked(bytes(data)), 0).Subgraphs(0)
    return sg.InputsLength(), sg.OutputsLength()


def reads_an_input_at(data: bytes, operands: dict[str, int]) -> bool:
    """Whether an op of the main subgraph whose builtin name is a key of `operands` reads a graph
    input at the operand position given, without unpacking the model."""
    root = schema.Model.GetRootAs(_read_checked(bytes(data)), 0)
    wanted = {getattr(schema.BuiltinOperator, name): k for name, k in operands.items()}
    codes = [max(root.OperatorCodes(i).DeprecatedBuiltinCode(), root.OperatorCodes(i).BuiltinCode())
             for i in range(root.OperatorCodesLength())]
    sg = root.Subgraphs(0)
    inputs = {sg.Inputs(i) for i in range(sg.InputsLength())}
    for i in range(sg.OperatorsLength()):
        op = sg.Operators(i)
        k = wanted.get(codes[op.OpcodeIndex()]) if op.OpcodeIndex() < len(codes) else None
        if k is not None and op.InputsLength() > k and op.Inputs(k) in inputs:
            return True
    return False


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
    except unpack_errors():
        raise ModelError(f"{label}: truncated or corrupt flatbuffer") from None


# Constant buffers at least this large are not copied into the builder: they go after the
# flatbuffer's tables, referenced where they are (model_to_chunks).
TAIL_MIN_BYTES = 1024


class _AlignedBufferT(schema.BufferT):
    """A BufferT whose data vector is packed at a 16-byte boundary, as the schema demands; with
    `tail`, an empty aligned vector that model_to_chunks points at the data after the tables."""

    tail = False

    def Pack(self, builder):  # noqa: N802 - the generated API's name
        data_offset = None
        if self.tail:
            builder.StartVector(1, 0, BUFFER_ALIGNMENT)
            data_offset = builder.EndVector()
        elif self.data is not None and len(self.data) > 0:
            raw = _byte_view(self.data)
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


def _byte_view(data) -> memoryview:
    """The bytes of a buffer's data (a uint8 array, bytes or a list of ints) without a copy
    where they already are contiguous bytes."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return memoryview(data).cast("B")
    return memoryview(np.ascontiguousarray(data, dtype=np.uint8)).cast("B")


def model_to_chunks(model: schema.ModelT) -> list:
    """A `ModelT` serialised as pieces whose concatenation is the .tflite file: the flatbuffer's
    tables, then each large constant buffer as a 16-byte aligned vector that refers to the
    model's own array (no copy). Writing the pieces (os.writev) or joining them once is all
    the copying a model's weights see."""
    original = model.buffers or []
    aligned, tail = [], []
    for i, buf in enumerate(original):
        copy = _AlignedBufferT()
        copy.data, copy.offset, copy.size = buf.data, buf.offset, buf.size
        if buf.data is not None and not isinstance(buf.data, int) and len(buf.data) >= TAIL_MIN_BYTES:
            copy.tail = True
            tail.append(i)
        aligned.append(copy)
    small = sum(len(b.data) for b in aligned if b.data is not None and not b.tail)
    builder = flatbuffers.Builder(small + 256 * 1024)
    model.buffers = aligned
    try:
        builder.Finish(model.Pack(builder), file_identifier=FILE_IDENTIFIER)
    finally:
        model.buffers = original
    head = bytearray(builder.Output())
    head += bytes(-len(head) % BUFFER_ALIGNMENT)
    root = schema.Model.GetRootAs(head, 0)
    chunks, end = [head], len(head)
    for i in tail:
        data = _byte_view(original[i].data)
        at = end + (-(end + 4) % BUFFER_ALIGNMENT)  # the length prefix; the data after it is aligned
        table = root.Buffers(i)._tab
        field = table.Pos + table.Offset(4)  # Buffer.data's offset, pointed at the vector here
        struct.pack_into("<I", head, field, at - field)
        chunks += [bytes(at - end), struct.pack("<I", len(data)), data]
        end = at + 4 + len(data)
    return [c for c in chunks if len(c)]


def model_to_bytes(model: schema.ModelT) -> bytes:
    """Serialise a `ModelT` with 16-byte aligned constant buffers."""
    return b"".join(model_to_chunks(model))


def tensor_names_of_type(model, dtype: str) -> list[str]:
    """Names of the tensors of every subgraph whose type is `dtype` (a `Tensor.dtype` name such as
    "float16"). `model` is a ModelT or the .tflite bytes; bytes are read through the flatbuffer's
    accessors (cheap on big models), and bytes that cannot be read give an empty list (the
    caller's own load reports what is wrong with them)."""
    code = getattr(schema.TensorType, dtype.upper())
    found = []
    if isinstance(model, (bytes, bytearray, memoryview)):
        try:
            root = schema.Model.GetRootAs(bytes(model), 0)
            for s in range(root.SubgraphsLength()):
                sg = root.Subgraphs(s)
                for i in range(sg.TensorsLength()):
                    t = sg.Tensors(i)
                    if t.Type() == code:
                        found.append((t.Name() or b"").decode(errors="replace"))
        except Exception:  # noqa: BLE001 - a corrupt file
            return []
        return found
    for sg in model.subgraphs or []:
        for t in sg.tensors or []:
            if t.type == code:
                found.append(t.name.decode(errors="replace") if isinstance(t.name, bytes) else str(t.name))
    return found


def check_output_folder(folder: str | os.PathLike, inputs=()) -> Path:
    """Refuse an output folder that exists as something else, or holds an input model."""
    out = Path(folder)
    if os.path.lexists(out) and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a folder; choose a new or empty folder")
    for p in inputs:
        try:
            inside = Path(p).resolve().is_relative_to(out.resolve())
        except (OSError, RuntimeError):
            inside = False
        if inside:
            raise UsageError(f"{out}: holds the input model {p}; choose another output folder")
    return out


def check_output_path(path: str | os.PathLike, inputs=()) -> Path:
    """Refuse, before any work, an output path a writer must not replace; returns it as a Path.

    Exit 2 (UsageError) when `path` is one of `inputs` (the same file, through any link);
    exit 4 (DeviceError) when it exists and is not a regular file (a directory, a device such
    as /dev/full, a fifo, a socket, or a symlink to one of those), or its folder is not one.
    A symlink to a regular file is replaced by the new file; its target is left alone.
    """
    target = Path(path)
    for p in inputs or ():
        try:
            same = os.path.samefile(target, p)
        except (OSError, ValueError):
            same = False
        if same:
            raise UsageError(f"{target}: is the input model {p}; refusing to overwrite it (choose another output)")
    try:
        st = target.stat()
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise DeviceError(f"{target}: cannot write ({exc.strerror})") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise DeviceError(f"{target}: exists and is {what}; refusing to replace it")
    parent = _existing_ancestor(target.parent)
    if parent is not None and not parent.is_dir():
        raise DeviceError(f"{target}: {parent} is not a folder")
    return target


def check_output(path: str | os.PathLike, inputs=()) -> Path:
    """Refuse, before any work, an output file that cannot or must not be written (see
    `check_output_path`), and one whose existing folder refuses a new file (exit 4). Every
    command and API call that writes a file asks this first, so no minutes of solving are lost."""
    target = check_output_path(path, inputs)
    folder = target.parent
    if folder.is_dir():
        try:
            fd, probe = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".probe", dir=folder)
        except OSError as exc:
            raise DeviceError(f"{target}: cannot write ({exc.strerror})") from None
        os.close(fd)
        os.unlink(probe)
    return target


def _existing_ancestor(folder: Path) -> Path | None:
    for p in (folder, *folder.parents):
        if os.path.lexists(p):
            return p
    return None


def write_bytes_atomic(path: str | os.PathLike, data: bytes, inputs=()) -> None:
    """Write `data` to `path` all at once, or not at all.

    The bytes go to a temporary file in the same folder, which then replaces `path` with one
    rename; the temporary file (and any folder this call created) is removed on every failure,
    an interrupt included. `check_output_path` decides what may be replaced (never an input,
    never anything but a regular file).
    """
    target = check_output_path(path, inputs)
    created = _missing_folders(target.parent)
    tmp = None
    try:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        except OSError as exc:
            raise DeviceError(f"{target}: cannot write ({exc.strerror})") from None
        _register_temp(tmp)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
                os.fchmod(fh.fileno(), _mode_for(target))
            check_output_path(target, inputs)  # again: it may have changed while we wrote
            os.replace(tmp, target)
            tmp_done = tmp
            tmp = None
            _unregister_temp(tmp_done)
        except OSError as exc:
            raise DeviceError(f"{target}: cannot write ({exc.strerror})") from None
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
            _unregister_temp(tmp)
        for folder in created:
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def _missing_folders(folder: Path) -> list[Path]:
    """The folders `mkdir(parents=True)` would create for `folder`, deepest first."""
    out = []
    for p in (folder, *folder.parents):
        if os.path.lexists(p):
            break
        out.append(p)
    return out


def _mode_for(target: Path) -> int:
    """An existing file keeps its permissions; a new one gets the usual 0666 less the umask."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def _register_temp(path) -> None:
    # The CLI's interrupt handling removes registered temporaries if it has to exit hard.
    interrupts.register_temp(path)


def _unregister_temp(path) -> None:
    interrupts.unregister_temp(path)


def write_model(model: schema.ModelT, path: str | os.PathLike, inputs=()) -> bytes:
    """Serialise and write atomically (see `write_bytes_atomic`); returns the bytes written."""
    data = model_to_bytes(model)
    write_bytes_atomic(path, data, inputs=inputs)
    return data
