"""The fitting tools write the package's TOML data through serializers (tools/package_toml.py):
a device descriptor keeps its comments and every value the tool does not fit, byte for byte."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.package_toml import tables_text, with_fitted_values, without_stamp  # noqa: E402

DEVICES = ROOT / "tpu_pipeline" / "toolchain" / "data" / "devices"


@pytest.mark.parametrize("path", sorted(DEVICES.glob("*.toml")), ids=lambda p: p.stem)
def test_a_descriptor_read_and_written_back_is_the_same_bytes(path):
    text = path.read_text()
    assert with_fitted_values(text, {}, path.name) == text


@pytest.mark.parametrize("name", ["coral-usb", "coral-devboard", "coral-pcie"])
def test_the_calibrated_values_written_as_the_tools_print_them_change_nothing(name):
    """calibrate_edgetpu.py and bench_pipeline_fidelity.py write these keys with `:.6g`."""
    text = (DEVICES / f"{name}.toml").read_text()
    d = tomllib.loads(text)
    keys = ["link.host_bandwidth_bytes_per_s", "timing.invoke_overhead_s", "timing.per_op_s"]
    keys += [f"compute.efficiency.{c}" for c in d["compute"]["efficiency"]]
    values = {"memory.param_sram_bytes": f"{d['memory']['param_sram_bytes']}"}
    for key in keys:
        section, *rest = key.split(".")
        v = d[section]
        for part in rest:
            v = v[part]
        values[key] = f"{v:.6g}"
    assert with_fitted_values(text, values, name) == text


def test_a_fitted_value_changes_its_line_only_and_keeps_the_comments():
    text = (DEVICES / "coral-usb.toml").read_text()
    body = without_stamp(text, "# Coral ")
    assert body.startswith("# Coral USB Accelerator") and text.endswith(body)
    new = with_fitted_values(body, {"timing.per_op_s": "2.5e-05", "compute.efficiency.depthwise": "0.5"}, "coral-usb")
    changed = [(a, b) for a, b in zip(body.splitlines(), new.splitlines()) if a != b]
    assert changed == [("per_op_s = 1.2e-05", "per_op_s = 2.5e-05"), ("depthwise = 1", "depthwise = 0.5")]
    assert tomllib.loads(new)["compute"]["efficiency"]["depthwise"] == 0.5
    with pytest.raises(SystemExit, match="cannot find timing.per_layer_s"):
        with_fitted_values(body, {"timing.per_layer_s": "1"}, "coral-usb")


def test_tables_are_written_by_the_serializer_under_a_header():
    text = tables_text(["fitted by a tool", "", "on: a, b"], {"cmsis-nn": {"conv": {"per_unit": 1.5, "ops": 3}}})
    assert text.startswith("# fitted by a tool\n#\n# on: a, b\n\n")
    assert tomllib.loads(text) == {"cmsis-nn": {"conv": {"per_unit": 1.5, "ops": 3}}}
