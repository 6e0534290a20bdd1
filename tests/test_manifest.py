"""report.json as a typed, versioned manifest: tampered reports are refused with one line naming
the field (exit 2), never opened outside the folder; compile's real reports round-trip; the
compiler never imports the runtime; TFLite Micro refuses float16 models by saying so."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tpu_pipeline.toolchain.device import load_device
from tpu_pipeline.cli import main

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
MODEL = FIX / "tiny_irregular_int8.tflite"
FLOAT = FIX / "concat_conv_float32.tflite"
SEG = "m_segment_0_of_1.tflite"


def compiled_dir(tmp_path: Path) -> tuple[Path, dict]:
    """A one-segment compiled directory and a valid report for it; a copy of the model sits
    outside the folder, where a tampered report may point."""
    d = tmp_path / "out"
    d.mkdir()
    shutil.copy(MODEL, d / SEG)
    shutil.copy(MODEL, d / "m.tflite")
    shutil.copy(MODEL, tmp_path / "outside.tflite")
    from tpu_pipeline.toolchain.tflite import read_model

    sg = read_model(MODEL).subgraphs[0]
    name = lambda i: sg.tensors[i].name.decode()  # noqa: E731
    report = {"model": "m.tflite", "num_segments": 1, "device": "coral-usb",
              "segments": [{"index": 0, "file": SEG, "inputs": [name(i) for i in sg.inputs],
                            "outputs": [name(i) for i in sg.outputs], "ops": len(sg.operators),
                            "predicted_latency_s": 0.001}],
              "predicted": {"latency_s": 0.001, "throughput_per_s": 1000.0, "energy_j": 0.002}}
    return d, report


def _seg(report, **changes):
    r = json.loads(json.dumps(report))
    r["segments"][0].update(changes)
    return r


def _top(report, **changes):
    r = json.loads(json.dumps(report))
    r.update(changes)
    return r


def _nested(depth: int):
    v: list = []
    for _ in range(depth):
        v = [v]
    return v


# (id, report (a dict, or a function of (report, tmp_path) giving a dict or raw bytes), expected text)
TAMPERED = [
    ("dotdot-existing", lambda r, t: _seg(r, file="../outside.tflite"), "report.json: segments[0].file: "),
    ("dotdot-deep", lambda r, t: _seg(r, file="../../x.tflite"), "report.json: segments[0].file: "),
    ("absolute-passwd", lambda r, t: _seg(r, file="/etc/passwd"), "report.json: segments[0].file: "),
    ("absolute-model-file", lambda r, t: _seg(r, file=str(t / "outside.tflite")), "report.json: segments[0].file: "),
    ("model-passwd", lambda r, t: _top(r, model="/etc/passwd"), "report.json: model: "),
    ("model-outside", lambda r, t: _top(r, model="../outside.tflite"), "report.json: model: "),
    ("device-path", lambda r, t: _top(r, device="/etc/passwd"), "report.json: device: "),
    ("device-relative", lambda r, t: _top(r, device="../devices/coral-usb.toml"), "report.json: device: "),
    ("device-unknown", lambda r, t: _top(r, device="README.md"), "report.json: device: "),
    ("symlink-escape", "symlink", "report.json: segments[0].file: "),
    ("file-not-a-string", lambda r, t: _seg(r, file=42), "report.json: segments[0].file: "),
    ("inputs-a-string", lambda r, t: _seg(r, inputs="input"), "report.json: segments[0].inputs: "),
    ("inputs-a-number", lambda r, t: _seg(r, inputs=[1]), "report.json: segments[0].inputs[0]: "),
    ("index-a-string", lambda r, t: _seg(r, index="0"), "report.json: segments[0].index: "),
    ("ops-a-boolean", lambda r, t: _seg(r, ops=True), "report.json: segments[0].ops: "),
    ("segment-a-string", lambda r, t: _top(r, segments=[SEG]), "report.json: segments[0]: "),
    ("segments-missing", lambda r, t: {k: v for k, v in r.items() if k != "segments"}, "report.json: segments: "),
    ("segments-an-object", lambda r, t: _top(r, segments={"0": SEG}), "report.json: segments: "),
    ("huge-latency", lambda r, t: b'{"segments": [{"index": 0, "file": "%s", "predicted_latency_s": 1e999}]}'
     % SEG.encode(), "report.json: not readable JSON"),
    ("huge-integer", lambda r, t: b'{"num_segments": 1%s, "segments": []}' % (b"0" * 5000),
     "report.json: not readable JSON"),
    ("huge-ops", lambda r, t: _seg(r, ops=10 ** 19), "report.json: segments[0].ops: "),
    ("negative-parameters", lambda r, t: _seg(r, parameter_bytes=-1), "report.json: segments[0].parameter_bytes: "),
    ("nan", lambda r, t: json.dumps(_top(r, predicted={"latency_s": float("nan")})).encode(),
     "report.json: not readable JSON"),
    ("non-utf8", lambda r, t: b'{"segments": [{"index": 0, "file": "\xff\xfe.tflite"}]}', "report.json: not UTF-8"),
    ("json-list", lambda r, t: json.dumps([r]).encode(), "report.json: expected a JSON object"),
    ("deeply-nested", lambda r, t: b'{"segments": ' + b"[" * 100000 + b"]" * 100000 + b"}",
     "report.json: not readable JSON"),
    ("nested-extra-field", lambda r, t: _top(r, notes=_nested(200)), "report.json: not readable JSON: nested"),
    ("newer-version", lambda r, t: _top(r, version=99), "report.json: version: "),
    ("same-file-twice", lambda r, t: _top(r, num_segments=2, segments=[r["segments"][0], {**r["segments"][0],
                                                                                        "index": 1}]),
     "report.json: segments[1].file: "),
    ("not-a-model-name", lambda r, t: _seg(r, file="report.json"), "report.json: segments[0].file: "),
]


@pytest.mark.parametrize("make, expected", [c[1:] for c in TAMPERED], ids=[c[0] for c in TAMPERED])
def test_run_refuses_a_tampered_report_with_one_line(tmp_path, capsys, make, expected):
    d, report = compiled_dir(tmp_path)
    if make == "symlink":
        (d / SEG).unlink()
        (d / SEG).symlink_to(tmp_path / "outside.tflite")
        content = report
    else:
        content = make(report, tmp_path)
    (d / "report.json").write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    code = main(["run", str(d), "--backend", "emulator", "-N", "1", "--warmup", "0", "--json"])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err[:2000]
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert len(lines[0]) < 400


def test_the_untampered_report_runs(tmp_path, capsys):
    """The tampered cases above differ from this one in one field only."""
    d, report = compiled_dir(tmp_path)
    (d / "report.json").write_text(json.dumps(report))
    assert main(["run", str(d), "--backend", "emulator", "-N", "1", "--warmup", "0", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["verified"] is True
    assert rep["predicted"]["source"] == "report.json" and rep["predicted"]["latency_s"] == 0.001


def test_a_link_inside_the_folder_is_accepted(tmp_path):
    from tpu_pipeline.toolchain.manifest import load_manifest

    d, report = compiled_dir(tmp_path)
    (d / "sub").mkdir()
    (d / SEG).rename(d / "sub" / SEG)
    (d / SEG).symlink_to(Path("sub") / SEG)
    (d / "report.json").write_text(json.dumps(report))
    assert load_manifest(d).segments[0].file == SEG


def test_a_folder_without_report_refuses_a_segment_link_leading_out(tmp_path, capsys):
    """Without report.json the runtime finds Coral-named segment files itself: same rule."""
    d = tmp_path / "out"
    d.mkdir()
    shutil.copy(MODEL, tmp_path / "outside.tflite")
    (d / SEG).symlink_to(tmp_path / "outside.tflite")
    assert main(["run", str(d), "--backend", "emulator", "-N", "1", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"segment file: '{SEG}' is a link leading outside the folder" in err[0], err
    (d / SEG).unlink()
    shutil.copy(MODEL, d / SEG)  # the same file, really in the folder, runs
    assert main(["run", str(d), "--backend", "emulator", "-N", "1", "--json"]) == 0


def test_manifest_types_defaults_and_unknown_fields(tmp_path):
    from tpu_pipeline.toolchain.manifest import MANIFEST_VERSION, Manifest, Prediction, SegmentEntry

    d, report = compiled_dir(tmp_path)
    report["solver"] = {"proven_optimal": True, "lower_bounds": [1, 2]}
    report["segments"][0]["sram_bytes"] = 123
    m = Manifest.from_json(report, d)
    assert m.version == 1 and MANIFEST_VERSION == 2  # no version: read as 1 (version 2 adds -n auto's table)
    assert m.num_segments == 1 and m.model == "m.tflite" and m.device == "coral-usb"
    assert isinstance(m.segments[0], SegmentEntry) and m.segments[0].ops == report["segments"][0]["ops"]
    assert m.segments[0].inputs == tuple(report["segments"][0]["inputs"])
    assert m.predicted == Prediction(0.001, 1000.0, 0.002, {})
    out = m.to_json()
    assert out["version"] == 1  # kept as read
    assert out["solver"] == report["solver"] and out["segments"][0]["sram_bytes"] == 123  # kept
    again = Manifest.from_json(json.loads(m.dumps()), d)
    assert again == m
    # a segment without inputs/outputs is read from the file by the runtime
    bare = {"segments": [{"file": SEG}]}
    assert Manifest.from_json(bare, d).segments[0].inputs is None


def test_dumps_writes_strict_json(tmp_path):
    from tpu_pipeline.toolchain.manifest import Manifest

    d, report = compiled_dir(tmp_path)
    report["gain_throughput"] = float("inf")  # a free-form figure: JSON cannot hold it
    text = Manifest.from_json(report, d).dumps()
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in report.json"))["gain_throughput"] is None


def test_compile_output_is_a_valid_manifest(tmp_path, capsys):
    """What compile writes today loads through the manifest unchanged in every typed field."""
    from tpu_pipeline.runtime.deployment import load_deployment
    from tpu_pipeline.toolchain.manifest import Manifest, load_manifest

    out = tmp_path / "c"
    assert main(["compile", str(MODEL), "-n", "2", "-o", str(out), "--json"]) == 0
    capsys.readouterr()
    raw = json.loads((out / "report.json").read_text())
    m = load_manifest(out)
    assert [s.file for s in m.segments] == [s["file"] for s in raw["segments"]]
    assert [list(s.inputs) for s in m.segments] == [s["inputs"] for s in raw["segments"]]
    assert m.predicted.latency_s == raw["predicted"]["latency_s"]
    assert Manifest.from_json(json.loads(m.dumps()), out) == m
    dep = load_deployment(out)
    assert dep.manifest == m and dep.device == raw["device"]


def test_compiler_never_imports_the_runtime_or_the_cli():
    """Dependencies point one way: tpu_pipeline (the CLI) -> runtime -> toolchain. No toolchain
    module imports `runtime` or `tpu_pipeline`, statically or through importlib."""
    found = []
    for path in sorted((ROOT / "tpu_pipeline" / "toolchain").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                    "import_module", "__import__") and node.args:
                names = [ast.unparse(node.args[0]).strip("'\"f")]
            else:
                continue
            found += [f"{rel}:{node.lineno}" for n in names if n.startswith(("tpu_pipeline.runtime", "tpu_pipeline.cli", "tpu_pipeline.commands", "tpu_pipeline.entry")) or n == "tpu_pipeline"]
    assert found == [], f"the compiler imports the runtime or the CLI at {found}"


# --- --power-meter: handled once, refused where it cannot be used ------------------------------

def test_power_meter_on_the_emulator_is_refused_not_ignored(capsys):
    from tpu_pipeline.runtime.power import FakeUmMeter

    with FakeUmMeter("UM25C", 5.0, 0.1) as meter:
        for argv in (["run", str(MODEL), "--backend", "emulator"],
                     ["profile", str(MODEL), "--device", "sparkfun-edge", "--backend", "emulator"]):
            code = main([*argv, "-N", "1", "--power-meter", meter.port, "--json"])
            err = capsys.readouterr().err.strip().splitlines()
            assert code == 2 and len(err) == 1, err
            assert err[0].startswith("error: --power-meter: the emulator backend cannot use a power meter"), err


def test_a_new_backend_is_one_module_and_one_registration(monkeypatch, capsys):
    """docs/architecture.md's worked example: a backend module plus its line in BUILTIN is all it
    takes; the command line offers it and `run` reaches it through the registry's checks."""
    import sys
    import types

    from tpu_pipeline.runtime import backends
    from tpu_pipeline.runtime.backends.common import Backend
    from tpu_pipeline.toolchain.errors import DeviceError

    ran = []

    class MyBackend(Backend):
        name, kinds = "mydevice", ("mcu",)

        def readiness(self, port=None, deployment=None):
            return False, "no board"

        def run(self, request, progress=None, power=None):
            ran.append(request.device.name)  # the Device the command resolved
            raise DeviceError("mydevice: no board attached")

    module = types.ModuleType("tpu_pipeline.runtime.backends.mydevice")
    module.MyBackend = MyBackend
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(backends.BUILTIN, "mydevice", "mydevice:MyBackend")
    code = main(["run", str(MODEL), "--backend", "mydevice", "--device", "sparkfun-edge", "-N", "1"])
    assert code == 4 and ran == ["sparkfun-edge"]
    assert "mydevice: no board attached" in capsys.readouterr().err


