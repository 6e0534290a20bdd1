"""Spatial geometry of the windowed ops on [1, H, W, C] tensors: their windows and padding, the
box of an input that an output box reads, and box arithmetic.

One definition for everything that reasons about rows and columns: patch-based execution
(`rewrite.patch`), its estimates (`fit.estimate`), the kernels' scratch sizes (`memory.scratch`),
the cost model's kernel paths (`cost.mcu`) and the harness kernels (`ir.kernels`).

Padding follows TFLite: SAME gives `out = ceil(in / stride)` and splits the total padding with the
smaller half before; VALID pads nothing; EXPLICIT (harness kernels only, `ir.kernels`) carries its
leading padding in the options (`pad_top`, `pad_left`), the trailing padding being whatever the
output size reads past the end.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tpu_pipeline.toolchain.ir.graph import Graph, Op

Box = tuple[int, int, int, int]  # h0, h1, w0, w1 (half-open), in a tensor's own coordinates
WINDOWED = ("CONV_2D", "DEPTHWISE_CONV_2D", "MAX_POOL_2D", "AVERAGE_POOL_2D")
PADS = ("PAD", "PADV2")


class Window(NamedTuple):
    """One spatial axis of an op's window: output index o reads input o*stride - pad_before +
    i*dilation for i in 0..kernel-1. A PAD op is a 1-tap window whose pad_before is its padding
    (output o reads input o - pad)."""
    kernel: int
    stride: int
    dilation: int
    pad_before: int


def hw(graph: Graph, t: int) -> tuple[int, int]:
    s = graph.tensors[t].shape
    return s[1], s[2]


def same_split(in_size: int, out_size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """(before, after) padding SAME uses for an axis (after = the larger half)."""
    total = max((out_size - 1) * stride + (kernel - 1) * dilation + 1 - in_size, 0)
    return total // 2, total - total // 2


def pad_values(graph: Graph, op: Op) -> np.ndarray:
    """A PAD/PADV2's paddings as a [rank, 2] int array."""
    return graph.tensors[op.inputs[1]].values().reshape(-1, 2).astype(np.int64)


def window(graph: Graph, op: Op) -> tuple[Window, Window]:
    """(rows, columns) windows of a windowed op or a PAD/PADV2 on [1, H, W, C] tensors."""
    x, y = op.inputs[0], op.outputs[0]
    (ih, iw), (oh, ow) = hw(graph, x), hw(graph, y)
    if op.opcode in PADS:
        p = pad_values(graph, op)
        return Window(1, 1, 1, int(p[1, 0])), Window(1, 1, 1, int(p[2, 0]))
    o = op.options
    if op.opcode in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        w = graph.tensors[op.inputs[1]].shape
        kh, kw, dh, dw = w[1], w[2], o.dilation_h, o.dilation_w
    else:
        kh, kw, dh, dw = o.filter_height, o.filter_width, 1, 1
    if o.padding == "EXPLICIT":
        return Window(kh, o.stride_h, dh, o.pad_top), Window(kw, o.stride_w, dw, o.pad_left)

    def before(i, out, k, s, d):
        return 0 if o.padding == "VALID" else same_split(i, out, k, s, d)[0]

    return (Window(kh, o.stride_h, dh, before(ih, oh, kh, o.stride_h, dh)),
            Window(kw, o.stride_w, dw, before(iw, ow, kw, o.stride_w, dw)))


def leading_pads(graph: Graph, op: Op) -> tuple[int, int]:
    """(top, left) padding of a convolution or pool, whatever its padding mode."""
    rows, cols = window(graph, op)
    return rows.pad_before, cols.pad_before


def reads(graph: Graph, op: Op, out: Box) -> Box:
    """The virtual input box (it may reach past the image) op needs for its output box `out`."""
    if op.opcode not in WINDOWED + PADS:
        return out
    (kh, sh, dh, ph), (kw, sw, dw, pw) = window(graph, op)
    return (out[0] * sh - ph, (out[1] - 1) * sh - ph + (kh - 1) * dh + 1,
            out[2] * sw - pw, (out[3] - 1) * sw - pw + (kw - 1) * dw + 1)


def clip(box: Box, size: tuple[int, int]) -> Box:
    return max(box[0], 0), min(box[1], size[0]), max(box[2], 0), min(box[3], size[1])


def union(a: Box | None, b: Box) -> Box:
    return b if a is None else (min(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), max(a[3], b[3]))


