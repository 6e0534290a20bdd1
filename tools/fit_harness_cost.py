#!/usr/bin/env python3
"""Fit the cost of the harness's own kernels (tpu_pipeline.toolchain.ir.kernels, ir.stage) to QEMU instruction counts.

    python tools/fit_harness_cost.py --collect   # QEMU, both kernel sets (about 20 minutes, once)
    python tools/fit_harness_cost.py             # fit from the collected counts
    python tools/fit_harness_cost.py --report    # also docs/bench/harness_kernels.md (own kernels vs the set's)
    python tools/fit_harness_cost.py --held-out FIT.tflite:RUN.json ...  # stages of real models, predicted vs QEMU

The builtin kernels' coefficients come from tools/fit_mcu_cost.py. A harness convolution runs the
same kernel as its builtin (its own cost is the builtin's), except:
- overlapped (output over its input): one kernel call per output row into a ring, then a copy
  of each row: instructions = the builtin's + per_unit x output rows + per_output x output
  elements + overhead (the [K.overlap] table);
- a patch stage (square grids recomputing halos or streamed in 2-D, row stripes streamed): every call's rows
  priced by their layer's class rates (without the per-op overhead), its overlapped calls by [K.overlap], plus per_call x layer calls
  + per_row x the calls' output rows + per_copied x elements copied (tiles in and out, slices)
  (the [K.patch_stage] table: effective rates, see cost/mcu.py stage_instructions); a 2-D
  streamed stage's pastes (halo caches, assembled inputs) by per_pasted x elements + per_paste_row
  x rows, fitted apart on the 2-D stages with the table's other stage rates as they are.
Both are fitted here by non-negative least squares on models built from random weights
(tests/helpers/cnn_builder.py: no TensorFlow needed), measured on the emulated Cortex-M4F
(`-icount shift=0`). The tables are merged into tpu_pipeline/toolchain/data/mcu_cost.toml (written with tomli_w).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

MEASUREMENTS = REPO / "docs" / "bench" / "harness_ops.json"
TABLE = REPO / "tpu_pipeline" / "toolchain" / "data" / "mcu_cost.toml"
KERNEL_SETS = ("cmsis-nn", "reference")
SIZES = [(12, 8), (16, 16), (24, 8), (20, 24)]  # (H = W, channels) of the block's input
# (H = W, channels, window, stride): the fast depthwise kernel against the kernel set's
DW_SIZES = [(28, 48, 5, 1), (14, 96, 7, 1), (20, 64, 7, 2), (32, 40, 5, 2), (14, 64, 3, 1), (28, 32, 3, 1),
            (7, 96, 5, 1), (10, 44, 3, 2)]
# (H, W, channels, stride): the depthwise 3x3 kernel for narrow maps ("dw3") against "fast" and the kernel set's
DW3_SIZES = [(25, 5, 64, 1), (12, 12, 64, 1), (6, 6, 128, 1), (3, 3, 256, 1), (9, 7, 40, 1), (12, 12, 64, 2),
             (25, 5, 64, 2), (6, 6, 128, 2), (10, 4, 48, 2),
             # small maps at stride 1, where a channel's set-up weighs: the crossover with CMSIS-NN's 3x3 kernel
             (4, 4, 128, 1), (5, 5, 96, 1), (3, 3, 64, 1), (7, 7, 64, 1), (8, 8, 24, 1)]
SE_SIZES = [(28, 24), (14, 48), (7, 96), (20, 40), (10, 30)]  # (H = W, channels): TPUP_MEAN / TPUP_MUL
# (H = W, channels): a residual ADD on TPUP_ADD against the kernel set's ADD (4 x 4 x 8: below the table)
ADD_SIZES = [(28, 24), (14, 48), (20, 16), (10, 30), (6, 8), (4, 8)]
# (H = W, input channels, output channels, window, stride): the packed convolution against the kernel set's
FIRST_SIZES = [(64, 3, 16, 3, 2), (48, 3, 32, 3, 2), (40, 3, 8, 3, 1), (32, 1, 16, 3, 2), (30, 4, 16, 3, 2),
               (36, 3, 16, 5, 2),
               # more of each of its two speeds (cost/mcu.py: 3x3 over 3 channels streamed, the rest generic)
               (32, 3, 16, 3, 2), (24, 3, 24, 3, 1), (28, 2, 16, 3, 2), (20, 4, 8, 3, 1), (24, 3, 8, 5, 1)]
# (H = W, input channels, output channels, stride): the pointwise kernel against the kernel set's 1x1
PW_SIZES = [(40, 8, 48, 1), (20, 48, 16, 1), (20, 16, 48, 1), (10, 144, 24, 1), (10, 24, 144, 1), (5, 240, 40, 1),
            (5, 40, 240, 1), (3, 480, 96, 1), (14, 13, 27, 1), (16, 32, 64, 2)]
# (inputs, outputs, per-channel weights): TPUP_FULLY_CONNECTED against the kernel set's FULLY_CONNECTED
FC_SIZES = [(640, 128, False), (128, 128, False), (128, 8, False), (8, 128, False), (128, 640, False),
            (250, 64, True), (37, 29, False), (1024, 12, False)]
# (H = W, input channels, output channels, window, stride): the window kernel against the kernel set's
WIN_SIZES = [(32, 16, 16, 3, 1), (16, 32, 32, 3, 1), (8, 64, 64, 3, 1), (32, 16, 32, 3, 2), (16, 32, 64, 3, 2),
             (13, 8, 12, 3, 1), (14, 24, 24, 5, 1), (10, 12, 7, 3, 2)]
DEVICE = "qemu-mps2-an386"


def models():
    """(name, graph, model bytes) for every measured variant of each size: harness kernels as
    they are, overlapped, and the block as patch stages on two grids."""
    from helpers.cnn_builder import CnnBuilder

    from tpu_pipeline.toolchain.ir.convert import to_model
    from tpu_pipeline.toolchain.ir.kernels import OVERLAP, kernel_name, with_kernel
    from tpu_pipeline.toolchain.rewrite.fold_pad import fold_pads
    from tpu_pipeline.toolchain.rewrite.patch import checked_region, patch_regions
    from tpu_pipeline.toolchain.rewrite.patch_stage import build_stage, stage_refusal
    from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

    for h, c in SIZES:
        b = CnnBuilder(seed=h * 100 + c, spread=True)
        x = b.input((1, h, h, 3))
        s = b.conv(x, c, k=3, act="RELU6")
        e = b.conv(s, 3 * c, k=1, act="RELU6")
        d = b.dw(e, k=3, act="RELU6")
        p = b.conv(d, c, k=1)
        r = b.add(p, s)
        d5 = b.dw(b.pad(r, 2, 2, 2, 2), k=5, stride=2, padding="VALID", act="RELU6")
        out = b.conv(d5, c, k=1)
        src = b.model_bytes([out])
        g, _ = fold_pads(b.graph([out]), harness=True)
        convs = [i for i, op in enumerate(g.ops) if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D")]
        plain = with_kernel(g, convs, kernel_name())
        yield f"h{h}c{c}_plain", plain, model_to_bytes(to_model(plain, read_model(src)))
        over = with_kernel(plain, [i for i in convs if i not in (0,)], kernel_name(OVERLAP))
        yield f"h{h}c{c}_overlap", over, model_to_bytes(to_model(over, read_model(src)))
        regions = [rg for rg in patch_regions(plain) if rg.input == plain.tensors[plain.inputs[0]].name
                   and stage_refusal(plain, checked_region(plain, rg)[2]) is None]
        region = max(regions, key=lambda rg: len(rg.ops))
        tin, tout, positions = checked_region(plain, region)
        for grid in ((2, 2), (3, 3)):
            staged = build_stage(plain, tin, tout, positions, grid)
            yield f"h{h}c{c}_stage{grid[0]}", staged, model_to_bytes(to_model(staged, read_model(src)))
        for n in (2, 4):  # row stripes, streamed: nothing recomputed
            staged = build_stage(plain, tin, tout, positions, (n, 1))
            yield f"h{h}c{c}_stream{n}", staged, model_to_bytes(to_model(staged, read_model(src)))
        for grid in ((2, 2), (3, 3)):  # square grids streamed in 2-D: nothing recomputed (halo caches)
            staged = build_stage(plain, tin, tout, positions, grid, stream=True)
            yield f"h{h}c{c}_s2d{grid[0]}", staged, model_to_bytes(to_model(staged, read_model(src)))
    for h, c in SE_SIZES:
        yield f"se_h{h}c{c}", *_se_model(h, c)
    for h, c in ADD_SIZES:
        for harness in (True, False):
            yield f"add_h{h}c{c}_{'tpup' if harness else 'builtin'}", *_add_model(h, c, harness)
    for h, c, k, stride in DW_SIZES:
        for flags in (("fast",), ()):
            yield f"dw_h{h}c{c}k{k}s{stride}_{flags[0] if flags else 'cmsis'}", *_dw_model(h, c, k, stride, flags)
        if stride == 1:  # the same layer over its dying input: a call per row through a ring
            yield f"dw_h{h}c{c}k{k}s{stride}_fastring", *_dw_model(h, c, k, stride, ("fast", "overlap"))
    for h, w, c, stride in DW3_SIZES:
        for flags in (("dw3",), ("fast",), ()):
            yield _dw3_name(h, w, c, stride, flags), *_dw3_model(h, w, c, stride, flags)
    for h, cin, cout, k, stride in FIRST_SIZES:
        for flags in (("packed",), ()):
            yield (f"first_h{h}c{cin}o{cout}k{k}s{stride}_{flags[0] if flags else 'cmsis'}",
                   *_first_model(h, cin, cout, k, stride, flags))
    for h, c, k, stride in PW_SIZES:
        for flags in (("pointwise16",), ("pointwise",), ()):
            yield _pw_name(h, c, k, stride, flags), *_pw_model(h, c, k, stride, flags)
    for h, cin, cout, k, stride in WIN_SIZES:
        for flags in (("window",), ()):
            yield _win_name(h, cin, cout, k, stride, flags), *_win_model(h, cin, cout, k, stride, flags)
    for n, m, per_channel in FC_SIZES:
        for harness in (True, False):
            yield _fc_name(n, m, per_channel, harness), *_fc_model(n, m, per_channel, harness)


def _win_name(h: int, cin: int, cout: int, k: int, stride: int, flags: tuple) -> str:
    return f"win_h{h}c{cin}o{cout}k{k}s{stride}_{flags[0] if flags else 'cmsis'}"


def _win_model(h: int, cin: int, cout: int, k: int, stride: int, flags: tuple):
    """(graph, bytes): one convolution (SAME, ReLU) on the window kernel or on the kernel set's (CMSIS-NN's
    im2col kernel)."""
    from helpers.cnn_builder import CnnBuilder

    from tpu_pipeline.toolchain.ir.convert import to_model
    from tpu_pipeline.toolchain.ir.kernels import kernel_name, with_kernel
    from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

    b = CnnBuilder(seed=h * 1000 + cin * 10 + cout + k, spread=True)
    out = b.conv(b.input((1, h, h, cin)), cout, k=k, stride=stride, act="RELU")
    src = b.model_bytes([out])
    g = with_kernel(b.graph([out]), [0], kernel_name(*flags))
    return g, model_to_bytes(to_model(g, read_model(src)))


def _fc_name(n: int, m: int, per_channel: bool, harness: bool) -> str:
    return f"fc_n{n}m{m}{'pc' if per_channel else ''}_{'tpup' if harness else 'builtin'}"


def _fc_model(n: int, m: int, per_channel: bool, harness: bool):
    """(graph, bytes): one fully connected layer (ReLU) on TPUP_FULLY_CONNECTED or on the kernel set's."""
    from helpers.cnn_builder import CnnBuilder

    from tpu_pipeline.toolchain.ir.convert import to_model
    from tpu_pipeline.toolchain.ir.kernels import kernel_name, with_kernel
    from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

    b = CnnBuilder(seed=n * 7 + m, spread=True)
    out = b.fc(b.input((1, n)), m, act="RELU", per_channel=per_channel)
    src = b.model_bytes([out])
    g = with_kernel(b.graph([out]), [0], kernel_name()) if harness else b.graph([out])
    return g, model_to_bytes(to_model(g, read_model(src)))


