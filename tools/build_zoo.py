#!/usr/bin/env python3
"""Build the tpu-pipeline model zoo and the committed test fixtures.

This is the ONLY place in the repository that imports TensorFlow; ``tpu_pipeline/toolchain/`` and
``tpu_pipeline/runtime/`` never do.  TensorFlow is imported lazily, so ``--list`` works without it.

    python tools/build_zoo.py --out models                 # the whole zoo (cached)
    python tools/build_zoo.py --out models --only darts_v2_cifar resnet50
    python tools/build_zoo.py --list
    python tools/build_zoo.py --out models --float         # float32 of every model too
    python tools/build_zoo.py --fixtures                   # tests/fixtures + examples/

Every int8 model uses full-integer post-training quantization (int8 in, int8 out, builtin int8
ops only) calibrated on 4 random samples; weights are random (``weights=None``) with a per-model
fixed seed, so a rebuild gives the same model.  Each built model is checked in a child process:
it must load and invoke in LiteRT (``ai_edge_litert``) and, when possible, in TFLite Micro; the
result (and TFLM's arena head) goes to ``<out>/MANIFEST.json``.  Files are written atomically and
skipped when already present (``--force`` rebuilds).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FIXTURES_DIR = REPO / "tests" / "fixtures"
EXAMPLES_DIR = REPO / "examples"
CHECK_TIMEOUT_S = 900

tf = None  # imported lazily by _tf()
L = None   # tf.keras.layers


def _tf():
    global tf, L
    if tf is None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
        import tensorflow as _tf_mod  # noqa: the one TensorFlow import of the project
        tf = _tf_mod
        L = tf.keras.layers
        import warnings
        warnings.filterwarnings("ignore", category=UserWarning)
        try:
            import absl.logging
            absl.logging.set_verbosity(absl.logging.ERROR)
        except Exception:  # pragma: no cover
            pass
    return tf


# --------------------------------------------------------------------------------------------
# Model specifications
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Spec:
    name: str
    family: str
    build: Callable[[], object]          # () -> keras.Model with a batch-1 static input
    regular: bool
    float32: bool = False                # also build <name>_float32.tflite by default
    coral_name: str | None = None        # matches data/coral_published_latency.csv `model`
    note: str = ""


def _seed_of(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def _inp(h: int, w: int | None = None, c: int = 3, name: str = "input"):
    return L.Input((h, w or h, c), batch_size=1, name=name)


# ---- Keras applications ---------------------------------------------------------------------

def _app(attr: str, size: int, **kw) -> Callable[[], object]:
    def build():
        fn = getattr(tf.keras.applications, attr)
        return fn(weights=None, input_tensor=_inp(size), **kw)
    return build


# ---- small building blocks ------------------------------------------------------------------

def _bn(x):
    return L.BatchNormalization(epsilon=1e-5)(x)


def _conv_bn(x, c, k=1, s=1, relu=True, pre_relu=False, d=1):
    if pre_relu:
        x = L.ReLU()(x)
    x = L.Conv2D(c, k, strides=s, padding="same", dilation_rate=d, use_bias=False)(x)
    x = _bn(x)
    return L.ReLU()(x) if relu else x


def _sep(x, c, k=3, s=1, d=1):
    """Depthwise k x k + pointwise 1x1 + BN (BN folds into the pointwise conv)."""
    x = L.DepthwiseConv2D(k, strides=s, padding="same", dilation_rate=d, use_bias=False)(x)
    x = L.Conv2D(c, 1, use_bias=False)(x)
    return _bn(x)


# ---- GoogLeNet / InceptionV1 (slim layout) --------------------------------------------------

def build_inception_v1(size: int = 224, classes: int = 1001):
    """InceptionV1 as in TF-slim (BN after every conv; the '5x5' branch uses 3x3 like slim)."""
    i = _inp(size)
    x = _conv_bn(i, 64, 7, 2)
    x = L.MaxPooling2D(3, 2, padding="same")(x)
    x = _conv_bn(x, 64, 1)
    x = _conv_bn(x, 192, 3)
    x = L.MaxPooling2D(3, 2, padding="same")(x)

    def block(x, c0, c1a, c1b, c2a, c2b, c3):
        b0 = _conv_bn(x, c0, 1)
        b1 = _conv_bn(_conv_bn(x, c1a, 1), c1b, 3)
        b2 = _conv_bn(_conv_bn(x, c2a, 1), c2b, 3)
        b3 = _conv_bn(L.MaxPooling2D(3, 1, padding="same")(x), c3, 1)
        return L.Concatenate()([b0, b1, b2, b3])

    x = block(x, 64, 96, 128, 16, 32, 32)
    x = block(x, 128, 128, 192, 32, 96, 64)
    x = L.MaxPooling2D(3, 2, padding="same")(x)
    x = block(x, 192, 96, 208, 16, 48, 64)
    x = block(x, 160, 112, 224, 24, 64, 64)
    x = block(x, 128, 128, 256, 24, 64, 64)
    x = block(x, 112, 144, 288, 32, 64, 64)
    x = block(x, 256, 160, 320, 32, 128, 128)
    x = L.MaxPooling2D(2, 2, padding="same")(x)
    x = block(x, 256, 160, 320, 32, 128, 128)
    x = block(x, 384, 192, 384, 48, 128, 128)
    x = L.GlobalAveragePooling2D()(x)
    x = L.Dense(classes, activation="softmax")(x)
    return tf.keras.Model(i, x, name="inception_v1")


# ---- RandWire (Xie et al. 2019) -------------------------------------------------------------

def ws_graph(n: int, k: int, p: float, seed: int) -> list[tuple[int, int]]:
    """Watts-Strogatz WS(n, k, p) as networkx builds it, oriented low -> high index (a DAG)."""
    rng = random.Random(seed)
    adj: dict[int, set[int]] = {u: set() for u in range(n)}
    for j in range(1, k // 2 + 1):
        for u in range(n):
            v = (u + j) % n
            adj[u].add(v)
            adj[v].add(u)
    for j in range(1, k // 2 + 1):
        for u in range(n):
            v = (u + j) % n
            if rng.random() < p and v in adj[u]:
                w = rng.randrange(n)
                while w == u or w in adj[u]:
                    w = rng.randrange(n)
                    if len(adj[u]) >= n - 1:
                        break
                else:
                    adj[u].discard(v)
                    adj[v].discard(u)
                    adj[u].add(w)
                    adj[w].add(u)
    return sorted({(min(u, v), max(u, v)) for u in adj for v in adj[u]})


def _randwire_stage(x, c: int, n: int, k: int, p: float, seed: int, out_agg: str = "add"):
    edges = ws_graph(n, k, p, seed)
    preds: dict[int, list[int]] = {u: [] for u in range(n)}
    succs: dict[int, list[int]] = {u: [] for u in range(n)}
    for u, v in edges:
        preds[v].append(u)
        succs[u].append(v)
    out: dict[int, object] = {}
    for v in range(n):  # index order is a topological order
        if preds[v]:
            ins = [out[u] for u in preds[v]]
            agg = ins[0] if len(ins) == 1 else L.Add()(ins)
            stride = 1
        else:  # an input node reads the stage input, with stride 2
            agg, stride = x, 2
        h = L.ReLU()(agg)
        out[v] = _sep(h, c, 3, stride)
    sinks = [out[v] for v in range(n) if not succs[v]]
    if len(sinks) == 1:
        return sinks[0]
    if out_agg == "concat":  # variant: concat the sinks, 1x1 conv back to c channels
        return _conv_bn(L.Concatenate()(sinks), c, 1, relu=False, pre_relu=True)
    return L.Add()(sinks)  # the paper averages; a sum differs by a constant factor


def build_randwire(size: int, c: int, n: int, k: int, p: float, stages: int, seed: int,
                   classes: int, head: int = 1280, stem_stride2: int = 2,
                   out_agg: str = "add", name: str = "randwire"):
    """RandWire small regime: conv1 (C/2, s2), conv2 (C, s2), then `stages` random stages
    of n nodes with C, 2C, 4C channels (each halves the resolution), 1x1 conv head, GAP, FC."""
    i = _inp(size)
    x = _conv_bn(i, c // 2, 3, 2 if stem_stride2 >= 1 else 1, relu=False)
    x = L.ReLU()(x)
    x = _sep(x, c, 3, 2 if stem_stride2 >= 2 else 1)
    for s in range(stages):
        x = _randwire_stage(x, c * (2 ** s), n, k, p, seed + s, out_agg)
    x = _conv_bn(x, head, 1, pre_relu=True)
    x = L.GlobalAveragePooling2D()(x)
    x = L.Dense(classes)(x)
    return tf.keras.Model(i, x, name=name)


# ---- DARTS / NASNet-A / AmoebaNet-A cells (genotypes as in the DARTS code release) ---------

GENOTYPES = {
    "DARTS_V2": dict(
        normal=[("sep_conv_3x3", 0), ("sep_conv_3x3", 1), ("sep_conv_3x3", 0), ("sep_conv_3x3", 1),
                ("sep_conv_3x3", 1), ("skip_connect", 0), ("skip_connect", 0), ("dil_conv_3x3", 2)],
        normal_concat=[2, 3, 4, 5],
        reduce=[("max_pool_3x3", 0), ("max_pool_3x3", 1), ("skip_connect", 2), ("max_pool_3x3", 1),
                ("max_pool_3x3", 0), ("skip_connect", 2), ("skip_connect", 2), ("max_pool_3x3", 1)],
        reduce_concat=[2, 3, 4, 5]),
    # not a published genotype: a DARTS normal cell with a dilated convolution at every node,
    # for the space-to-batch fixture
    "DARTS_DIL": dict(
        normal=[("dil_conv_3x3", 0), ("sep_conv_3x3", 1), ("dil_conv_3x3", 1), ("skip_connect", 0),
                ("dil_conv_5x5", 2), ("skip_connect", 1), ("dil_conv_3x3", 3), ("max_pool_3x3", 2)],
        normal_concat=[2, 3, 4, 5],
        reduce=[("max_pool_3x3", 0), ("max_pool_3x3", 1), ("skip_connect", 2), ("max_pool_3x3", 1),
                ("max_pool_3x3", 0), ("skip_connect", 2), ("skip_connect", 2), ("max_pool_3x3", 1)],
        reduce_concat=[2, 3, 4, 5]),
    "NASNet": dict(
        normal=[("sep_conv_5x5", 1), ("sep_conv_3x3", 0), ("sep_conv_5x5", 0), ("sep_conv_3x3", 0),
                ("avg_pool_3x3", 1), ("skip_connect", 0), ("avg_pool_3x3", 0), ("avg_pool_3x3", 0),
                ("sep_conv_3x3", 1), ("skip_connect", 1)],
        normal_concat=[2, 3, 4, 5, 6],
        reduce=[("sep_conv_5x5", 1), ("sep_conv_7x7", 0), ("max_pool_3x3", 1), ("sep_conv_7x7", 0),
                ("avg_pool_3x3", 1), ("sep_conv_5x5", 0), ("skip_connect", 3), ("avg_pool_3x3", 2),
                ("sep_conv_3x3", 2), ("max_pool_3x3", 1)],
        reduce_concat=[4, 5, 6]),
    "AmoebaNet": dict(
        normal=[("avg_pool_3x3", 0), ("max_pool_3x3", 1), ("sep_conv_3x3", 0), ("sep_conv_5x5", 2),
                ("sep_conv_3x3", 0), ("avg_pool_3x3", 3), ("sep_conv_3x3", 1), ("skip_connect", 1),
                ("skip_connect", 0), ("avg_pool_3x3", 1)],
        normal_concat=[4, 5, 6],
        reduce=[("avg_pool_3x3", 0), ("sep_conv_3x3", 1), ("max_pool_3x3", 0), ("sep_conv_7x7", 2),
                ("sep_conv_7x7", 0), ("avg_pool_3x3", 1), ("max_pool_3x3", 0), ("max_pool_3x3", 1),
                ("conv_7x1_1x7", 0), ("sep_conv_3x3", 5)],
        reduce_concat=[3, 4, 6]),
}


def _factorized_reduce(x, c):
    x = L.ReLU()(x)
    a = L.Conv2D(c // 2, 1, strides=2, use_bias=False)(x)
    b = L.Conv2D(c - c // 2, 1, strides=2, use_bias=False)(L.Cropping2D(((1, 0), (1, 0)))(x))
    return _bn(L.Concatenate()([a, b]))


def _dil_conv_s2b(x, c: int, k: int):
    """dil_conv (ReLU, depthwise k x k dilation 2 "same", pointwise, BN) written the way TF1/slim
    atrous convolutions (DeepLab) reach the converter: SPACE_TO_BATCH_ND (block 2x2, the "same"
    padding) -> DEPTHWISE_CONV_2D "valid" -> CONV_2D 1x1 -> BATCH_TO_SPACE_ND.  Two convolutions
    between the pair keep the converter from folding it back into one dilated depthwise op, so
    the tensors in between have batch 4."""
    p = k - 1  # (k - 1) * 2 / 2 on each side
    x = L.ReLU()(x)
    x = L.Lambda(lambda t: tf.space_to_batch_nd(t, [2, 2], [[p, p], [p, p]]))(x)
    x = L.DepthwiseConv2D(k, padding="valid", use_bias=False)(x)
    x = _bn(L.Conv2D(c, 1, use_bias=False)(x))
    return L.Lambda(lambda t: tf.batch_to_space(t, [2, 2], [[0, 0], [0, 0]]))(x)


def _darts_op(name: str, x, c: int, stride: int, s2b: bool = False):
    if name == "skip_connect":
        return x if stride == 1 else _factorized_reduce(x, c)
    if name == "max_pool_3x3":
        return L.MaxPooling2D(3, stride, padding="same")(x)
    if name == "avg_pool_3x3":
        return L.AveragePooling2D(3, stride, padding="same")(x)
    m = re.fullmatch(r"sep_conv_(\d)x\d", name)
    if m:  # DARTS SepConv: (ReLU, dw k s, pw, BN) x 2
        k = int(m.group(1))
        x = _sep(L.ReLU()(x), c, k, stride)
        return _sep(L.ReLU()(x), c, k, 1)
    m = re.fullmatch(r"dil_conv_(\d)x\d", name)
    if m:
        k = int(m.group(1))
        if stride == 1 and s2b:
            return _dil_conv_s2b(x, c, k)
        if stride == 1:
            return _sep(L.ReLU()(x), c, k, 1, d=2)
        x = L.ReLU()(x)  # TF cannot combine dilation with stride: dilate, then subsample
        x = L.DepthwiseConv2D(k, padding="same", dilation_rate=2, use_bias=False)(x)
        x = L.MaxPooling2D(1, 2)(x)
        return _bn(L.Conv2D(c, 1, use_bias=False)(x))
    if name == "conv_7x1_1x7":
        x = L.ReLU()(x)
        x = L.Conv2D(c, (1, 7), strides=(1, stride), padding="same", use_bias=False)(x)
        x = L.Conv2D(c, (7, 1), strides=(stride, 1), padding="same", use_bias=False)(x)
        return _bn(x)
    raise ValueError(name)


def _nas_cell(genotype: dict, s0, s1, c: int, reduction: bool, reduction_prev: bool, s2b: bool = False):
    s0 = _factorized_reduce(s0, c) if reduction_prev else _conv_bn(s0, c, 1, relu=False, pre_relu=True)
    s1 = _conv_bn(s1, c, 1, relu=False, pre_relu=True)
    ops = genotype["reduce" if reduction else "normal"]
    concat = genotype["reduce_concat" if reduction else "normal_concat"]
    states = [s0, s1]
    for j in range(len(ops) // 2):
        hs = []
        for name, idx in ops[2 * j: 2 * j + 2]:
            stride = 2 if reduction and idx < 2 else 1
            hs.append(_darts_op(name, states[idx], c, stride, s2b))
        states.append(L.Add()(hs))
    return L.Concatenate()([states[i] for i in concat])


def build_nas_network(genotype: str, size: int, c: int, layers: int, classes: int,
                      imagenet_stem: bool = False, name: str = "nas", s2b: bool = False):
    """DARTS-style network (as in the DARTS code) for CIFAR (stem 3x3, 3C) or ImageNet
    (three stride-2 convs); reduction cells at layers//3 and 2*layers//3. `s2b`: dilated
    convolutions as SPACE_TO_BATCH_ND -> convs -> BATCH_TO_SPACE_ND (see _dil_conv_s2b)."""
    g = GENOTYPES[genotype]
    i = _inp(size)
    if imagenet_stem:
        s0 = _conv_bn(i, c // 2, 3, 2)
        s0 = _conv_bn(s0, c, 3, 2, relu=False)
        s1 = _conv_bn(L.ReLU()(s0), c, 3, 2, relu=False)
        reduction_prev = True
    else:
        s0 = s1 = _conv_bn(i, 3 * c, 3, relu=False)
        reduction_prev = False
    cur = c
    for layer in range(layers):
        reduction = layer in (layers // 3, 2 * layers // 3)
        if reduction:
            cur *= 2
        s0, s1 = s1, _nas_cell(g, s0, s1, cur, reduction, reduction_prev, s2b)
        reduction_prev = reduction
    x = L.GlobalAveragePooling2D()(s1)
    x = L.Dense(classes)(x)
    return tf.keras.Model(i, x, name=name)


def _upsample(x, f: int):
    # Resizing -> RESIZE_NEAREST_NEIGHBOR (UpSampling2D lowers to RESHAPE + TILE, not in TFLM)
    return L.Resizing(int(x.shape[1]) * f, int(x.shape[2]) * f, interpolation="nearest")(x)


# ---- HRNet-style multi-resolution stage -----------------------------------------------------

def build_hrnet(size: int = 64, c: int = 16, branches: int = 3, units: int = 3,
                classes: int = 10, name: str = "hrnet"):
    """Stem (two stride-2 3x3 convs), then parallel branches at 1/4, 1/8, 1/16 resolution with
    C, 2C, 4C channels; each unit runs one residual block per branch and then exchanges:
    strided 3x3 convs downwards, 1x1 conv + nearest upsampling upwards, ADD. HRNetV2 head:
    upsample all branches, concatenate, 1x1 conv, GAP, FC."""
    i = _inp(size)
    x = _conv_bn(i, c, 3, 2)
    x = _conv_bn(x, c, 3, 2)
    xs = [x]
    for b in range(1, branches):
        xs.append(_conv_bn(xs[-1], c * 2 ** b, 3, 2))
    for _ in range(units):
        ys = []
        for b, xb in enumerate(xs):  # basic residual block
            cb = c * 2 ** b
            y = _conv_bn(xb, cb, 3)
            y = _conv_bn(y, cb, 3, relu=False)
            ys.append(L.ReLU()(L.Add()([y, xb])))
        xs = []
        for j in range(branches):
            cj = c * 2 ** j
            terms = []
            for b, yb in enumerate(ys):
                if b == j:
                    terms.append(yb)
                elif b > j:
                    t = _conv_bn(yb, cj, 1, relu=False)
                    terms.append(_upsample(t, 2 ** (b - j)))
                else:
                    t = yb
                    for step in range(j - b):
                        last = step == j - b - 1
                        t = _conv_bn(t, cj if last else c * 2 ** (b + step + 1), 3, 2, relu=not last)
                    terms.append(t)
            xs.append(L.ReLU()(L.Add()(terms)))
    up = [xs[0]] + [_upsample(xb, 2 ** b) for b, xb in enumerate(xs) if b]
    x = _conv_bn(L.Concatenate()(up), c * 4, 1)
    x = L.GlobalAveragePooling2D()(x)
    x = L.Dense(classes)(x)
    return tf.keras.Model(i, x, name=name)


def _hr_basic(x, c: int):
    y = _conv_bn(x, c, 3)
    y = _conv_bn(y, c, 3, relu=False)
    return L.ReLU()(L.Add()([y, x]))


def _hr_bottleneck(x, c: int):
    y = _conv_bn(x, c, 1)
    y = _conv_bn(y, c, 3)
    y = _conv_bn(y, 4 * c, 1, relu=False)
    sc = x if int(x.shape[-1]) == 4 * c else _conv_bn(x, 4 * c, 1, relu=False)
    return L.ReLU()(L.Add()([y, sc]))


def _hr_fuse(ys: list, widths: list[int]) -> list:
    """HRNet exchange: every output branch j sums all inputs, brought to its resolution
    (1x1 conv + nearest upsampling from below, chains of strided 3x3 convs from above)."""
    xs = []
    for j, cj in enumerate(widths):
        terms = []
        for b, yb in enumerate(ys):
            if b == j:
                terms.append(yb)
            elif b > j:
                terms.append(_upsample(_conv_bn(yb, cj, 1, relu=False), 2 ** (b - j)))
            else:
                t = yb
                for step in range(j - b):
                    last = step == j - b - 1
                    t = _conv_bn(t, cj if last else widths[b], 3, 2, relu=not last)
                terms.append(t)
        xs.append(L.ReLU()(L.Add()(terms)))
    return xs


def build_hrnet_w(width: int, size: int = 224, classes: int = 1000, name: str = "hrnet_w"):
    """HRNet-W<width> (Wang et al. 2020) at its published layout: stem (two stride-2 3x3 convs,
    64), stage 1 (4 bottlenecks), stages 2/3/4 with 2/3/4 branches (C, 2C, 4C, 8C) and 1/4/3
    modules of 4 basic blocks per branch, each module ending in a full exchange. Head
    simplified to HRNetV2's (upsample every branch, concatenate, 1x1 conv), then GAP and FC."""
    i = _inp(size)
    x = _conv_bn(i, 64, 3, 2)
    x = _conv_bn(x, 64, 3, 2)
    for _ in range(4):
        x = _hr_bottleneck(x, 64)
    widths = [width, 2 * width]
    xs = [_conv_bn(x, widths[0], 3), _conv_bn(x, widths[1], 3, 2)]
    for branches, modules in ((2, 1), (3, 4), (4, 3)):
        if len(xs) < branches:  # transition: a new branch from the lowest resolution
            widths.append(2 * widths[-1])
            xs.append(_conv_bn(xs[-1], widths[-1], 3, 2))
        for _ in range(modules):
            ys = []
            for xb, cb in zip(xs, widths):
                for _ in range(4):
                    xb = _hr_basic(xb, cb)
                ys.append(xb)
            xs = _hr_fuse(ys, widths)
    up = [xs[0]] + [_upsample(xb, 2 ** b) for b, xb in enumerate(xs) if b]
    x = _conv_bn(L.Concatenate()(up), sum(widths), 1)
    x = L.GlobalAveragePooling2D()(x)
    x = L.Dense(classes)(x)
    return tf.keras.Model(i, x, name=name)


