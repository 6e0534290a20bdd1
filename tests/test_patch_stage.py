"""Patch stages (tpu_pipeline.toolchain.ir.stage, rewrite/patch_stage.py, harness/tpup_stage.cc): a patch
region run tile by tile inside one harness op. Host side: round trip through the file, the builtin
view is an identity in LiteRT and TFLite Micro, the arena and the tail are below patches by copies.
Board side (QEMU, both kernel sets): bit-identical to the host, head and tail as predicted."""

from __future__ import annotations

import dataclasses


import numpy as np
import pytest

from helpers.cnn_builder import CnnBuilder
from helpers.firmware import needs_arm, needs_qemu, qemu_run_as_planned
from tpu_pipeline.toolchain.device import CMSIS_NN, REFERENCE, load_device
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.execute.compare import verify_models
from tpu_pipeline.toolchain.ir import from_model, stage
from tpu_pipeline.toolchain.ir.convert import builtin_view_bytes, to_model
from tpu_pipeline.toolchain.ir.kernel_variants.packed import packed_weights
from tpu_pipeline.toolchain.ir.kernels import kernel_name, with_kernel
from tpu_pipeline.toolchain.memory.lifetimes import lifetimes
from tpu_pipeline.toolchain.memory.tflm import plan_for_tflm
from tpu_pipeline.toolchain.memory.tflm_target import target_tail
from tpu_pipeline.toolchain.rewrite.patch import checked_region, apply_patches, patch_regions
from tpu_pipeline.toolchain.rewrite.patch_stage import build_stage, stage_refusal
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model
from tpu_pipeline.toolchain.tflite.metadata import with_offline_plan

BOARD = load_device("qemu-mps2-an386")


def _mbv2_like(seed=3):
    """A MobileNetV2-like stem at 24x20: conv s2, an inverted residual block with an ADD, a stride-2
    depthwise with PyTorch-style symmetric padding (folded: explicit padding), then a head."""
    from tpu_pipeline.toolchain.rewrite.fold_pad import fold_pads

    b = CnnBuilder(seed=seed, spread=True)
    x = b.input((1, 24, 20, 3))
    s = b.conv(x, 8, k=3, stride=2, act="RELU6")
    e = b.conv(s, 24, k=1, act="RELU6")
    d = b.dw(e, k=3, act="RELU6")
    p = b.conv(d, 8, k=1)
    r = b.add(p, s)
    e2 = b.conv(r, 16, k=1, act="RELU6")
    d2 = b.dw(b.pad(e2, 1, 1, 1, 1), k=3, stride=2, padding="VALID", act="RELU6")
    out = b.conv(d2, 12, k=1)
    head = b.pool(out, "AVERAGE_POOL_2D", k=3, stride=3)
    src = b.model_bytes([head])
    g, _ = fold_pads(b.graph([head]), harness=True)
    g = with_kernel(g, [i for i, op in enumerate(g.ops) if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D")
                        and not op.kernel], kernel_name())
    return g, src


def _region(g):
    """The largest region from the model's input that a stage runs."""
    def ok(r):
        return stage_refusal(g, checked_region(g, r)[2]) is None

    return max((r for r in patch_regions(g) if r.input == g.tensors[g.inputs[0]].name and ok(r)),
               key=lambda r: len(r.ops))


def _staged(g, grid):
    region = _region(g)
    tin, tout, positions = checked_region(g, region)
    return build_stage(g, tin, tout, positions, grid), region


def _in_qemu(path, staged, src: bytes, kernels_set):
    """`staged` written to `path` and run on the emulated board: its outputs equal the host's
    TFLite Micro's and its arena is the predicted one. The run."""
    path.write_bytes(_write(staged, src))
    return qemu_run_as_planned(path, BOARD, kernels_set, iterations=2, seed=5)


def _stage_instructions(r) -> int:
    """The instructions the run's patch-stage op took."""
    return next(o["instructions"] for o in r.op_instructions if o["opcode"] == stage.OPCODE)


def _write(g, src: bytes, planned: bool = True) -> bytes:
    model = to_model(g, read_model(src))
    if planned:
        plan = plan_for_tflm(g, lifetimes(g, semantics="tflm"), n_tensors=len(g.tensors))
        model = with_offline_plan(model, list(plan.tensor_offsets))
    return model_to_bytes(model)


@pytest.mark.parametrize("grid", [(2, 2), (3, 2)])
def test_a_stage_round_trips_and_its_builtin_view_is_an_identity(grid):
    g, src = _mbv2_like()
    staged, region = _staged(g, grid)
    assert sum(stage.is_stage(op) for op in staged.ops) == 1
    assert len(staged.ops) == len(g.ops) - len(region.ops) + 1
    data = _write(staged, src)
    back = from_model(read_model(data))
    (op,) = [o for o in back.ops if stage.is_stage(o)]
    (orig,) = [o for o in staged.ops if stage.is_stage(o)]
    assert op.options.program == orig.options.program and op.options.grid == grid
    assert stage.encode(op.options) == stage.encode(orig.options)
    view = from_model(read_model(builtin_view_bytes(data)))
    assert not any(o.kernel for o in view.ops) and len(view.ops) == len(from_model(read_model(src)).ops)
    results = verify_models(src, data, runs=2)
    assert {r.runtime for r in results} == {"litert", "tflm"}
    assert all(o.ok and o.max_abs == 0 for r in results for o in r.outputs), [r.to_json() for r in results]


