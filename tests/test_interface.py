"""Interface changes (tpu_pipeline.toolchain.rewrite.interface) and the commands that offer them:
`--int8-io` drops the float QUANTIZE/DEQUANTIZE at the boundary (the results are those of the
original fed the dequantized int8 input, bit for bit), `--input-outside-arena` keeps the inputs out
of the offline plan. (The harness firmware running an input outside the arena:
tests/test_harness_firmware.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.cnn_builder import CnnBuilder
from conftest import run_cli
from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.execute.litert import run_litert
from tpu_pipeline.toolchain.ir import from_model
from tpu_pipeline.toolchain.ir.convert import rewritten_model
from tpu_pipeline.toolchain.rewrite.interface import int8_io
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model
from tpu_pipeline.toolchain.tflite.metadata import EXTERNAL, read_offline_plan


def _float_io_cnn():
    b = CnnBuilder(seed=4, spread=True)
    x = b.float_input((1, 16, 16, 3))
    y = b.conv(b.conv(x, 8, k=3, stride=2, act="RELU6"), 8, k=1)
    out = b.dequantize(b.pool(y, "AVERAGE_POOL_2D", k=8, stride=8))
    return b.graph([out]), b.model_bytes([out])


def _run(data: bytes, x: np.ndarray) -> np.ndarray:
    return run_litert(data, [x])[0][0]


def test_int8_io_gives_the_original_results_on_the_quantized_interface():
    g, data = _float_io_cnn()
    new, notes = int8_io(g)
    assert len(new.ops) == len(g.ops) - 2 and len(notes) == 2
    assert [new.tensors[t].dtype for t in (*new.inputs, *new.outputs)] == ["int8", "int8"]
    out = model_to_bytes(rewritten_model(new, read_model(data)))
    xq = new.tensors[new.inputs[0]].quant
    yq = new.tensors[new.outputs[0]].quant
    rng = np.random.default_rng(0)
    for _ in range(3):
        q = rng.integers(-128, 128, (1, 16, 16, 3), dtype=np.int8)
        x = ((q.astype(np.float32) - xq.zero_point[0]) * np.float32(xq.scale[0])).astype(np.float32)
        want = _run(data, x)  # the original, fed what the int8 input stands for
        got = _run(out, q)
        assert np.array_equal((got.astype(np.float32) - yq.zero_point[0]) * np.float32(yq.scale[0]), want)
    with pytest.raises(UsageError, match="nothing|no float"):
        int8_io(new)


def test_fit_and_compile_offer_the_interface_options(tmp_path):
    _, data = _float_io_cnn()
    src = tmp_path / "float_io.tflite"
    src.write_bytes(data)
    fitted = tmp_path / "fitted.tflite"
    r = run_cli("fit", str(src), "--int8-io", "--input-outside-arena", "--objective", "memory", "--time-limit", "5",
                "-o", str(fitted), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert any("QUANTIZE dropped" in n for n in d["notes"]) and d["arena_head_bytes_measured"] is not None
    g = from_model(read_model(fitted))
    assert g.tensors[g.inputs[0]].dtype == "int8" and g.external == g.inputs
    assert read_offline_plan(read_model(fitted))[g.inputs[0]] == EXTERNAL
    out = tmp_path / "compiled"
    r = run_cli("compile", str(src), "-n", "1", "--int8-io", "--input-outside-arena", "--verify", "--time-limit", "5",
                "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    whole = read_model(out / "float_io.tflite")
    g = from_model(whole)
    assert g.tensors[g.inputs[0]].dtype == "int8" and g.tensors[g.outputs[0]].dtype == "int8"
    assert read_offline_plan(whole)[g.inputs[0]] == EXTERNAL
    r = run_cli("compile", str(tmp_path / "fitted.tflite"), "-n", "1", "--int8-io", "-o", str(tmp_path / "again"))
    assert r.returncode == 2 and f"{tmp_path / 'fitted.tflite'}: --int8-io found no" in r.stderr
