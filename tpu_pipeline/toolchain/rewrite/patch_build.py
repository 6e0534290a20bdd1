"""The ops of a patched region: per output tile, slices, explicit pads and the region's ops run
VALID on the tile's boxes; then the concatenations that assemble the output (see patch.py)."""

from __future__ import annotations

import numpy as np

from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.ir import Graph, ops as irops
from tpu_pipeline.toolchain.rewrite.edit import GraphEditor
from tpu_pipeline.toolchain.ir.geometry import PADS, WINDOWED, Box, clip, hw, reads, region_needs, splits, window

_MIN = {"int8": -128, "uint8": 0, "int16": -32768, "float32": float(np.finfo(np.float32).min)}


def pool_min(dtype: str):
    """The value that never wins a max (PADV2 before a SAME max-pool)."""
    if dtype not in _MIN:
        raise UsageError(f"patch region: a SAME max pool on {dtype} tensors is not supported")
    return _MIN[dtype]


def _same_pads_it(graph: Graph, op, vbox: Box, real: Box, obox: Box) -> bool:
    """Whether the op run SAME on the unpadded tile `real` pads exactly to `vbox` (TFLite's SAME:
    out = ceil(in / stride), the total padding split with the smaller half before), so the tile
    needs no explicit PAD (a copy). Only for ops that are SAME in the model: their kernels already
    pad with the zero point (conv) or ignore padded taps (max pool)."""
    if vbox == real or op.options.padding != "SAME" or op.opcode == "AVERAGE_POOL_2D":
        return False
    for (k, s, d, _), (v0, v1), (r0, r1), (o0, o1) in zip(
            window(graph, op), ((vbox[0], vbox[1]), (vbox[2], vbox[3])), ((real[0], real[1]), (real[2], real[3])),
            ((obox[0], obox[1]), (obox[2], obox[3]))):
        n, out = r1 - r0, o1 - o0
        total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
        if -(-n // s) != out or (total // 2, total - total // 2) != (r0 - v0, v1 - r1):
            return False
    return True


class _Tiler:
    def __init__(self, graph: Graph, editor: GraphEditor, tin: int, tout: int, positions):
        self.g, self.ed = graph, editor
        self.tin, self.tout = tin, tout
        self.region = [graph.ops[i] for i in positions]
        self.consts: dict[tuple, int] = {}
        self.out: list = []

    # ---- helpers ------------------------------------------------------------------------------
    def _version(self, t: int) -> int:
        return 1 if self.g.tensors[t].dtype == "float32" else 2

    def _const(self, values, dtype: str, like: int | None = None) -> int:
        arr = np.asarray(values)
        key = (dtype, arr.shape, arr.tobytes(), like)
        if key not in self.consts:
            quant = self.g.tensors[like].quant if like is not None else None
            self.consts[key] = self.ed.add_constant("patch/const", arr, dtype, quant)
        return self.consts[key]

    def _activation(self, like: int, box: Box, tag: str) -> int:
        t = self.g.tensors[like]
        shape = (1, box[1] - box[0], box[3] - box[2], t.shape[3])
        return self.ed.add_activation(f"{t.name}/{tag}", t.dtype, shape, t.quant)

    # ---- one tile -----------------------------------------------------------------------------
    def needs(self, box: Box) -> dict[int, Box]:
        """Tensor -> the box of it the tile needs (clipped to the tensor), walking backwards."""
        need = region_needs(self.g, self.region, self.tout, box)
        if need is None:
            raise UsageError(f"patch grid too fine: a tile of '{self.g.tensors[self.tout].name}' reads nothing of "
                             "one of the region's tensors")
        return need

    def _fetch(self, have, cache, x: int, vbox: Box, mode, tag: str) -> int:
        """A tensor holding box `vbox` of x (virtual: parts past the image are padding)."""
        t, hbox = have[x]
        real = clip(vbox, hw(self.g, x))
        key = ("slice", x, real)
        if key not in cache:
            src = t
            if real != hbox:
                src = self._activation(x, real, f"slice_{tag}")
                c = self.g.tensors[x].shape[3]
                begin = [0, real[0] - hbox[0], real[2] - hbox[2], 0]
                end = [1, real[1] - hbox[0], real[3] - hbox[2], c]
                self.out.append(irops.strided_slice(t, self._const(begin, "int32"), self._const(end, "int32"),
                                                    self._const([1, 1, 1, 1], "int32"), src, self._version(x)))
            cache[key] = src
        src = cache[key]
        pads = (real[0] - vbox[0], vbox[1] - real[1], real[2] - vbox[2], vbox[3] - real[3])
        if not any(pads):
            return src
        key = ("pad", x, vbox, mode)
        if key not in cache:
            y = self._activation(x, vbox, f"pad_{tag}")
            paddings = self._const([[0, 0], [pads[0], pads[1]], [pads[2], pads[3]], [0, 0]], "int32")
            if mode == "zero":  # PAD fills with the output's zero point (0 in float)
                self.out.append(irops.pad(src, paddings, y, self._version(x)))
            else:
                value = mode[1] if mode[0] == "value" else \
                    self._const([pool_min(self.g.tensors[x].dtype)], self.g.tensors[x].dtype, like=x)
                self.out.append(irops.padv2(src, paddings, value, y, self._version(x)))
            cache[key] = y
        return cache[key]

    def tile(self, box: Box, tag: str) -> int:
        """Emit the ops of one output tile; returns the tile tensor."""
        need = self.needs(box)
        full = hw(self.g, self.tin)
        have = {self.tin: (self.tin, (0, full[0], 0, full[1]))}
        cache: dict = {}
        for op in self.region:
            y, obox = op.outputs[0], need[op.outputs[0]]
            if op.opcode in PADS:
                mode = "zero" if op.opcode == "PAD" else ("value", op.inputs[2])
                have[y] = (self._fetch(have, cache, op.inputs[0], reads(self.g, op, obox), mode, tag), obox)
                continue
            windowed = op.opcode in WINDOWED
            mode = "zero"
            if op.opcode == "MAX_POOL_2D" and op.options.padding == "SAME":
                mode = ("min",)
            inputs, padding = [], "VALID"
            for x in op.inputs:
                if not self.g.is_activation(x):
                    inputs.append(x)
                    continue
                vbox = reads(self.g, op, obox) if windowed else obox
                if windowed and _same_pads_it(self.g, op, vbox, clip(vbox, hw(self.g, x)), obox):
                    vbox, padding = clip(vbox, hw(self.g, x)), "SAME"  # no PAD copy needed
                inputs.append(self._fetch(have, cache, x, vbox, mode, tag))
            t = self._activation(y, obox, tag)
            new = irops.like(op, inputs, (t,), padding=padding) if windowed else irops.like(op, inputs, (t,))
            self.out.append(new)
            have[y] = (t, obox)
        return have[self.tout][0]

    # ---- the whole output ---------------------------------------------------------------------
    def build(self, grid: tuple[int, int]) -> list:
        gh, gw = grid
        oh, ow = hw(self.g, self.tout)
        ver = self._version(self.tout)
        rows = []
        for r, (h0, h1) in enumerate(splits(oh, gh)):
            tiles = [self.tile((h0, h1, w0, w1), f"p{r}_{c}") for c, (w0, w1) in enumerate(splits(ow, gw))]
            if gw == 1:
                rows.append(tiles[0])
                continue
            row = self.tout if gh == 1 else self._activation(self.tout, (h0, h1, 0, ow), f"row{r}")
            self.out.append(irops.concatenation(tiles, row, axis=2, version=ver))
            rows.append(row)
        if gh > 1:
            self.out.append(irops.concatenation(rows, self.tout, axis=1, version=ver))
        return self.out


def build_tiles(graph: Graph, editor: GraphEditor, tin: int, tout: int, positions, grid) -> list:
    """The ops that replace the region's ops (positions), in patch-by-patch order."""
    return _Tiler(graph, editor, tin, tout, positions).build(grid)