def test_a_stage_beats_patches_by_copies_in_arena_and_tail():
    g, _ = _mbv2_like()
    region = _region(g)
    copies = apply_patches(g, region, (3, 2))
    staged, _ = _staged(g, (3, 2))
    for kernels in (CMSIS_NN, REFERENCE):
        assert target_tail(staged, kernels).bytes < target_tail(copies, kernels).bytes - 1000
    sem = "tflm"
    assert lifetimes(staged, semantics=sem).peak < lifetimes(copies, semantics=sem).peak


def _rings(staged):
    (op,) = [o for o in staged.ops if stage.is_stage(o)]
    return [s for s in stage.steps(op.options) if s[0] == stage.CONV and s[11] > 0], op.options.scratch


def test_dying_tile_buffers_are_written_over():
    """A depthwise convolution in place and a pointwise expansion over its dying input (a ring of
    rows each) make the tile's buffers smaller than planning every buffer apart; the builtin view
    is unchanged (the same layers on the same boxes)."""
    g, src = _mbv2_like()
    region = _region(g)
    tin, tout, positions = checked_region(g, region)
    over = build_stage(g, tin, tout, positions, (3, 2))
    apart = build_stage(g, tin, tout, positions, (3, 2), in_place=False)
    rings, scratch = _rings(over)
    assert rings and not _rings(apart)[0]
    assert scratch < _rings(apart)[1]
    assert lifetimes(over, semantics="tflm").peak < lifetimes(apart, semantics="tflm").peak
    assert builtin_view_bytes(_write(over, src, False)) == builtin_view_bytes(_write(apart, src, False))


def test_what_a_stage_cannot_run_is_refused():
    b = CnnBuilder(seed=1)
    x = b.input((1, 8, 8, 4))
    y = b.pool(b.conv(x, 4, k=3), "MAX_POOL_2D", k=2, stride=2)
    g = b.graph([y])
    assert "MAX_POOL_2D" in stage_refusal(g, [0, 1])
    with pytest.raises(UsageError, match="patch stage"):
        build_stage(g, g.inputs[0], y, [0, 1], (2, 2))


# ---- on the emulated board ------------------------------------------------------------------------
@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_a_stage_runs_in_qemu_as_the_host_runs_its_builtin_view(tmp_path, kernels_set):
    g, src = _mbv2_like()
    staged, _ = _staged(g, (3, 2))
    r = _in_qemu(tmp_path / "staged.tflite", staged, src, kernels_set)
    assert any(o["opcode"] == stage.OPCODE for o in r.op_instructions)
    assert _rings(staged)[0]  # overlapped tile calls ran (in place, through their rings)


# ---- stripes without recomputation -----------------------------------------------------------------
def _streamed(g, n):
    region = _region(g)
    tin, tout, positions = checked_region(g, region)
    return build_stage(g, tin, tout, positions, (n, 1), stream=True)


def _rows_computed(staged) -> dict[int, int]:
    """Layer -> output rows its CONV / ADD steps compute, over all tiles."""
    op = next(o for o in staged.ops if stage.is_stage(o))
    rows: dict[int, int] = {}
    for s in stage.steps(op.options):
        if s[0] == stage.CONV:
            rows[s[1]] = rows.get(s[1], 0) + s[8]
        elif s[0] == stage.ADD:
            rows[s[1]] = rows.get(s[1], 0) + s[13]
    return rows


@pytest.mark.parametrize("n", [2, 3, 5])
def test_a_streamed_stage_computes_every_row_once_and_is_an_identity(n):
    g, src = _mbv2_like()
    staged = _streamed(g, n)
    op = next(o for o in staged.ops if stage.is_stage(o))
    body = op.options.body
    heights = {j: body.tensors[layer.outputs[0]].shape[1] for j, layer in enumerate(body.ops)}
    assert _rows_computed(staged) == heights  # no row computed twice
    region = _region(g)
    tin, tout, positions = checked_region(g, region)
    recomputing = build_stage(g, tin, tout, positions, (n, 1), stream=False)
    assert sum(_rows_computed(recomputing).values()) > sum(heights.values())  # (which the plain stage does)
    data = _write(staged, src)
    results = verify_models(src, data, runs=2)
    assert all(o.ok and o.max_abs == 0 for r in results for o in r.outputs), [r.to_json() for r in results]


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_a_streamed_stage_runs_in_qemu_with_its_stream_buffers_predicted(tmp_path, kernels_set):
    g, src = _mbv2_like()
    staged = _streamed(g, 3)
    r = _in_qemu(tmp_path / "streamed.tflite", staged, src, kernels_set)
    assert r.arena_used_bytes == r.head_bytes + r.tail_bytes


