"""TFLite Micro on the host (its reference kernels): in this process, or in a child process when
its C++ side may abort or its stderr (file descriptor 2) must be read.

Outputs of TFLite Micro are only ever compared with outputs of TFLite Micro (FACTS.md: its
kernels can differ from LiteRT's by 1 LSB on int8 models).
"""

from __future__ import annotations

import functools

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from tpu_pipeline.toolchain.errors import InfeasibleError, ModelError

CHECKOUT = Path(__file__).resolve().parents[3]  # the checkout, so a child imports this same toolchain


def tflm_interpreter(data: bytes, arena_size: int):
    """TFLite Micro's interpreter over `data` with an arena of `arena_size` bytes (its own
    exception when it cannot allocate the model)."""
    import tflite_micro.python.tflite_micro.runtime as runtime  # TFLite Micro's module, not ours

    from tpu_pipeline.toolchain.execute.litert import host_view

    return runtime.Interpreter.from_bytes(host_view(bytes(data)), arena_size=int(arena_size))


@functools.lru_cache(maxsize=8)
def io_counts(data: bytes) -> tuple[int, int]:
    """(inputs, outputs) of the main subgraph. The binding has no count, and asking it for one
    past the end prints an error on the C++ side, so the count comes from the model itself: its
    two vectors read, not the whole model unpacked (a verification asks once per model and run)."""
    from tpu_pipeline.toolchain.tflite.io import main_io_counts

    return main_io_counts(bytes(data))


def io_details(interp, which: str, data: bytes) -> list[dict]:
    """Input ("input") or output ("output") details of a TFLite Micro interpreter over `data`."""
    n_in, n_out = io_counts(data)
    get = interp.get_input_details if which == "input" else interp.get_output_details
    return [get(i) for i in range(n_in if which == "input" else n_out)]


def run_tflm(data: bytes, inputs, arena_size: int = 32 * 1024 * 1024) -> list[np.ndarray]:
    """Outputs of one TFLite Micro run on `inputs` (by position); ModelError if it cannot run."""
    try:
        it = tflm_interpreter(data, arena_size)
        for i, x in enumerate(inputs):
            it.set_input(x, i)
        it.invoke()
        return [np.array(it.get_output(i)) for i in range(io_counts(data)[1])]
    except (RuntimeError, ValueError) as exc:
        raise ModelError(f"TFLite Micro cannot run the model: {str(exc).splitlines()[0] if str(exc) else exc}") from None


# Builtin ops whose TFLite Micro kernel reads arena bytes that nothing wrote, so that the model's
# outputs depend on what the arena held before. SPACE_TO_BATCH_ND, where it pads, pads with its
# SpaceToBatchParams.output_offset: Init takes the struct from the arena's persistent tail and no
# code ever sets it (the trees in shared/tflm; LiteRT pads with the output's zero point). A board
# boots with its arena zeroed (the harness firmware's is in .bss), and so is a fresh process's
# (glibc maps an arena this large anew), but a long-lived process may hand the interpreter heap
# memory it used before: such a model's host outputs then drift from run to run (valgrind:
# "uninitialised value ... created by operator new[] in InterpreterWrapper"). Every command that
# writes a model (export-mcu too) replaces its padding by an explicit PAD (tflite.extract.
# runtime_exact_model); a model run as given keeps it.
ARENA_DEPENDENT_OPS = {
    "SPACE_TO_BATCH_ND": "TFLite Micro's SPACE_TO_BATCH_ND pads with a value its kernel never sets (whatever its "
                         "arena held: zero on a board that boots with a zeroed arena)",
}


def reference_outputs(host: "TflmModel", data: bytes, input_sets) -> list[list[np.ndarray]]:
    """Host TFLite Micro's outputs for each input set (each a list by position), as a board that
    boots with a zeroed arena computes them: by `host` in this process, or, for a model with an op
    of ARENA_DEPENDENT_OPS, in a fresh child process, whose arena starts zeroed too."""
    if host.arena_dependent:
        return run_tflm_sets_in_child(data, input_sets)
    return [host.run(x) for x in input_sets]


