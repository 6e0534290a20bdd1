"""Numerics of rewrites: a float64 reference convolution, the model a rewritten graph is written
as, and calibration values of activations (LiteRT's builtin kernels on random inputs; running
models lives in `toolchain.execute`).
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from toolchain.errors import ModelError
from toolchain.execute.inputs import random_inputs
from toolchain.execute.litert import input_details, run_litert
from toolchain.ir import Graph, to_model
from toolchain.tflite import model_to_bytes

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


def standalone_model(graph: Graph, model: schema.ModelT | None = None) -> schema.ModelT:
    """A ModelT for `graph`: `to_model(graph, model)` when the source model is known, else one
    built from the IR alone (builtin ops only; enough for calibration and tests)."""
    if model is not None:
        return rewritten_model(graph, model)
    base = schema.ModelT()
    base.version = 3
    base.description = b"tpu-pipeline rewrite"
    base.buffers = [schema.BufferT()]
    base.operatorCodes = []
    sg = schema.SubGraphT()
    sg.tensors, sg.operators, sg.inputs, sg.outputs = [], [], [], []
    base.subgraphs = [sg]
    if any(op.is_custom for op in graph.ops):
        raise ModelError(f"graph '{graph.name}' has custom ops; it cannot be run without its source model")
    bare = Graph(tuple(dataclasses.replace(t, source=None) for t in graph.tensors),
                 tuple(dataclasses.replace(op, source=None) for op in graph.ops),
                 graph.inputs, graph.outputs, graph.name)
    return to_model(bare, base)


def prune_buffers(model: schema.ModelT) -> schema.ModelT:
    """Empty the buffers no tensor and no metadata entry refers to any more (a rewrite's sliced
    filters replace the originals); indices stay, so nothing else needs renumbering."""
    used = {0}
    for sg in model.subgraphs or []:
        used.update(int(t.buffer or 0) for t in sg.tensors or [])
    used.update(int(m.buffer) for m in model.metadata or [])
    if all(i in used or not (b.data is not None and len(b.data)) for i, b in enumerate(model.buffers or [])):
        return model
    out = copy.copy(model)
    out.buffers = [b if i in used else schema.BufferT() for i, b in enumerate(model.buffers)]
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


def rewritten_model(graph: Graph, model: schema.ModelT) -> schema.ModelT:
    """The ModelT to write for a rewritten graph: `to_model`, without a stale offline memory plan
    (its offsets were for the old tensors) and without the buffers nothing refers to any more."""
    from toolchain.tflite import OFFLINE_PLAN_NAME

    out = to_model(graph, model)
    if out.metadata:
        def name(m):
            return m.name.decode() if isinstance(m.name, bytes) else (m.name or "")
        kept = [m for m in out.metadata if name(m) != OFFLINE_PLAN_NAME]
        if len(kept) != len(out.metadata):
            out = copy.copy(out)
            out.metadata = kept
    return prune_buffers(out)
