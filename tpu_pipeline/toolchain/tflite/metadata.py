"""Model metadata entries, and TFLite Micro's offline memory plan among them.

The plan is the metadata entry `OfflineMemoryAllocation`; its buffer holds little-endian int32
words `[version, subgraph, N, offset_0 .. offset_{N-1}]`, N being the number of tensors of all
subgraphs together (TFLM refuses the model otherwise); -1 leaves a tensor to the online planner.
"""

from __future__ import annotations

import copy

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from tpu_pipeline.toolchain.errors import InfeasibleError
from tpu_pipeline.toolchain.tflite.names import text

OFFLINE_PLAN_NAME = "OfflineMemoryAllocation"
OFFLINE_PLAN_VERSION = 1
ONLINE = -1
# A tensor the application keeps outside the arena (`Graph.external`): only the harness firmware's
# planner knows this value (data/firmware/harness/main.cc); host views write ONLINE instead.
EXTERNAL = -2


def _name(entry) -> str:
    return text(entry.name)  # bad UTF-8 replaced, as the reader shows it: a name is never fatal


def get_metadata(model: schema.ModelT, name: str) -> bytes | None:
    for entry in model.metadata or []:
        if _name(entry) == name:
            data = model.buffers[entry.buffer].data
            return b"" if data is None else np.asarray(data, dtype=np.uint8).tobytes()
    return None


def set_metadata(model: schema.ModelT, name: str, payload: bytes) -> schema.ModelT:
    """A copy of `model` whose metadata entry `name` holds `payload` (replaced if present)."""
    out = copy.copy(model)
    # Buffer 0 is the schema's empty sentinel that tensors without data point at: a model stored
    # without any buffer (Coral's model_invoking_error.tflite) gets it first, or the metadata would
    # become those tensors' data
    out.buffers = list(model.buffers or [schema.BufferT()])
    out.metadata = [copy.copy(m) for m in (model.metadata or [])]
    buf = schema.BufferT()
    buf.data = np.frombuffer(payload, dtype=np.uint8).copy()
    for entry in out.metadata:
        if _name(entry) == name:
            # Reuse the slot: the old buffer would be left dangling otherwise.
            out.buffers[entry.buffer] = buf
            return out
    entry = schema.MetadataT()
    entry.name = name
    entry.buffer = len(out.buffers)
    out.buffers.append(buf)
    out.metadata.append(entry)
    return out


def total_tensor_count(model: schema.ModelT) -> int:
    return sum(len(sg.tensors or []) for sg in model.subgraphs)


def with_offline_plan(model: schema.ModelT, offsets: list[int], label: str = "") -> schema.ModelT:
    """A copy of `model` carrying `offsets` (one per tensor of all subgraphs) as TFLM's plan.
    InfeasibleError (naming `label`) when an offset does not fit TFLM's int32 words."""
    expected = total_tensor_count(model)
    if len(offsets) != expected:
        raise ValueError(f"offline plan has {len(offsets)} offsets, the model has {expected} tensors")
    too_big = [o for o in offsets if not (ONLINE <= o < 2**31 or o == EXTERNAL)]
    if too_big:
        # TFLite Micro reads the plan as int32 words.
        raise InfeasibleError(f"{label + ': ' if label else ''}the arena plan puts a tensor at offset {max(too_big):,} bytes; TFLite Micro's "
                              "offline plan holds 32-bit offsets (under 2 GiB)")
    words = np.array([OFFLINE_PLAN_VERSION, 0, expected, *offsets], dtype="<i4")
    return set_metadata(model, OFFLINE_PLAN_NAME, words.tobytes())


def read_offline_plan(model: schema.ModelT) -> list[int] | None:
    payload = get_metadata(model, OFFLINE_PLAN_NAME)
    if payload is None:
        return None
    words = np.frombuffer(payload, dtype="<i4")
    return [int(x) for x in words[3 : 3 + int(words[2])]]
