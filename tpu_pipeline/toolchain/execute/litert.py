"""LiteRT on the host: the one place a LiteRT interpreter is built, and running it.

Two resolvers: `builtin_only=True` (the default) is LiteRT's builtin kernels without default
delegates, deterministic, what every verification and calibration uses; `builtin_only=False` is
LiteRT's default resolver (XNNPACK included), what a user's interpreter runs, used for host
latency and for the load check. Delegates (the Edge TPU) are passed in by the caller.
"""

from __future__ import annotations

import contextlib
import weakref
from pathlib import Path

import numpy as np

from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.execute.child import CORRUPT_INDEX, RuntimeCrash

# A model that picks our harness's kernels per op (tpu_pipeline.toolchain.ir.kernels) names them as custom ops.
HARNESS_KERNEL_MARK = b"TPUP_"
# ... and an offline plan with an input outside the arena holds this word (tflite.metadata.EXTERNAL).
EXTERNAL_MARK = (-2).to_bytes(4, "little", signed=True)


def host_view(data: bytes) -> bytes:
    """What a host runtime runs for `data`: the model itself, or, where it picks harness kernels
    per op or keeps inputs outside the arena, the same graph on the builtin kernels (which compute
    the same results) with the arena plan a stock runtime can follow."""
    return host_view_numbered(data)[0]