def test_backend_registry_checks_requests_in_one_place():
    from tpu_pipeline.runtime.backends import (Backend, RunRequest, get_backend, register, registry, run_backend,
                                  select_backend)
    from tpu_pipeline.runtime.deployment import load_deployment
    from tpu_pipeline.toolchain.errors import UsageError

    assert {"emulator", "coral", "mcu"} <= set(registry())
    assert all(isinstance(b, Backend) for b in registry().values())
    assert get_backend("coral").power_meter and get_backend("mcu").power_meter
    assert not get_backend("emulator").power_meter
    dep = load_deployment(MODEL)
    assert select_backend("auto", "mcu", None, dep).backend == "emulator"
    assert select_backend("auto", "mcu", "/dev/ttyX", dep).backend == "mcu"
    with pytest.raises(UsageError, match="unknown backend 'tpu-v9'"):
        select_backend("tpu-v9", "mcu")
    with pytest.raises(UsageError, match="--backend coral cannot run device 'sparkfun-edge': it is an MCU"):
        run_backend("coral", RunRequest(dep, load_device("sparkfun-edge"), "mcu"))
    with pytest.raises(UsageError, match="--backend mcu cannot run device 'coral-usb': it is an Edge TPU"):
        run_backend("mcu", RunRequest(dep, load_device("coral-usb"), "edgetpu", port="/dev/ttyX"))
    with pytest.raises(UsageError, match="needs --port"):
        run_backend("mcu", RunRequest(dep, load_device("sparkfun-edge"), "mcu"))

    class Board(Backend):  # a backend added later gets the same checks before it runs
        name = "test-board"
        kinds = ("mcu",)
        power_meter_why_not = "no meter on this board"

        def run(self, request, progress=None, power=None):
            raise AssertionError("must be refused before running")

    register(Board())
    try:
        with pytest.raises(UsageError, match="test-board backend cannot use a power meter .no meter on this board"):
            run_backend("test-board", RunRequest(dep, load_device("sparkfun-edge"), "mcu"), power_meter="/dev/ttyUSB9")
    finally:
        from tpu_pipeline.runtime import backends

        backends._EXTRA.pop("test-board", None)