# ---- SwiftNet-style cells (Zhang et al. 2019; the SERENITY benchmark) -----------------------

def _swift_cell(x, c: int):
    """Parallel branches whose outputs are concatenated and re-mixed (concat -> 1x1 conv,
    concat -> depthwise), the patterns SERENITY's identity rewrites target."""
    n1 = _conv_bn(x, c, 1)
    n2 = L.ReLU()(_sep(x, c, 3))
    n3 = L.ReLU()(_sep(x, c, 5))
    n4 = _conv_bn(L.Concatenate()([n1, n2]), c, 1)                     # concat -> conv
    cat = L.Concatenate()([n2, n3])                                     # concat -> depthwise
    n5 = L.ReLU()(_bn(L.Conv2D(c, 1, use_bias=False)(
        L.DepthwiseConv2D(3, padding="same", use_bias=False)(cat))))
    n6 = _conv_bn(L.Concatenate()([n1, n3, n4]), c, 1)
    n7 = _conv_bn(L.MaxPooling2D(3, 1, padding="same")(x), c, 1)
    out = _conv_bn(L.Concatenate()([n4, n5, n6, n7]), c, 1, relu=False)
    if x.shape[-1] == c:
        out = L.Add()([out, x])
    return L.ReLU()(out)


def build_swiftnet(size: int = 64, c: int = 16, cells_per_stage: int = 1, stages: int = 3,
                   classes: int = 2, name: str = "swiftnet"):
    i = _inp(size)
    x = _conv_bn(i, c, 3, 2)
    for s in range(stages):
        cs = c * 2 ** s
        if s:
            x = _conv_bn(x, cs, 3, 2)
        for _ in range(cells_per_stage):
            x = _swift_cell(x, cs)
    x = L.GlobalAveragePooling2D()(x)
    x = L.Dense(classes)(x)
    return tf.keras.Model(i, x, name=name)


