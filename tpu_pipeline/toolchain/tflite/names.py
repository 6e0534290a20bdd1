"""Names as the flatbuffer object API gives them (bytes, str or None), as text."""

from __future__ import annotations


def text(value) -> str:
    """A tensor, metadata, signature or custom-op name as str: bytes decoded as UTF-8 (bad
    bytes replaced), None as ""."""
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
