"""Numerics of rewrites: a float64 reference convolution, and calibration values of activations
(LiteRT's builtin kernels on random inputs; running models lives in `tpu_pipeline.toolchain.execute`).
"""

from __future__ import annotations

import numpy as np

from tpu_pipeline.toolchain.execute.inputs import random_inputs
from tpu_pipeline.toolchain.execute.litert import input_details, run_litert
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.ir.convert import standalone_model
from tpu_pipeline.toolchain.tflite import model_to_bytes


def conv2d_nhwc(x, w, stride_h=1, stride_w=1, dil_h=1, dil_w=1, same=True):
    """Reference CONV_2D in float64: x [N,H,W,C], w [O,kh,kw,C] -> [N,OH,OW,O] (TFLite padding)."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    n, h, wd, _ = x.shape
    o, kh, kw, _ = w.shape
    ekh, ekw = (kh - 1) * dil_h + 1, (kw - 1) * dil_w + 1
    if same:
        oh, ow = -(-h // stride_h), -(-wd // stride_w)
        ph = max((oh - 1) * stride_h + ekh - h, 0)
        pw = max((ow - 1) * stride_w + ekw - wd, 0)
        pt, pl = ph // 2, pw // 2
        x = np.pad(x, ((0, 0), (pt, ph - pt), (pl, pw - pl), (0, 0)))
    else:
        oh, ow = (h - ekh) // stride_h + 1, (wd - ekw) // stride_w + 1
    out = np.zeros((n, oh, ow, o))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, i * dil_h: i * dil_h + (oh - 1) * stride_h + 1: stride_h,
                      j * dil_w: j * dil_w + (ow - 1) * stride_w + 1: stride_w, :]
            out += patch @ w[:, i, j, :].T
    return out


def calibration_values(graph: Graph, tensors, runs: int = 4, seed: int = 0, model=None) -> dict[int, list]:
    """Values of activation `tensors` (indices of `graph`) over `runs` random inputs (LiteRT)."""
    data = model_to_bytes(standalone_model(graph, model))
    rng = np.random.default_rng(seed)
    details = input_details(data)
    acc: dict[int, list] = {t: [] for t in tensors}
    for _ in range(runs):
        _, vals = run_litert(data, random_inputs(details, rng), tensors)
        for t, v in vals.items():
            acc[t].append(v)
    return acc


def calibration_values_within(part: Graph, tensors, whole: Graph, runs: int = 4, seed: int = 0,
                              model=None) -> dict[int, list]:
    """`calibration_values` of tensors of `part`, a piece of `whole` (same tensor names) that a
    rewrite may have changed: `whole` runs on random inputs; tensors it has come from it, and the
    others from `part` fed, run by run, with the values `whole` gave its inputs."""
    index = {t.name: t.index for t in whole.tensors}
    feeds = [index[part.tensors[t].name] for t in part.inputs]
    known = [t for t in tensors if part.tensors[t].name in index]
    fed = calibration_values(whole, list(dict.fromkeys(feeds + [index[part.tensors[t].name] for t in known])),
                             runs, seed, model)
    out = {t: fed[index[part.tensors[t].name]] for t in known}
    rest = [t for t in tensors if t not in out]
    if rest:
        data = model_to_bytes(standalone_model(part, model))
        for t in rest:
            out[t] = []
        for r in range(runs):
            _, vals = run_litert(data, [fed[f][r] for f in feeds], rest)
            for t in rest:
                out[t].append(vals[t])
    return out