# --- float16: TFLite Micro has no float16 kernels; say so -----------------------------------

def float16_weights_model(src: Path) -> bytes:
    """What the converter's float16 quantization writes: a float16 constant and a DEQUANTIZE
    op turning it into the float32 weights the convolution reads."""
    from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model, schema

    m = read_model(src)
    sg = m.subgraphs[0]
    conv = next(op for op in sg.operators
                if m.operatorCodes[op.opcodeIndex].builtinCode == schema.BuiltinOperator.CONV_2D)
    w = sg.tensors[conv.inputs[1]]
    weights = np.frombuffer(bytes(bytearray(m.buffers[w.buffer].data)), dtype=np.float32)
    half = schema.BufferT()
    half.data = np.frombuffer(weights.astype(np.float16).tobytes(), dtype=np.uint8)
    m.buffers.append(half)
    t = schema.TensorT()
    t.name, t.shape, t.type, t.buffer = w.name + b"_fp16", list(w.shape), schema.TensorType.FLOAT16, len(m.buffers) - 1
    sg.tensors.append(t)
    m.buffers.append(schema.BufferT())
    w.buffer = len(m.buffers) - 1  # now computed by the DEQUANTIZE below
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.DEQUANTIZE
    code.version = 3
    m.operatorCodes.append(code)
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = len(m.operatorCodes) - 1, [len(sg.tensors) - 1], [conv.inputs[1]]
    sg.operators.insert(0, op)
    return model_to_bytes(m)