# ---- Fixtures -------------------------------------------------------------------------------

def build_tiny_irregular():
    i = _inp(16, c=3)
    a = L.Conv2D(8, 3, padding="same", activation="relu")(i)
    b1 = L.Conv2D(8, 1, activation="relu")(a)
    b2 = L.Conv2D(8, 1, activation="relu")(L.DepthwiseConv2D(3, padding="same")(a))
    b3 = L.Conv2D(8, 1, activation="relu")(L.MaxPooling2D(3, 1, padding="same")(a))
    c1 = L.Conv2D(16, 1, activation="relu")(L.Concatenate(axis=-1)([b1, b2]))      # concat -> conv
    c2 = L.DepthwiseConv2D(3, padding="same")(L.Concatenate(axis=-1)([b2, b3]))      # concat -> dw
    s = L.ReLU()(L.Add()([c1, c2]))
    s = L.Conv2D(16, 3, strides=2, padding="same", activation="relu")(s)
    t = L.Conv2D(16, 3, strides=2, padding="same", activation="relu")(b1)
    s = L.Add()([s, t])
    x = L.GlobalAveragePooling2D()(s)
    x = L.Dense(10)(x)
    return tf.keras.Model(i, x, name="tiny_irregular")


def build_multi_output():
    i = _inp(16, c=3)
    a = L.Conv2D(8, 3, padding="same", activation="relu")(i)
    b = L.Conv2D(8, 3, strides=2, padding="same", activation="relu")(a)
    c = L.DepthwiseConv2D(3, padding="same", activation="relu")(a)
    c = L.Conv2D(8, 1, activation="relu")(c)
    out_cls = L.Dense(5, name="logits")(L.GlobalAveragePooling2D()(b))
    out_map = L.Conv2D(4, 1, name="feature_map")(L.Add()([c, a]))
    return tf.keras.Model(i, [out_cls, out_map], name="multi_output")


