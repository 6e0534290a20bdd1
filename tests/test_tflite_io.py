"""Reading and writing .tflite: lossless round trips, aligned buffers, clear refusals."""

from __future__ import annotations

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema

from conftest import EXAMPLE, FIXTURES, fixture_models, run_cli, tflm_models
from tpu_pipeline.toolchain.execute.litert import seeded_outputs
from tpu_pipeline.toolchain.execute.tflm import run_tflm_in_child
from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model, write_model
from tpu_pipeline.toolchain.tflite.metadata import get_metadata, set_metadata

MODELS = fixture_models()


def _buffer_positions(data: bytes) -> list[tuple[int, int]]:
    root = schema.Model.GetRootAs(data, 0)
    out = []
    for i in range(root.BuffersLength()):
        b = root.Buffers(i)
        if b.DataLength():
            out.append((b._tab.Vector(b._tab.Offset(4)), b.DataLength()))
    return out


def test_there_are_models_to_test():
    assert len(MODELS) >= 5


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_round_trip_keeps_everything(path, tmp_path):
    original = read_model(path)
    out = tmp_path / "copy.tflite"
    write_model(original, out)
    again = read_model(out)
    assert len(again.subgraphs) == len(original.subgraphs)
    for sa, sb in zip(original.subgraphs, again.subgraphs):
        assert [t.name for t in sa.tensors] == [t.name for t in sb.tensors]
        assert [t.buffer for t in sa.tensors] == [t.buffer for t in sb.tensors]
        assert [list(o.inputs) for o in sa.operators] == [list(o.inputs) for o in sb.operators]
    assert len(again.buffers) == len(original.buffers)
    for ba, bb in zip(original.buffers, again.buffers):
        da = b"" if ba.data is None else np.asarray(ba.data, np.uint8).tobytes()
        db = b"" if bb.data is None else np.asarray(bb.data, np.uint8).tobytes()
        assert da == db
    assert [m.name for m in original.metadata or []] == [m.name for m in again.metadata or []]
    sig_a = [(s.signatureKey, [m.name for m in s.inputs], [m.tensorIndex for m in s.outputs])
             for s in original.signatureDefs or []]
    sig_b = [(s.signatureKey, [m.name for m in s.inputs], [m.tensorIndex for m in s.outputs])
             for s in again.signatureDefs or []]
    assert sig_a == sig_b


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_written_buffers_are_16_byte_aligned(path):
    data = model_to_bytes(read_model(path))
    positions = _buffer_positions(data)
    assert positions, "expected constant buffers"
    assert all(start % 16 == 0 for start, _ in positions)


