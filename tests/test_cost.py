"""Device descriptors and the Edge TPU cost model."""

from __future__ import annotations

import pytest

from tpu_pipeline.cli import main
from tpu_pipeline.toolchain.cost import EdgeTpuCostModel, OP_CLASSES, PS_PER_S, available_devices, load_device, op_class
from tpu_pipeline.toolchain.errors import UsageError
from helpers.models import EDGETPU


def test_every_shipped_descriptor_loads_and_validates():
    names = available_devices()
    for required in ("coral-usb", "coral-pcie", "coral-devboard", "sparkfun-edge"):
        assert required in names
    kinds = {load_device(n).kind for n in names}
    assert kinds == {"edgetpu", "mcu"}
    assert sum(load_device(n).kind == "mcu" for n in names) >= 2
    usb = load_device("coral-usb")
    assert 7 * 2**20 <= usb.param_sram_bytes <= 8 * 2**20
    assert set(usb.efficiency) == set(OP_CLASSES)
    edge = load_device("sparkfun-edge")
    assert edge.sram_bytes == 384 * 1024 and edge.clock_hz == 48e6 and edge.baud == 921600


@pytest.mark.parametrize("mutation, message", [
    (lambda s: s.replace('kind = "edgetpu"', 'kind = "gpu"'), "'kind'"),
    (lambda s: s.replace("param_sram_bytes = 1000", ""), "param_sram_bytes"),
    (lambda s: s.replace("host_bandwidth_bytes_per_s = 1e9", "host_bandwidth_bytes_per_s = -1"), "must be > 0"),
    (lambda s: s.replace("conv = 0.5", "conv = 1.5"), "fraction"),
    (lambda s: s.replace("other = 1.0", "other = 1.0\nsystolic = 1.0"), "unknown op class"),
    (lambda s: s.replace("depthwise = 0.25", ""), "'depthwise'"),
    (lambda s: s.replace("param_sram_bytes = 1000", 'param_sram_bytes = "8MB"'), "must be a number"),
    (lambda s: s + "\n[[[", "not valid TOML"),
])
def test_bad_descriptors_are_refused_naming_the_file(tmp_path, mutation, message):
    p = tmp_path / "bad.toml"
    p.write_text(mutation(EDGETPU))
    with pytest.raises(UsageError) as exc:
        load_device(p)
    assert str(p) in str(exc.value) and message in str(exc.value)


def test_unknown_device_name_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown device"):
        load_device("no-such-board")


def test_cli_unknown_device_exits_2(capsys):
    from tests.conftest import FIXTURES
    assert main(["compile", str(FIXTURES / "chain_int8.tflite"), "-n", "1", "--device", "nope", "-o", "/tmp/never"]) == 2
    assert "unknown device" in capsys.readouterr().err


def test_stage_latency_formula(tmp_path):
    p = tmp_path / "toy.toml"
    p.write_text(EDGETPU)
    m = EdgeTpuCostModel(load_device(p))
    assert m.ps_per_byte == 1000  # 1 GB/s
    # 3000 parameter bytes, 1000 fit: 2000 streamed; 100 in + 50 out bytes; 1 ms compute
    s = m.stage(n_ops=2, compute_ps=10**9, param=3000, in_bytes=100, out_bytes=50)
    assert s.offchip_bytes == 2000 and s.sram_bytes == 1000
    expected_s = 1e-3 + 1e-3 + 2000 / 1e9 + 150 / 1e9
    assert s.latency_ps == round(expected_s * PS_PER_S)
    small = m.stage(1, 0, 10, 0, 0)
    assert small.offchip_bytes == 0 and small.latency_ps == m.overhead_ps
    pipe = m.pipeline([s, small])
    assert pipe.bottleneck == 0
    assert pipe.throughput_per_s == pytest.approx(1 / s.latency_s)
    assert pipe.latency_s == pytest.approx(s.latency_s + small.latency_s)
    # steady state: the fast device idles for the rest of the period
    assert pipe.energy_j == pytest.approx(2.0 * s.latency_s + 2.0 * small.latency_s + 0.5 * (s.latency_s - small.latency_s))


def test_op_classes():
    assert op_class("CONV_2D") == "conv" and op_class("DEPTHWISE_CONV_2D") == "depthwise"
    assert op_class("FULLY_CONNECTED") == "fully_connected" and op_class("ADD") == "elementwise"
    assert op_class("MAX_POOL_2D") == "other" and op_class("CUSTOM:foo") == "other"


def test_mcu_descriptor_is_not_an_edge_tpu():
    with pytest.raises(UsageError, match="not an Edge TPU"):
        EdgeTpuCostModel("sparkfun-edge")
