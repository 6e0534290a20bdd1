"""Patch-based execution (tpu_pipeline/toolchain/rewrite/patch.py): regions, the rewrite's structure, and its
outputs against the original in LiteRT and TFLite Micro (each compared with itself)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from helpers.cnn_builder import CnnBuilder, graph_bytes
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.execute.compare import verify_models
from tpu_pipeline.toolchain.ir import macs
from tpu_pipeline.toolchain.memory import lifetimes
from tpu_pipeline.toolchain.rewrite.patch import PatchRegion, apply_patches, patch_regions
from tpu_pipeline.toolchain.schedule import schedule


def _total_macs(graph) -> int:
    return sum(macs(graph, i) or 0 for i in range(len(graph.ops)))


def _exact_both(original, patched, runs=2):
    res = verify_models(graph_bytes(original), graph_bytes(patched), runs=runs)
    assert [v.runtime for v in res] == ["litert", "tflm"] and not any(v.skipped for v in res), res
    return res


def _structure(original, patched, region, grid):
    assert patched.lint() == []
    names = [t.name for t in patched.tensors]
    assert len(set(names)) == len(names)
    assert [patched.tensors[t].name for t in patched.outputs] == [original.tensors[t].name for t in original.outputs]
    inside = set(region.ops)
    kept = [op for op in original.ops if original.tensors[op.outputs[0]].name not in inside]
    for op in kept:  # ops outside the region untouched (same opcode, options, tensor names)
        name = original.tensors[op.outputs[0]].name
        (twin,) = [o for o in patched.ops if o.outputs and patched.tensors[o.outputs[0]].name == name]
        assert (twin.opcode, twin.options) == (op.opcode, op.options)
        assert [patched.tensors[t].name for t in twin.inputs] == [original.tensors[t].name for t in op.inputs]
    for op in patched.ops:
        if op.opcode == "CONCATENATION":
            assert len(op.inputs) <= 8
        if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D", "MAX_POOL_2D", "AVERAGE_POOL_2D") and \
                patched.tensors[op.outputs[0]].name.rsplit("/", 1)[-1].startswith("p"):
            assert op.options.padding == "VALID" or any(  # SAME only where it pads exactly as needed
                o.options.padding == "SAME" and o.opcode == op.opcode for o in original.ops)
    # one concatenation per row of tiles (when there are columns) and one over the rows
    joins = [op for op in patched.ops if op.opcode == "CONCATENATION" and op not in original.ops]
    assert len(joins) == (grid[0] if grid[1] > 1 else 0) + (1 if grid[0] > 1 else 0)


# ---- random int8 CNNs -----------------------------------------------------------------------------
@st.composite
def cnns(draw, dtype="int8"):
    b = CnnBuilder(seed=draw(st.integers(0, 2**16)), dtype=dtype)
    x = b.input((1, draw(st.integers(5, 14)), draw(st.integers(5, 14)), draw(st.integers(1, 4))))
    prev = None
    for _ in range(draw(st.integers(2, 5))):
        _, h, w, c = b.shape(x)
        kind = draw(st.sampled_from(["conv", "conv", "dw", "dw", "add", "maxpool", "avgpool", "pad"]))
        k = draw(st.sampled_from([1, 3]))
        stride = draw(st.sampled_from([1, 2])) if min(h, w) >= 6 else 1
        dil = draw(st.sampled_from([1, 2])) if stride == 1 and k == 3 else 1
        pad = draw(st.sampled_from(["SAME", "VALID"])) if min(h, w) > (k - 1) * dil + 2 else "SAME"
        act = draw(st.sampled_from(["NONE", "RELU", "RELU6"]))
        if kind == "conv":
            y = b.conv(x, draw(st.integers(1, 6)), k, stride, dil, pad, act)
        elif kind == "dw":
            y = b.dw(x, k, stride, dil, pad, act)
        elif kind == "add" and prev is not None and b.shape(prev) == b.shape(x):
            y = b.add(x, prev)
        elif kind == "maxpool" and min(h, w) >= 4:
            y = b.pool(x, "MAX_POOL_2D", draw(st.sampled_from([2, 3])), draw(st.sampled_from([1, 2])),
                       draw(st.sampled_from(["SAME", "VALID"])))
        elif kind == "avgpool" and min(h, w) >= 4:
            y = b.pool(x, "AVERAGE_POOL_2D", 2, draw(st.sampled_from([1, 2])), "VALID")
        elif kind == "pad":
            y = b.pad(x, *(draw(st.integers(0, 1)) for _ in range(4)))
        else:
            y = b.dw(x, 3, 1, 1, "SAME", act)
        prev, x = x, y
    return b.graph([x])


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_random_int8_cnns_bit_identical(data):
    graph = data.draw(cnns())
    regions = patch_regions(graph)
    assert regions, "the input of a CNN of local ops always starts a region"
    region = data.draw(st.sampled_from(regions))
    grid = (data.draw(st.integers(1, min(4, region.max_grid[0]))),
            data.draw(st.integers(1, min(4, region.max_grid[1]))))
    note(f"{region} grid {grid}")
    try:
        patched = apply_patches(graph, region, grid)
    except UsageError as exc:  # a tile that reads nothing of a tensor (a PAD's border only)
        assert "too fine" in str(exc)
        return
    if grid == (1, 1):
        assert patched is graph
        return
    _structure(graph, patched, region, grid)
    # halos are recomputed; rows and columns nothing reads (a VALID stride-2 op's last input row)
    # are no longer computed at all, so fewer MACs is possible, but never more than once per tile
    assert _total_macs(patched) <= _total_macs(graph) * grid[0] * grid[1]
    for v in _exact_both(graph, patched):
        assert v.bit_exact, v.to_json()
    s = schedule(patched, time_limit=5)
    assert s.peak <= lifetimes(patched, None, "tflm").peak


def _chain(dtype="int8", seed=0, pool="MAX_POOL_2D", pool_pad="SAME"):
    b = CnnBuilder(seed=seed, dtype=dtype)
    x = b.input((1, 13, 11, 3))
    y = b.conv(x, 8, k=3, stride=2, padding="SAME", act="RELU6")
    z = b.add(b.dw(y, k=3, dilation=2), y)
    p = b.pool(z, pool, k=3, stride=1, padding=pool_pad)
    q = b.pad(p, 1, 0, 0, 1)
    return b.graph([b.conv(q, 6, k=3, stride=1, padding="VALID")])


def test_pointwise_region_costs_no_extra_macs():
    b = CnnBuilder(seed=3)
    x = b.input((1, 9, 7, 4))
    y = b.conv(b.conv(x, 6, k=1), 5, k=1, act="RELU")
    g = b.graph([b.add(y, b.conv(y, 5, k=1))])
    (first, *_) = [r for r in patch_regions(g) if r.output == g.tensors[g.outputs[0]].name]
    patched = apply_patches(g, first, (3, 2))
    assert _total_macs(patched) == _total_macs(g)
    assert all(v.bit_exact for v in _exact_both(g, patched))


def test_same_max_pool_pads_with_the_minimum():
    """PADV2 with -128 before a SAME max pool keeps every max; padding with the zero point
    instead (what a conv needs) changes the border outputs: the test can tell them apart."""
    g = _chain(seed=5)
    region = [r for r in patch_regions(g) if r.input == "t0" and r.output == g.tensors[g.outputs[0]].name][0]
    patched = apply_patches(g, region, (3, 3))
    pads = [op for op in patched.ops if op.opcode == "PADV2"]
    assert pads
    assert {int(patched.tensors[op.inputs[2]].values()[0]) for op in pads} == {-128}
    assert all(v.bit_exact for v in _exact_both(g, patched, runs=3))
    # break it on purpose: the pooled tensor's zero point as the pad value
    zp = g.tensors[[op for op in g.ops if op.opcode == "MAX_POOL_2D"][0].inputs[0]].quant.zero_point[0]
    value = pads[0].inputs[2]
    t = patched.tensors[value]
    bad_t = dataclasses.replace(t, data=np.frombuffer(np.int8(zp).tobytes(), np.uint8).copy())
    bad = dataclasses.replace(patched, tensors=patched.tensors[:value] + (bad_t,) + patched.tensors[value + 1:])
    assert not all(v.bit_exact for v in _exact_both(g, bad, runs=3))


@pytest.mark.parametrize("grid", [(2, 2), (4, 3), (6, 5)])
def test_float_model(grid):
    g = _chain(dtype="float32", seed=2)
    region = patch_regions(g)[4]
    patched = apply_patches(g, region, grid)
    res = _exact_both(g, patched)
    assert all(v.ok for v in res)  # float: exact or within float rounding (reported by the bench)


def test_same_average_pool_ends_regions():
    g = _chain(pool="AVERAGE_POOL_2D", pool_pad="SAME")
    pooled = [op for op in g.ops if op.opcode == "AVERAGE_POOL_2D"][0]
    name = g.tensors[pooled.outputs[0]].name
    assert all(name not in r.ops for r in patch_regions(g))
    with pytest.raises(UsageError, match="average pool"):
        apply_patches(g, PatchRegion("t0", g.tensors[g.outputs[0]].name, (), (2, 2)), (2, 2))


def test_illegal_grids_and_regions():
    g = _chain()
    region = patch_regions(g)[0]
    for grid in [(0, 1), (region.max_grid[0] + 1, 1), (1, 9)]:
        with pytest.raises(UsageError, match="grid"):
            apply_patches(g, region, grid)
    with pytest.raises(UsageError, match="no tensor"):
        apply_patches(g, dataclasses.replace(region, input="nope"), (2, 2))
    with pytest.raises(UsageError, match="ops are not"):
        apply_patches(g, dataclasses.replace(region, ops=region.ops[:-1] + ("x",)), (2, 2))


def test_regions_are_between_articulations():
    """A tensor inside a residual block (the dw output, joined by the ADD) starts no region."""
    g = _chain()
    dw = [op for op in g.ops if op.opcode == "DEPTHWISE_CONV_2D"][0]
    inner = g.tensors[dw.outputs[0]].name
    regions = patch_regions(g)
    assert all(r.input != inner and r.output != inner for r in regions)
    assert all(r.max_grid == (min(8, s[1]), min(8, s[2])) for r in regions
               for s in [next(t.shape for t in g.tensors if t.name == r.output)])


def test_tensor_read_with_two_halos():
    """y is read first by a 1x1 conv (no halo), then by a dilated 3x3 (halo 2): each tile computes
    y over the union of both needs and slices it for the 1x1 conv."""
    b = CnnBuilder(seed=7)
    x = b.input((1, 12, 10, 3))
    y = b.conv(x, 4, k=3, stride=1, padding="SAME", act="RELU")
    a = b.conv(y, 5, k=1)
    c = b.conv(y, 5, k=3, dilation=2, padding="SAME")
    g = b.graph([b.add(a, c)])
    region = [r for r in patch_regions(g) if r.input == "t0" and r.output == g.tensors[g.outputs[0]].name][0]
    patched = apply_patches(g, region, (3, 2))
    assert any(op.opcode == "STRIDED_SLICE" and patched.tensors[op.inputs[0]].name.startswith(g.tensors[y].name)
               for op in patched.ops)
    assert all(v.bit_exact for v in _exact_both(g, patched))


def test_tile_runs_cover_the_axis_longest_first():
    """The last tiles run while nearly all of the output is held: they get the short runs."""
    from tpu_pipeline.toolchain.ir.geometry import splits

    for n in range(1, 40):
        for k in range(1, min(n, 8) + 1):
            runs = splits(n, k)
            sizes = [b - a for a, b in runs]
            assert runs[0][0] == 0 and runs[-1][1] == n and all(runs[i][1] == runs[i + 1][0] for i in range(k - 1))
            assert sizes == sorted(sizes, reverse=True) and max(sizes) - min(sizes) <= 1
