"""Host time of each op alone in TFLite Micro: every op is cut out as a one-op model
(`tpu_pipeline.toolchain.tflite.extract.extract_segment`) and timed on random inputs. The sum differs from a
whole-model invoke (no shared caches, per-invoke overhead counted per op), but the ranking of
the slow ops is what a profile needs."""

from __future__ import annotations

import time

import numpy as np


def tflm_op_times(model_bytes: bytes, iterations: int = 3, arena_size: int = 64 * 1024 * 1024,
                  seed: int = 0, label: str | None = None) -> dict[int, float]:
    """{op position: median seconds}; ops TFLite Micro cannot run alone are left out.

    ModelError when the model has float16 tensors (TFLite Micro cannot run any of them)."""
    from tpu_pipeline.toolchain.execute.inputs import random_tensor
    from tpu_pipeline.toolchain.execute.litert import runtime_shapes
    from tpu_pipeline.toolchain.execute.tflm import tflm_interpreter
    from tpu_pipeline.toolchain.execute.tflm_arena import check_tflm_dtypes
    from tpu_pipeline.toolchain.ir import from_model
    from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model
    from tpu_pipeline.toolchain.tflite.extract import extract_segment

    model = read_model(model_bytes, name=label)
    check_tflm_dtypes(model, label)
    graph = from_model(model)
    rng = np.random.default_rng(seed)
    times: dict[int, float] = {}
    for i, op in enumerate(graph.ops):
        ins = [t for t in dict.fromkeys(op.inputs) if t >= 0 and graph.is_activation(t)]
        outs = [t for t in op.outputs if t >= 0]
        try:
            part = extract_segment(model, [i], ins, outs, real=runtime_shapes(model))
            one = tflm_interpreter(model_to_bytes(part), arena_size)
            for k in range(len(part.subgraphs[0].inputs)):
                d = one.get_input_details(k)
                one.set_input(random_tensor(rng, d["shape"], d["dtype"]), k)
        except Exception:  # noqa: BLE001 - this op cannot run alone in TFLite Micro: leave it out
            continue
        samples = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            one.invoke()
            samples.append(time.perf_counter() - t0)
        times[i] = float(np.median(samples))
    return times
