"""Flatbuffer I/O. The only room that knows the .tflite schema's object API."""

from tpu_pipeline.toolchain.tflite.io import (
    check_output_path,
    model_to_bytes,
    read_bytes,
    read_model,
    schema,
    tensor_names_of_type,
    write_bytes_atomic,
    write_model,
)
from tpu_pipeline.toolchain.tflite.metadata import (
    OFFLINE_PLAN_NAME,
    get_metadata,
    set_metadata,
    read_offline_plan,
    with_offline_plan,
)

__all__ = [
    "read_model",
    "read_bytes",
    "write_model",
    "write_bytes_atomic",
    "check_output_path",
    "model_to_bytes",
    "schema",
    "tensor_names_of_type",
    "OFFLINE_PLAN_NAME",
    "get_metadata",
    "set_metadata",
    "read_offline_plan",
    "with_offline_plan",
]
