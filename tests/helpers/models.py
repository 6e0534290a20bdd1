"""Models and descriptors several test modules build: a stem-heavy CNN, a fixture with a CUSTOM op
nothing has a kernel for, a toy Edge TPU descriptor."""

from __future__ import annotations

import copy
from pathlib import Path

from helpers.cnn_builder import CnnBuilder
from tpu_pipeline.toolchain.tflite import read_model, schema

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

# a small Edge TPU descriptor with round numbers (cost model and partition tests)
EDGETPU = """
name = "toy"
kind = "edgetpu"
[memory]
param_sram_bytes = 1000
[link]
host_bandwidth_bytes_per_s = 1e9
[timing]
invoke_overhead_s = 1e-3
[compute]
peak_ops_per_s = 2e9
[compute.efficiency]
conv = 0.5
depthwise = 0.25
fully_connected = 1.0
elementwise = 1.0
other = 1.0
[power]
active_w = 2.0
idle_w = 0.5
"""


def stem_heavy_cnn(tmp_path: Path, seed: int = 3, dtype: str = "int8") -> Path:
    """A MobileNet-like stem: the peak sits in the first, high-resolution layers."""
    b = CnnBuilder(seed=seed, dtype=dtype)
    x = b.input((1, 40, 40, 3))
    y = b.conv(x, 16, k=3, stride=2, act="RELU6")  # 20x20x16
    y = b.conv(y, 48, k=1, act="RELU6")  # expand: the peak
    y = b.dw(y, k=3, stride=2, act="RELU6")  # 10x10x48
    y = b.conv(y, 8, k=1)
    z = b.add(b.conv(b.dw(b.conv(y, 24, k=1, act="RELU6"), k=3, act="RELU6"), 8, k=1), y)
    out = b.conv(z, 4, k=3, stride=2, padding="VALID")
    path = tmp_path / f"stem_{dtype}.tflite"
    path.write_bytes(b.model_bytes([out]))
    return path


def with_custom_op(name: str, after_op: int | None, code: str = "MyCustomDecoder"):
    """The fixture `name` with a CUSTOM op `code` (no kernel anywhere) inserted: reading the
    output of op `after_op` and feeding that op's consumers (same shape and type, as a decoder
    or a MediaPipe op would), or, with after_op None, reading the graph's first output and
    giving a new graph output (Coral's PoseNet decoder at the end)."""
    m = copy.deepcopy(read_model(FIXTURES / f"{name}.tflite"))
    sg = m.subgraphs[0]
    oc = schema.OperatorCodeT()
    oc.builtinCode = schema.BuiltinOperator.CUSTOM
    oc.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    oc.customCode = code.encode()
    oc.version = 1
    m.operatorCodes.append(oc)
    src = sg.outputs[0] if after_op is None else sg.operators[after_op].outputs[0]
    new = copy.deepcopy(sg.tensors[src])
    new.name = (sg.tensors[src].name.decode() + "/decoded").encode()
    new.buffer = 0
    sg.tensors.append(new)
    t_new = len(sg.tensors) - 1
    op = schema.OperatorT()
    op.opcodeIndex = len(m.operatorCodes) - 1
    op.inputs, op.outputs = [src], [t_new]
    if after_op is None:
        sg.operators.append(op)
        sg.outputs = [t_new] + list(sg.outputs[1:])
    else:
        for o in sg.operators[after_op + 1:]:
            o.inputs = [t_new if t == src else t for t in o.inputs]
        sg.operators.insert(after_op + 1, op)
    return m
