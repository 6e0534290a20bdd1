"""The one random-input generator: the same seed gives the same tensors to every runtime, backend,
verification and test.

Distribution (the one compile --verify and rewrite's verification have always used): 8- and
16-bit integers over their full range (quantized activations), wider integers 0..8 (they are
indices and sizes, which a full range would send out of bounds), floats N(0, 1), booleans 0/1,
anything else zeros. Dynamic dimensions (-1) become 1.
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


def random_inputs(details, rng: np.random.Generator) -> list[np.ndarray]:
    """One tensor per input detail (a dict with "shape" and "dtype", as LiteRT and TFLite Micro
    describe their inputs), in order."""
    return [random_tensor(rng, d["shape"], d["dtype"]) for d in details]


def seeded_inputs(details, seed: int = 0) -> list[np.ndarray]:
    return random_inputs(details, np.random.default_rng(seed))


def input_stream(specs, n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """`n` dicts name -> array for `specs` = [(name, shape, dtype)], reproducible from `seed`."""
    rng = np.random.default_rng(seed)
    return [{name: random_tensor(rng, shape, dtype) for name, shape, dtype in specs} for _ in range(n)]