def test_fit_offers_stages_on_row_stripes_and_they_stream():
    from tpu_pipeline.toolchain.fit.grids import stage_grids
    from tpu_pipeline.toolchain.fit.variants import _patch_label

    grids = stage_grids((4, 3))
    streamed = [g for g, recompute in grids if not recompute]
    assert {(2, 1), (3, 1), (4, 1), (2, 2), (3, 3)} <= set(streamed) and len(streamed) == len(set(streamed))
    assert {g for g, recompute in grids if recompute} == {(2, 2), (3, 3), (4, 3)}  # square grids both ways
    g, _ = _mbv2_like()
    region = _region(g)
    assert "streamed" in _patch_label(region, (3, 1), "stage") and "streamed" in _patch_label(region, (2, 2), "stage")
    assert "streamed" not in _patch_label(region, (2, 2), "stage", recompute=True)
    tin, tout, positions = checked_region(g, region)
    default = build_stage(g, tin, tout, positions, (3, 1))  # a stripe grid streams unless told not to
    assert _rows_computed(default) == _rows_computed(_streamed(g, 3))


# ---- square grids without recomputation (2-D halo caches) -----------------------------------------
def _area_computed(staged) -> dict[int, int]:
    """Layer -> output elements (pixels) its CONV / ADD steps compute, over all tiles."""
    op = next(o for o in staged.ops if stage.is_stage(o))
    area: dict[int, int] = {}
    for s in stage.steps(op.options):
        if s[0] == stage.CONV:
            area[s[1]] = area.get(s[1], 0) + s[8] * s[9]
        elif s[0] == stage.ADD:
            area[s[1]] = area.get(s[1], 0) + s[13] * s[14]
    return area


def _random_block(seed: int):
    """A random region from the model's input: odd sizes, a stride-2 convolution, an inverted
    residual block (pointwise, depthwise 3x3 or 5x5, pointwise, ADD), a depthwise of stride 2 on
    SAME or explicit (folded PAD) padding, a 1x1; then a head the stage leaves out."""
    import numpy as np

    from tpu_pipeline.toolchain.rewrite.fold_pad import fold_pads

    rng = np.random.default_rng(seed)
    b = CnnBuilder(seed=seed, spread=True)
    x = b.input((1, int(rng.choice([23, 25, 27])), int(rng.choice([19, 21, 29])), int(rng.integers(1, 4))))
    c = int(rng.choice([4, 8, 12]))
    s = b.conv(x, c, k=3, stride=2, act="RELU6", padding=str(rng.choice(["SAME", "VALID"])))
    e = b.conv(s, 3 * c, k=1, act="RELU6")
    d = b.dw(e, k=int(rng.choice([3, 5])), act="RELU6")
    r = b.add(b.conv(d, c, k=1), s)
    if rng.integers(2):
        d2 = b.dw(b.pad(r, 1, 1, 1, 1), k=3, stride=2, padding="VALID", act="RELU6")
    else:
        d2 = b.dw(r, k=3, stride=2, padding="SAME", act="RELU")
    out = b.conv(d2, c + 4, k=1)
    head = b.pool(out, "AVERAGE_POOL_2D", k=2, stride=2)
    src = b.model_bytes([head])
    g, _ = fold_pads(b.graph([head]), harness=True)
    g = with_kernel(g, [i for i, op in enumerate(g.ops) if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D")
                        and not op.kernel], kernel_name())
    return g, src


def _streamed2d(g, grid):
    tin, tout, positions = checked_region(g, _region(g))
    return build_stage(g, tin, tout, positions, grid, stream=True)


@pytest.mark.parametrize("grid", [(2, 2), (3, 2), (2, 3), (3, 3), (6, 2)])
def test_a_2d_streamed_stage_computes_every_element_once_and_is_an_identity(grid):
    g, src = _mbv2_like()
    staged = _streamed2d(g, grid)
    body = next(o for o in staged.ops if stage.is_stage(o)).options.body
    whole = {j: body.tensors[layer.outputs[0]].shape[1] * body.tensors[layer.outputs[0]].shape[2]
             for j, layer in enumerate(body.ops)}
    assert _area_computed(staged) == whole  # no element computed twice
    tin, tout, positions = checked_region(g, _region(g))
    recomputing = build_stage(g, tin, tout, positions, grid)  # (a square grid's default)
    assert sum(_area_computed(recomputing).values()) > sum(whole.values())
    assert any(s[0] == stage.PASTE for s in stage.steps(next(o for o in staged.ops if stage.is_stage(o)).options))
    data = _write(staged, src)
    back = from_model(read_model(data))
    assert next(o for o in back.ops if stage.is_stage(o)).options.program == \
        next(o for o in staged.ops if stage.is_stage(o)).options.program
    results = verify_models(src, data, runs=2)
    assert {r.runtime for r in results} == {"litert", "tflm"}
    assert all(o.ok and o.max_abs == 0 for r in results for o in r.outputs), [r.to_json() for r in results]


def _wide(g) -> tuple[int, int]:
    """The finest wide grid fit offers for `g`'s region from its input (one-row tiles)."""
    from tpu_pipeline.toolchain.fit.grids import wide_grids

    oh, ow = g.tensors[checked_region(g, _region(g))[1]].shape[1:3]
    return max(wide_grids((oh, ow), min(16, ow)))