class TflmModel:
    """A TFLite Micro interpreter over `model_bytes` with an arena of `arena_size` bytes, as an
    MCU would run it.

    Raises InfeasibleError when the model does not fit the arena, ModelError when TFLM cannot
    run it at all (an unsupported op, say)."""

    def __init__(self, model_bytes: bytes, arena_size: int, label: str = "model"):
        try:
            self._interp = tflm_interpreter(model_bytes, arena_size)
        except RuntimeError as exc:
            text = " ".join(str(exc).split())
            if "allocate" in text.lower() or "memory" in text.lower():
                raise InfeasibleError(f"{label}: does not fit a {arena_size:,}-byte TFLite Micro arena ({text[:160]})") from None
            raise ModelError(f"{label}: TFLite Micro cannot load it ({text[:160]})") from None
        from tpu_pipeline.toolchain.ir import from_model
        from tpu_pipeline.toolchain.tflite import read_model

        from tpu_pipeline.toolchain.tflite.extract import padding_space_to_batch_zero_points

        model = read_model(bytes(model_bytes), name=label)
        graph = from_model(model)
        self.input_names = tuple(graph.tensors[t].name for t in graph.inputs)
        # what of ARENA_DEPENDENT_OPS the model runs in the form that reads unwritten bytes: its
        # outputs then depend on the arena's past (a model export-mcu wrote has none)
        self.arena_dependent = ["SPACE_TO_BATCH_ND"] if padding_space_to_batch_zero_points(model) else []
        self.output_names = tuple(graph.tensors[t].name for t in graph.outputs)
        def spec(d):
            return np.dtype(d["dtype"]), tuple(int(x) for x in d["shape"])

        # (dtype, shape) of each input and output, in the model's order
        self.inputs = [spec(self._interp.get_input_details(i)) for i in range(len(graph.inputs))]
        self.outputs = [spec(self._interp.get_output_details(i)) for i in range(len(graph.outputs))]

    def input_sets(self, data: bytes, n: int, seed: int) -> list[list[np.ndarray]]:
        """`n` input sets for this model (`data`: its bytes), each a list by position, reproducible
        from `seed` (execute.inputs.input_stream; inputs read as shapes get their own values)."""
        from tpu_pipeline.toolchain.execute.inputs import input_stream, shape_operand_values

        specs = [(name, shape, dt) for name, (dt, shape) in zip(self.input_names, self.inputs)]
        stream = input_stream(specs, n, seed, shape_operand_values(data))
        return [[x[name] for name in self.input_names] for x in stream]

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        for k, x in enumerate(inputs):
            dtype, shape = self.inputs[k]
            self._interp.set_input(np.asarray(x, dtype=dtype).reshape(shape), k)
        self._interp.invoke()
        return [np.array(self._interp.get_output(k)) for k in range(len(self.outputs))]


def run_tflm_in_child(model: bytes | Path, inputs=None, seed: int = 0, arena_size: int = 64 * 1024 * 1024,
                      timeout: float = 300.0) -> list[np.ndarray]:
    """Outputs of TFLite Micro run in a child Python process (its C++ side may abort), on
    `inputs` or, when None, on `tpu_pipeline.toolchain.execute.inputs.random_inputs` for TFLite Micro's own
    input details from `seed`. ModelError with the child's last stderr line if it fails."""
    return _in_child(model, None if inputs is None else [inputs], seed, arena_size, timeout)[0]


def run_tflm_sets_in_child(model: bytes | Path, input_sets, arena_size: int = 64 * 1024 * 1024,
                           timeout: float = 1800.0) -> list[list[np.ndarray]]:
    """Outputs of TFLite Micro on each of `input_sets` (each a list by position), in one child
    process: what a check runs next to the process's own runs (a large model takes seconds per
    run in the reference kernels, and the machine has more than one core)."""
    return _in_child(model, list(input_sets), 0, arena_size, timeout)


def _in_child(model, input_sets, seed, arena_size, timeout) -> list[list[np.ndarray]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(model) if isinstance(model, (str, Path)) else Path(tmp) / "model.tflite"
        if not isinstance(model, (str, Path)):
            path.write_bytes(bytes(model))
        given = Path(tmp) / "inputs.npz"
        if input_sets is not None:
            np.savez(given, **{f"s{i}_{k}": x for i, xs in enumerate(input_sets) for k, x in enumerate(xs)})
        out = Path(tmp) / "outputs.npz"
        code = "import sys; from tpu_pipeline.toolchain.execute.tflm import _child; _child(*sys.argv[1:])"
        proc = subprocess.run([sys.executable, "-c", code, str(path.resolve()), str(given if input_sets is not None else ""),
                               str(seed), str(arena_size), str(out)],
                              capture_output=True, text=True, timeout=timeout, cwd=str(CHECKOUT))
        if proc.returncode != 0 or not out.exists():
            last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise ModelError(f"{path.name}: TFLite Micro failed in a child process ({last[:300]})")
        with np.load(out) as z:
            return _unpack_sets(z)


def _unpack_sets(z) -> list[list[np.ndarray]]:
    keys = sorted((tuple(int(p) for p in k[1:].split("_")), k) for k in z.files)
    sets: list[list[np.ndarray]] = [[] for _ in range(max((i for (i, _), _ in keys), default=-1) + 1)]
    for (i, _), k in keys:
        sets[i].append(z[k])
    return sets


def _child(path: str, given: str, seed: str, arena_size: str, out: str) -> None:
    """Runs in the child of `_in_child`: one run per input set (one seeded set when none given)."""
    from tpu_pipeline.toolchain.execute.inputs import seeded_inputs, shape_operand_values

    data = Path(path).read_bytes()
    if given:
        with np.load(given) as z:
            sets = _unpack_sets(z)
    else:
        sets = [seeded_inputs(io_details(tflm_interpreter(data, int(arena_size)), "input", data), int(seed),
                              shape_operand_values(data))]
    np.savez(out, **{f"s{i}_{k}": y for i, xs in enumerate(sets)
                     for k, y in enumerate(run_tflm(data, xs, int(arena_size)))})
