"""Check a rewritten model against its original: the same random inputs through LiteRT and through
TFLite Micro, outputs compared runtime by runtime.

Policy (docs/rewrite.md):
- integer outputs must be bit-exact, unless the rewrite was knowingly lossy (`lossy_ok`), in
  which case the worst deviation in output LSBs is measured and reported;
- float outputs must agree within FLOAT_RTOL x max(1, max |original output|): the splits only
  re-associate sums, each rewritten op's error is bounded by 2(K+n)u times the sum of |x||w|
  (K products per output element, n partial sums, u = 2^-24), and this tolerance leaves room for
  its propagation through the layers after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toolchain.errors import ModelError, VerificationError
from toolchain.rewrite.numerics import input_details, random_inputs, run_litert, run_tflm

FLOAT_RTOL = 1e-4


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


def _compare(a_list, b_list, lossy_ok):
    checks = []
    for i, (a, b) in enumerate(zip(a_list, b_list)):
        if a.shape != b.shape:
            checks.append(OutputCheck(i, str(a.dtype), float("inf"), 0.0, False))
            continue
        diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
        if a.dtype.kind == "f":
            tol = FLOAT_RTOL * max(1.0, float(np.max(np.abs(a))) if a.size else 1.0)
            checks.append(OutputCheck(i, str(a.dtype), diff, tol, bool(diff <= tol)))
        else:
            checks.append(OutputCheck(i, str(a.dtype), diff, float("inf") if lossy_ok else 0.0,
                                      bool(lossy_ok or diff == 0)))
    if len(a_list) != len(b_list):
        checks.append(OutputCheck(len(checks), "-", float("inf"), 0.0, False))
    return checks


def verify_models(original: bytes, rewritten: bytes, runs: int = 3, seed: int = 0,
                  runtimes=("litert", "tflm"), lossy_ok: bool = False,
                  tflm_arena_size: int = 64 * 1024 * 1024) -> list[Verification]:
    """Run both models on `runs` random inputs in each runtime and compare the outputs."""
    rng = np.random.default_rng(seed)
    details = input_details(original)
    inputs = [random_inputs(details, rng) for _ in range(runs)]
    results = []
    for rt in runtimes:
        run = (lambda d, x: run_litert(d, x)[0]) if rt == "litert" else \
            (lambda d, x: run_tflm(d, x, arena_size=tflm_arena_size))
        seen: dict[int, list] = {}
        try:
            for x in inputs:
                for c in _compare(run(original, x), run(rewritten, x), lossy_ok):
                    seen.setdefault(c.index, []).append(c)
        except ModelError as exc:
            results.append(Verification(rt, 0, (), skipped=str(exc)))
            continue
        checks = tuple(OutputCheck(i, cs[0].dtype, max(c.max_abs for c in cs), min(c.tolerance for c in cs),
                                   all(c.ok for c in cs)) for i, cs in sorted(seen.items()))
        results.append(Verification(rt, runs, checks))
    return results


def check_or_raise(results: list[Verification], label: str) -> None:
    """Raise VerificationError naming the first output that disagrees."""
    for v in results:
        for o in v.outputs:
            if not o.ok:
                raise VerificationError(
                    f"{label}: output {o.index} differs from the original in {v.runtime} "
                    f"(worst deviation {o.max_abs:g}, allowed {o.tolerance:g})")