def build_chain():
    i = _inp(32, c=3)
    x = i
    for k, (ch, s) in enumerate([(8, 2), (8, 1), (16, 2), (16, 1), (16, 1), (32, 2), (32, 1), (32, 1)]):
        x = L.Conv2D(ch, 3, strides=s, padding="same", activation="relu")(x)
    return tf.keras.Model(i, x, name="chain")


def build_concat_conv():
    i = _inp(32, c=8)
    b1 = L.Conv2D(16, 1, activation="relu")(i)
    b2 = L.Conv2D(16, 3, padding="same", activation="relu")(i)
    b3 = L.Conv2D(16, 1, activation="relu")(L.DepthwiseConv2D(3, padding="same")(i))
    b4 = L.Conv2D(16, 1, activation="relu")(L.MaxPooling2D(3, 1, padding="same")(i))
    cat = L.Concatenate(axis=-1)([b1, b2, b3, b4])                     # 32x32x64
    p = L.Conv2D(16, 1)(cat)                                           # concat -> 1x1 conv
    d = L.Conv2D(16, 1)(L.DepthwiseConv2D(3, padding="same")(cat))     # concat -> depthwise
    out = L.ReLU()(L.Add()([p, d]))
    return tf.keras.Model(i, out, name="concat_conv")


def build_pool_softmax():
    i = _inp(16, c=3)
    x = L.Conv2D(8, 3, padding="same", activation="relu")(i)
    x = L.MaxPooling2D(2)(x)
    x = L.AveragePooling2D(2)(x)
    x = L.Reshape((4 * 4 * 8,))(x)
    x = L.Dense(10)(x)
    x = L.Softmax()(x)
    return tf.keras.Model(i, x, name="pool_softmax")


