"""Names as the flatbuffer object API gives them (bytes, str or None), as text; operator codes by name."""

from __future__ import annotations

from ai_edge_litert import schema_py_generated as schema

BUILTIN_NAMES = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}


def text(value) -> str:
    """A tensor, metadata, signature or custom-op name as str: bytes decoded as UTF-8 (bad
    bytes replaced), None as ""."""
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def opcode_name(model: schema.ModelT, opcode_index: int) -> tuple[str, int, int]:
    """(name, builtin code, version) of an operator code entry."""
    code = model.operatorCodes[opcode_index]
    builtin = max(int(code.builtinCode or 0), int(code.deprecatedBuiltinCode or 0))
    if builtin == schema.BuiltinOperator.CUSTOM:
        return f"CUSTOM:{text(code.customCode)}", builtin, int(code.version or 1)
    return BUILTIN_NAMES.get(builtin, f"BUILTIN_{builtin}"), builtin, int(code.version or 1)


def tensor_name(model: schema.ModelT, index: int, subgraph: int = 0) -> str:
    """The name of tensor `index` of a subgraph (main by default), as text."""
    return text(model.subgraphs[subgraph].tensors[index].name)
