"""export-mcu: what the harness firmware is built from, checked against TFLite Micro itself."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tpu_pipeline.toolchain.execute.tflm import TflmModel
from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena
from tpu_pipeline.cli import main
from tpu_pipeline.toolchain.cost.mcu import estimate_mcu, op_class
from tpu_pipeline.toolchain.data import DEVICES_DIR
from tpu_pipeline.toolchain.device import CMSIS_NN, device_from_descriptor
from tpu_pipeline.toolchain.export_mcu import resolver_method
from tpu_pipeline.toolchain.ir import from_model
from tpu_pipeline.toolchain.tflite import read_model, read_offline_plan
from tpu_pipeline.toolchain.tflite.metadata import total_tensor_count

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module", params=["tiny_irregular_int8.tflite", "multi_output_int8.tflite"])
def exported(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("fw")
    assert main(["export-mcu", str(FIX / request.param), "--device", "sparkfun-edge", "-o", str(out), "--json"]) == 0
    return FIX / request.param, out, json.loads((out / "export.json").read_text())


def test_c_array_is_the_model_aligned(exported):
    src, out, info = exported
    cc = (out / "model_data.cc").read_text()
    assert "alignas(16) const unsigned char g_model_data[]" in cc
    data = bytes(int(h, 16) for h in re.findall(r"0x([0-9a-f]{2})", cc))
    assert data == (out / "model.tflite").read_bytes()
    assert f"g_model_data_len = {len(data)};" in cc


def test_resolver_lists_exactly_the_ops_used(exported):
    src, out, info = exported
    used = list(dict.fromkeys(op.opcode for op in from_model(read_model(src)).ops))
    h = (out / "op_resolver.h").read_text()
    assert f"MicroMutableOpResolver<kHarnessNumOps>" in h and f"kHarnessNumOps = {len(used)};" in h
    assert re.findall(r"resolver\.(Add\w+)\(\)", h) == [resolver_method(o) for o in used]


def test_offline_plan_is_honoured_by_tflm_and_the_arena_fits(exported):
    src, out, info = exported
    model = read_model(out / "model.tflite")
    plan = read_offline_plan(model)
    assert plan is not None and len(plan) == total_tensor_count(model)
    assert any(o >= 0 for o in plan)
    real = measure_tflm_arena(out / "model.tflite")
    assert real.head == info["measured_head"] <= info["planned_head"]
    assert info["planned_head"] <= info["tflm_own_head"]  # never worse than TFLM's own plan
    assert f"#define HARNESS_ARENA_SIZE {info['arena_size']}" in (out / "harness_config.h").read_text()
    # The configured arena is enough for real TFLite Micro, and the outputs do not change.
    planned = TflmModel((out / "model.tflite").read_bytes(), info["arena_size"], "exported")
    plain = TflmModel(src.read_bytes(), 1 << 20, "original")
    rng = np.random.default_rng(0)
    for _ in range(3):
        xs = [rng.integers(-128, 128, size=s).astype(dt) for dt, s in plain.inputs]
        for a, b in zip(planned.run(xs), plain.run(xs)):
            assert np.array_equal(a, b)


def test_harness_sources_are_copied(exported):
    _, out, info = exported
    assert (out / "main.cc").is_file() and (out / "harness_platform.h").is_file()
    assert set(info["files"]) <= {p.name for p in out.iterdir()}


def test_export_to_a_device_that_is_too_small_exits_3(tmp_path, capsys):
    toml = (DEVICES_DIR / "sparkfun-edge.toml").read_text()
    small = tmp_path / "tiny.toml"
    small.write_text(toml.replace('name = "sparkfun-edge"', 'name = "tiny"').replace("sram_bytes = 393216", "sram_bytes = 4096"))
    out = tmp_path / "fw"
    assert main(["export-mcu", str(FIX / "tiny_irregular_int8.tflite"), "--device", str(small), "-o", str(out)]) == 3
    assert "SRAM" in capsys.readouterr().err
    assert not out.exists()  # a failed export leaves nothing behind


def test_export_replaces_a_padding_space_to_batch_by_an_explicit_pad(tmp_path, capsys):
    """TFLite Micro's SPACE_TO_BATCH_ND pads with a value nothing sets (execute/tflm.py
    ARENA_DEPENDENT_OPS): on a board, darts_s2b as given computes with what its arena held, not
    what LiteRT computes. The exported model pads through PAD (the zero point) and computes LiteRT's
    outputs (within LiteRT's own rounding, 1), on any arena."""
    from tpu_pipeline.toolchain.execute.litert import run_litert
    from tpu_pipeline.toolchain.execute.tflm import run_tflm_sets_in_child
    from tpu_pipeline.toolchain.tflite.extract import padding_space_to_batch_zero_points

    src, out = FIX / "darts_s2b_int8.tflite", tmp_path / "fw"
    assert main(["export-mcu", str(src), "--device", "qemu-mps2-an386", "-o", str(out)]) == 0
    assert "8 SPACE_TO_BATCH_ND op(s) now read an explicit PAD" in capsys.readouterr().out
    info = json.loads((out / "export.json").read_text())
    assert any("explicit PAD" in n for n in info["notes"]) and "PAD" in info["ops"]
    data = (out / "model.tflite").read_bytes()
    assert padding_space_to_batch_zero_points(read_model(data)) == []
    host = TflmModel(data, 8 << 20)
    assert host.arena_dependent == []
    sets = host.input_sets(data, 3, 0)
    as_given = run_tflm_sets_in_child(src.read_bytes(), sets)  # a zeroed arena: pads with 0, not the zero point
    gap_exported = gap_as_given = 0
    for x, given in zip(sets, as_given):
        want = run_litert(src, x)[0][0].astype(int)
        gap_exported = max(gap_exported, int(np.abs(host.run(x)[0].astype(int) - want).max()))
        gap_as_given = max(gap_as_given, int(np.abs(given[0].astype(int) - want).max()))
    assert gap_exported <= 1 < gap_as_given


def test_a_dynamic_batch_model_on_harness_kernels_gets_its_real_shapes(tmp_path, capsys):
    """A dynamic-batch model on harness kernels (MLPerf Tiny's kws and this darts_s2b as tests and
    users write them): LiteRT prepares its builtin view, whose tensors are numbered apart; its
    shapes go back to the model's own tensors (they once landed on the requantization constants,
    and TFLite Micro refused the export). The export computes LiteRT's outputs."""
    from helpers.firmware import written
    from tpu_pipeline.toolchain.execute.litert import run_litert, runtime_shapes
    from tpu_pipeline.toolchain.fit.variants import on_harness
    from tpu_pipeline.toolchain.ir.kernels import kernel_choices

    src = read_model((FIX / "darts_s2b_dynbatch_int8.tflite").read_bytes())
    graph = on_harness(from_model(src))[0]
    assert kernel_choices(graph)
    model = tmp_path / "harness.tflite"
    model.write_bytes(written(graph, src))
    own, given = runtime_shapes(read_model(model.read_bytes())), runtime_shapes(src)
    assert {i: own[i] for i in given} == given  # the model's own tensors: the source's shapes
    for t in graph.tensors[len(src.subgraphs[0].tensors):]:  # the constants on_harness added: no other shape
        assert own.get(t.index, tuple(t.shape)) == tuple(t.shape)
    out = tmp_path / "fw"
    assert main(["export-mcu", str(model), "--device", "qemu-mps2-an386", "-o", str(out)]) == 0, capsys.readouterr().err
    host = TflmModel(data := (out / "model.tflite").read_bytes(), 8 << 20)
    for x in host.input_sets(data, 2, 0):
        want = run_litert(FIX / "darts_s2b_dynbatch_int8.tflite", x)[0][0].astype(int)
        assert int(np.abs(host.run(x)[0].astype(int) - want).max()) <= 1


def test_export_to_an_edgetpu_is_a_usage_error(tmp_path, capsys):
    assert main(["export-mcu", str(FIX / "chain_int8.tflite"), "--device", "coral-usb", "-o", str(tmp_path / "x")]) == 2
    assert "not an MCU" in capsys.readouterr().err


def test_resolver_method_names():
    assert [resolver_method(o) for o in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "MAX_POOL_2D",
                                         "PADV2", "L2_NORMALIZATION", "HARD_SWISH")] == \
        ["AddConv2D", "AddDepthwiseConv2D", "AddFullyConnected", "AddMaxPool2D", "AddPadV2",
         "AddL2Normalization", "AddHardSwish"]


def test_mcu_cost_model_sums_its_ops():
    g = from_model(read_model(FIX / "tiny_irregular_int8.tflite"))
    device = device_from_descriptor(
        {"name": "m", "kind": "mcu", "memory": {"sram_bytes": 1, "flash_bytes": 1}, "link": {"baud": 9600},
         "compute": {"clock_hz": 1e6, "cycles_per_mac": {"conv": 2, "depthwise": 3, "fully_connected": 5,
                                                         "elementwise": 7, "other": 11}},
         "power": {"active_w": 0.5, "idle_w": 0.0}}, "m.toml")
    e = estimate_mcu(g, device, CMSIS_NN)
    assert e.cycles == sum(o.cycles for o in e.ops)
    assert e.latency_s == pytest.approx(e.cycles / 1e6) and e.energy_j == pytest.approx(e.latency_s * 0.5)
    for o in e.ops:
        assert o.cycles == {"conv": 2, "depthwise": 3, "fully_connected": 5, "elementwise": 7, "other": 11}[o.op_class] * o.work
    assert op_class("CONV_2D") == "conv" and op_class("CONCATENATION") == "other"
