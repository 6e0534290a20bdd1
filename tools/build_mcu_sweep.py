#!/usr/bin/env python3
"""Small int8 models that sweep op sizes for the MCU cost fit (tools/fit_mcu_cost.py).

    <python with TensorFlow> tools/build_mcu_sweep.py --out models/mcu_sweep

The zoo's networks are large; the cost model must also be right for small ops (a `fit` patch,
a tiny keyword-spotting layer) and for ops the zoo lacks (PAD). Each model here chains, at one
size (H = W, C channels): a 3x3 convolution, a 1x1 convolution, a 3x3 and a 5x5 depthwise
convolution, an add, a zero padding (PAD), a strided slice, a concatenation and a strided 3x3
convolution, so every op class gets measured across sizes. Random weights, int8 with TFLite's
converter, as tools/build_zoo.py builds the zoo (whose conversion this reuses).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

SIZES = [(4, 8), (8, 16), (12, 4), (16, 8), (16, 32), (24, 48), (32, 16), (48, 8)]


def build(h: int, c: int):
    import build_zoo as z

    tf = z._tf()
    L = tf.keras.layers
    i = L.Input((h, h, c), batch_size=1, name="input")
    a = L.Conv2D(c, 3, padding="same", activation="relu")(i)
    b = L.Conv2D(c, 1, activation="relu")(a)
    d3 = L.DepthwiseConv2D(3, padding="same")(b)
    d5 = L.DepthwiseConv2D(5, padding="same")(d3)
    e = L.Add()([d5, b])
    p = L.ZeroPadding2D(1)(e)
    s = L.Lambda(lambda t: t[:, 1:-1, 1:-1, :])(p)
    k = L.Concatenate(axis=-1)([s, a])
    out = L.Conv2D(c, 3, strides=2, padding="same")(k)
    return tf.keras.Model(i, out, name=f"sweep_{h}x{h}x{c}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "models" / "mcu_sweep")
    args = ap.parse_args(argv)
    import build_zoo as z

    for h, c in SIZES:
        name = f"sweep_{h}x{h}x{c}_int8.tflite"
        path = args.out / name
        if path.exists():
            continue
        data = z.convert(build(h, c), "int8", z._seed_of(name))
        z.write_atomic(path, data)
        print(f"wrote {path} ({len(data):,} bytes)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