def _pw_name(h: int, cin: int, cout: int, stride: int, flags: tuple) -> str:
    return f"pw_h{h}c{cin}k{cout}s{stride}_{flags[0] if flags else 'cmsis'}"


def _pw_model(h: int, cin: int, cout: int, stride: int, flags: tuple):
    """(graph, bytes): one 1x1 convolution (an expansion with ReLU6, or a projection without) on the
    harness's own kernels ("pointwise", "pointwise16") or on the kernel set's (CMSIS-NN's 1x1 kernel)."""
    from helpers.cnn_builder import CnnBuilder

    from tpu_pipeline.toolchain.ir.convert import to_model
    from tpu_pipeline.toolchain.ir.kernels import kernel_name, with_kernel
    from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

    b = CnnBuilder(seed=h * 1000 + cin + cout, spread=True)
    x = b.input((1, h, h, cin))
    out = b.conv(x, cout, k=1, stride=stride, act="RELU6" if cout > cin else "NONE")
    src = b.model_bytes([out])
    g = with_kernel(b.graph([out]), [0], kernel_name(*flags))
    return g, model_to_bytes(to_model(g, read_model(src)))


def _dw_model(h: int, c: int, k: int, stride: int, flags: tuple):
    """(graph, bytes): one depthwise convolution on the harness's own kernel ("fast") or on the
    kernel set's (CMSIS-NN's "opt" or 3x3 kernel): the same layer, for the fit and the comparison."""
    from helpers.cnn_builder import CnnBuilder

    from tpu_pipeline.toolchain.ir.convert import to_model
    from tpu_pipeline.toolchain.ir.kernels import kernel_name, with_kernel
    from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

    b = CnnBuilder(seed=h * 1000 + c + k, spread=True)
    x = b.input((1, h, h, 8))
    e = b.conv(x, c, k=1, act="RELU6")
    out = b.dw(e, k=k, stride=stride, act="RELU6")
    src = b.model_bytes([out])
    g = b.graph([out])
    g = with_kernel(with_kernel(g, [0], kernel_name()), [1], kernel_name(*flags))
    return g, model_to_bytes(to_model(g, read_model(src)))