def build_darts_s2b():
    """Two DARTS normal cells (C=8, 16x16) whose dilated convolutions are space-to-batch pairs."""
    g = GENOTYPES["DARTS_DIL"]
    i = _inp(16, c=3)
    s0 = s1 = _conv_bn(i, 24, 3, relu=False)
    for _ in range(2):
        s0, s1 = s1, _nas_cell(g, s0, s1, 8, False, False, s2b=True)
    x = L.GlobalAveragePooling2D()(s1)
    x = L.Dense(10)(x)
    return tf.keras.Model(i, x, name="darts_s2b")


def build_randwire_example():
    return build_randwire(size=32, c=16, n=12, k=4, p=0.75, stages=2, seed=7, classes=10,
                          head=128, stem_stride2=0, out_agg="concat", name="randwire_small")


def convert_control_flow() -> bytes:
    """float32 model with WHILE and IF (several subgraphs), from a concrete function."""
    _tf()
    rng = np.random.default_rng(_seed_of("control_flow"))
    w = tf.constant(rng.standard_normal((8, 8)).astype(np.float32) * 0.3)
    b = tf.constant(rng.standard_normal((8,)).astype(np.float32) * 0.1)

    @tf.function(input_signature=[tf.TensorSpec([1, 8], tf.float32)])
    def f(x):
        def body(i, h):
            return i + 1, tf.tanh(tf.matmul(h, w) + b)
        _, h = tf.while_loop(lambda i, h: i < 3, body, (tf.constant(0), x))
        return tf.cond(tf.reduce_sum(h) > 0.0, lambda: h * 2.0, lambda: h - 1.0)

    conv = tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f)
    with _quiet():
        return conv.convert()


# ---- The registry ---------------------------------------------------------------------------

def _specs() -> list[Spec]:
    app = [  # (name, keras attr, size, coral_name)
        ("resnet50", "ResNet50", 224, "ResNet50V1"),
        ("resnet101", "ResNet101", 224, None),
        ("resnet152", "ResNet152", 224, None),
        ("resnet50v2", "ResNet50V2", 224, "ResNet50V2"),
        ("resnet101v2", "ResNet101V2", 224, None),
        ("resnet152v2", "ResNet152V2", 224, "ResNet152V2"),
        ("densenet121", "DenseNet121", 224, None),
        ("densenet169", "DenseNet169", 224, None),
        ("densenet201", "DenseNet201", 224, None),
        ("xception", "Xception", 299, None),
        ("inception_resnet_v2", "InceptionResNetV2", 299, None),
        ("mobilenet_v2", "MobileNetV2", 224, "MobileNetV2"),
        ("nasnet_mobile", "NASNetMobile", 224, None),
        ("mobilenet_v1", "MobileNet", 224, "MobileNetV1"),
        ("vgg16", "VGG16", 224, "VGG16"),
    ]
    fam = lambda n: re.sub(r"\d+.*$", "", n.split("_")[0]) if not n.startswith("mobilenet") else "mobilenet"
    specs = [Spec(n, fam(n), _app(a, s), regular=not n.startswith("nasnet"), coral_name=cn)
             for n, a, s, cn in app]
    specs.append(Spec("mobilenet_v1_025_96", "mobilenet", _app("MobileNet", 96, alpha=0.25), regular=True,
                      note="MobileNetV1 alpha 0.25 at 96x96: the visual-wake-words size class (MLPerf Tiny)"))
    specs.append(Spec("inception_v1", "inception", lambda: build_inception_v1(), regular=True,
                      coral_name="InceptionV1", note="hand-built GoogLeNet, TF-slim layout"))
    irregular = [
        Spec("randwire_ws_cifar", "randwire",
             lambda: build_randwire(32, 32, 32, 4, 0.75, 3, 101, 10, head=512, stem_stride2=0,
                                    name="randwire_ws_cifar"), regular=False, float32=True,
             note="WS(32,4,0.75) x3 stages, C=32, 32x32 input (CIFAR)"),
        Spec("randwire_ws_small", "randwire",
             lambda: build_randwire(160, 48, 32, 4, 0.75, 3, 201, 1000, head=1280,
                                    name="randwire_ws_small"), regular=False, float32=True,
             note="small regime, WS(32,4,0.75) x3 stages, C=48, 160x160 input"),
        Spec("darts_v2_cifar", "darts",
             lambda: build_nas_network("DARTS_V2", 32, 16, 8, 10, name="darts_v2_cifar"),
             regular=False, float32=True, note="DARTS-V2 genotype, C=16, 8 cells, 32x32"),
        Spec("darts_v2_cifar_s2b", "darts",
             lambda: build_nas_network("DARTS_V2", 32, 16, 8, 10, name="darts_v2_cifar_s2b", s2b=True),
             regular=False, float32=True,
             note="darts_v2_cifar with its dilated convs as SPACE_TO_BATCH_ND/BATCH_TO_SPACE_ND pairs"),
        Spec("darts_v2_imagenet", "darts",
             lambda: build_nas_network("DARTS_V2", 224, 24, 5, 1000, imagenet_stem=True,
                                       name="darts_v2_imagenet"),
             regular=False, float32=True, note="DARTS-V2 genotype, ImageNet stem, C=24, 5 cells"),
        Spec("nasnet_a_cifar", "nasnet_a",
             lambda: build_nas_network("NASNet", 32, 16, 6, 10, name="nasnet_a_cifar"),
             regular=False, float32=True, note="NASNet-A genotype, C=16, 6 cells, 32x32"),
        Spec("amoebanet_a_cifar", "amoebanet_a",
             lambda: build_nas_network("AmoebaNet", 32, 16, 6, 10, name="amoebanet_a_cifar"),
             regular=False, float32=True, note="AmoebaNet-A genotype, C=16, 6 cells, 32x32"),
        Spec("hrnet_small", "hrnet", lambda: build_hrnet(64, 16, 3, 3, 10, name="hrnet_small"),
             regular=False, float32=True, note="3 branches, 3 exchange units, 64x64"),
        Spec("swiftnet_hpd", "swiftnet",
             lambda: build_swiftnet(64, 16, 1, 3, 2, name="swiftnet_hpd"),
             regular=False, float32=True, note="3 SwiftNet-style cells, 64x64 (HPD-like)"),
        Spec("swiftnet_cell_a", "swiftnet",
             lambda: build_swiftnet(64, 24, 2, 1, 2, name="swiftnet_cell_a"),
             regular=False, float32=True, note="two SwiftNet-style cells at one resolution"),
    ]
    # issue 15: scheduling at scale (int8 only)
    for n in (48, 64, 96):
        irregular.append(Spec(
            f"randwire_ws{n}", "randwire",
            lambda n=n: build_randwire(224, 78, n, 4, 0.75, 1, 300 + n, 1000, head=1280,
                                       name=f"randwire_ws{n}"), regular=False,
            note=f"one WS({n},4,0.75) stage, C=78 (the small regime's width), 224x224"))
    for w in (18, 32):
        irregular.append(Spec(
            f"hrnet_w{w}", "hrnet", lambda w=w: build_hrnet_w(w, name=f"hrnet_w{w}"), regular=False,
            note=f"HRNet-W{w} layout (4 branches, 1/4/3 modules of 4 basic blocks); "
                 "head simplified to HRNetV2's concat + 1x1 conv"))
    irregular.append(Spec(
        "darts_v2_cifar20", "darts",
        lambda: build_nas_network("DARTS_V2", 32, 36, 20, 10, name="darts_v2_cifar20"),
        regular=False, note="DARTS-V2 genotype at its published CIFAR size: C=36, 20 cells, 32x32"))
    return irregular + specs  # cheap ones first


