"""Validation of what the reader reads: the flatbuffer's structure before it is unpacked, then
the unpacked model's contents.

`verify_flatbuffer` does in Python what flatbuffers' C++ Verifier does (the Python package has
none): it walks every table reachable from the root and checks that each vtable, field, table,
vector and string lies inside the file, aligned, within a depth and a table-count limit (a
crafted file can make the object API loop or allocate without end; one whose offsets wrap to
negative numbers is read silently from the end of the buffer). The layout of each table is
taken from LiteRT's generated schema module itself (the accessor methods name their vtable
slot and element type), so every table and union member of the schema is covered.

`validate_model` checks the unpacked `ModelT`: indices in range, enums known, constant buffers
the size their tensor's shape and type say, quantization arrays that fit the tensor.
"""

from __future__ import annotations

import inspect
import math
import re
import struct
from functools import lru_cache

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from flatbuffers import number_types as N

from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.tflite.names import text as _text

MAX_DEPTH = 64              # as flatbuffers' C++ Verifier
MAX_TABLES = 1_000_000      # as flatbuffers' C++ Verifier
EDGETPU_CUSTOM_CODE = "edgetpu-custom-op"
ETHOSU_CUSTOM_CODE = "ethos-u"  # Arm Vela's compiled NPU subgraphs


class _Corrupt(Exception):
    """Raised inside the walk; turned into one ModelError line naming the file."""


# ---- table layouts from the generated code ------------------------------------------------------

_OFFSET = re.compile(r"self\._tab\.Offset\((\d+)\)")
_SCALAR = re.compile(r"self\._tab\.Get\(flatbuffers\.number_types\.(\w+)Flags, o \+ self\._tab\.Pos\)")
_VECTOR_SCALAR = re.compile(r"self\._tab\.Get\(flatbuffers\.number_types\.(\w+)Flags, a \+")
_OBJ = re.compile(r"obj = (\w+)\(\)")
_CREATOR = re.compile(r"self\.\w+ = (\w+)Creator\(self\.\w+, \w+\.(\w+)\(\)\)")


@lru_cache(maxsize=1)
def _class_sources() -> dict[str, dict[str, str]]:
    """class name -> method name -> source, for every class of the generated schema module."""
    text = inspect.getsource(schema)
    out: dict[str, dict[str, str]] = {}
    for block in re.split(r"^(?=class )", text, flags=re.M):
        head = re.match(r"class (\w+)\(", block)
        if head:
            parts = re.split(r"^    def (\w+)\(", block, flags=re.M)
            out[head.group(1)] = dict(zip(parts[1::2], parts[2::2]))
    return out


@lru_cache(maxsize=None)
def _layout(cls_name: str) -> dict[int, tuple]:
    """vtable offset -> field kind of the generated table class `cls_name`:
    ("scalar", size) | ("string",) | ("table", cls) | ("vector", elem size) | ("tables", cls) |
    ("union", union enum name, vtable offset of its type field)."""
    sources = _class_sources()
    fields: dict[int, tuple] = {}
    scalars: dict[str, int] = {}
    for name, src in sources.get(cls_name, {}).items():
        if not name[:1].isupper() or name == "Init" or name.endswith(("AsNumpy", "Length", "IsNone")) \
                or name.startswith("GetRootAs"):
            continue
        m = _OFFSET.search(src)
        if not m:
            continue
        off = int(m.group(1))
        if "self._tab.Union(" in src:
            fields[off] = ("union", name)  # completed below
        elif "self._tab.String(" in src:
            fields[off] = ("string",)
        elif "Indirect(o + self._tab.Pos)" in src:
            fields[off] = ("table", _OBJ.search(src).group(1))
        elif "self._tab.Vector(o)" in src and "Indirect(x)" in src:
            fields[off] = ("tables", _OBJ.search(src).group(1))
        elif (v := _VECTOR_SCALAR.search(src)) is not None:
            fields[off] = ("vector", getattr(N, v.group(1) + "Flags").bytewidth)
        elif (s := _SCALAR.search(src)) is not None:
            fields[off] = ("scalar", getattr(N, s.group(1) + "Flags").bytewidth)
            scalars[name] = off
        else:
            raise RuntimeError(f"schema accessor {cls_name}.{name} not understood")
    # A union field `X` keeps its type in the scalar field `XType`; the object API's creator
    # call names the union enum.
    creators = {}
    for src in sources.get(cls_name + "T", {}).values():
        for creator, accessor in _CREATOR.findall(src):
            creators[accessor] = creator
    for off, kind in list(fields.items()):
        if kind[0] == "union":
            fields[off] = ("union", creators.get(kind[1], kind[1]), scalars[kind[1] + "Type"])
    return fields