def _dw3_name(h: int, w: int, c: int, stride: int, flags: tuple) -> str:
    return f"dw3_h{h}w{w}c{c}s{stride}_{flags[0] if flags else 'cmsis'}"


def _dw3_model(h: int, w: int, c: int, stride: int, flags: tuple):
    """(graph, bytes): one 3x3 depthwise convolution (RELU6) on a narrow map, on "dw3", "fast" or the
    kernel set's kernel: the same layer, for the fit and the comparison."""
    from helpers.cnn_builder import CnnBuilder

    from tpu_pipeline.toolchain.ir.convert import to_model
    from tpu_pipeline.toolchain.ir.kernels import kernel_name, with_kernel
    from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

    b = CnnBuilder(seed=h * 1000 + w * 10 + c + stride, spread=True)
    x = b.input((1, h, w, 8))
    e = b.conv(x, c, k=1, act="RELU6")
    out = b.dw(e, k=3, stride=stride, act="RELU6")
    src = b.model_bytes([out])
    g = b.graph([out])
    g = with_kernel(with_kernel(g, [0], kernel_name()), [1], kernel_name(*flags))
    return g, model_to_bytes(to_model(g, read_model(src)))


def _first_model(h: int, cin: int, cout: int, k: int, stride: int, flags: tuple):
    """(graph, bytes): a first layer (few input channels, RELU6 quantized as converters write it, its
    clamp the whole int8 range) on the packed kernel or on the kernel set's (CMSIS-NN's im2col
    kernel), then a 1x1 convolution on the kernel set's."""
    from helpers.cnn_builder import CnnBuilder

    from tpu_pipeline.toolchain.ir.convert import to_model
    from tpu_pipeline.toolchain.ir.kernels import kernel_name, with_kernel
    from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

    b = CnnBuilder(seed=h * 1000 + cin * 10 + k, spread=True)
    x = b.input((1, h, h, cin))
    first = b.conv(x, cout, k=k, stride=stride, act="RELU6")
    q = b.tensors[first].quant  # as converters write a first layer's ReLU6: zero point -128, scale 6/255
    b.tensors[first] = dataclasses.replace(b.tensors[first], quant=dataclasses.replace(q, scale=(6 / 255,),
                                                                                        zero_point=(-128,)))
    out = b.conv(first, 8, k=1)
    src = b.model_bytes([out])
    g = b.graph([out])
    g = with_kernel(with_kernel(g, [1], kernel_name()), [0], kernel_name(*flags))
    return g, model_to_bytes(to_model(g, read_model(src)))


