"""tools/bench_mcu_latency.py's bookkeeping: which TinyEngine tensor is which output, how outputs
are compared, how layers are grouped, how the table states ratios (the QEMU runs are the benchmark's)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import bench_mcu_latency as b  # noqa: E402


def test_outputs_are_found_by_shape_and_an_ambiguous_one_is_refused():
    info = {"outputs": [{"buffer": "&buffer0[2592]", "shape": [3, 3, 160]},
                        {"buffer": "&buffer0[160]", "shape": [1, 1, 2]}]}
    assert b.output_places(info, [np.zeros((1, 2), np.int8)]) == [(160, 2)]
    info["outputs"].append({"buffer": "&buffer0[0]", "shape": [1, 1, 2]})
    with pytest.raises(RuntimeError, match="no single TinyEngine tensor"):
        b.output_places(info, [np.zeros((1, 2), np.int8)])
    with pytest.raises(RuntimeError, match="not buffer0"):
        b.output_places({"outputs": [{"buffer": "&buffer1[0]", "shape": [1, 1, 2]}]}, [np.zeros((1, 2), np.int8)])


def test_compare_counts_equal_elements_as_signed_bytes():
    want = [np.array([[0, 2, -128]], np.int8)]
    assert b.compare([bytes([0, 2, 0x80])], want)["identical"]
    c = b.compare([bytes([3, 2, 0x7F])], want)
    assert (c["identical"], c["elements_equal"], c["max_abs_diff"]) == (False, 1, 255)


def test_layer_classes_name_kernel_and_stride():
    assert b.layer_class("CONV_2D", 1, 1) == "conv 1x1"
    assert b.layer_class("CONV_2D", 3, 2) == "conv 3x3 s2"
    assert b.layer_class("DEPTHWISE_CONV_2D", 3, 1) == "depthwise 3x3 s1"
    assert b.layer_class("DEPTHWISE_CONV_2D", 1, 1) == "depthwise 1x1 s1"
    assert b.layer_class("ADD", None, None) == "add"


def test_the_table_states_ratios_against_tinyengine_on_the_same_core():
    rows = [b.row("m", "tinyengine", "an386", "whole layers, float requantize", 100, 10, "x", True, "c",
                  layers=[{"class": "conv 1x1", "instructions": 60}, {"class": "add", "instructions": 40}]),
            b.row("m", "tflm-builtin", "an386", "as converted", 150, 20, "y", True, "c",
                  layers=[{"class": "conv 1x1", "instructions": 120}, {"class": "add", "instructions": 30}]),
            b.row("m", "tinyengine", "an500", "whole layers, float requantize", 200, 10, "x", False, "c",
                  match={"elements_equal": 1, "elements": 2, "max_abs_diff": 3})]
    text = b.render(rows)
    assert "| m | tflm-builtin | an386 | as converted | 150 | 1.50x |" in text
    assert "no: 1/2 equal, max diff 3" in text
    assert "| m | an386 | conv 1x1 | 60 | - | 120 (2.00x) | - |" in text


def test_reused_tinyengine_rows_say_so_and_keep_their_plan():
    earlier = [{**b.row("m", "tinyengine", "an386", "whole layers, float requantize", 100, 10, "x", True, "c"),
                "plan": {"best": {"peak": 5}}, "run": "2026-01-01T00:00:00Z"},
               {**b.row("m", "tinyengine", "an500", "whole layers, float requantize", 100, 10, "x", True, "c"),
                "plan": {"best": {"peak": 5}}},
               b.row("m", "tpu-pipeline", "an386", "fastest", 90, 10, "y", True, "c")]
    rows = b.reused_tinyengine_rows(earlier, "m", ["an386", "an500"])
    assert [r["reused_from"] for r in rows] == ["2026-01-01T00:00:00Z", "before run stamps"]
    assert rows[0]["plan"]["best"]["peak"] == 5
    assert "(reused from run 2026-01-01T00:00:00Z: not measured beside ours)" in b.render(rows)
    with pytest.raises(SystemExit):
        b.reused_tinyengine_rows(earlier, "other", ["an386"])


def test_the_figure_draws_each_model_with_more_than_one_engine(tmp_path):
    import mcu_latency_figure as fig

    rows = [b.row("m", "tinyengine", "an386", "whole layers", 100, 1000, "x", True, "c"),
            b.row("m", "tpu-pipeline", "an386", "fastest", 90, 1200, "y", True, "c"),
            b.row("m", "tpu-pipeline", "an386", "smallest", 300, 400, "y", True, "c"),
            b.row("m", "tpu-pipeline", "an500", "fastest", 91, 1200, "y", True, "c"),  # another core: not drawn
            b.row("alone", "tflm-builtin", "an386", "as converted", 50, 10, "z", True, "c")]  # nothing to compare
    lines = fig.write(rows, tmp_path)
    assert [s.id for s in fig.scatters(rows)] == ["scatter-m"]
    assert [len(s.points) for s in fig.scatters(rows)] == [3]
    svg = (tmp_path / "mcu_latency_m.svg").read_text()
    assert svg.count("<circle") == 3 + 2 and svg.count("<polyline") == 1  # 3 points + 2 legend swatches; ours joined
    assert "![m on an386" in "\n".join(lines) and 'id="scatter-m"' in (tmp_path / "mcu_latency.html").read_text()
