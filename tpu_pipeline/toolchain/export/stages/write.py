"""The project's files written into the output folder, each atomically."""

from __future__ import annotations

from tpu_pipeline.toolchain.driver import PassRecord
from tpu_pipeline.toolchain.tflite.io import write_bytes_atomic


def write(state, allowed):
    out = state.options.out_dir
    out.mkdir(parents=True, exist_ok=True)
    for name, content in state.files:
        write_bytes_atomic(str(out / name), content)
    return state, PassRecord("write", "ran", 0.0, {"files": len(state.files)})