def _se_model(h: int, c: int):
    """(graph, bytes): squeeze-and-excitation on TPUP_MEAN / TPUP_MUL, as MCUNetV2 writes it (MEAN
    over W then H, a scalar MUL, the broadcast scaling) and as MobileNetV3 does (MEAN over H and W)."""
    from helpers.cnn_builder import CnnBuilder

    from tpu_pipeline.toolchain.ir.convert import to_model
    from tpu_pipeline.toolchain.ir.kernels import MEAN_MUL, kernel_name, with_kernel
    from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

    b = CnnBuilder(seed=h * 1000 + c, spread=True)
    x = b.input((1, h, h, c))
    d = b.conv(x, c, k=1, act="RELU6")
    s = b.conv(b.mean(b.mean(d, axes=(2,), scale=0.03), axes=(1,), scale=0.02), c, k=1)
    k = b._tensor((1,), "int8", quant=b.tensors[s].quant, values=[60])
    y = b.mul(d, b.mul(s, k))
    g2 = b.conv(b.mean(y, axes=(1, 2), scale=0.04), c, k=1)
    out = b.mul(y, g2)
    src = b.model_bytes([out])
    g = b.graph([out])
    g = with_kernel(g, [i for i, op in enumerate(g.ops) if op.opcode in MEAN_MUL], kernel_name())
    return g, model_to_bytes(to_model(g, read_model(src)))


def _add_model(h: int, c: int, harness: bool):
    """(graph, bytes): a residual ADD (RELU) of a 1x1 convolution's output and its input, the ADD
    on TPUP_ADD or on the kernel set's (the convolutions on the harness either way)."""
    from helpers.cnn_builder import CnnBuilder

    from tpu_pipeline.toolchain.ir.convert import to_model
    from tpu_pipeline.toolchain.ir.kernels import kernel_name, with_kernel
    from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

    b = CnnBuilder(seed=h * 1000 + c + 7, spread=True)
    a = b.conv(b.input((1, h, h, c)), c, k=1, act="RELU6")
    out = b.add(b.conv(a, c, k=1), a, act="RELU")
    src = b.model_bytes([out])
    g = b.graph([out])
    g = with_kernel(g, [i for i, op in enumerate(g.ops) if op.opcode == "CONV_2D" or harness], kernel_name())
    return g, model_to_bytes(to_model(g, read_model(src)))