def test_large_buffers_are_written_from_the_models_own_arrays():
    """model_to_chunks refers to each large constant buffer where the model holds it (no copy
    into the builder) and points the buffer's data field at it: the joined file reads back with
    every buffer's bytes, each large one after the tables."""
    from tpu_pipeline.toolchain.tflite.io import TAIL_MIN_BYTES, model_to_chunks

    model = read_model(EXAMPLE)
    large = [b for b in model.buffers if b.data is not None and len(b.data) >= TAIL_MIN_BYTES]
    assert large, "the fixture needs buffers large enough to go after the tables"
    chunks = model_to_chunks(model)
    for b in large:
        assert any(isinstance(c, memoryview) and np.shares_memory(np.asarray(c), b.data) for c in chunks)
    data = b"".join(chunks)
    again = read_model(data)
    for ba, bb in zip(model.buffers, again.buffers):
        da = b"" if ba.data is None else np.asarray(ba.data, np.uint8).tobytes()
        db = b"" if bb.data is None else np.asarray(bb.data, np.uint8).tobytes()
        assert da == db
    tables = len(chunks[0])
    sizes = {n: start for start, n in _buffer_positions(data)}
    assert all(sizes[len(b.data)] >= tables for b in large)


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_round_trip_runs_identically_in_litert(path):
    copy = model_to_bytes(read_model(path))
    for a, b in zip(seeded_outputs(path), seeded_outputs(copy)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("path", tflm_models()[:4], ids=lambda p: p.name)
def test_round_trip_runs_identically_in_tflm(path, tmp_path):
    copy = model_to_bytes(read_model(path))
    for a, b in zip(run_tflm_in_child(path), run_tflm_in_child(copy)):
        np.testing.assert_array_equal(a, b)


def test_metadata_set_and_replace():
    model = read_model(MODELS[0])
    m1 = set_metadata(model, "tpu-pipeline", b"one")
    m2 = set_metadata(m1, "tpu-pipeline", b"two")
    assert get_metadata(read_model(model_to_bytes(m2)), "tpu-pipeline") == b"two"
    assert len(m2.buffers) == len(m1.buffers)  # replaced in place, nothing dangling
    assert get_metadata(model, "tpu-pipeline") is None  # the input is untouched


# ---- refusals ---------------------------------------------------------------------------------

def _bad_inputs(tmp_path):
    good = MODELS[0].read_bytes()
    cases = {
        "empty": b"",
        "random": np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
        "truncated": good[: len(good) // 3],
        "no_identifier": good[:4] + b"XXXX" + good[8:],
    }
    # A buffer whose length runs past the end of the file.
    start, _ = _buffer_positions(good)[-1]
    patched = bytearray(good)
    patched[start - 4 : start] = (len(good) * 2).to_bytes(4, "little")
    cases["buffer_outside"] = bytes(patched)
    # The > 2 GiB format: data stored outside the flatbuffer (offset/size).
    model = read_model(good)
    model.buffers[1].data = None
    model.buffers[1].offset, model.buffers[1].size = 1 << 31, 64
    cases["external_buffers"] = model_to_bytes(model)
    model = read_model(good)
    model.version = 7
    cases["unknown_version"] = model_to_bytes(model)
    paths = {}
    for name, data in cases.items():
        p = tmp_path / f"{name}.tflite"
        p.write_bytes(data)
        paths[name] = p
    return paths


EXPECTED = {
    "empty": "empty file",
    "random": "not a TFLite model",
    "truncated": "truncated",
    "no_identifier": "not a TFLite model",
    "buffer_outside": "outside the file",
    "external_buffers": "outside the flatbuffer",
    "unknown_version": "schema version 7",
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_bad_input_is_refused_with_a_typed_error(case, tmp_path):
    path = _bad_inputs(tmp_path)[case]
    with pytest.raises(ModelError, match=EXPECTED[case]):
        read_model(path)


@pytest.mark.parametrize("case", ["empty", "random", "truncated", "buffer_outside", "unknown_version"])
def test_cli_refuses_bad_input_in_one_line_with_exit_2(case, tmp_path):
    path = _bad_inputs(tmp_path)[case]
    proc = run_cli("inspect", str(path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(path) in lines[0]
    assert "Traceback" not in proc.stderr


def test_missing_file_and_directory(tmp_path):
    for target, words in ((tmp_path / "nope.tflite", "no such file"), (tmp_path, "is a directory")):
        proc = run_cli("inspect", str(target))
        assert proc.returncode == 2 and words in proc.stderr


def test_tensor_names_of_type_reads_objects_and_bytes_alike():
    """TFLite Micro's float16 refusal asks this room, not the schema (tpu_pipeline/toolchain/execute/tflm_arena)."""
    from tpu_pipeline.toolchain.tflite import tensor_names_of_type

    model = read_model(FIXTURES / "concat_conv_float32.tflite")
    assert tensor_names_of_type(model, "float16") == []
    t = model.subgraphs[0].tensors[1]
    t.type = schema.TensorType.FLOAT16
    name = t.name.decode()
    assert tensor_names_of_type(model, "float16") == [name]
    assert tensor_names_of_type(model_to_bytes(model), "float16") == [name]
    assert name not in tensor_names_of_type(model, "float32")
    assert tensor_names_of_type(b"\x00" * 7, "float16") == []  # unreadable: the caller's load says why
