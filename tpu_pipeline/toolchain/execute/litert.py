"""LiteRT on the host: the one place a LiteRT interpreter is built, and running it.

Two resolvers: `builtin_only=True` (the default) is LiteRT's builtin kernels without default
delegates, deterministic, what every verification and calibration uses; `builtin_only=False` is
LiteRT's default resolver (XNNPACK included), what a user's interpreter runs, used for host
latency and for the load check. Delegates (the Edge TPU) are passed in by the caller.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tpu_pipeline.toolchain.errors import ModelError

# A model that picks our harness's kernels per op (tpu_pipeline.toolchain.ir.kernels) names them as custom ops.
HARNESS_KERNEL_MARK = b"TPUP_"
# ... and an offline plan with an input outside the arena holds this word (tflite.metadata.EXTERNAL).
EXTERNAL_MARK = (-2).to_bytes(4, "little", signed=True)


def host_view(data: bytes) -> bytes:
    """What a host runtime runs for `data`: the model itself, or, where it picks harness kernels
    per op or keeps inputs outside the arena, the same graph on the builtin kernels (which compute
    the same results) with the arena plan a stock runtime can follow."""
    if HARNESS_KERNEL_MARK not in data and EXTERNAL_MARK not in data:
        return data
    from tpu_pipeline.toolchain.ir.convert import builtin_view_bytes

    return builtin_view_bytes(data)


# what LiteRT raises for a model it cannot build or prepare (its C++ errors surface as these)
LOAD_ERRORS = (RuntimeError, ValueError, TypeError, MemoryError, OverflowError)


def new_interpreter(model: bytes | str | Path, *, builtin_only: bool = True, delegates=None,
                    preserve: bool = False, num_threads: int | None = 1):
    """An interpreter for `model` (bytes, or a path LiteRT reads itself) with its tensors
    allocated. LiteRT's own exception when it cannot build or prepare one."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    if isinstance(model, (str, Path)) and HARNESS_KERNEL_MARK in Path(model).read_bytes():
        model = Path(model).read_bytes()
    if isinstance(model, (str, Path)):
        kwargs: dict = {"model_path": str(model)}
    else:
        kwargs = {"model_content": host_view(bytes(model))}
    if builtin_only:
        kwargs["experimental_op_resolver_type"] = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    if delegates:
        kwargs["experimental_delegates"] = list(delegates)
    if preserve:
        kwargs["experimental_preserve_all_tensors"] = True
    if num_threads is not None:
        kwargs["num_threads"] = num_threads
    it = Interpreter(**kwargs)
    it.allocate_tensors()
    return it


def litert_interpreter(model: bytes | str | Path, *, label: str | None = None, **options):
    """`new_interpreter(model, **options)`, or ModelError (one line; naming `label` when given)."""
    try:
        return new_interpreter(model, **options)
    except (RuntimeError, ValueError) as exc:
        if label is not None:
            raise ModelError(f"{label}: LiteRT cannot load it ({' '.join(str(exc).split())[:200]})") from None
        raise ModelError(f"LiteRT cannot load the model: {str(exc).splitlines()[0] if str(exc) else exc}") from None


def litert_load_error(model: bytes | str | Path, **options) -> str | None:
    """None if LiteRT builds and prepares an interpreter for `model`, else its error message."""
    try:
        new_interpreter(model, **options)
    except LOAD_ERRORS as exc:
        return str(exc) or type(exc).__name__
    return None


def input_details(model: bytes | str | Path) -> list[dict]:
    return litert_interpreter(model).get_input_details()


def run_positional(it, inputs) -> list[np.ndarray]:
    """One invocation of interpreter `it`, inputs and outputs in the model's order."""
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def run_named(it, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One invocation of interpreter `it`, inputs and outputs matched by tensor name; KeyError
    names an input `feeds` lacks."""
    for d in it.get_input_details():
        it.set_tensor(d["index"], feeds[d["name"]])
    it.invoke()
    return {d["name"]: it.get_tensor(d["index"]).copy() for d in it.get_output_details()}


def run_litert(model: bytes | str | Path, inputs, tensors=()) -> tuple[list[np.ndarray], dict]:
    """Outputs (in the model's output order) and the values of `tensors` (indices) after one run
    with LiteRT's builtin kernels."""
    it = litert_interpreter(model, preserve=bool(tensors))
    outs = run_positional(it, inputs)
    return outs, {t: it.get_tensor(t).copy() for t in tensors}


def seeded_outputs(model: bytes | str | Path, seed: int = 0) -> list[np.ndarray]:
    """Outputs of one run with LiteRT's builtin kernels on `seeded_inputs(..., seed)`."""
    from tpu_pipeline.toolchain.execute.inputs import seeded_inputs

    it = litert_interpreter(model)
    return run_positional(it, seeded_inputs(it.get_input_details(), seed))