def test_fit_offers_wide_grids_streamed():
    """Besides squares and stripes, fit offers a stage short wide tiles (one or two output rows
    high, at least four times as wide), streamed only: detection's 32x40 stage output gets 16x5
    and 32x3 (both 20.96 M instructions in QEMU against 21.38 M on 10x10, in the same arena)."""
    from tpu_pipeline.toolchain.fit.grids import stage_grids, wide_grids

    wide = wide_grids((32, 40), 16)
    assert {(16, 5), (32, 3), (32, 10)} <= set(wide) and (16, 6) not in wide and (32, 11) not in wide
    assert all(r > c and 40 // c >= 4 * (32 // r) for r, c in wide)
    grids = stage_grids((16, 16), (32, 40))
    assert set(wide) <= {g for g, recompute in grids if not recompute}
    assert not set(wide) & {g for g, recompute in grids if recompute}
    assert len(grids) == len(set(grids))
    assert wide_grids((36, 36), 16) == [(18, 2), (18, 3), (18, 4)]  # (one-row tiles: past 32 rows)
    assert stage_grids((16, 16)) == [g for g in grids if g[0] not in set(wide)]  # (without the output's size)


def test_2d_streamed_columns_run_even_where_that_widens_no_tile():
    """A 2-D streamed stage's columns (geometry.even_splits): they cover the axis in order, no run
    wider than splits' widest, every run even where splits left an odd one and the widest stays
    (40 columns in 3: 14, 14, 12, not 14, 13, 13: the kernels' pixel pairs leave no lone pixel);
    the stage's tiles are those columns."""
    from tpu_pipeline.toolchain.ir.geometry import even_splits, splits

    assert even_splits(40, 3) == [(0, 14), (14, 28), (28, 40)] and even_splits(7, 2) == splits(7, 2)
    for n in range(1, 60):
        for k in range(1, min(n, 16) + 1):
            runs, plain = even_splits(n, k), splits(n, k)
            sizes = [b - a for a, b in runs]
            assert runs[0][0] == 0 and runs[-1][1] == n and all(runs[i][1] == runs[i + 1][0] for i in range(k - 1))
            assert max(sizes) <= max(b - a for a, b in plain) and min(sizes) > 0
            if runs != plain:
                assert all(w % 2 == 0 for w in sizes[1:]) and sizes[0] % 2 == n % 2
    from tpu_pipeline.toolchain.rewrite.fold_pad import fold_pads

    b = CnnBuilder(seed=4, spread=True)
    x = b.input((1, 6, 40, 4))
    out = b.conv(b.dw(b.conv(x, 8, k=1, act="RELU6"), k=3, act="RELU6"), 8, k=1)
    g, _ = fold_pads(b.graph([b.pool(out, "AVERAGE_POOL_2D", k=2, stride=2)]), harness=True)
    g = with_kernel(g, [i for i, op in enumerate(g.ops) if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D")], kernel_name())
    staged = _streamed2d(g, (2, 3))
    outs = {(s[3], s[3] + s[5]) for s in stage.steps(next(o for o in staged.ops if stage.is_stage(o)).options)
            if s[0] == stage.COPY_OUT}
    assert outs == {(0, 14), (14, 28), (28, 40)}


def _moves(staged) -> int:
    """PASTE steps moving a box within one buffer (a cache: rows a third tile shares)."""
    op = next(o for o in staged.ops if stage.is_stage(o))
    return sum(1 for s in stage.steps(op.options) if s[0] == stage.PASTE and s[1] == s[8])


def test_rows_three_tiles_share_stay_in_the_caches():
    """On a grid fine enough that a row of a layer's output is needed by three tiles (the halo
    grows through the block), the caches keep it for the third (moved within the cache) and no
    element is still computed twice."""
    g, _ = _mbv2_like()
    staged = _streamed2d(g, (4, 3))
    assert _moves(staged) > 0 and _moves(_streamed2d(g, (2, 2))) == 0
    body = next(o for o in staged.ops if stage.is_stage(o)).options.body
    assert _area_computed(staged) == {j: body.tensors[layer.outputs[0]].shape[1] * body.tensors[layer.outputs[0]].shape[2]
                                      for j, layer in enumerate(body.ops)}


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_2d_streamed_stages_run_in_qemu_bit_identical(tmp_path, kernels_set):
    """Random regions (odd sizes, stride 2, depthwise + pointwise + ADD, SAME, VALID and explicit
    padding) on several grids, two with rows three tiles share, each one stage of one model:
    outputs equal the host's TFLite Micro's, and the arena is the predicted one (the caches
    inside the stage's scratch)."""
    cases = [(_mbv2_like(), (4, 3)), (_mbv2_like(), (6, 2))] + \
        [(_random_block(seed), grid) for seed, grid in ((10, (3, 3)), (12, (3, 2)), (13, (2, 3)))] + \
        [(_random_block(seed), _wide(_random_block(seed)[0])) for seed in (14, 15)]
    for (g, src), grid in cases:
        staged = _streamed2d(g, grid)
        _in_qemu(tmp_path / f"s2d_{grid[0]}x{grid[1]}_{len(g.ops)}.tflite", staged, src, kernels_set)


# ---- the packed first convolution inside stages ----------------------------------------------------
def _packed_first(g):
    """`g` with its first convolution (3x3 over 3 channels) on the packed kernel."""
    return with_kernel(g, [0], kernel_name("packed"))


def _packed_stages():
    g, src = _mbv2_like()
    g = _packed_first(g)
    tin, tout, positions = checked_region(g, _region(g))
    return [(build_stage(g, tin, tout, positions, grid, stream=stream), src)
            for grid, stream in (((3, 2), False), ((3, 1), True), ((3, 3), True))]


def test_stages_keep_the_packed_kernel_and_its_weights():
    """The stage's first layer stays on the packed kernel, its layer record names the re-laid
    weights (input 4), and it reads back from the file as it was built."""
    for staged, src in _packed_stages():
        (op,) = [o for o in staged.ops if stage.is_stage(o)]
        first = op.options.body.ops[0]
        assert first.kernel == "tpup+packed" and len(first.inputs) == 5
        assert np.array_equal(op.options.body.tensors[first.inputs[4]].values(), packed_weights(op.options.body, first))
        back = from_model(read_model(_write(staged, src)))
        (read,) = [o for o in back.ops if stage.is_stage(o)]
        first = read.options.body.ops[0]
        assert first.kernel == "tpup+packed" and len(first.inputs) == 5
        assert np.array_equal(read.options.body.tensors[first.inputs[4]].values(), packed_weights(read.options.body, first))
        assert stage.encode(read.options) == stage.encode(op.options)


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_stages_with_the_packed_kernel_run_in_qemu_bit_identical(tmp_path, kernels_set):
    """Recomputing, stripe-streamed and 2-D streamed stages whose first layer runs the packed
    kernel: outputs equal the host's TFLite Micro's, the arena is the predicted one."""
    for k, (staged, src) in enumerate(_packed_stages()):
        _in_qemu(tmp_path / f"packed_{k}.tflite", staged, src, kernels_set)


# ---- a packed layer set up once an invoke ----------------------------------------------------------
def _streamed_first(out_c: int):
    """A stem whose first convolution (3x3 s2 over 3 channels, `out_c` channels, no activation: the
    whole int8 range) runs the packed kernel's streamed path, then a depthwise and a 1x1. Its
    2-D streamed 3x3 stage and its 3-stripe stage (9 and 3 calls of the packed layer: set up once
    only where rewrite/patch_stage.py SETUP_MIN_CALLS allows)."""
    b = CnnBuilder(seed=6, spread=True)
    x = b.input((1, 24, 20, 3))
    s = b.conv(x, out_c, k=3, stride=2)
    out = b.conv(b.dw(s, k=3, act="RELU6"), 8, k=1)
    head = b.pool(out, "AVERAGE_POOL_2D", k=3, stride=3)
    src = b.model_bytes([head])
    g = b.graph([head])
    g = with_kernel(g, [i for i, op in enumerate(g.ops) if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D")], kernel_name())
    g = _packed_first(g)
    tin, tout, positions = checked_region(g, _region(g))
    return [(build_stage(g, tin, tout, positions, grid, stream=True), src) for grid in ((3, 3), (3, 1))]


def test_a_stage_keeps_its_packed_layers_set_up_in_its_scratch(monkeypatch):
    """A packed layer called on at least SETUP_MIN_CALLS tiles is marked (layer word 22) and the
    stage asks for its tile buffers, then 16 + 12 x out_c bytes (16-aligned) per marked layer
    (harness/tpup_stage.cc SetupsBefore), then its kernels' largest buffer; fewer calls: no set-up."""
    from tpu_pipeline.toolchain.memory.scratch import scratch_requests
    from tpu_pipeline.toolchain.memory.semantics import get_semantics
    from tpu_pipeline.toolchain.rewrite import patch_stage

    for staged, _ in _streamed_first(8):  # (9 and 3 calls: below the default)
        op = next(o for o in staged.ops if stage.is_stage(o))
        assert stage.setup_bytes(op.options) == 0 and op.options.layer_words[stage.SETUP_WORD] == 0
    monkeypatch.setattr(patch_stage, "SETUP_MIN_CALLS", 3)
    for out_c, setup in ((8, 112), (7, 112), (16, 208)):
        for staged, _ in _streamed_first(out_c):
            (i,) = [k for k, o in enumerate(staged.ops) if stage.is_stage(o)]
            op = staged.ops[i]
            assert stage.setup_bytes(op.options) == setup
            assert op.options.layer_words[stage.SETUP_WORD] == 1
            assert not any(op.options.layer_words[k * stage.LAYER_WORDS + stage.SETUP_WORD] for k in (1, 2))
            sem = get_semantics("tflm-cmsis-nn")
            body = op.options.body
            own = max((scratch_requests(body, j, sem) or [0])[0] for j in range(len(body.ops)))
            assert scratch_requests(staged, i, sem) == [-(-op.options.scratch // 16) * 16 + setup + own]


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_stages_with_a_packed_layer_set_up_once_run_in_qemu_bit_identical(tmp_path, kernels_set, monkeypatch):
    """The packed first layer on its streamed path (the whole int8 range), set up once an invoke in
    the stage's scratch (an even and an odd count of channels: the last pair marked, a lone last
    channel): outputs equal the host's TFLite Micro's, the arena is the predicted one."""
    from tpu_pipeline.toolchain.rewrite import patch_stage

    monkeypatch.setattr(patch_stage, "SETUP_MIN_CALLS", 3)
    for out_c in (8, 7):
        for k, (staged, src) in enumerate(_streamed_first(out_c)):
            _in_qemu(tmp_path / f"setup_{out_c}_{k}.tflite", staged, src, kernels_set)


# ---- the fast depthwise kernel on streamed stripes ---------------------------------------------------
def _fast(g):
    """`g` with its depthwise convolutions on the harness's own kernel (flag "fast") where it applies."""
    from tpu_pipeline.toolchain.ir.kernel_variants import fast_depthwise

    return with_kernel(g, [i for i, op in enumerate(g.ops) if fast_depthwise.applies(g, i)], kernel_name("fast"))


def _depthwise_kernels(staged) -> list[str]:
    body = next(o for o in staged.ops if stage.is_stage(o)).options.body
    return [layer.kernel for layer in body.ops if layer.opcode == "DEPTHWISE_CONV_2D"]


def test_only_streamed_stripes_keep_the_fast_depthwise_kernel():
    """Streamed row stripes (no call through a ring) run the fast depthwise kernel; in recomputing
    and 2-D streamed stages a depthwise layer that goes in place through rings runs the kernel
    set's (one run apart from its input, where that costs no scratch, keeps the fast kernel)."""
    g, src = _mbv2_like()
    g = _fast(g)
    tin, tout, positions = checked_region(g, _region(g))
    stripes = build_stage(g, tin, tout, positions, (3, 1), stream=True)
    assert _depthwise_kernels(stripes) == ["tpup+fast"] * 2 and not _rings(stripes)[0]
    assert _depthwise_kernels(from_model(read_model(_write(stripes, src)))) == ["tpup+fast"] * 2
    for grid, stream in (((3, 2), False), ((3, 3), True)):
        staged = build_stage(g, tin, tout, positions, grid, stream=stream)
        body = next(o for o in staged.ops if stage.is_stage(o)).options.body
        ringed = _ringed(staged)
        dw = [k for k, layer in enumerate(body.ops) if layer.opcode == "DEPTHWISE_CONV_2D"]
        assert any(k in ringed for k in dw)
        for k in dw:
            assert body.ops[k].kernel == ("tpup" if k in ringed else "tpup+fast"), (grid, k)


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_stripes_with_the_fast_depthwise_kernel_run_in_qemu_bit_identical(tmp_path, kernels_set):
    """Stripe stages whose depthwise layers (3x3 stride 1, and stride 2 with folded explicit
    padding) run the fast kernel, with the packed first layer: outputs equal the host's TFLite
    Micro's, the arena is the predicted one."""
    for n in (2, 3, 5):
        g, src = _mbv2_like()
        g = _packed_first(_fast(g))
        tin, tout, positions = checked_region(g, _region(g))
        staged = build_stage(g, tin, tout, positions, (n, 1), stream=True)
        assert _depthwise_kernels(staged) == ["tpup+fast"] * 2
        _in_qemu(tmp_path / f"fast_stripes_{n}.tflite", staged, src, kernels_set)


def test_a_streamed_stage_is_never_priced_below_its_layers_run_whole():
    """A streamed stage runs the same kernels (or slower ones) on the same elements, plus calls and
    copies: the cost model prices it at least at its layers run whole as fit runs them (each layer's
    kernel overhead once, cost.mcu.stage_features; the ADD on TPUP_ADD, whose arithmetic the stage's
    ADD step runs), so fit takes a stage for memory, never for a speed it has not."""
    from tpu_pipeline.toolchain.cost.mcu import estimate_mcu, fitted_table, stage_instructions
    from tpu_pipeline.toolchain.ir import add

    g, _ = _mbv2_like()
    g = _packed_first(_fast(g))
    adds = [i for i, op in enumerate(g.ops) if op.opcode == "ADD" and add.wins(g, op)]
    assert adds
    g = with_kernel(g, adds, kernel_name())
    tin, tout, positions = checked_region(g, _region(g))
    for kernels in (CMSIS_NN, REFERENCE):
        whole = estimate_mcu(g, BOARD, kernels).ops
        layers = sum(whole[i].instructions for i in positions)
        for grid in ((2, 1), (3, 1), (2, 2), (3, 3)):
            staged = build_stage(g, tin, tout, positions, grid, stream=True)
            (op,) = [o for o in staged.ops if stage.is_stage(o)]
            assert stage_instructions(op, fitted_table()[kernels.cost_key]) >= layers * (1 - 1e-9), (kernels.name, grid)


# ---- pointwise16 and dw3 inside stages ----------------------------------------------------------------
def _winning(g, stride2: bool = False):
    """`g` with every convolution on the variant that wins for it, as fit's fastest point has it
    (packed, pointwise16, dw3); `stride2`: the stride-2 depthwise forced onto dw3 too."""
    from tpu_pipeline.toolchain.ir.kernels import winning_variant, with_flag

    for i in range(len(g.ops)):
        flag = winning_variant(g, i)
        if flag:
            g = with_flag(g, [i], flag)
    s2 = [i for i, op in enumerate(g.ops) if op.opcode == "DEPTHWISE_CONV_2D" and op.options.stride_h == 2]
    return with_kernel(g, s2, kernel_name("dw3")) if stride2 else g


def _lean(g):
    """`g` with the same layers on the kernels stages ran before (pointwise, the kernel set's depthwise)."""
    pw16 = [i for i, op in enumerate(g.ops) if "pointwise16" in op.kernel]
    dw3 = [i for i, op in enumerate(g.ops) if "dw3" in op.kernel]
    return with_kernel(with_kernel(g, pw16, kernel_name("pointwise")), dw3, kernel_name())


STAGE_FORMS = (((3, 2), False), ((3, 1), True), ((3, 3), True))


def _layer_kernels(staged) -> list[str]:
    body = next(o for o in staged.ops if stage.is_stage(o)).options.body
    return [layer.kernel for layer in body.ops if layer.opcode != "ADD"]


def test_stages_keep_pointwise16_everywhere_and_dw3_on_stripes():
    """Every stage form runs the 1x1 layers on pointwise16 (layer word 21 naming their re-laid
    weights, input 4); streamed row stripes run the 3x3 depthwise layers on dw3 (stride 1 and 2),
    the other forms those which go through rings on the kernel set's; the file reads back as
    built; a flags word with a bit no stage kernel reads is refused."""
    from tpu_pipeline.toolchain.errors import ModelError
    from tpu_pipeline.toolchain.ir.kernel_variants.pointwise16 import relaid_weights

    g, src = _mbv2_like()
    g = _winning(g, stride2=True)
    tin, tout, positions = checked_region(g, _region(g))
    for grid, stream in STAGE_FORMS:
        staged = build_stage(g, tin, tout, positions, grid, stream=stream)
        ringed = _ringed(staged)  # (layers by position, the ADD's included: depthwise at 2 and 6)
        dw = ["tpup" if k in ringed else "tpup+dw3" for k in (2, 6)]
        assert grid[1] > 1 or dw == ["tpup+dw3"] * 2
        assert _layer_kernels(staged) == ["tpup+packed", "tpup+pointwise16", dw[0], "tpup+pointwise16",
                                          "tpup+pointwise16", dw[1], "tpup+pointwise16"], (grid, stream)
        (op,) = [o for o in staged.ops if stage.is_stage(o)]
        body = op.options.body
        for k, layer in enumerate(body.ops):
            if layer.kernel == "tpup+pointwise16":
                assert op.options.layer_words[k * stage.LAYER_WORDS + 21] == layer.inputs[4]
                assert np.array_equal(body.tensors[layer.inputs[4]].values(), relaid_weights(body, layer))
        data = _write(staged, src)
        (read,) = [o for o in from_model(read_model(data)).ops if stage.is_stage(o)]
        assert stage.encode(read.options) == stage.encode(op.options)
        assert [layer.kernel for layer in read.options.body.ops] == [layer.kernel for layer in body.ops]
    words = list(op.options.layer_words)
    words[4] |= 0x400  # (window: not a kernel stages run)
    bad = stage.encode(dataclasses.replace(op.options, layer_words=tuple(words)))
    with pytest.raises(ModelError, match="flags"):
        stage.decode(bad, op.inputs, staged.tensors, "op")


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_stages_with_pointwise16_and_dw3_run_in_qemu_bit_identical_and_faster(tmp_path, kernels_set):
    """Recomputing, stripe-streamed and 2-D streamed stages whose 1x1 layers run pointwise16 (and,
    on stripes, 3x3 depthwise layers dw3): outputs equal the host's TFLite Micro's, the arena is
    the predicted one, and the stage takes fewer instructions than the same stage on pointwise and
    the kernel set's depthwise (so the kernels really ran: a firmware that drops their flags, or
    reads no re-laid weights, computes the same outputs more slowly). Stripes with the stride-2
    depthwise on dw3 too: bit-identical."""
    g, src = _mbv2_like()
    tin, tout, positions = checked_region(g, _region(g))
    for k, (grid, stream) in enumerate(STAGE_FORMS):
        counts = []
        for name, graph in (("fast", _winning(g)), ("lean", _lean(_winning(g)))):
            staged = build_stage(graph, tin, tout, positions, grid, stream=stream)
            r = _in_qemu(tmp_path / f"{name}_{k}.tflite", staged, src, kernels_set)
            counts.append(_stage_instructions(r))
        assert counts[0] < counts[1], (grid, stream, counts)
    staged = build_stage(_winning(g, stride2=True), tin, tout, positions, (3, 1), stream=True)
    assert _layer_kernels(staged).count("tpup+dw3") == 2
    _in_qemu(tmp_path / "stride2.tflite", staged, src, kernels_set)


# ---- depthwise layers run apart from their input where that costs no scratch --------------------------
def _stem():
    """TinyEngine's detection stem at 48x60: conv s2 (packed), depthwise 3x3 s1 on the fast kernel
    (its map too wide for dw3), two 1x1 (pointwise16), depthwise s2, 1x1."""
    from tpu_pipeline.toolchain.ir.kernels import winning_variant, with_flag

    b = CnnBuilder(seed=4, spread=True)
    x = b.input((1, 48, 60, 3))
    s = b.conv(x, 16, k=3, stride=2, act="RELU6")
    p = b.conv(b.dw(s, k=3, act="RELU6"), 16, k=1)
    out = b.conv(b.dw(b.conv(p, 32, k=1, act="RELU6"), k=3, stride=2, act="RELU6"), 16, k=1)
    head = b.pool(out, "AVERAGE_POOL_2D", k=3, stride=3)
    g = b.graph([head])
    g = with_kernel(g, [i for i, op in enumerate(g.ops) if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D")], kernel_name())
    for i in range(len(g.ops)):
        flag = winning_variant(g, i)
        if flag:
            g = with_flag(g, [i], flag)
    return g, b.model_bytes([head]), out


def _ringed(staged) -> set[int]:
    (op,) = [o for o in staged.ops if stage.is_stage(o)]
    return {s[1] for s in stage.steps(op.options) if s[0] == stage.CONV and s[11] > 0}


def test_a_2d_streamed_depthwise_layer_keeps_the_fast_kernel_where_running_it_apart_costs_no_scratch():
    """In a 2-D streamed stage the fast depthwise layer, which rings would have put on the kernel
    set's (a call per row), runs apart from its input on the fast kernel where the stage's scratch
    stays what it was with rings; the layers that need rings keep them."""
    g, _, out = _stem()
    assert g.ops[1].kernel == "tpup+fast"
    lean = with_kernel(g, [1], kernel_name())
    for grid in ((4, 4), (4, 3)):
        staged = build_stage(g, g.inputs[0], out, list(range(6)), grid, stream=True)
        ringed = build_stage(lean, g.inputs[0], out, list(range(6)), grid, stream=True)
        assert _layer_kernels(staged)[1] == "tpup+fast" and 1 not in _ringed(staged) and 1 in _ringed(ringed)
        assert _rings(staged)[1] == _rings(ringed)[1]  # (the same scratch)
        assert _ringed(staged) & {3, 4}


@needs_arm
@needs_qemu
@pytest.mark.parametrize("kernels_set", ["reference", "cmsis-nn"])
def test_a_2d_streamed_stage_with_a_depthwise_layer_apart_runs_in_qemu_bit_identical_and_faster(tmp_path, kernels_set):
    """That stage: outputs equal the host's TFLite Micro's, the arena is the predicted one, fewer
    instructions than the same stage with that layer through rings on the kernel set's."""
    g, src, out = _stem()
    counts = []
    for name, graph in (("apart", g), ("ringed", with_kernel(g, [1], kernel_name()))):
        staged = build_stage(graph, g.inputs[0], out, list(range(6)), (4, 4), stream=True)
        r = _in_qemu(tmp_path / f"{name}.tflite", staged, src, kernels_set)
        counts.append(_stage_instructions(r))
    assert counts[0] < counts[1], counts


def test_a_stage_program_is_generated_once_per_region_and_form(monkeypatch):
    """Programs are kept per region and form (fit builds a stage, its `_apart` trials and the
    chosen one again on the whole model): every form's program as generated afresh, the winning
    kernels' and the lean ones' (a layer apart from its input where its kernel is STRIPES_ONLY),
    and building them all again generates none."""
    from tpu_pipeline.toolchain.rewrite import patch_stage

    forms = [((2, 2), None), ((3, 2), None), ((2, 3), None), ((3, 1), None), ((2, 1), None), ((3, 3), True),
             ((2, 2), True)]
    base, _ = _mbv2_like()
    graphs = [base, _winning(base, stride2=True)]
    tin, tout, positions = checked_region(base, _region(base))
    fresh = {}
    with monkeypatch.context() as m:  # (every program generated: no key is met twice)
        m.setattr(patch_stage, "_program_key", lambda *args: object())
        for k, g in enumerate(graphs):
            for grid, stream in forms:
                op = next(o for o in build_stage(g, tin, tout, positions, grid, stream=stream).ops if stage.is_stage(o))
                fresh[k, grid, stream] = (op.options.program, op.options.scratch)
    patch_stage._PROGRAMS.clear()
    for _ in range(2):
        for k, g in enumerate(graphs):
            for grid, stream in forms:
                op = next(o for o in build_stage(g, tin, tout, positions, grid, stream=stream).ops if stage.is_stage(o))
                assert (op.options.program, op.options.scratch) == fresh[k, grid, stream], (k, grid, stream)
        if _ == 0:
            generated = len(patch_stage._PROGRAMS)
    assert generated == len(patch_stage._PROGRAMS) >= len(forms)


def test_stage_profile_finds_a_stages_layers_run_whole_and_drops_one_kind_of_step():
    """tools/stage_profile.py's bookkeeping (its QEMU runs are the measurement's): a stage's layers
    in the model without it are the ops between its input and output, and a model without one kind
    of step keeps every other step in order. (Match the producer by the stage's input instead of
    its output and the first check fails.)"""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import stage_profile

    g, src = _mbv2_like()
    tin, tout, positions = checked_region(g, _region(g))
    staged = _streamed2d(g, (2, 2))
    i = next(k for k, o in enumerate(staged.ops) if stage.is_stage(o))
    assert stage_profile.whole_layers(staged, i, g) == sorted(positions)
    program = staged.ops[i].options.program
    for kind in ("paste", "layer 1"):
        back = from_model(read_model(stage_profile.without(read_model(_write(staged, src)), staged, i, kind)))
        kept = list(stage.steps(back.ops[i].options))
        assert kept == [s for s in stage.steps(staged.ops[i].options) if stage_profile.step_kind(s) != kind]
        assert len(back.ops[i].options.program) < len(program)
