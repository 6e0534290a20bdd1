#!/usr/bin/env python3
"""Where a patch stage's instructions go, in QEMU: each stage against the same layers run whole, and
per kind of step.

    python tools/stage_profile.py FIT.tflite FAST.tflite              # every stage of FIT vs FAST's layers
    python tools/stage_profile.py FIT.tflite FAST.tflite --steps 0 28 # and stage ops 0, 28 per kind of step

FIT is a fit point with patch stages (`tpu-pipeline fit MODEL --budget B --device qemu-mps2-an386
--int8-io --input-outside-arena -o FIT.tflite`), FAST one without (`fit MODEL --device ...`). Both
run once on the emulated Cortex-M4F (CMSIS-NN kernel set, `-icount shift=0`, per-op instruction
counts). A stage's layers in FAST are the ops between its input and output tensors (by name).
`--steps`: for each kind of step of the stage's program (each layer's CONV calls, COPY_IN, SLICE,
PASTE, ADD, COPY_OUT) a copy of FIT without those steps runs too; what the stage loses is what
that kind takes (its outputs then differ: counts only), printed beside the layer run whole.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tpu_pipeline.toolchain.ir import stage as st  # noqa: E402
from tpu_pipeline.toolchain.ir.convert import from_model, to_model  # noqa: E402
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model  # noqa: E402

DEVICE = "qemu-mps2-an386"
STEP_NAMES = {st.COPY_IN: "copy in", st.SLICE: "slice", st.ADD: "add", st.COPY_OUT: "copy out", st.PASTE: "paste"}


def counts(path: Path) -> tuple[int, dict[int, int]]:
    """(instructions per inference, per op) of `path` in QEMU."""
    from tpu_pipeline.runtime.backends.qemu import run_on_qemu
    from tpu_pipeline.toolchain.device import kernel_set, load_device

    q = run_on_qemu(path, load_device(DEVICE), kernel_set("cmsis-nn"), iterations=1, quiet=True, timeout=3600)
    return q.instructions, {o["index"]: o["instructions"] for o in q.op_instructions}


def whole_layers(fit, i: int, fast) -> list[int]:
    """FAST's ops between stage op i's input and output tensors (by name), in order."""
    producer = {fast.tensors[t].name: j for j, op in enumerate(fast.ops) for t in op.outputs}
    src = fit.tensors[fit.ops[i].inputs[0]].name
    todo, seen = [producer[fit.tensors[fit.ops[i].outputs[0]].name]], set()
    while todo:
        j = todo.pop()
        if j not in seen:
            seen.add(j)
            todo += [producer[fast.tensors[t].name] for t in fast.ops[j].inputs
                     if t >= 0 and fast.tensors[t].name != src and fast.tensors[t].name in producer]
    return sorted(seen)


def step_kind(step: list[int]) -> str:
    return f"layer {step[1]}" if step[0] == st.CONV else STEP_NAMES[step[0]]


def without(model, graph, i: int, kind: str) -> bytes:
    """The model with stage op i's steps of `kind` dropped."""
    op = graph.ops[i]
    program = [w for step in st.steps(op.options) if step_kind(step) != kind for w in step]
    ops = list(graph.ops)
    ops[i] = dataclasses.replace(op, options=dataclasses.replace(op.options, program=tuple(program)))
    return model_to_bytes(to_model(dataclasses.replace(graph, ops=ops), model))


def profile(fit_path: Path, graph, i: int, measured: int, whole: list[int], fast, fast_ops: dict) -> None:
    model = read_model(fit_path.read_bytes())
    kinds: dict[str, int] = {}
    for step in st.steps(graph.ops[i].options):
        kinds[step_kind(step)] = kinds.get(step_kind(step), 0) + 1
    with tempfile.TemporaryDirectory() as tmp:
        for kind, n in kinds.items():
            path = Path(tmp) / "dropped.tflite"
            path.write_bytes(without(model, graph, i, kind))
            took = measured - counts(path)[1][i]
            line = f"  {kind:>9}: {n:5d} steps {took:>12,}"
            if kind.startswith("layer") and len(whole) == len(graph.ops[i].options.body.ops):
                j = whole[int(kind.split()[1])]  # (the body's layers in FAST's order)
                line += f"  whole {fast_ops[j]:>12,} ({fast.ops[j].opcode}) {100 * (took / fast_ops[j] - 1):+.1f} %"
            print(line, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("fit", type=Path)
    ap.add_argument("fast", type=Path)
    ap.add_argument("--steps", type=int, nargs="*", default=[], help="stage ops to profile per kind of step")
    args = ap.parse_args()
    fit, fast = (from_model(read_model(p.read_bytes())) for p in (args.fit, args.fast))
    (fit_total, fit_ops), (fast_total, fast_ops) = counts(args.fit), counts(args.fast)
    print(f"whole model: {fit_total:,} against {fast_total:,} ({100 * (fit_total / fast_total - 1):+.2f} %)")
    for i, op in enumerate(fit.ops):
        if not st.is_stage(op):
            continue
        whole = whole_layers(fit, i, fast)
        same = sum(fast_ops[j] for j in whole)
        print(f"op {i}: {op.options.grid[0]}x{op.options.grid[1]} stage, {len(op.options.body.ops)} layers: "
              f"{fit_ops[i]:,} against {same:,} whole ({100 * (fit_ops[i] / same - 1):+.1f} %)", flush=True)
        if i in args.steps:
            profile(args.fit, fit, i, fit_ops[i], whole, fast, fast_ops)
    return 0


if __name__ == "__main__":
    sys.exit(main())
