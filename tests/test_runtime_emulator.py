"""Emulated Edge TPU pipelines (LiteRT per segment) and MCU emulation (TFLite Micro), end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tpu_pipeline.toolchain.device import load_device
from tpu_pipeline.runtime.backends import select_backend
from tpu_pipeline.runtime.backends.coral import list_edgetpus, run_coral
from tpu_pipeline.runtime.backends.emulator import run_edgetpu_emulation, run_mcu_emulation
from tpu_pipeline.runtime.deployment import load_deployment
from tpu_pipeline.toolchain.execute.litert import runtime_shapes
from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena
from tpu_pipeline.cli import main
from tpu_pipeline.toolchain.data import DEVICES_DIR
from tpu_pipeline.toolchain.errors import DeviceError, ModelError
from tpu_pipeline.toolchain.ir import from_model
from tpu_pipeline.toolchain.tflite import read_model, write_model
from tpu_pipeline.toolchain.tflite.extract import extract_segment

FIX = Path(__file__).parent / "fixtures"
MODEL = FIX / "tiny_irregular_int8.tflite"
MULTI = FIX / "multi_output_int8.tflite"


def split_contiguous(src: Path, cuts: list[int], out: Path) -> Path:
    """Coral-style compiled directory: stored op order cut before each position in `cuts`."""
    model = read_model(src)
    g = from_model(model)
    out.mkdir(parents=True, exist_ok=True)
    bounds = [0, *cuts, len(g.ops)]
    n = len(bounds) - 1
    stem = src.stem
    segs = []
    for k in range(n):
        ops = list(range(bounds[k], bounds[k + 1]))
        mine = set(ops)
        produced = {t for i in ops for t in g.ops[i].outputs}
        ins = []
        for i in ops:
            for t in g.ops[i].inputs:
                if t >= 0 and g.is_activation(t) and t not in produced and t not in ins:
                    ins.append(t)
        later = {t for i in range(bounds[k + 1], len(g.ops)) for t in g.ops[i].inputs}
        outs = [t for i in ops for t in g.ops[i].outputs if t in later or t in g.outputs]
        if k == n - 1:
            outs = [t for t in g.outputs]
        f = f"{stem}_segment_{k}_of_{n}.tflite"
        write_model(extract_segment(model, ops, ins, outs, real=runtime_shapes(model)), str(out / f))
        segs.append({"index": k, "file": f, "inputs": [g.tensors[t].name for t in ins],
                     "outputs": [g.tensors[t].name for t in outs], "ops": len(ops)})
        assert mine
    (out / f"{stem}.tflite").write_bytes(src.read_bytes())
    (out / "report.json").write_text(json.dumps({"model": f"{stem}.tflite", "source": str(src), "num_segments": n,
                                                 "device": "coral-usb", "segments": segs}))
    return out


def test_single_model_is_a_one_segment_pipeline():
    dep = load_deployment(MODEL)
    assert len(dep.segments) == 1 and dep.whole == MODEL
    assert dep.graph_inputs == dep.segments[0].inputs


def test_three_segment_pipeline_reproduces_the_whole_model_bit_exactly(tmp_path):
    d = split_contiguous(MODEL, [5, 11], tmp_path / "c")
    dep = load_deployment(d)
    assert len(dep.segments) == 3
    rep = run_edgetpu_emulation(dep, 8, 1, 0, load_device("coral-usb"))
    assert rep.error is None
    assert rep.verified is True and rep.max_abs_diff == 0.0
    assert [s.latency.n for s in rep.stages] == [8, 8, 8]
    assert rep.throughput_per_s and rep.throughput_per_s > 0
    p = rep.predicted
    # the pipeline simulator on the three segments' loads, recomputed here from the files
    from tpu_pipeline.toolchain.cost.edgetpu import EdgeTpuCostModel
    from tpu_pipeline.toolchain.cost.pipeline import simulate
    from tpu_pipeline.toolchain.ir import total_param_bytes
    m = EdgeTpuCostModel(load_device("coral-usb"))
    loads = []
    for seg in dep.segments:
        g = from_model(read_model(seg.path))
        st = m.stage(len(g.ops), sum(c.compute_ps for c in m.op_costs(g)), total_param_bytes(g),
                     sum(g.tensors[t].nbytes for t in g.inputs), sum(g.tensors[t].nbytes for t in g.outputs))
        assert st.latency_s == pytest.approx(p["stages_s"][len(loads)])
        loads.append(m.load(st))
    sim = simulate(loads, m.bandwidth)
    assert p["period_s"] == pytest.approx(sim.period_s) and p["throughput_per_s"] == pytest.approx(1 / sim.period_s)
    assert p["latency_s"] == pytest.approx(sim.latency_s)
    # never faster than its slowest stage or than the link can carry every stage's bytes
    assert p["period_s"] >= max(p["stages_s"]) * (1 - 1e-9)
    assert p["period_s"] >= sum(ld.stream_bytes + ld.in_bytes + ld.out_bytes for ld in loads) / m.bandwidth
    assert p["latency_s"] >= sum(p["stages_s"]) * (1 - 1e-9)
    assert p["energy_j"] > 0


def test_tensors_skipping_a_segment_travel_by_name(tmp_path):
    # multi_output: two graph outputs; cut so the last segment does not produce all of them.
    g = from_model(read_model(MULTI))
    d = split_contiguous(MULTI, [len(g.ops) // 2], tmp_path / "m")
    rep = run_edgetpu_emulation(load_deployment(d), 4, 0, 0, load_device("coral-usb"))
    assert rep.verified is True


def test_wrong_segment_is_caught_as_a_verification_failure(tmp_path, capsys):
    d = split_contiguous(MODEL, [5], tmp_path / "c")
    seg = d / "tiny_irregular_int8_segment_1_of_2.tflite"
    model = read_model(seg)
    # Corrupt one weight byte of the second segment: outputs must no longer match.
    for b in model.buffers:
        if b.data is not None and len(b.data) > 64:
            b.data = np.array(b.data, dtype=np.uint8)
            b.data[10] ^= 0x55
            break
    write_model(model, str(seg))
    assert main(["run", str(d), "-N", "3", "--backend", "emulator"]) == 1
    assert "outputs differ" in capsys.readouterr().err


def test_run_cli_json_and_backend_choice(tmp_path, capsys):
    d = split_contiguous(MODEL, [8], tmp_path / "c")
    assert main(["run", str(d), "-N", "4", "--json"]) == 0
    cap = capsys.readouterr()
    rep = json.loads(cap.out)
    assert rep["backend"] == "emulator" and rep["verified"] is True and len(rep["stages"]) == 2
    assert set(rep["latency"]) >= {"min_s", "median_s", "p90_s"}
    assert rep["predicted"]["throughput_per_s"] > 0


def test_auto_says_why_it_emulates(capsys):
    assert main(["run", str(MODEL), "-N", "2"]) == 0
    err = capsys.readouterr().err
    assert "backend: emulator" in err and "no Edge TPU found" in err


@pytest.mark.parametrize("content, message", [
    ("{not json", "not readable JSON"),
    ('{"segments": []}', "no 'segments' list"),
    ('{"num_segments": 2, "segments": [{"index": 0, "file": "missing.tflite"}]}', "num_segments is 2"),
    ('{"segments": [{"index": 0, "file": "missing.tflite"}]}', "missing.tflite is missing"),
])
def test_bad_compiled_directory_exits_2(tmp_path, capsys, content, message):
    (tmp_path / "report.json").write_text(content)
    assert main(["run", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_directory_without_report_uses_coral_file_names(tmp_path):
    d = split_contiguous(MODEL, [6], tmp_path / "c")
    (d / "report.json").unlink()
    dep = load_deployment(d)
    assert [s.path.name for s in dep.segments] == ["tiny_irregular_int8_segment_0_of_2.tflite",
                                                   "tiny_irregular_int8_segment_1_of_2.tflite"]
    (d / "tiny_irregular_int8_segment_1_of_2.tflite").unlink()
    with pytest.raises(ModelError, match=r"segment\(s\) \[1\] of 2"):
        load_deployment(d)


def test_edgetpu_enumeration_reads_sysfs_and_dev(tmp_path):
    usb, dev = tmp_path / "usb", tmp_path / "dev"
    for name, vid, pid in (("1-1", "1a6e", "089a"), ("1-2", "18d1", "9302"), ("1-3", "18d1", "4ee7"),
                           ("2-1", "046d", "c52b")):
        (usb / name).mkdir(parents=True)
        (usb / name / "idVendor").write_text(vid + "\n")
        (usb / name / "idProduct").write_text(pid + "\n")
    dev.mkdir()
    (dev / "apex_0").touch()
    (dev / "apex_1").touch()
    tpus = list_edgetpus(str(usb), str(dev))
    assert [t.id for t in tpus] == ["usb:0", "usb:1", "pci:0", "pci:1"]  # a Pixel phone (18d1:4ee7) is no TPU
    assert list_edgetpus(str(tmp_path / "none"), str(tmp_path / "none")) == []


def test_coral_without_hardware_fails_fast_with_a_clear_error(capsys):
    if list_edgetpus():
        pytest.skip("an Edge TPU is attached")
    with pytest.raises(DeviceError, match="no Edge TPU found"):
        run_coral(load_deployment(MODEL), load_device("coral-usb"), iterations=1)
    assert main(["run", str(MODEL), "--backend", "coral"]) == 4
    assert "no Edge TPU found" in capsys.readouterr().err
    assert select_backend("auto", "edgetpu").backend == "emulator"


def test_mcu_emulation_measures_the_real_tflm_arena():
    rep = run_mcu_emulation(MODEL, load_device("sparkfun-edge"), iterations=3, warmup=1)
    real = measure_tflm_arena(MODEL)
    a = rep.arena
    assert rep.error is None and a["fits"] is True
    assert (a["head"], a["tail"]) == (real.head, real.tail)
    assert a["predicted_head"] == real.head  # our TFLM planner model, to the byte
    assert rep.latency.n == 3
    assert rep.predicted["latency_s"] > 0 and len(rep.ops) == len(from_model(read_model(MODEL)).ops)


def test_mcu_that_is_too_small_exits_3(tmp_path, capsys):
    toml = (DEVICES_DIR / "sparkfun-edge.toml").read_text()
    small = tmp_path / "tiny-mcu.toml"
    small.write_text(toml.replace('name = "sparkfun-edge"', 'name = "tiny-mcu"')
                     .replace("sram_bytes = 393216", "sram_bytes = 8192"))
    assert main(["profile", str(MODEL), "--device", str(small), "-N", "1", "--json"]) == 3
    cap = capsys.readouterr()
    rep = json.loads(cap.out)
    assert rep["arena"]["fits"] is False and rep["arena"]["head"] == measure_tflm_arena(MODEL).head
    assert "does not fit" in cap.err


def test_profile_mcu_cli(capsys):
    assert main(["profile", str(MODEL), "--device", "sparkfun-edge", "-N", "2", "--host-ops", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "fits" in out and "slowest ops" in out and "host µs" in out


def test_compiled_by_tpu_pipeline_compile_runs_verified(tmp_path, capsys):
    out = tmp_path / "c2"
    assert main(["compile", str(MODEL), "-n", "2", "-o", str(out), "--time-limit", "5"]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "-N", "3", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["verified"] is True and len(rep["stages"]) == 2 and rep["predicted"]["source"] == "report.json"