def is_empty(box: Box) -> bool:
    return box[0] >= box[1] or box[2] >= box[3]


def splits(n: int, k: int) -> list[tuple[int, int]]:
    """`n` rows (or columns) in `k` runs, the longer ones first: the last tiles run while nearly
    all of the output is held, so they are the ones to keep small."""
    q, r = divmod(n, k)
    return [(i * q + min(i, r), (i + 1) * q + min(i + 1, r)) for i in range(k)]


def even_splits(n: int, k: int) -> list[tuple[int, int]]:
    """`n` columns in `k` runs of an even width, the longer ones first (an odd `n`'s extra column
    on the first), where `n` holds two a run: the harness kernels compute pixel pairs, and a run
    of odd width computes its lone last pixel as a pair (detection's 32x3 stage: 13-wide tiles
    left one a row). Where that would widen the widest run, `splits(n, k)`."""
    plain = splits(n, k)
    if n < 2 * k:
        return plain
    extra = n % 2
    even = [(0 if i == 0 else 2 * a + extra, 2 * b + extra) for i, (a, b) in enumerate(splits(n // 2, k))]
    return even if max(b - a for a, b in even) <= max(b - a for a, b in plain) else plain


def region_needs(graph: Graph, region_ops, out_tensor: int, box: Box) -> dict[int, Box] | None:
    """Tensor -> the box of it a tile of `out_tensor` with box `box` needs, for the region's ops
    (`region_ops`: Op objects in execution order), walking backwards: each op maps its output's box
    to the input box its window reads, clipped to the tensor; a tensor read by several ops is
    needed over the union of their boxes. None when the tile reads nothing of some tensor (a grid
    too fine for the region's windows)."""
    need = {out_tensor: box}
    for op in reversed(list(region_ops)):
        obox = need[op.outputs[0]]
        for x in dict.fromkeys(op.inputs):
            if not graph.is_activation(x):
                continue
            real = clip(reads(graph, op, obox), hw(graph, x))
            if is_empty(real):
                return None
            need[x] = union(need.get(x), real)
    return need


class AxisNeeds:
    """`region_needs` along one axis (0: rows, 1: columns) for every tile at once. Each op maps an
    output run [o0, o1) to the input run its window reads, clipped to the tensor, and a tensor read
    by several ops is needed over the union: the start of every needed run depends on o0 alone
    and its end on o1 alone. So one backward walk over arrays of every o0 (0..n-1) and every o1
    (0..n) answers all grids: `runs(starts, ends)` indexes it (a grid's p runs: p lookups, no walk)."""

    def __init__(self, graph: Graph, region_ops, out_tensor: int, axis: int):
        n = hw(graph, out_tensor)[axis]
        self.lo = {out_tensor: np.arange(n + 1, dtype=np.int64)}  # tensor -> start of its run, by o0
        self.hi = {out_tensor: np.arange(n + 1, dtype=np.int64)}  # tensor -> end of its run, by o1
        self.reads: list[tuple[np.ndarray, np.ndarray]] = []  # every op's input run (start, end): empty if start >= end
        for op in reversed(list(region_ops)):
            lo, hi = self.lo[op.outputs[0]], self.hi[op.outputs[0]]
            if op.opcode in WINDOWED + PADS:
                k, s, d, p = window(graph, op)[axis]
                read = lo * s - p, (hi - 1) * s - p + (k - 1) * d + 1
            else:
                read = lo, hi
            for x in dict.fromkeys(op.inputs):
                if not graph.is_activation(x):
                    continue
                a, b = read
                a, b = np.maximum(a, 0), np.minimum(b, hw(graph, x)[axis])
                self.reads.append((a, b))
                self.lo[x] = a if x not in self.lo else np.minimum(self.lo[x], a)
                self.hi[x] = b if x not in self.hi else np.maximum(self.hi[x], b)

    def runs(self, starts, ends) -> dict[int, tuple[np.ndarray, np.ndarray]] | None:
        """Tensor -> (starts, ends) of the runs tiles [starts[i], ends[i]) of the output need; None
        when some tile reads nothing of some tensor (as region_needs)."""
        s, e = np.asarray(starts), np.asarray(ends)
        if any(bool((a[s] >= b[e]).any()) for a, b in self.reads):
            return None
        return {t: (self.lo[t][s], self.hi[t][e]) for t in self.lo}