@lru_cache(maxsize=None)
def _union_members(enum_name: str) -> dict[int, str]:
    enum = getattr(schema, enum_name)
    return {v: k for k, v in vars(enum).items() if not k.startswith("_") and isinstance(v, int) and v != 0}


# ---- the walk -----------------------------------------------------------------------------------

class _Walker:
    def __init__(self, data: bytes):
        self.data = data
        self.n = len(data)
        self.tables = 0

    def _u32(self, pos: int) -> int:
        if pos < 0 or pos + 4 > self.n:
            raise _Corrupt(f"offset {pos} outside the file")
        return struct.unpack_from("<I", self.data, pos)[0]

    def _i32(self, pos: int) -> int:
        if pos < 0 or pos + 4 > self.n:
            raise _Corrupt(f"offset {pos} outside the file")
        return struct.unpack_from("<i", self.data, pos)[0]

    def _u16(self, pos: int) -> int:
        if pos < 0 or pos + 2 > self.n:
            raise _Corrupt(f"offset {pos} outside the file")
        return struct.unpack_from("<H", self.data, pos)[0]

    def _vector(self, pos: int, elem: int, what: str) -> tuple[int, int]:
        """(start of elements, length) of the vector whose uoffset is stored at `pos`."""
        if pos % 4:
            raise _Corrupt(f"misaligned offset to {what}")
        vec = pos + self._u32(pos)
        if vec % 4:
            raise _Corrupt(f"misaligned {what}")
        length = self._u32(vec)
        if vec + 4 + length * elem > self.n:
            raise _Corrupt(f"{what} ({length} elements) runs outside the file")
        return vec + 4, length

    def table(self, pos: int, cls_name: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise _Corrupt(f"tables nested deeper than {MAX_DEPTH}")
        self.tables += 1
        if self.tables > MAX_TABLES:
            raise _Corrupt(f"more than {MAX_TABLES:,} tables")
        if pos % 4:
            raise _Corrupt(f"misaligned {cls_name} table")
        vtable = pos - self._i32(pos)
        if vtable % 2:
            raise _Corrupt(f"misaligned vtable of a {cls_name} table")
        vt_size = self._u16(vtable)
        table_size = self._u16(vtable + 2)
        if vt_size < 4 or vt_size % 2 or vtable + vt_size > self.n:
            raise _Corrupt(f"bad vtable of a {cls_name} table")
        if table_size < 4 or pos + table_size > self.n:
            raise _Corrupt(f"a {cls_name} table runs outside the file")
        layout = _layout(cls_name)
        for voff, kind in layout.items():
            if voff >= vt_size:
                continue
            field = self._u16(vtable + voff)
            if field == 0:
                continue
            size = kind[1] if kind[0] == "scalar" else 4
            if field + size > table_size:
                raise _Corrupt(f"a field of a {cls_name} table lies outside the table")
            at = pos + field
            what = f"{cls_name} field"
            if kind[0] == "string":
                start, length = self._vector(at, 1, f"string in a {what}")
                if start + length >= self.n or self.data[start + length] != 0:
                    raise _Corrupt(f"unterminated string in a {what}")
            elif kind[0] == "table":
                if at % 4:
                    raise _Corrupt(f"misaligned offset in a {what}")
                self.table(at + self._u32(at), kind[1], depth + 1)
            elif kind[0] == "vector":
                self._vector(at, kind[1], f"vector in a {what}")
            elif kind[0] == "tables":
                start, length = self._vector(at, 4, f"table vector in a {what}")
                for j in range(length):
                    slot = start + 4 * j
                    self.table(slot + self._u32(slot), kind[1], depth + 1)
            elif kind[0] == "union":
                type_voff = kind[2]
                type_field = self._u16(vtable + type_voff) if type_voff < vt_size else 0
                utype = self.data[pos + type_field] if type_field else 0
                if type_field and type_field + 1 > table_size:
                    raise _Corrupt(f"a field of a {cls_name} table lies outside the table")
                members = _union_members(kind[1])
                if utype == 0:
                    continue
                if utype not in members:
                    raise _Corrupt(f"unknown {kind[1]} type {utype}")
                if at % 4:
                    raise _Corrupt(f"misaligned offset in a {what}")
                self.table(at + self._u32(at), members[utype], depth + 1)


def verify_flatbuffer(data: bytes, label: str) -> None:
    """Raise ModelError unless every table reachable from the root lies inside `data`."""
    walker = _Walker(data)
    try:
        walker.table(walker._u32(0), "Model", 0)
    except _Corrupt as exc:
        raise ModelError(f"{label}: truncated or corrupt flatbuffer ({exc})") from None
    except RecursionError:
        raise ModelError(f"{label}: truncated or corrupt flatbuffer (tables nested too deeply)") from None


# ---- the unpacked model -------------------------------------------------------------------------

_BUILTIN_CODES = {v for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
_DTYPES = {v: k.lower() for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
# Bytes per element of a constant buffer; None where the shape does not fix the size.
_DTYPE_BITS = {
    "float32": 32, "float16": 16, "int32": 32, "uint8": 8, "int64": 64, "bool": 8, "int16": 16,
    "complex64": 64, "int8": 8, "float64": 64, "complex128": 128, "uint64": 64, "uint32": 32,
    "uint16": 16, "int4": 4, "bfloat16": 16, "int2": 2, "uint4": 4, "float8_e4m3fn": 8, "float8_e5m2": 8,
}

_ZERO_POINT_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535),
                     "int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1)}


def _len(values) -> int:
    return 0 if values is None or isinstance(values, int) else len(values)


def _list(values) -> list[int]:
    if values is None or isinstance(values, int):
        return []
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        return values.tolist()  # Python ints in one call
    return [int(v) for v in values]


def validate_model(model: schema.ModelT, label: str) -> None:
    """Raise ModelError (one line naming `label`) for the first inconsistency found."""
    def bad(msg: str) -> ModelError:
        return ModelError(f"{label}: {msg}")

    codes = model.operatorCodes or []
    for i, code in enumerate(codes):
        builtin = max(int(code.builtinCode or 0), int(code.deprecatedBuiltinCode or 0))
        if builtin not in _BUILTIN_CODES or not 0 <= int(code.deprecatedBuiltinCode or 0) <= 127:
            raise bad(f"operator code {i} has unknown builtin operator {builtin}")
        if int(code.version or 1) < 1:
            raise bad(f"operator code {i} has version {code.version}")
        if builtin == schema.BuiltinOperator.CUSTOM and _text(code.customCode) == EDGETPU_CUSTOM_CODE:
            raise bad(f"is already compiled for the Edge TPU ({EDGETPU_CUSTOM_CODE}); "
                      "pass the CPU .tflite it was compiled from")
        if builtin == schema.BuiltinOperator.CUSTOM and _text(code.customCode) == ETHOSU_CUSTOM_CODE:
            # Vela's output: the NPU's command stream in a custom op whose scratch tensors no
            # operator writes; neither LiteRT nor TFLite Micro without the NPU runs it
            raise bad(f"is compiled by Vela for an Arm Ethos-U NPU ({ETHOSU_CUSTOM_CODE} custom op); "
                      "pass the .tflite it was compiled from (the model given to vela)")
    buffers = model.buffers or []
    for i, m in enumerate(model.metadata or []):
        if not 0 <= int(m.buffer) < len(buffers):
            raise bad(f"metadata '{_text(m.name)}' refers to buffer {m.buffer}, which does not exist")
    for i in _list(model.metadataBuffer):
        if not 0 <= i < len(buffers):
            raise bad(f"metadata buffer {i} does not exist")
    subgraphs = model.subgraphs or []
    for s, sg in enumerate(subgraphs):
        where = f"subgraph {s}" if s else "the main subgraph"
        if sg is None:
            raise bad(f"{where} is missing")
        tensors = sg.tensors or []
        nt = len(tensors)
        for i, t in enumerate(tensors):
            if t is None:
                raise bad(f"tensor {i} of {where} is missing")
            _check_tensor(t, i, buffers, bad)
        for kind, idx in (("input", sg.inputs), ("output", sg.outputs)):
            for t in _list(idx):
                if not 0 <= t < nt:
                    raise bad(f"{where} {kind} tensor {t} does not exist ({nt} tensors)")
        for i, op in enumerate(sg.operators or []):
            if op is None:
                raise bad(f"operator {i} of {where} is missing")
            if not 0 <= int(op.opcodeIndex) < len(codes):
                raise bad(f"operator {i} of {where} refers to operator code {op.opcodeIndex}, which does not exist")
            # -1 is an omitted optional tensor, which LiteRT accepts in all three lists.
            for kind, idx, lowest in (("input", op.inputs, -1), ("output", op.outputs, -1),
                                      ("intermediate", op.intermediates, -1)):
                for t in _list(idx):
                    if not lowest <= t < nt:
                        raise bad(f"operator {i} of {where} has {kind} tensor {t}, which does not exist "
                                  f"({nt} tensors)")
            opt = int(op.builtinOptionsType or 0)
            if opt and op.builtinOptions is None:
                raise bad(f"operator {i} of {where} has unknown builtin options type {opt}")
    for sig in model.signatureDefs or []:
        if not 0 <= int(sig.subgraphIndex) < len(subgraphs):
            raise bad(f"signature '{_text(sig.signatureKey)}' refers to subgraph {sig.subgraphIndex}, which does not exist")
        nt = len(subgraphs[sig.subgraphIndex].tensors or [])
        for m in (sig.inputs or []) + (sig.outputs or []):
            if not 0 <= int(m.tensorIndex) < nt:
                raise bad(f"signature '{_text(sig.signatureKey)}' refers to tensor {m.tensorIndex}, which does not exist")


def _check_tensor(t, i: int, buffers, bad) -> None:
    name = f"tensor {i} ('{_text(t.name)}')"
    dtype = _DTYPES.get(t.type)
    if dtype is None:
        raise bad(f"{name} has unknown type code {t.type}")
    shape = _list(t.shape)
    if any(d < -1 for d in shape):
        raise bad(f"{name} has a negative dimension in its shape {shape}")
    if any(d < -1 for d in _list(t.shapeSignature)):
        raise bad(f"{name} has a bad shape signature {_list(t.shapeSignature)}")
    if not 0 <= int(t.buffer) < max(len(buffers), 1):
        raise bad(f"{name} refers to buffer {t.buffer}, which does not exist ({len(buffers)} buffers)")
    buf = buffers[t.buffer] if t.buffer < len(buffers) else None
    size = _len(buf.data) if buf is not None else 0
    bits = _DTYPE_BITS.get(dtype)
    if size and bits is not None and t.sparsity is None and all(d >= 0 for d in shape):
        expected = (math.prod(shape) * bits + 7) // 8
        if size != expected:
            raise bad(f"{name} has {size:,} bytes of data, its shape {shape} and type {dtype} need {expected:,}")
    q = t.quantization
    if q is not None:
        scale = [] if q.scale is None or isinstance(q.scale, int) else q.scale
        zero = _list(q.zeroPoint)
        if len(scale) or zero:
            axis = int(q.quantizedDimension or 0)
            if len(scale) > 1 or len(zero) > 1:
                if len(shape) == 1 and len(scale) == shape[0] and axis >= 0:
                    # TFLite Micro reads a 1-D tensor's scales element by element whatever dimension
                    # it names (its own person_detect.tflite: biases "quantized along dimension 3");
                    # LiteRT refuses such a model, and the commands that need LiteRT say so.
                    axis = 0
                if not 0 <= axis < len(shape):
                    raise bad(f"{name} is quantized along dimension {axis} of a rank-{len(shape)} tensor")
                if len(scale) != shape[axis] and shape[axis] >= 0:
                    raise bad(f"{name} has {len(scale)} quantization scales for {shape[axis]} channels "
                              f"(dimension {axis})")
            if zero and len(zero) != len(scale):
                raise bad(f"{name} has {len(scale)} quantization scales but {len(zero)} zero points")
            lo, hi = _ZERO_POINT_RANGE.get(dtype, (-(2**63), 2**63 - 1))
            if zero and not lo <= min(zero) <= max(zero) <= hi:
                raise bad(f"{name} has a zero point outside the range of {dtype}")
            if len(scale) and not np.isfinite(np.asarray(scale, dtype=np.float64)).all():
                raise bad(f"{name} has a quantization scale that is not finite")


def unpack_errors() -> tuple[type[BaseException], ...]:
    """What the generated object API raises on a corrupt buffer that still passed the walk."""
    return (struct.error, IndexError, ValueError, TypeError, UnicodeDecodeError, OverflowError, KeyError,
            AttributeError, AssertionError, MemoryError, RecursionError, np.exceptions.AxisError)
