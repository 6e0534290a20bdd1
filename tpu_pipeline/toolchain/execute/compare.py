"""Comparing runs: one model against another on the same random inputs, runtime by runtime, and
segments chained by tensor name against the whole model.

Policy (docs/rewrite.md):
- integer outputs must be bit-exact, unless the change was knowingly lossy (`lossy_ok`), in
  which case the worst deviation in output LSBs is measured and reported;
- float outputs must agree within FLOAT_RTOL x max(1, max |original output|): the rewrites only
  re-associate sums, each rewritten op's error is bounded by 2(K+n)u times the sum of |x||w|
  (K products per output element, n partial sums, u = 2^-24), and this tolerance leaves room for
  its propagation through the layers after it.
Outputs of one runtime are only ever compared with outputs of the same runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpu_pipeline.toolchain.errors import ModelError, VerificationError
from tpu_pipeline.toolchain.execute.child import call_in_child, start_in_child
from tpu_pipeline.toolchain.execute.inputs import random_inputs, shape_operand_values
from tpu_pipeline.toolchain.execute.litert import input_details, litert_interpreter, run_litert, run_named
from tpu_pipeline.toolchain.execute.tflm import run_tflm

FLOAT_RTOL = 1e-4


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Largest |a - b| (in output units: LSBs for integer tensors); 0 for empty tensors."""
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


@dataclass(frozen=True)
class OutputCheck:
    index: int
    dtype: str
    max_abs: float  # worst |rewritten - original| (in output units: LSBs for integer outputs)
    tolerance: float
    ok: bool

    def to_json(self):
        return dict(self.__dict__)


@dataclass(frozen=True)
class Verification:
    runtime: str  # litert | tflm
    runs: int
    outputs: tuple  # OutputCheck per model output
    skipped: str = ""  # why this runtime could not run the models, if it could not

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    @property
    def bit_exact(self) -> bool:
        return bool(self.outputs) and all(o.max_abs == 0 for o in self.outputs)

    @property
    def max_deviation_lsb(self) -> int | None:
        ints = [o.max_abs for o in self.outputs if o.dtype not in ("float32", "float16", "float64")]
        return int(max(ints)) if ints else None

    def to_json(self):
        return {"runtime": self.runtime, "runs": self.runs, "ok": self.ok, "bit_exact": self.bit_exact,
                "max_deviation_lsb": self.max_deviation_lsb, "skipped": self.skipped,
                "outputs": [o.to_json() for o in self.outputs]}


def compare_outputs(a_list, b_list, lossy_ok: bool = False) -> list[OutputCheck]:
    """Output by output (by position): `a_list` is the reference. Integers exact (any deviation
    allowed but measured when `lossy_ok`), floats within FLOAT_RTOL."""
    checks = []
    for i, (a, b) in enumerate(zip(a_list, b_list)):
        if a.shape != b.shape:
            checks.append(OutputCheck(i, str(a.dtype), float("inf"), 0.0, False))
            continue
        diff = max_abs_diff(a, b)
        if a.dtype.kind == "f":
            tol = FLOAT_RTOL * max(1.0, float(np.max(np.abs(a))) if a.size else 1.0)
            checks.append(OutputCheck(i, str(a.dtype), diff, tol, bool(diff <= tol)))
        else:
            checks.append(OutputCheck(i, str(a.dtype), diff, float("inf") if lossy_ok else 0.0,
                                      bool(lossy_ok or diff == 0)))
    if len(a_list) != len(b_list):
        checks.append(OutputCheck(len(checks), "-", float("inf"), 0.0, False))
    return checks


def compare_named(outputs: list[dict], reference: list[dict]) -> tuple[bool, float]:
    """(bit-exact?, largest absolute difference) over every tensor of every run, matched by
    name; a missing tensor or another shape is (False, inf)."""
    exact, worst = True, 0.0
    for got, want in zip(outputs, reference):
        for name, w in want.items():
            g = got.get(name)
            if g is None or g.shape != w.shape:
                return False, float("inf")
            if not np.array_equal(g, w):
                exact = False
                worst = max(worst, max_abs_diff(g, w))
    return exact, worst


RUNTIME_NAMES = {"litert": "LiteRT", "tflm": "TFLite Micro"}

# A model this large takes seconds per TFLite Micro run (reference kernels; VGG16: 17 s): the
# original's runs then go to a child process, next to the rewritten model's runs here.
SIDE_BY_SIDE_BYTES = 8 * 1024 * 1024


def verify_models(original: bytes, rewritten: bytes, runs: int = 3, seed: int = 0,
                  runtimes=("litert", "tflm"), lossy_ok: bool = False,
                  tflm_arena_size: int = 64 * 1024 * 1024, side_by_side: bool | None = None) -> list[Verification]:
    """Run both models on `runs` random inputs in each runtime and compare the outputs.
    `side_by_side`: TFLite Micro runs the original in a child process meanwhile (default: for
    models of SIDE_BY_SIDE_BYTES and more)."""
    rng = np.random.default_rng(seed)
    details = _input_details(original)
    fixed = shape_operand_values(original)
    inputs = [random_inputs(details, rng, fixed) for _ in range(runs)]
    if side_by_side is None:
        side_by_side = len(original) >= SIDE_BY_SIDE_BYTES
    results = []
    # each runtime in a child of its own, all started at once (they run side by side on a
    # multi-core host), collected in order: one that crashes on the model skips its check, named
    calls = [(rt, start_in_child(_output_pairs, rt, original, rewritten, inputs, tflm_arena_size, side_by_side,
                                 runtime=RUNTIME_NAMES[rt], doing="running the model")) for rt in runtimes]
    for rt, call in calls:
        seen: dict[int, list] = {}
        try:
            pairs = call.result()
            for want, got in pairs:
                for c in compare_outputs(want, got, lossy_ok):
                    seen.setdefault(c.index, []).append(c)
        except ModelError as exc:
            results.append(Verification(rt, 0, (), skipped=str(exc)))
            continue
        checks = tuple(OutputCheck(i, cs[0].dtype, max(c.max_abs for c in cs), min(c.tolerance for c in cs),
                                   all(c.ok for c in cs)) for i, cs in sorted(seen.items()))
        results.append(Verification(rt, runs, checks))
    return results


