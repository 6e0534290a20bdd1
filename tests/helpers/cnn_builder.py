"""A small IR-level builder of random CNNs (int8 with per-channel weights, or float32), so tests can
make real .tflite models without TensorFlow:

    b = CnnBuilder(seed=1, dtype="int8")
    x = b.input((1, 9, 11, 3))
    y = b.conv(x, 8, k=3, stride=2, padding="SAME", act="RELU6")
    z = b.add(b.dw(y, k=3, dilation=2), y)
    graph = b.graph([z]);  data = b.model_bytes([z])
"""

from __future__ import annotations

import numpy as np

from tpu_pipeline.toolchain.ir import Graph, Quantization, Tensor
from tpu_pipeline.toolchain.ir import ops as irops
from tpu_pipeline.toolchain.ir.convert import standalone_model
from tpu_pipeline.toolchain.ir.options import (AddOptions, ConcatenationOptions, Conv2DOptions, DepthwiseConv2DOptions,
                                              FullyConnectedOptions, MulOptions, Pool2DOptions, ReducerOptions)
from tpu_pipeline.toolchain.tflite import model_to_bytes

_NP = {"int8": np.int8, "int32": np.int32, "float32": np.float32}


def _out(n: int, k: int, s: int, d: int, padding: str) -> int:
    return -(-n // s) if padding == "SAME" else (n - (k - 1) * d - 1) // s + 1


class CnnBuilder:
    """`spread=True` (int8): every activation's scale follows an estimate of its input's spread
    (and a ReLU output's zero point sits low), so deep chains keep tens of distinct values per
    tensor instead of collapsing to a few: a test comparing outputs then sees any wrong byte."""

    def __init__(self, seed: int = 0, dtype: str = "int8", spread: bool = False):
        self.rng = np.random.default_rng(seed)
        self.dtype = dtype
        self.spread = spread
        self.std: dict[int, float] = {}  # activation -> estimated standard deviation, in LSBs
        self.tensors: list[Tensor] = []
        self.ops: list = []
        self.inputs: list[int] = []

    # ---- tensors --------------------------------------------------------------------------
    def _tensor(self, shape, dtype=None, quant=None, values=None) -> int:
        data = None
        if values is not None:
            data = np.frombuffer(np.ascontiguousarray(values, dtype=_NP[dtype]).tobytes(), dtype=np.uint8).copy()
            data.flags.writeable = False
        i = len(self.tensors)
        self.tensors.append(Tensor(index=i, name=f"t{i}", dtype=dtype or self.dtype, shape=tuple(shape),
                                   quant=quant, data=data))
        return i

    def _act(self, shape, scale: float | None = None, act: str = "NONE", std: float = 40.0) -> int:
        if self.dtype != "int8":
            return self._tensor(shape)
        scale = scale if scale is not None else float(self.rng.uniform(0.02, 0.1))
        zero = int(self.rng.integers(-20, 21))
        if self.spread and act != "NONE":
            zero, std = -100, 0.6 * std  # the positive half of a ReLU's input over most of the range
        t = self._tensor(shape, quant=Quantization((scale,), (zero,)))
        self.std[t] = std
        return t

    def _scale(self, t: int) -> float:
        q = self.tensors[t].quant
        return q.scale[0] if q else 1.0

    def shape(self, t: int) -> tuple[int, ...]:
        return self.tensors[t].shape

    def float_input(self, shape) -> int:
        """A float32 input quantized by a QUANTIZE, as a converter writes a float-interface model:
        the int8 tensor the body reads."""
        xf = self._tensor(shape, "float32")
        self.inputs.append(xf)
        x = self._act(shape, std=73.0)
        self.ops.append(irops.op("QUANTIZE", (xf,), (x,), None, 1))
        return x

    def dequantize(self, t) -> int:
        """A float32 output: `t` through a DEQUANTIZE."""
        y = self._tensor(self.shape(t), "float32")
        self.ops.append(irops.op("DEQUANTIZE", (t,), (y,), None, 2))
        return y

    def input(self, shape) -> int:
        t = self._act(shape, std=73.0)  # (random int8 inputs: uniform over the range)
        self.inputs.append(t)
        return t

    def _weights(self, x: int, shape, axis: int, k_sum: int):
        """(weights, bias, output scale) for a conv-like op reading x."""
        cout = shape[axis]
        if self.dtype != "int8":
            w = self._tensor(shape, "float32", values=self.rng.normal(0, 1 / np.sqrt(k_sum), shape))
            return w, self._tensor((cout,), "float32", values=self.rng.normal(0, 0.1, cout)), None
        if self.spread:  # real outputs of a few units (what a ReLU6 passes), 40 LSBs per deviation
            out_scale = float(self.rng.uniform(0.03, 0.06))
            ws = out_scale * 40 / (np.sqrt(k_sum) * self._scale(x) * 73 * self.std.get(x, 40.0))
            ws = ws * self.rng.uniform(0.7, 1.3, cout)
        else:
            ws = self.rng.uniform(0.005, 0.02, cout)
        w = self._tensor(shape, "int8", Quantization(tuple(ws), (0,) * cout, axis),
                         self.rng.integers(-127, 128, shape))
        bs = self._scale(x) * ws
        b = self._tensor((cout,), "int32", Quantization(tuple(bs), (0,) * cout, 0),
                         self.rng.integers(-2000, 2001, cout))
        if self.spread:
            return w, b, out_scale
        # about 40 output LSBs per standard deviation of the accumulator: few saturations
        return w, b, float(np.sqrt(k_sum) * self._scale(x) * ws.mean() * 3600 / 40)

    # ---- layers ---------------------------------------------------------------------------
    def conv(self, x, cout, k=3, stride=1, dilation=1, padding="SAME", act="NONE") -> int:
        _, h, w, cin = self.shape(x)
        wt, b, scale = self._weights(x, (cout, k, k, cin), 0, k * k * cin)
        y = self._act((1, _out(h, k, stride, dilation, padding), _out(w, k, stride, dilation, padding), cout), scale,
                      act)
        opts = Conv2DOptions(padding, stride, stride, act, dilation, dilation)
        self.ops.append(irops.op("CONV_2D", (x, wt, b), (y,), opts, 3))
        return y

    def dw(self, x, k=3, stride=1, dilation=1, padding="SAME", act="NONE") -> int:
        _, h, w, c = self.shape(x)
        wt, b, scale = self._weights(x, (1, k, k, c), 3, k * k)
        y = self._act((1, _out(h, k, stride, dilation, padding), _out(w, k, stride, dilation, padding), c), scale,
                      act)
        opts = DepthwiseConv2DOptions(padding, stride, stride, 1, act, dilation, dilation)
        self.ops.append(irops.op("DEPTHWISE_CONV_2D", (x, wt, b), (y,), opts, 3))
        return y

    def fc(self, x, m, act="NONE", per_channel=False, bias=True, batches=1) -> int:
        """An int8 FULLY_CONNECTED of `m` outputs reading x as [batches, N] (symmetric int8 weights,
        per tensor or per output; outputs of about 40 LSBs per deviation, as `spread` sets them)."""
        n = self.tensors[x].num_elements // batches
        out_scale = float(self.rng.uniform(0.03, 0.06))
        ws = out_scale * 40 / (np.sqrt(n) * self._scale(x) * 73 * self.std.get(x, 40.0))
        ws = ws * self.rng.uniform(0.7, 1.3, m if per_channel else 1)
        w = self._tensor((m, n), "int8", Quantization(tuple(map(float, ws)), (0,) * len(ws), 0),
                         self.rng.integers(-127, 128, (m, n)))
        b = -1
        if bias:
            scales = tuple(float(self._scale(x) * s) for s in np.resize(ws, m))
            b = self._tensor((m,), "int32", Quantization(scales, (0,) * m, 0), self.rng.integers(-3000, 3001, m))
        y = self._act((batches, m), out_scale, act)
        self.ops.append(irops.op("FULLY_CONNECTED", (x, w, b), (y,), FullyConnectedOptions(fused_activation=act), 9))
        return y

    def pool(self, x, kind="MAX_POOL_2D", k=2, stride=2, padding="VALID") -> int:
        _, h, w, c = self.shape(x)
        q = self.tensors[x].quant
        y = self._tensor((1, _out(h, k, stride, 1, padding), _out(w, k, stride, 1, padding), c), quant=q)
        self.ops.append(irops.op(kind, (x,), (y,), Pool2DOptions(padding, stride, stride, k, k), 2))
        self.std[y] = self.std.get(x, 40.0)
        return y

    def add(self, a, b, act="NONE") -> int:
        sa, sb = self._scale(a), self._scale(b)
        std = float(np.hypot(self.std.get(a, 40.0) * sa, self.std.get(b, 40.0) * sb) / (sa + sb))
        y = self._act(self.shape(a), (sa + sb) if self.dtype == "int8" else None, act, std)
        self.ops.append(irops.op("ADD", (a, b), (y,), AddOptions(act), 2))
        return y

    def mean(self, x, axes=(1, 2), keep_dims=True, scale=None) -> int:
        """A global average pool as converters write it: MEAN over H and W, keeping the dims (other
        `axes`, and an output `scale` of its own, on request)."""
        shape = self.shape(x)
        resolved = {a % len(shape) for a in axes}
        out = tuple(1 if a in resolved else d for a, d in enumerate(shape)) if keep_dims else \
            tuple(d for a, d in enumerate(shape) if a not in resolved)
        axis = self._tensor((len(axes),), "int32", values=list(axes))
        q = self.tensors[x].quant
        if scale is not None:
            q = Quantization(scale=(float(scale),), zero_point=(int(self.rng.integers(-20, 20)),))
        y = self._tensor(out, quant=q)
        self.ops.append(irops.op("MEAN", (x, axis), (y,), ReducerOptions(keep_dims), 2))
        self.std[y] = self.std.get(x, 40.0) / 4
        return y

    def mul(self, a, b, act="NONE") -> int:
        """a * b, b broadcast over a's shape (a squeeze-and-excitation scaling)."""
        scale = self._scale(a) * self._scale(b) * 60 if self.dtype == "int8" else None
        y = self._act(self.shape(a), scale, act)
        self.ops.append(irops.op("MUL", (a, b), (y,), MulOptions(act), 2))
        return y

    def concat(self, xs) -> int:
        _, h, w, _ = self.shape(xs[0])
        q = self.tensors[xs[0]].quant  # one quantization for all: a plain copy
        if q is not None:
            self.tensors = [t if t.index not in xs else Tensor(t.index, t.name, t.dtype, t.shape, quant=q)
                            for t in self.tensors]
        y = self._tensor((1, h, w, sum(self.shape(x)[3] for x in xs)), quant=q)
        self.ops.append(irops.op("CONCATENATION", xs, (y,), ConcatenationOptions(3), 2))
        return y

    def pad(self, x, top, bottom, left, right) -> int:
        _, h, w, c = self.shape(x)
        p = self._tensor((4, 2), "int32", values=[[0, 0], [top, bottom], [left, right], [0, 0]])
        y = self._tensor((1, h + top + bottom, w + left + right, c), quant=self.tensors[x].quant)
        self.ops.append(irops.pad(x, p, y, 2 if self.dtype == "int8" else 1))
        self.std[y] = self.std.get(x, 40.0)
        return y

    # ---- results --------------------------------------------------------------------------
    def graph(self, outputs) -> Graph:
        return Graph(tuple(self.tensors), tuple(self.ops), tuple(self.inputs), tuple(outputs), "cnn")

    def model_bytes(self, outputs) -> bytes:
        return graph_bytes(self.graph(outputs))


def graph_bytes(graph: Graph) -> bytes:
    return model_to_bytes(standalone_model(graph))
