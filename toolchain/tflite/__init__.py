"""Flatbuffer I/O. The only room that knows the .tflite schema's object API."""

from toolchain.tflite.io import read_model, write_model, model_to_bytes, schema
from toolchain.tflite.metadata import (
    OFFLINE_PLAN_NAME,
    get_metadata,
    set_metadata,
    read_offline_plan,
    with_offline_plan,
)

__all__ = [
    "read_model",
    "write_model",
    "model_to_bytes",
    "schema",
    "OFFLINE_PLAN_NAME",
    "get_metadata",
    "set_metadata",
    "read_offline_plan",
    "with_offline_plan",
]
