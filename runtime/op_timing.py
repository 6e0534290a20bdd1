"""Host time of each op alone in TFLite Micro: every op is cut out as a one-op model
(`toolchain.tflite.extract.extract_segment`) and timed on random inputs. The sum differs from a
whole-model invoke (no shared caches, per-invoke overhead counted per op), but the ranking of
the slow ops is what a profile needs."""

from __future__ import annotations

import time

import numpy as np

from runtime.inputs import random_tensor


def tflm_op_times(model_bytes: bytes, iterations: int = 3, arena_size: int = 64 * 1024 * 1024,
                  seed: int = 0) -> dict[int, float]:
    """{op position: median seconds}; ops TFLite Micro cannot run alone are left out."""
    from runtime.tflm import TflmModel
    from toolchain.errors import ToolchainError
    from toolchain.ir import from_model
    from toolchain.tflite import model_to_bytes, read_model
    from toolchain.tflite.extract import extract_segment

    model = read_model(model_bytes)
    graph = from_model(model)
    rng = np.random.default_rng(seed)
    times: dict[int, float] = {}
    for i, op in enumerate(graph.ops):
        ins = [t for t in dict.fromkeys(op.inputs) if t >= 0 and graph.is_activation(t)]
        outs = [t for t in op.outputs if t >= 0]
        try:
            one = TflmModel(model_to_bytes(extract_segment(model, [i], ins, outs)), arena_size, f"op {i}")
        except (ToolchainError, ValueError, RuntimeError):
            continue
        xs = [random_tensor(rng, shape, dt) for dt, shape in one.inputs]
        samples = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            one.run(xs)
            samples.append(time.perf_counter() - t0)
        times[i] = float(np.median(samples))
    return times