# (file stem, family, builder, regular, dtypes); paths relative to the repository
FIXTURES = [
    ("tests/fixtures/tiny_irregular", "fixture", build_tiny_irregular, False, ("int8", "float32")),
    ("tests/fixtures/multi_output", "fixture", build_multi_output, False, ("int8",)),
    ("tests/fixtures/chain", "fixture", build_chain, True, ("int8",)),
    ("tests/fixtures/concat_conv", "fixture", build_concat_conv, False, ("int8", "float32")),
    ("tests/fixtures/pool_softmax", "fixture", build_pool_softmax, True, ("int8",)),
    ("tests/fixtures/darts_s2b", "fixture", build_darts_s2b, False, ("int8", "float32")),
    # the same cells converted with a dynamic batch (Keras' default): the tensors between
    # SPACE_TO_BATCH_ND and BATCH_TO_SPACE_ND are stored as [1, ...] but are [4, ...] at run time
    ("tests/fixtures/darts_s2b_dynbatch", "fixture", build_darts_s2b, False, ("int8", "float32"), True),
    ("examples/randwire_small", "randwire", build_randwire_example, False, ("int8",)),
]


# --------------------------------------------------------------------------------------------
# Conversion
# --------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the converter's C++ and Python chatter (file descriptors 1 and 2)."""
    if os.environ.get("BUILD_ZOO_VERBOSE"):
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def _build_model(builder: Callable[[], object], seed: int):
    _tf()
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(seed)
    model = builder()
    # Random BN statistics, so BN folding is not an identity and activations are not trivial.
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            for var, lo, hi, normal in ((layer.gamma, 0.5, 1.5, False), (layer.beta, 0, 0.1, True),
                                        (layer.moving_mean, 0, 0.1, True),
                                        (layer.moving_variance, 0.5, 1.5, False)):
                if var is not None:
                    shape = tuple(var.shape)
                    val = rng.normal(lo, hi, shape) if normal else rng.uniform(lo, hi, shape)
                    var.assign(val.astype(np.float32))
    _calibrate_logits(model, seed)
    return model


_FROZEN: dict = {}  # id(model) -> (model, frozen concrete function) of the model being built


def _calibrate_logits(model, seed: int) -> None:
    """Scale the classifier feeding a softmax so random-weight logits have a trained-like spread
    (std ~4).  Otherwise the logits are tiny, their int8 scale is < ~0.004 and TFLite Micro's
    int8 SOFTMAX over 1000 classes aborts (a reference-kernel DCHECK) -- an artifact of random
    weights, not of the architecture."""
    has_softmax = any(isinstance(l, L.Softmax) or getattr(l, "activation", None) is tf.keras.activations.softmax
                      or (isinstance(l, L.Activation) and "softmax" in str(l.get_config().get("activation")))
                      for l in model.layers)
    if not has_softmax:
        return
    last = [l for l in model.layers if isinstance(l, (L.Dense, L.Conv2D)) and not isinstance(l, L.DepthwiseConv2D)]
    if not last or isinstance(last[-1], L.Conv2D) and tuple(last[-1].kernel_size) != (1, 1):
        return
    kl = last[-1]
    x = tf.keras.Model(model.inputs, kl.input)(
        [np.random.default_rng(seed).uniform(-1, 1, tuple(model.inputs[0].shape)).astype(np.float32)])
    w = kl.kernel.numpy()
    pre = np.asarray(x).reshape(-1, w.shape[-2]) @ w.reshape(-1, w.shape[-1])
    std = float(pre.std())
    if std > 0:
        kl.kernel.assign(w * (4.0 / std))