def _input_details(model: bytes) -> list[dict]:
    """The inputs as LiteRT describes them, or as TFLite Micro does for a model LiteRT refuses
    (the runtime LiteRT refuses is then reported as skipped by `verify_models`)."""
    try:
        return input_details(model)
    except ModelError:
        from tpu_pipeline.toolchain.execute.tflm import io_details, tflm_interpreter

        def details(data):
            return io_details(tflm_interpreter(data, 64 * 1024 * 1024), "input", data)

        return call_in_child(details, model, runtime="TFLite Micro", doing="loading the model")


def _output_pairs(rt: str, original: bytes, rewritten: bytes, inputs, arena_size: int, side_by_side: bool):
    """(original's outputs, rewritten's outputs) per input set, in runtime `rt`."""
    if rt == "litert":
        return [(run_litert(original, x)[0], run_litert(rewritten, x)[0]) for x in inputs]
    if not side_by_side:
        return [(run_tflm(original, x, arena_size=arena_size), run_tflm(rewritten, x, arena_size=arena_size))
                for x in inputs]
    from concurrent.futures import ThreadPoolExecutor

    from tpu_pipeline.toolchain.execute.tflm import run_tflm_sets_in_child

    with ThreadPoolExecutor(max_workers=1) as pool:  # the thread only waits for the child
        theirs = pool.submit(run_tflm_sets_in_child, original, inputs, arena_size)
        ours = [run_tflm(rewritten, x, arena_size=arena_size) for x in inputs]
        return list(zip(theirs.result(), ours))


def check_or_raise(results: list[Verification], label: str) -> None:
    """Raise VerificationError naming the first output that disagrees."""
    for v in results:
        for o in v.outputs:
            if not o.ok:
                raise VerificationError(
                    f"{label}: output {o.index} differs from the original in {v.runtime} "
                    f"(worst deviation {o.max_abs:g}, allowed {o.tolerance:g})")


# ---- Segments chained by tensor name ---------------------------------------------------------------

def _interpreter(data: bytes):
    try:
        return litert_interpreter(data)
    except ModelError as exc:
        raise VerificationError(str(exc)) from None


def _run(it, feeds: dict[str, np.ndarray], label: str) -> dict[str, np.ndarray]:
    missing = [d["name"] for d in it.get_input_details() if d["name"] not in feeds]
    if missing:
        raise VerificationError(f"segment input '{missing[0]}' is produced by no earlier segment")
    try:
        return run_named(it, feeds)
    except RuntimeError as exc:
        raise VerificationError(f"{label}: LiteRT failed to run it: {exc}") from None


def verify_chain(originals: list[tuple[str, bytes, str]], segments: list[bytes], samples: int = 2,
                 seed: int = 0, exact: bool = True) -> dict:
    """Run the original model(s) and the chained segments (tensors matched by name) on the same
    random inputs under LiteRT's builtin kernels; raise VerificationError unless every output is
    bit-identical (or, with `exact=False`, report the largest difference). `originals` holds
    (label, model bytes, tensor-name prefix). Runs in a child process: LiteRT crashing on the
    model raises RuntimeCrash (ModelError) instead of ending the caller."""
    return call_in_child(_verify_chain, originals, segments, samples, seed, exact, runtime="LiteRT",
                         doing="running the model and its segments")


def _verify_chain(originals, segments, samples, seed, exact) -> dict:
    rng = np.random.default_rng(seed)
    refs = [(label, _interpreter(data), prefix) for label, data, prefix in originals]
    shapes = {label: shape_operand_values(data) for label, data, _ in originals}
    segs = [_interpreter(s) for s in segments]
    compared = 0
    worst = 0.0
    for _ in range(samples):
        env: dict[str, np.ndarray] = {}
        expected: dict[str, np.ndarray] = {}
        for label, it, prefix in refs:
            details = it.get_input_details()
            feeds = {d["name"]: x for d, x in zip(details, random_inputs(details, rng, shapes[label]))}
            for name, arr in feeds.items():
                env[prefix + name] = arr
            expected.update({prefix + k: v for k, v in _run(it, feeds, label).items()})
        for k, it in enumerate(segs):
            env.update(_run(it, env, f"segment {k}"))
        for name, want in expected.items():
            if name not in env:
                raise VerificationError(f"output '{name}' is produced by no segment")
            got = env[name]
            if got.shape != want.shape or got.dtype != want.dtype:
                raise VerificationError(f"output '{name}': shape or type differs ({got.shape} {got.dtype} vs "
                                        f"{want.shape} {want.dtype})")
            if not np.array_equal(got, want):
                diff = max_abs_diff(got, want)
                if exact:
                    raise VerificationError(f"output '{name}': chained segments differ from the whole model "
                                            f"(max |diff| {diff:g})")
                worst = max(worst, diff)
            compared += 1
    return {"samples": samples, "outputs_compared": compared, "bit_identical": worst == 0.0,
            "max_abs_diff": worst, "runtime": "LiteRT builtin kernels (no default delegates)"}
