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


# ---- What TFLite Micro reads without having written it ------------------------------------------

def tflm_hazards(model) -> list[str]:
    """Reasons why TFLite Micro's outputs for `model` (a ModelT) can depend on memory its kernels
    never wrote, so that an op order or an arena plan that LiteRT runs bit-identically can change
    TFLite Micro's outputs. Empty when there is none. Two are known (tests/test_real_models.py
    reproduces both):

    - stored shapes that are placeholders (a dynamic-batch model: signature -1, stored 1, and
      LiteRT allocates e.g. 4 between SPACE_TO_BATCH_ND and BATCH_TO_SPACE_ND). TFLite Micro never
      recomputes shapes: BATCH_TO_SPACE_ND then writes a quarter of its output and the ops after
      it read whatever an earlier tensor left at those arena bytes. Fix: write the real shapes
      (`toolchain.tflite.extract.with_static_shapes`) before planning.
    - SPACE_TO_BATCH_ND with padding: TFLite Micro's kernel allocates its parameters in Init and
      never fills them in Prepare, so the pad value is the byte the arena's tail held (0 in a
      fresh arena, which is right only for float32 or a zero point of 0; LiteRT pads with the
      zero point). Nothing the toolchain writes can fix that inside the kernel.
    """
    from toolchain.ir.convert import opcode_name
    from toolchain.tflite.extract import stale_shapes

    out = []
    sg = model.subgraphs[0]
    try:
        stale = stale_shapes(model)
    except ModelError as exc:
        stale = {}
        out.append(f"cannot check the stored shapes: {exc}")
    if stale:
        t, (old, new) = next(iter(stale.items()))
        name = sg.tensors[t].name
        name = name.decode("utf-8", "replace") if isinstance(name, bytes) else name
        out.append(f"{len(stale)} tensor(s) are stored with placeholder shapes (e.g. '{name}' stored {list(old)}, "
                   f"allocated {list(new)} by LiteRT): TFLite Micro runs on the stored shapes, writes only part "
                   f"of such tensors and reads arena bytes nothing wrote")
    pads = []
    for op in sg.operators or []:
        if opcode_name(model, op.opcodeIndex)[0] != "SPACE_TO_BATCH_ND" or len(op.inputs) < 3:
            continue
        pt = sg.tensors[op.inputs[2]]
        buf = model.buffers[pt.buffer] if pt.buffer else None
        data = np.frombuffer(bytes(buf.data), dtype=np.int32) if buf is not None and buf.data is not None else None
        if data is None or np.any(data != 0):
            q = sg.tensors[op.outputs[0]].quantization
            zp = int(q.zeroPoint[0]) if q is not None and q.zeroPoint is not None and len(q.zeroPoint) else 0
            pads.append(zp)
    if pads:
        wrong = sum(1 for zp in pads if zp != 0)
        out.append(f"{len(pads)} SPACE_TO_BATCH_ND op(s) pad: TFLite Micro's kernel pads with an uninitialised "
                   f"byte from its arena (0 in a fresh arena)"
                   + (f"; {wrong} of them have a non-zero zero point, so even a fresh arena gives other "
                      f"outputs than LiteRT" if wrong else ""))
    return out