def host_view_numbered(data: bytes) -> tuple[bytes, dict[int, int] | None]:
    """`host_view`, and where each of `data`'s tensors is in it (None: the view is `data`):
    `tpu_pipeline.toolchain.ir.convert.builtin_view_numbered`."""
    if HARNESS_KERNEL_MARK not in data and EXTERNAL_MARK not in data:
        return data, None
    from tpu_pipeline.toolchain.ir.convert import builtin_view_numbered

    return builtin_view_numbered(data)


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
    refuse_overrunning_kernels(it)
    with _state_checked():
        for d, x in zip(it.get_input_details(), inputs):
            it.set_tensor(d["index"], x)
        it.invoke()
        return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def run_named(it, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One invocation of interpreter `it`, inputs and outputs matched by tensor name; KeyError
    names an input `feeds` lacks."""
    refuse_overrunning_kernels(it)
    with _state_checked():
        for d in it.get_input_details():
            it.set_tensor(d["index"], feeds[d["name"]])
        it.invoke()
        return {d["name"]: it.get_tensor(d["index"]).copy() for d in it.get_output_details()}


_SAFE: weakref.WeakSet = weakref.WeakSet()  # interpreters refuse_overrunning_kernels found safe


def refuse_overrunning_kernels(it) -> None:
    """RuntimeCrash, before anything runs, where one of LiteRT's kernels would write past a buffer.

    LiteRT's full-integer SVDF (int8 input) reads its time weights and its state as int16 and checks
    neither type; TFLite Micro also takes them as int8 (its keyword model has both so). On such an
    op LiteRT reads and writes twice the buffer: it segfaults, aborts in free(), hands out tensor
    indices out of its own range, or fails a later kernel's parameter check, differently run to run.
    Refused here, the answer is the same every run. An interpreter found safe is not asked again:
    its ops and their types are fixed when it is built."""
    if it in _SAFE:
        return
    details = getattr(it, "_get_op_details", None)
    nodes = getattr(getattr(it, "_interpreter", None), "NumNodes", None)
    if details is None or nodes is None:  # pragma: no cover - an interpreter without LiteRT's op introspection
        return
    for index in range(nodes()):
        try:
            op = details(index)
        except UnicodeDecodeError:  # a custom op's name that is not UTF-8 (LiteRT decodes it): not an SVDF
            continue
        types = op.get("operand_types") or []
        if op.get("op_name") == "SVDF" and len(types) == 5 and types[0] is np.int8:
            narrow = [role for role, t in (("time weights", types[2]), ("state", types[4])) if t is not np.int16]
            if narrow:
                raise RuntimeCrash(f"LiteRT would crash (its int8 SVDF kernel reads op {op['index']}'s int8 "
                                   f"{' and '.join(narrow)} as int16, past their end)", "LiteRT")
    _SAFE.add(it)


@contextlib.contextmanager
def _state_checked():
    """A run whose interpreter reports one of its own tensor indices out of range has corrupted
    its memory: that is a crash (RuntimeCrash), whichever way it shows this time."""
    try:
        yield
    except ValueError as exc:
        if CORRUPT_INDEX not in str(exc):
            raise
        raise RuntimeCrash(f"LiteRT crashed (it corrupted its own memory: {exc})", "LiteRT") from None


def run_litert(model: bytes | str | Path, inputs, tensors=()) -> tuple[list[np.ndarray], dict]:
    """Outputs (in the model's output order) and the values of `tensors` (indices) after one run
    with LiteRT's builtin kernels."""
    where = None
    if tensors:  # (indices of `model`'s tensors: a model on harness kernels runs as a view numbered apart)
        model, where = host_view_numbered(model if isinstance(model, bytes) else Path(model).read_bytes())
    it = litert_interpreter(model, preserve=bool(tensors))
    outs = run_positional(it, inputs)
    return outs, {t: it.get_tensor(t if where is None else where[t]).copy() for t in tensors}


def seeded_outputs(model: bytes | str | Path, seed: int = 0) -> list[np.ndarray]:
    """Outputs of one run with LiteRT's builtin kernels on `seeded_inputs(..., seed)`."""
    from tpu_pipeline.toolchain.execute.inputs import seeded_inputs

    it = litert_interpreter(model)
    return run_positional(it, seeded_inputs(it.get_input_details(), seed))


_SHAPES_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def runtime_shapes(model) -> dict[int, tuple[int, ...]]:
    """Shape of every tensor of the main subgraph of `model` (as read by tflite/) as LiteRT
    allocates it when it prepares the model at its stored input shapes (batch 1 for a dynamic-batch
    model); the stored shapes, without running anything, for a model with static shapes. Only
    tensors whose shape LiteRT reports are listed. Raises ModelError if LiteRT cannot prepare the
    model and the stored shapes are not all static (the real shapes are then unknown)."""
    from tpu_pipeline.toolchain.tflite.extract import needs_runtime_shapes, stored_shapes
    from tpu_pipeline.toolchain.tflite.io import model_to_bytes

    cached = _SHAPES_CACHE.get(model)
    if cached is not None:
        return cached
    if not needs_runtime_shapes(model):
        shapes = stored_shapes(model)
    else:
        count = len(model.subgraphs[0].tensors or [])
        try:
            got = _prepared_shapes(model_to_bytes(model))
            shapes = {i: v for i, v in got.items() if i < count}
        except (RuntimeError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            shapes = _shapes_before_custom_ops(model)
            if shapes is None:
                raise ModelError(f"the model has dynamic dimensions (shape signature -1) and LiteRT cannot prepare "
                                 f"it to find the real shapes ({first}); convert it with a static batch") from None
    try:
        _SHAPES_CACHE[model] = shapes
    except TypeError:  # pragma: no cover - a model object that is not weak-referenceable
        pass
    return shapes


def _prepared_shapes(data: bytes) -> dict[int, tuple[int, ...]]:
    """LiteRT's shapes, by `data`'s tensor indices: a model on harness kernels is prepared as its
    builtin view, whose tensors are numbered apart (read as `data`'s, a dynamic-batch model's
    requantization constants took activation shapes, and TFLite Micro refused the model)."""
    view, where = host_view_numbered(data)
    it = new_interpreter(view)
    got = {int(d["index"]): tuple(int(x) for x in d["shape"]) for d in it.get_tensor_details()}
    return got if where is None else {i: got[j] for i, j in where.items() if j in got}


def _shapes_before_custom_ops(model) -> dict | None:
    """Real shapes of the tensors up to the first custom op (LiteRT may have no kernel for it):
    the model cut to the ops not downstream of a custom op (`tflite.extract.cut_before_custom_ops`).
    Tensors from the custom ops on keep their stored shapes. None if that does not help."""
    from tpu_pipeline.toolchain.tflite.extract import cut_before_custom_ops, stored_shapes
    from tpu_pipeline.toolchain.tflite.io import model_to_bytes

    try:
        cut = cut_before_custom_ops(model)
        if cut is None:
            return None
        got = _prepared_shapes(model_to_bytes(cut[0]))
    except (RuntimeError, ValueError, ModelError):
        return None
    shapes = stored_shapes(model)
    shapes.update({cut[1][i]: v for i, v in got.items() if i < len(cut[1])})
    return shapes