@pytest.fixture
def fp16_model(tmp_path) -> Path:
    p = tmp_path / "weights_fp16.tflite"
    p.write_bytes(float16_weights_model(FLOAT))
    from tpu_pipeline.toolchain.execute.litert import new_interpreter

    new_interpreter(p, builtin_only=False).invoke()  # a real model: LiteRT runs it
    return p


FP16_MESSAGE = "TFLite Micro cannot run this model (it has no float16 kernels: 1 float16 tensors, e.g. "


@pytest.mark.parametrize("argv", [["profile", "{m}", "--device", "sparkfun-edge", "-N", "1"],
                                  ["run", "{m}", "--device", "sparkfun-edge", "-N", "1"],
                                  ["export-mcu", "{m}", "--device", "sparkfun-edge", "-o", "{out}"]],
                         ids=["profile", "run", "export-mcu"])
def test_float16_model_on_tflite_micro_says_so(fp16_model, tmp_path, capsys, argv):
    code = main([a.format(m=fp16_model, out=tmp_path / "export") for a in argv])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert code == 2, err
    assert len(err) == 1 and FP16_MESSAGE in err[0] and "any arena" not in err[0], err
    assert str(fp16_model) in err[0]


def test_float16_in_the_moved_helpers(fp16_model):
    from tpu_pipeline.toolchain.cost.op_timing import tflm_op_times
    from tpu_pipeline.toolchain.errors import ModelError
    from tpu_pipeline.toolchain.execute.tflm_arena import measure_tflm_arena

    with pytest.raises(ModelError, match=r"no float16 kernels: 1 float16 tensors"):
        measure_tflm_arena(fp16_model.read_bytes())
    with pytest.raises(ModelError, match=r"no float16 kernels: 1 float16 tensors"):
        tflm_op_times(fp16_model.read_bytes())
    measure_tflm_arena(FLOAT.read_bytes())  # the float32 original still measures