def convert(model, dtype: str, seed: int, dynamic_batch: bool = False) -> bytes:
    """Keras model -> .tflite bytes.  The model is traced once into a concrete function with a
    static batch-1 signature and its variables are frozen to constants; that is the graph
    `TFLiteConverter.from_keras_model` would convert, reached 3-4x faster (no SavedModel
    export of every variable).  `dynamic_batch`: trace with batch None instead, as
    `from_keras_model` does for a Keras Input without batch_size (every tensor then has shape
    signature -1 in the batch and the placeholder 1 in its stored shape)."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    key = (id(model), dynamic_batch)
    if key not in _FROZEN:
        _FROZEN.clear()
        specs = [tf.TensorSpec((None,) + tuple(t.shape[1:]) if dynamic_batch else t.shape, tf.float32,
                               name=f"input_{k}")
                 for k, t in enumerate(model.inputs)]
        fn = tf.function(lambda *xs: model(list(xs) if len(xs) > 1 else xs[0], training=False))
        _FROZEN[key] = (model, convert_variables_to_constants_v2(fn.get_concrete_function(*specs)))
    frozen = _FROZEN[key][1]
    conv = tf.lite.TFLiteConverter.from_concrete_functions([frozen])
    if dtype == "int8":
        shapes = [(1,) + tuple(int(d) for d in t.shape[1:]) for t in model.inputs]

        def representative():
            rng = np.random.default_rng(seed)
            for _ in range(4):
                yield [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]

        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = representative
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        conv.inference_input_type = tf.int8
        conv.inference_output_type = tf.int8
    with _quiet():
        return conv.convert()


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# --------------------------------------------------------------------------------------------
# Inspection and checks (no TensorFlow)
# --------------------------------------------------------------------------------------------

def op_summary(data: bytes) -> dict:
    """Operator statistics from the flatbuffer (all subgraphs)."""
    from ai_edge_litert import schema_py_generated as s
    names = {v: k for k, v in vars(s.BuiltinOperator).items() if not k.startswith("_")}
    m = s.Model.GetRootAs(data, 0)
    codes = []
    for i in range(m.OperatorCodesLength()):
        oc = m.OperatorCodes(i)
        code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
        codes.append(names.get(code, f"CUSTOM:{oc.CustomCode()}"))
    hist: dict[str, int] = {}
    per_sub = []
    for g in range(m.SubgraphsLength()):
        sg = m.Subgraphs(g)
        per_sub.append(sg.OperatorsLength())
        for k in range(sg.OperatorsLength()):
            n = codes[sg.Operators(k).OpcodeIndex()]
            hist[n] = hist.get(n, 0) + 1
    sg0 = m.Subgraphs(0)
    shapes = lambda idxs: [[int(d) for d in sg0.Tensors(int(t)).ShapeAsNumpy()] for t in idxs]
    return {"ops": per_sub[0], "subgraphs": len(per_sub), "ops_all_subgraphs": sum(per_sub),
            "op_types": dict(sorted(hist.items())),
            "inputs": shapes(sg0.InputsAsNumpy()), "outputs": shapes(sg0.OutputsAsNumpy())}


def _arena_guess(data: bytes) -> int:
    """Upper bound for the TFLM arena: every non-constant tensor + generous tail."""
    from ai_edge_litert import schema_py_generated as s
    m = s.Model.GetRootAs(data, 0)
    size = {0: 4, 1: 2, 2: 4, 3: 1, 4: 8, 6: 1, 7: 2, 9: 1, 10: 8}
    total, count = 0, 0
    for g in range(m.SubgraphsLength()):
        sg = m.Subgraphs(g)
        for t in range(sg.TensorsLength()):
            ten = sg.Tensors(t)
            count += 1
            buf = m.Buffers(ten.Buffer()) if ten.Buffer() < m.BuffersLength() else None
            if buf is not None and (buf.DataLength() > 0 or buf.Size() > 0):
                continue
            n = int(np.prod(ten.ShapeAsNumpy())) if ten.ShapeLength() else 1
            total += (n * size.get(ten.Type(), 4) + 15) // 16 * 16
    return total + count * 512 + (1 << 20)


def _check_child(path: str) -> dict:
    """Runs in a child process: LiteRT load+invoke, TFLM load+invoke and arena head."""
    data = Path(path).read_bytes()
    res: dict = {}
    try:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
        it = Interpreter(model_content=data,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        it.allocate_tensors()
        rng = np.random.default_rng(0)
        for d in it.get_input_details():
            x = rng.integers(-128, 128, d["shape"]) if d["dtype"] == np.int8 else rng.uniform(-1, 1, d["shape"])
            it.set_tensor(d["index"], x.astype(d["dtype"]))
        it.invoke()
        res["litert"] = True
    except Exception as e:  # noqa: BLE001
        res["litert"] = False
        res["litert_error"] = str(e).splitlines()[0][:300]
    print(json.dumps(res), flush=True)  # survives a TFLM crash
    try:
        from tflite_micro import runtime
        arena = _arena_guess(data)
        t0 = time.time()
        ip = runtime.Interpreter.from_bytes(data, arena_size=arena)
        rng = np.random.default_rng(0)
        for k in range(len(op_summary(data)["inputs"])):
            d = ip.get_input_details(k)
            x = rng.integers(-128, 128, d["shape"]) if d["dtype"] == np.int8 else rng.uniform(-1, 1, d["shape"])
            ip.set_input(x.astype(d["dtype"]), k)
        ip.invoke()
        res["tflm_invoke_s"] = round(time.time() - t0, 2)
        sys.stderr.flush()
        fd, tmp = tempfile.mkstemp()
        saved = os.dup(2)
        os.dup2(fd, 2)
        try:
            ip.print_allocations()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(fd)
        text = Path(tmp).read_text(errors="replace")
        os.unlink(tmp)
        m = re.search(r"Arena allocation head (\d+) bytes", text)
        if m:
            res["tflm_arena_head"] = int(m.group(1))
        res["tflm"] = True
    except Exception as e:  # noqa: BLE001
        res["tflm"] = False
        res["tflm_error"] = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
    return res


def check_model(path: Path, timeout: float = CHECK_TIMEOUT_S) -> dict:
    try:
        p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--check", str(path)],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"litert": None, "tflm": None, "check_error": f"timeout after {timeout:.0f} s"}
    res: dict = {"litert": None}
    for ln in p.stdout.splitlines():
        if ln.startswith("{"):
            res.update(json.loads(ln))
    if p.returncode != 0:
        tail = [ln for ln in p.stderr.strip().splitlines() if not ln.startswith(("W0", "I0"))]
        res["tflm"] = False
        res["tflm_error"] = (f"TFLM crashed (exit {p.returncode}"
                             + (f", signal {-p.returncode}" if p.returncode < 0 else "") + ")"
                             + (f": {tail[-1][:200]}" if tail else ""))
    return res


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------

def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _record(name, family, path: Path, dtype, regular, coral_name, note, seconds, check, rel_to):
    data = path.read_bytes()
    info = op_summary(data)
    rec = {"name": name, "family": family, "file": os.path.relpath(path, rel_to),
           "dtype": dtype, "regular": regular, "topology": "regular" if regular else "irregular",
           "coral_name": coral_name, "ops": info["ops"], "bytes": len(data), "sha256": _sha(data),
           "subgraphs": info["subgraphs"], "inputs": info["inputs"], "outputs": info["outputs"],
           "op_types": info["op_types"], "build_seconds": seconds, "note": note}
    rec.update(check)
    return rec


def _build_one(name, family, builder, dtypes, regular, coral_name, note, stems: dict[str, Path],
               force, do_check, old: dict, rel_to, dynamic_batch: bool = False) -> list[dict]:
    seed = _seed_of(name)
    recs = []
    model = None
    for dtype in dtypes:
        path = stems[dtype]
        t0 = time.time()
        built = False
        if force or not path.exists():
            if model is None:
                model = _build_model(builder, seed)
            write_atomic(path, convert(model, dtype, seed, dynamic_batch))
            built = True
        secs = round(time.time() - t0, 1)
        data = path.read_bytes()
        prev = old.get((name, dtype))
        if prev and prev.get("sha256") == _sha(data) and not built:
            check = {k: prev[k] for k in prev if k.startswith(("litert", "tflm", "check"))}
            secs = prev.get("build_seconds", secs)
        elif do_check:
            check = check_model(path)
            if dtype != "int8" and check.get("tflm") is False:
                check["tflm_note"] = "float32 model; only int8 models need to run in TFLM"
        else:
            check = {}
        rec = _record(name, family, path, dtype, regular, coral_name, note, secs, check, rel_to)
        recs.append(rec)
        flags = []
        if check.get("litert") is False or check.get("litert") is None and do_check:
            flags.append("LITERT-FAIL")
        if dtype == "int8" and check.get("tflm") is False:
            flags.append("TFLM-FAIL")
        head = check.get("tflm_arena_head")
        print(f"{name:22s} {dtype:7s} ops={rec['ops']:5d} size={rec['bytes'] / 1e6:8.3f} MB "
              f"{'built' if built else 'cached'} {secs:6.1f}s"
              + (f" tflm_head={head}" if head else "") + (" " + " ".join(flags) if flags else ""),
              flush=True)
    return recs


def _load_manifest(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return {(r["name"], r["dtype"]): r for r in json.loads(path.read_text())["models"]}
    except Exception:  # noqa: BLE001
        return {}


def _write_manifest(path: Path, recs: dict, extra: dict) -> None:
    models = [recs[k] for k in sorted(recs)]
    doc = {"generator": "tools/build_zoo.py", **extra, "models": models}
    write_atomic(path, (json.dumps(doc, indent=1) + "\n").encode())


def build_zoo(out: Path, only: list[str] | None, all_float: bool, force: bool, do_check: bool) -> int:
    specs = _specs()
    if only:
        unknown = set(only) - {s.name for s in specs}
        if unknown:
            print(f"build_zoo: unknown model(s): {', '.join(sorted(unknown))} (see --list)",
                  file=sys.stderr)
            return 2
        specs = [s for s in specs if s.name in only]
    out.mkdir(parents=True, exist_ok=True)
    mpath = out / "MANIFEST.json"
    old = _load_manifest(mpath)
    recs = dict(old)
    t_all = time.time()
    failures = 0
    for s in specs:
        dtypes = ("int8", "float32") if (s.float32 or all_float) else ("int8",)
        stems = {d: out / f"{s.name}_{d}.tflite" for d in dtypes}
        try:
            new = _build_one(s.name, s.family, s.build, dtypes, s.regular, s.coral_name, s.note,
                             stems, force, do_check, old, out)
        except Exception as e:  # noqa: BLE001
            failures += 1
            print(f"{s.name:22s} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:200]}",
                  flush=True)
            continue
        for r in new:
            recs[(r["name"], r["dtype"])] = r
        _write_manifest(mpath, recs, {})
    print(f"total {time.time() - t_all:.1f}s, manifest {mpath}", flush=True)
    return 1 if failures else 0


def build_fixtures(force: bool, do_check: bool) -> int:
    recs: dict = {}
    t_all = time.time()
    # control flow first: the converter names subgraphs after TF's global function counter
    # (e.g. "cond_true_500"), so it must be traced in a fresh process to be byte-stable.
    cf = FIXTURES_DIR / "control_flow_float32.tflite"
    t0 = time.time()
    if force or not cf.exists():
        write_atomic(cf, convert_control_flow())
    check = check_model(cf) if do_check else {}
    rec = _record("control_flow", "fixture", cf, "float32", False, None, "WHILE + IF",
                  round(time.time() - t0, 1), check, REPO)
    print(f"{'control_flow':22s} float32 ops={rec['ops']:5d} subgraphs={rec['subgraphs']} "
          f"types={','.join(rec['op_types'])} litert={check.get('litert')}", flush=True)
    recs[("control_flow", "float32")] = rec
    for stem, family, builder, regular, dtypes, *dyn in FIXTURES:
        name = Path(stem).name
        stems = {d: REPO / f"{stem}_{d}.tflite" for d in dtypes}
        for r in _build_one(name, family, builder, dtypes, regular, None,
                            "dynamic batch (shape signature -1)" if dyn and dyn[0] else "", stems, force,
                            do_check, {}, REPO, bool(dyn and dyn[0])):
            recs[(r["name"], r["dtype"])] = r
    for r in recs.values():  # timings are not reproducible; keep the manifest byte-stable
        r.pop("build_seconds", None)
        r.pop("tflm_invoke_s", None)
    _write_manifest(FIXTURES_DIR / "MANIFEST.json", recs,
                    {"regenerate": "python tools/build_zoo.py --fixtures"})
    print(f"total {time.time() - t_all:.1f}s", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "models", help="output directory (models)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="build only these models")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    ap.add_argument("--float", action="store_true", help="also build float32 of every model")
    ap.add_argument("--fixtures", action="store_true",
                    help="(re)build tests/fixtures/*.tflite and examples/randwire_small_int8.tflite")
    ap.add_argument("--force", action="store_true", help="rebuild even if the file exists")
    ap.add_argument("--no-check", action="store_true", help="skip the LiteRT/TFLM checks")
    ap.add_argument("--check", metavar="FILE", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.check:
        print(json.dumps(_check_child(a.check)), flush=True)
        return 0
    if a.list:
        for s in _specs():
            print(f"{s.name:22s} {s.family:12s} {'regular' if s.regular else 'irregular':9s} "
                  f"{s.coral_name or '-':12s} {s.note}")
        return 0
    if a.fixtures:
        return build_fixtures(a.force, not a.no_check)
    return build_zoo(a.out, a.only, a.float, a.force, not a.no_check)


if __name__ == "__main__":
    sys.exit(main())
