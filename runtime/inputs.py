"""Deterministic test inputs: the same seed gives the same tensors on every backend."""

from __future__ import annotations

import numpy as np


def random_tensor(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    if dtype.kind == "f":
        return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = max(info.min, -128), min(info.max, 255 if dtype.kind == "u" else 127)
        return rng.integers(lo, hi + 1, size=shape, dtype=np.int64).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    raise ValueError(f"cannot make inputs of type {dtype}")


def input_stream(specs, n: int, seed: int = 0):
    """`n` dicts name -> array for `specs` = [(name, shape, dtype)], reproducible from `seed`."""
    rng = np.random.default_rng(seed)
    return [{name: random_tensor(rng, shape, dtype) for name, shape, dtype in specs} for _ in range(n)]
