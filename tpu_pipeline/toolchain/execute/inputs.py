"""The one random-input generator: the same seed gives the same tensors to every runtime, backend,
verification and test.

Distribution (the one compile --verify and rewrite's verification have always used): 8- and
16-bit integers over their full range (quantized activations), wider integers 0..8 (they are
indices and sizes, which a full range would send out of bounds), floats N(0, 1), booleans 0/1,
anything else zeros. Dynamic dimensions (-1) become 1. A graph input that an op reads as a shape
(TRANSPOSE_CONV's output shape, RESHAPE's new shape, BROADCAST_TO's and FILL's shape) gets the
shape the model stores for that op's output instead (`shape_operand_values`): random sizes would
only make the kernel refuse to run (TFLite Micro's int16 TRANSPOSE_CONV test models).
"""

from __future__ import annotations

import numpy as np


def random_tensor(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    dt = np.dtype(dtype)
    shape = [max(int(s), 1) for s in shape]
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    if dt == np.bool_:
        return rng.integers(0, 2, shape).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo, hi = (info.min, info.max) if dt.itemsize <= 2 else (0, 8)
        return rng.integers(lo, hi, shape, endpoint=True).astype(dt)
    return np.zeros(shape, dtype=dt)


# op -> the input position it reads as the shape of its output
SHAPE_OPERANDS = {"TRANSPOSE_CONV": 0, "RESHAPE": 1, "BROADCAST_TO": 1, "FILL": 0}


def shape_operand_values(model: bytes) -> dict[str, np.ndarray]:
    """Graph input name -> the value it must hold, for graph inputs read as an output shape."""
    from tpu_pipeline.toolchain.ir import from_model
    from tpu_pipeline.toolchain.tflite import read_model

    from tpu_pipeline.toolchain.tflite.io import reads_an_input_at

    # most models have no such op: the op codes are read without unpacking the model
    if not reads_an_input_at(bytes(model), SHAPE_OPERANDS):
        return {}
    graph = from_model(read_model(bytes(model)))
    inputs = set(graph.inputs)
    out: dict[str, np.ndarray] = {}
    for op in graph.ops:
        k = SHAPE_OPERANDS.get(op.opcode)
        if k is None or len(op.inputs) <= k or op.inputs[k] not in inputs or not op.outputs:
            continue
        t, shape = graph.tensors[op.inputs[k]], graph.tensors[op.outputs[0]].shape
        if t.dtype in ("int32", "int64") and t.num_elements == len(shape):
            out[t.name] = np.asarray(shape, dtype=t.dtype).reshape(t.shape)
    return out


def random_inputs(details, rng: np.random.Generator, fixed: dict | None = None) -> list[np.ndarray]:
    """One tensor per input detail (a dict with "shape" and "dtype", as LiteRT and TFLite Micro
    describe their inputs), in order; `fixed` (name -> value, `shape_operand_values`) where given."""
    fixed = fixed or {}
    return [np.array(fixed[d["name"]]) if d.get("name") in fixed else random_tensor(rng, d["shape"], d["dtype"])
            for d in details]


def seeded_inputs(details, seed: int = 0, fixed: dict | None = None) -> list[np.ndarray]:
    return random_inputs(details, np.random.default_rng(seed), fixed)


def input_stream(specs, n: int, seed: int = 0, fixed: dict | None = None) -> list[dict[str, np.ndarray]]:
    """`n` dicts name -> array for `specs` = [(name, shape, dtype)], reproducible from `seed`;
    `fixed` (name -> value) for the inputs read as shapes."""
    rng = np.random.default_rng(seed)
    fixed = fixed or {}
    return [{name: np.array(fixed[name]) if name in fixed else random_tensor(rng, shape, dtype)
             for name, shape, dtype in specs} for _ in range(n)]