def collect(out: Path, force: bool = False) -> dict:
    from tpu_pipeline.runtime.backends.qemu import run_on_qemu
    from tpu_pipeline.toolchain.device import kernel_set, load_device
    from tpu_pipeline.toolchain.errors import ToolchainError

    data = json.loads(out.read_text()) if out.exists() else {"runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, _, blob in models():
            path = Path(tmp) / f"{name}.tflite"
            path.write_bytes(blob)
            for kernels in KERNEL_SETS:
                key = f"{name}/{kernels}"
                compared = (name.endswith(("_cmsis", "_fastring"))
                            or (name.startswith("dw3_") and name.endswith("_fast")))
                if (key in data["runs"] and not force) or (compared and kernels != "cmsis-nn"):
                    continue  # (the kernel set's own depthwise, and "fast" beside dw3: comparisons, on CMSIS-NN only)
                t0 = time.time()
                try:
                    r = run_on_qemu(path, load_device(DEVICE), kernel_set(kernels), iterations=1, quiet=True, timeout=600)
                except ToolchainError as exc:
                    data["runs"][key] = {"error": str(exc)}
                    print(f"{key}: {exc}", flush=True)
                    continue
                data["runs"][key] = {"ops": [[o["index"], o["opcode"], o["instructions"]] for o in r.op_instructions],
                                     "outputs_match": r.outputs_match}
                print(f"{key}: {r.instructions:,} instructions, outputs match {r.outputs_match}, "
                      f"{time.time() - t0:.0f} s", flush=True)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


# The [K.patch_stage] rates, fitted together over every stage form (square grids recomputing,
# row stripes and square grids streamed): fitted apart, the forms' columns are near collinear
# and the rates came out degenerate (131 instructions per copied byte, stripes overpriced 1.5-3.7x).
STAGE_RATES = ("per_call", "per_row", "per_copied", "per_pasted", "per_paste_row")


def stage_base(op, table: dict) -> float:
    """What a stage's layers and rings cost at their own rates (cost/mcu.py stage_instructions
    without the [K.patch_stage] terms)."""
    from tpu_pipeline.toolchain.cost.mcu import stage_features

    f = stage_features(op, table)
    ring = table["overlap"]
    return f.layers + ring["per_unit"] * f.ring_rows + ring["per_output"] * f.ring_copied


def stage_columns(op, table: dict) -> list[float]:
    """The columns STAGE_RATES multiply: calls, their rows, elements copied, pasted, paste rows."""
    from tpu_pipeline.toolchain.cost.mcu import stage_features

    f = stage_features(op, table)
    return [f.calls, f.rows, f.copied, f.pasted, f.paste_rows]


def fit(data: dict) -> dict:
    """{kernels: {"overlap": coefficients, "patch_stage": coefficients}}."""
    import numpy as np

    from fit_mcu_cost import nnls
    from tpu_pipeline.toolchain.cost.mcu import fitted_table
    from tpu_pipeline.toolchain.ir import stage
    from tpu_pipeline.toolchain.memory.lifetimes import overlapped_ops

    graphs = {name: g for name, g, _ in models()}
    base = fitted_table()
    out: dict[str, dict] = {}
    for kernels in KERNEL_SETS:
        table = dict(base[kernels])
        out.setdefault(kernels, {}).update(_fit_own_ops(data, graphs, kernels))
        for cls in ("overlap", "patch_stage"):  # overlap first: a stage's overlapped tile calls are priced by it
            a, y, size = [], [], []  # size: what each op's residual is a share of
            for name, g in graphs.items():
                run = data["runs"].get(f"{name}/{kernels}", {})
                if not run.get("ops") or not run.get("outputs_match"):
                    continue
                plain = {i: n for i, _, n in data["runs"].get(f"{name.rsplit('_', 1)[0]}_plain/{kernels}", {})
                         .get("ops", [])}
                for i, _, measured in run["ops"]:
                    op = g.ops[i]
                    if cls == "patch_stage" and stage.is_stage(op):
                        a.append(stage_columns(op, table))
                        y.append(measured - stage_base(op, table))
                        size.append(measured)
                    elif cls == "overlap" and i in overlapped_ops(g) and i in plain:  # (legal: really over its input)
                        t = g.tensors[op.outputs[0]]
                        a.append([t.shape[1], t.num_elements, 1.0])
                        y.append(measured - plain[i])
                        size.append(measured - plain[i])
            if not a:
                continue
            a, y = np.array(a, dtype=float), np.array(y, dtype=float)
            w = 1.0 / np.maximum(np.abs(np.array(size, dtype=float)), 1.0)  # (relative errors)
            coef = [round(float(c), 4) for c in nnls(a * w[:, None], y * w)]
            names = STAGE_RATES if cls == "patch_stage" else ("per_unit", "per_output", "overhead")
            table[cls] = {**dict(zip(names, coef)), "ops": len(y)}
            out.setdefault(kernels, {})[cls] = table[cls]
    return out


# Classes whose kernel sets up each channel (or group of four) per call: dw3 widens a channel's map
# into its buffer and pairs its weights, "fast" widens and sums four channels' weights; on a 3 x 3
# map that outweighs their faster loops (CMSIS-NN's kernel won there). Their rows get a per_channel
# rate (a stage's layer pays it per call: cost/mcu.py stage_features).
PER_CHANNEL = ("tpup_depthwise_3x3", "tpup_depthwise_fast")


def _fit_own_ops(data: dict, graphs: dict, kernels: str) -> dict:
    """[K.tpup_mean], [K.tpup_mul], [K.tpup_depthwise_fast], ..., [K.tpup_fully_connected]: instructions = per_unit x work + per_output x outputs +
    overhead over the harness's own MEAN / MUL ops (cost/mcu.py op_features gives both)."""
    import numpy as np

    from fit_mcu_cost import nnls
    from tpu_pipeline.toolchain.cost.mcu import op_features

    rows: dict[str, tuple[list, list]] = {}
    OWN_CLASSES = ("tpup_mean", "tpup_mul", "tpup_add", "tpup_depthwise_fast", "tpup_conv_packed", "tpup_conv_packed_3x3c3",
                   "tpup_pointwise",
                   "tpup_pointwise16", "tpup_fully_connected", "tpup_conv_window", "tpup_depthwise_3x3")
    for name, g in graphs.items():
        run = data["runs"].get(f"{name}/{kernels}", {})
        if (not run.get("ops") or not run.get("outputs_match") or name.endswith(("_fastring", "_cmsis"))):
            continue  # (through a ring: [K.overlap] prices that; "fast" on DW3_SIZES is its data on small maps)
        for i, _, measured in run["ops"]:
            f = op_features(g, i)
            if f.fit_class in OWN_CLASSES:
                a, y = rows.setdefault(f.fit_class, ([], []))
                a.append([f.work, f.outputs, 1.0] + ([f.channels] if f.fit_class in PER_CHANNEL else []))
                y.append(measured)
    out = {}
    for cls, (a, y) in rows.items():
        a, y = np.array(a, dtype=float), np.array(y, dtype=float)
        w = 1.0 / np.maximum(np.abs(y), 1.0)
        coef = [round(float(c), 4) for c in nnls(a * w[:, None], y * w)]
        out[cls] = {**dict(zip(("per_unit", "per_output", "overhead", "per_channel"), coef)), "ops": len(y)}
    return out


def merge(tables: dict) -> None:
    """Merge the fitted tables into mcu_cost.toml, keeping its header comment."""
    import tomllib

    import tomli_w

    text = TABLE.read_text()
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    data = tomllib.loads(text)
    for kernels, classes in tables.items():
        data.setdefault(kernels, {}).update(classes)
    note = ("# [K.overlap], [K.patch_stage], [K.tpup_mean], [K.tpup_mul], [K.tpup_add], [K.tpup_depthwise_fast],\n"
            "# [K.tpup_depthwise_3x3], [K.tpup_conv_packed], [K.tpup_pointwise], [K.tpup_pointwise16],\n"
            "# [K.tpup_conv_window] and [K.tpup_fully_connected] (the harness's overlapped convolutions, patch\n"
            "# stages, MEAN, MUL, ADD, fast depthwise, depthwise 3x3, packed, 1x1, 1x1 on re-laid weights, window\n"
            "# and fully connected kernels) by\n"
            "#   python tools/fit_harness_cost.py (docs/bench/harness_ops.json)\n")
    if note not in header:
        header += note
    TABLE.write_text(header + "\n" + tomli_w.dumps(data))


REPORT = REPO / "docs" / "bench" / "harness_kernels.md"


def report(data: dict) -> str:
    """docs/bench/harness_kernels.md: the harness's own kernels against the kernel set's on the
    same layers (QEMU counts of the collected models, CMSIS-NN build)."""
    from tpu_pipeline.toolchain.cost.mcu import op_features
    from tpu_pipeline.toolchain.ir import stage

    runs, graphs = data["runs"], {name: g for name, g, _ in models()}

    def ops(name: str) -> list:
        return runs.get(f"{name}/cmsis-nn", {}).get("ops") or []

    lines = ["## The harness's own kernels, per layer", "",
             "Command: `python tools/fit_harness_cost.py --collect --report` (QEMU mps2-an386, `-icount shift=0`, "
             "instructions per op as the harness counts them; every run's outputs equal host TFLite Micro's). "
             "Models from random weights (tests/helpers/cnn_builder.py); the same layer on the harness's own kernel "
             "and on the kernel set's (CMSIS-NN's depthwise 'opt' or 3x3 kernel).", "",
             "| depthwise layer (input H x W x C, window, stride) | CMSIS-NN | fast | CMSIS-NN / fast | "
             "fast over its dying input (a call per row through a ring) | ring / whole |",
             "|---|---:|---:|---:|---:|---:|"]
    for h, c, k, st in DW_SIZES:
        a, b = ops(f"dw_h{h}c{c}k{k}s{st}_cmsis"), ops(f"dw_h{h}c{c}k{k}s{st}_fast")
        r = ops(f"dw_h{h}c{c}k{k}s{st}_fastring")
        ring = f"{r[1][2]:,} | {r[1][2] / b[1][2]:.2f}x" if r and b else "- | -"
        if a and b:
            lines.append(f"| {h} x {h} x {c}, {k}x{k}, s{st} | {a[1][2]:,} | {b[1][2]:,} | {a[1][2] / b[1][2]:.2f}x | "
                         f"{ring} |")
    lines += _dw3_report(ops)
    lines += ["", "| first layer (input H x W x C, output channels, window, stride) | CMSIS-NN | packed | "
              "CMSIS-NN / packed |", "|---|---:|---:|---:|"]
    for h, cin, cout, k, st in FIRST_SIZES:
        a, b = ops(f"first_h{h}c{cin}o{cout}k{k}s{st}_cmsis"), ops(f"first_h{h}c{cin}o{cout}k{k}s{st}_packed")
        if a and b:
            lines.append(f"| {h} x {h} x {cin}, {cout}, {k}x{k}, s{st} | {a[0][2]:,} | {b[0][2]:,} | "
                         f"{a[0][2] / b[0][2]:.2f}x |")
    lines += _pw_report(ops, graphs)
    lines += _win_report(ops, graphs)
    lines += _fc_report(ops, graphs)
    lines += ["", "| op | elements read | instructions | per element |", "|---|---:|---:|---:|"]
    for h, c in SE_SIZES:
        g = graphs[f"se_h{h}c{c}"]
        for i, code, n in ops(f"se_h{h}c{c}"):
            f = op_features(g, i)
            if code in ("TPUP_MEAN", "TPUP_MUL") and f.work >= 1000:
                lines.append(f"| {code} ({h} x {h} x {c}) | {f.work:,} | {n:,} | {n / f.work:.1f} |")
    lines += _add_report(runs, graphs)
    lines += ["", "TinyEngine's squeeze-and-excitation layers on mcunetv2_large (docs/bench/mcu_latency.md: "
              "se_element_mult_2d 0.56 M, average_pool_2d 0.075 M instructions) are not the same arithmetic: its "
              "element_mult_nx1 (TinyEngine/src/kernels/int_forward_op/element_mult.c) assigns the output offset "
              "over the requantized product, so the compiler keeps a constant fill (0.6 instructions an element), "
              "and the code generator fuses ADD + MUL + MUL into it, skipping the hard-sigmoid ADD and MUL; its "
              "MEAN pair becomes one avg_pooling (avgpooling.c: raw int8 sums divided by the count, no zero "
              "point, no requantization) profiled as r28x240x28_1x240x1, 1,960 instructions where the tensor "
              "has 188,160 elements. Its outputs match TFLite Micro's on that model only "
              "because these SE inputs are mostly at their zero point (scale 2^-23). These loops compute "
              "TFLite's integers for every input.", ""]
    lines += ["", "Patch stages against the same layers run whole (the region from the block's input; "
              "`h`: H = W, `c`: channels): a streamed stage computes every element once (row stripes: "
              "stream buffers; square grids: 2-D halo caches, tiles in raster order), a recomputing square "
              "grid computes its halos again.", "",
              "| block | layers whole | stage 2x2 (recomputing) | streamed 2 stripes | streamed 4 stripes | "
              "streamed 2x2 (2-D) | streamed 3x3 (2-D) |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for h, c in SIZES:
        plain = ops(f"h{h}c{c}_plain")
        cells = []
        body = None
        for form in ("stage2", "stream2", "stream4", "s2d2", "s2d3"):
            st = [(i, n) for i, code, n in ops(f"h{h}c{c}_{form}") if code == stage.OPCODE]
            if st:
                body = len(graphs[f"h{h}c{c}_{form}"].ops[st[0][0]].options.body.ops)
            cells.append(st[0][1] if st else None)
        if not plain or body is None:
            continue
        whole = sum(n for _, _, n in plain[:body])  # (the region starts at the input: its first layers)
        lines.append(f"| h{h}c{c} | {whole:,} | " + " | ".join(
            "-" if n is None else f"{n:,} ({n / whole - 1:+.1%})" for n in cells) + " |")
    return "\n".join(lines) + "\n"


def _add_report(runs: dict, graphs: dict) -> list[str]:
    """TPUP_ADD against the kernel set's ADD on the same residual ADD, both kernel sets."""
    lines = ["", "| ADD (H x W x C, RELU) | elements | kernel set | builtin ADD | TPUP_ADD | per element (builtin / "
             "TPUP_ADD) | builtin / TPUP_ADD |", "|---|---:|---|---:|---:|---:|---:|"]
    for h, c in ADD_SIZES:
        for kernels in KERNEL_SETS:
            found = []
            for form in ("builtin", "tpup"):
                name = f"add_h{h}c{c}_{form}"
                g = graphs[name]
                at = next(i for i, op in enumerate(g.ops) if op.opcode == "ADD")
                found.append(next((n for i, _, n in runs.get(f"{name}/{kernels}", {}).get("ops") or [] if i == at),
                                  None))
            if None in found:
                continue
            n = h * h * c
            lines.append(f"| {h} x {h} x {c} | {n:,} | {kernels} | {found[0]:,} | {found[1]:,} | "
                         f"{found[0] / n:.1f} / {found[1] / n:.1f} | {found[0] / found[1]:.2f}x |")
    return lines


def _dw3_report(ops) -> list[str]:
    """The report's narrow-map 3x3 depthwise table: each DW3_SIZES layer on CMSIS-NN's kernel, "fast" and "dw3"."""
    lines = ["", "| 3x3 depthwise on a narrow map (input H x W x C, stride) | CMSIS-NN | fast | dw3 | per output "
             "(CMSIS-NN, fast, dw3) | best / dw3 |", "|---|---:|---:|---:|---|---:|"]
    for h, w, c, st in DW3_SIZES:
        a, f, d = (ops(_dw3_name(h, w, c, st, flags)) for flags in ((), ("fast",), ("dw3",)))
        if a and f and d:
            n = -(-h // st) * -(-w // st) * c
            per = ", ".join(f"{r[1][2] / n:.1f}" for r in (a, f, d))
            lines.append(f"| {h} x {w} x {c}, s{st} | {a[1][2]:,} | {f[1][2]:,} | {d[1][2]:,} | {per} | "
                         f"{min(a[1][2], f[1][2]) / d[1][2]:.2f}x |")
    return lines


def _pw_report(ops, graphs) -> list[str]:
    """The report's 1x1 table: each PW_SIZES layer on CMSIS-NN's 1x1 kernel, on the pointwise one and
    on pointwise16 (its weights re-laid as int16 pairs)."""
    from tpu_pipeline.toolchain.ir import macs
    from tpu_pipeline.toolchain.ir.requant import pointwise_requant_proven

    lines = ["", "| 1x1 layer (input H x W x C -> output channels, stride) | MACs | CMSIS-NN | pointwise | "
             "pointwise16 | CMSIS-NN / pointwise16 | instructions / MAC (pointwise16) | requantisation |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for h, c, k, st in PW_SIZES:
        a, b = ops(_pw_name(h, c, k, st, ())), ops(_pw_name(h, c, k, st, ("pointwise",)))
        d = ops(_pw_name(h, c, k, st, ("pointwise16",)))
        if a and b and d:
            g = graphs[_pw_name(h, c, k, st, ("pointwise",))]
            cheap = "SMMULR (proven)" if pointwise_requant_proven(g, g.ops[0]) else "exact integers"
            lines.append(f"| {h} x {h} x {c} -> {k}, s{st} | {macs(g, 0):,} | {a[0][2]:,} | {b[0][2]:,} | "
                         f"{d[0][2]:,} | {a[0][2] / d[0][2]:.2f}x | {d[0][2] / macs(g, 0):.2f} | {cheap} |")
    return lines


def _win_report(ops, graphs) -> list[str]:
    """The report's window table: each WIN_SIZES layer on the kernel set's convolution and on "window"."""
    from tpu_pipeline.toolchain.ir import macs

    lines = ["", "| convolution (input H x W x C -> output channels, window, stride) | MACs | CMSIS-NN | window | "
             "CMSIS-NN / window |", "|---|---:|---:|---:|---:|"]
    for h, c, k, kw, st in WIN_SIZES:
        a, b = ops(_win_name(h, c, k, kw, st, ())), ops(_win_name(h, c, k, kw, st, ("window",)))
        if a and b:
            g = graphs[_win_name(h, c, k, kw, st, ("window",))]
            lines.append(f"| {h} x {h} x {c} -> {k}, {kw}x{kw}, s{st} | {macs(g, 0):,} | {a[0][2]:,} | {b[0][2]:,} | "
                         f"{a[0][2] / b[0][2]:.2f}x |")
    return lines


def _fc_report(ops, graphs) -> list[str]:
    """The report's fully connected table: each FC_SIZES layer on the kernel set's FULLY_CONNECTED and on
    TPUP_FULLY_CONNECTED."""
    from tpu_pipeline.toolchain.ir import fully_connected, macs

    lines = ["", "| fully connected layer (inputs -> outputs) | MACs | CMSIS-NN | TPUP_FULLY_CONNECTED | "
             "CMSIS-NN / ours | requantisation |", "|---|---:|---:|---:|---:|---|"]
    for n, m, pc in FC_SIZES:
        a, b = ops(_fc_name(n, m, pc, False)), ops(_fc_name(n, m, pc, True))
        if a and b:
            g = graphs[_fc_name(n, m, pc, True)]
            cheap = "SMMULR (proven)" if fully_connected.requant_proven(g, g.ops[0]) else "exact integers"
            lines.append(f"| {n} -> {m}{', per channel' if pc else ''} | {macs(g, 0):,} | {a[0][2]:,} | {b[0][2]:,} | "
                         f"{a[0][2] / b[0][2]:.2f}x | {cheap} |")
    return lines


def held_out(pairs: list[str], kernels: str = "cmsis-nn") -> list[str]:
    """Every patch stage of the given models against its QEMU count (`MODEL.tflite:RUN.json`, RUN
    the `run --backend qemu --json` of MODEL, which these rates were not fitted on): predicted by
    cost/mcu.py stage_instructions with the table as it is, measured, and the error."""
    from tpu_pipeline.toolchain.cost.mcu import fitted_table, stage_instructions
    from tpu_pipeline.toolchain.ir import from_model, stage
    from tpu_pipeline.toolchain.tflite import read_model

    table, lines = fitted_table()[kernels], []
    for pair in pairs:
        model, run = pair.rsplit(":", 1)
        g = from_model(read_model(Path(model).read_bytes()))
        measured = {o["index"]: o["instructions"] for o in json.loads(Path(run).read_text())["op_instructions"]}
        for i, op in enumerate(g.ops):
            if stage.is_stage(op) and i in measured:
                p, m = stage_instructions(op, table), measured[i]
                lines.append(f"{Path(model).name} op {i} grid {op.options.grid[0]}x{op.options.grid[1]}: "
                             f"predicted {p:,.0f}, measured {m:,}, {100 * (p / m - 1):+.1f} %")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--held-out", nargs="+", metavar="MODEL:RUN", help="only print the stages of these models "
                    "(fit's outputs) against their QEMU counts (run --backend qemu --json), predicted with the "
                    "table as it is")
    ap.add_argument("--collect", action="store_true", help="measure in QEMU first (resumable)")
    ap.add_argument("--force", action="store_true", help="with --collect: measure again what is there")
    ap.add_argument("--report", action="store_true", help="also write docs/bench/harness_kernels.md")
    args = ap.parse_args()
    if args.held_out:
        print("\n".join(held_out(args.held_out)))
        return 0
    data = collect(MEASUREMENTS, args.force) if args.collect else json.loads(MEASUREMENTS.read_text())
    if args.report:
        REPORT.write_text(report(data))
    tables = fit(data)
    print(json.dumps(tables, indent=1))
    merge(tables)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
