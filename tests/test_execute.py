"""tpu_pipeline/toolchain/execute: the one place models are run (LiteRT, TFLite Micro), their random inputs made
and their outputs compared."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import FIXTURES
from tpu_pipeline.toolchain.errors import ModelError, VerificationError
from tpu_pipeline.toolchain.execute.compare import compare_named, compare_outputs, max_abs_diff, verify_chain
from tpu_pipeline.toolchain.execute.inputs import input_stream, random_inputs, seeded_inputs
from tpu_pipeline.toolchain.execute.litert import (input_details, litert_interpreter, litert_load_error, run_litert, run_named,
                                      run_positional, seeded_outputs)
from tpu_pipeline.toolchain.execute.tflm import TflmModel, run_tflm, run_tflm_in_child

INT8 = FIXTURES / "tiny_irregular_int8.tflite"
FLOAT = FIXTURES / "tiny_irregular_float32.tflite"


def test_runtime_stream_and_verification_inputs_come_from_one_generator():
    """The run harness (input_stream) and compile/rewrite verification (random_inputs) draw the
    same tensors from the same seed, for floats and 16-bit integers too (the harness used to
    draw floats from U(-1, 1) and clip int16 to int8's range)."""
    specs = [("x", (3, 5), np.float32), ("q", (4, 4), np.int16), ("u", (2,), np.uint8), ("b", (3,), np.bool_)]
    stream = input_stream(specs, 2, seed=4)
    rng = np.random.default_rng(4)
    for sample in stream:
        want = random_inputs([{"shape": s, "dtype": d} for _, s, d in specs], rng)
        for (name, _, _), w in zip(specs, want):
            assert sample[name].dtype == w.dtype and np.array_equal(sample[name], w), name


def test_input_distribution():
    big = [{"shape": [64, 64], "dtype": t} for t in (np.int8, np.int16, np.int32, np.float32, np.bool_)]
    i8, i16, i32, f32, b = seeded_inputs(big, 0)
    assert i8.min() == -128 and i8.max() == 127                  # the full int8 range
    assert i16.min() < -128 and i16.max() > 127                  # the full int16 range, not int8's
    assert i32.min() == 0 and i32.max() == 8                     # indices and sizes stay small
    assert abs(float(f32.mean())) < 0.1 and 0.9 < float(f32.std()) < 1.1 and np.abs(f32).max() > 2
    assert set(np.unique(b)) == {False, True}
    assert seeded_inputs([{"shape": [1, -1, 3], "dtype": np.int8}], 1)[0].shape == (1, 1, 3)
    assert all(np.array_equal(a, c) for a, c in zip(seeded_inputs(big, 3), seeded_inputs(big, 3)))


def test_litert_interpreters_from_bytes_and_path_agree():
    x = seeded_inputs(input_details(INT8), 2)
    a, _ = run_litert(INT8.read_bytes(), x)
    b, _ = run_litert(INT8, x)
    default = litert_interpreter(INT8, builtin_only=False, num_threads=None)
    feeds = {d["name"]: v for d, v in zip(default.get_input_details(), x)}
    c = run_named(default, feeds)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert [np.array_equal(v, w) for v, w in zip(c.values(), a)] == [True] * len(a)
    assert all(np.array_equal(p, q) for p, q in zip(seeded_outputs(INT8, 5), seeded_outputs(INT8.read_bytes(), 5)))


def test_a_corrupted_interpreter_state_is_a_crash_not_an_internal_error():
    """LiteRT's int8 SVDF overwrites the interpreter's own state on TFLite Micro's keyword model:
    run to run it segfaults, aborts in free(), or hands back an output index out of its own range
    (that last one ended compile --verify with an internal error, exit 70, in CI)."""
    from tpu_pipeline.toolchain.execute.child import RuntimeCrash

    class Corrupted:  # a real interpreter whose output index the kernel has overwritten
        def __init__(self, it):
            self.it = it

        def __getattr__(self, name):
            return getattr(self.it, name)

        def get_tensor(self, index):
            raise ValueError(f"Invalid tensor index {index + 2137194496} exceeds max tensor index 62")

    it = Corrupted(litert_interpreter(INT8))
    x = seeded_inputs(input_details(INT8), 1)
    with pytest.raises(RuntimeCrash, match=r"^LiteRT crashed \(it corrupted its own memory: Invalid tensor index"):
        run_positional(it, x)
    with pytest.raises(RuntimeCrash):
        run_named(it, {d["name"]: v for d, v in zip(it.get_input_details(), x)})
    with pytest.raises(ValueError, match="Cannot set tensor"):  # a caller's wrong input stays its own error
        run_positional(litert_interpreter(INT8), [v.astype(np.float64) for v in x])


def test_litert_refusals_are_one_line():
    junk = b"\x1c\x00\x00\x00TFL3" + bytes(64)
    assert litert_load_error(junk)
    with pytest.raises(ModelError, match=r"^m\.tflite: LiteRT cannot load it \(") as e:
        litert_interpreter(junk, label="m.tflite")
    assert "\n" not in str(e.value)
    with pytest.raises(ModelError, match="^LiteRT cannot load the model: "):
        litert_interpreter(junk)
    assert litert_load_error(INT8.read_bytes()) is None


def test_tflm_in_process_in_a_child_and_as_an_mcu_agree():
    data = INT8.read_bytes()
    x = seeded_inputs(input_details(data), 6)
    here = run_tflm(data, x)
    child = run_tflm_in_child(INT8, inputs=x)
    mcu = TflmModel(data, 1 << 20, "m").run(x)
    assert len(here) == len(child) == len(mcu) > 0
    for a, b, c in zip(here, child, mcu):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    # seeded in the child from TFLite Micro's own input details: the same inputs as above
    assert all(np.array_equal(a, b) for a, b in zip(run_tflm_in_child(data, seed=6), here))


def test_tflm_child_failure_is_a_model_error():
    with pytest.raises(ModelError, match="TFLite Micro failed in a child process"):
        run_tflm_in_child(b"\x1c\x00\x00\x00TFL3" + bytes(64))


def test_compare_outputs_policy():
    ints = np.array([1, 2, 3], dtype=np.int8)
    off = np.array([1, 2, 5], dtype=np.int8)
    exact, = compare_outputs([ints], [ints.copy()])
    assert exact.ok and exact.max_abs == 0
    strict, = compare_outputs([ints], [off])
    assert not strict.ok and strict.max_abs == 2 and strict.tolerance == 0
    lossy, = compare_outputs([ints], [off], lossy_ok=True)
    assert lossy.ok and lossy.max_abs == 2                       # measured in LSBs, allowed
    f = np.array([100.0, -3.0], dtype=np.float32)
    near, = compare_outputs([f], [f + np.float32(5e-3)])          # within 1e-4 x max(1, 100)
    far, = compare_outputs([f], [f + np.float32(2e-2)])
    assert near.ok and not far.ok and far.tolerance == pytest.approx(1e-2)
    shape, extra = compare_outputs([ints], [ints.reshape(3, 1), ints])[0], compare_outputs([ints], [ints, ints])
    assert not shape.ok and shape.max_abs == float("inf") and not extra[-1].ok
    assert max_abs_diff(np.array([], np.int8), np.array([], np.int8)) == 0.0


def test_compare_named():
    a = {"y": np.array([1, 2], dtype=np.int8)}
    assert compare_named([a], [dict(a)]) == (True, 0.0)
    assert compare_named([{"y": np.array([1, 5], dtype=np.int8)}], [a]) == (False, 3.0)
    assert compare_named([{}], [a]) == (False, float("inf"))


def test_verify_chain_names_the_output_that_differs():
    data = INT8.read_bytes()
    res = verify_chain([("m", data, "")], [data], samples=1)
    assert res["bit_identical"] and res["outputs_compared"] >= 1
    # another model with the same tensor names but other weights: caught, output named
    other = (FIXTURES / "tiny_irregular_float32.tflite").read_bytes()
    with pytest.raises(VerificationError, match="output '.*'"):
        verify_chain([("m", FLOAT.read_bytes(), "")], [_perturbed(other)], samples=1)
    with pytest.raises(VerificationError, match="produced by no earlier segment"):
        verify_chain([("m", data, "p/")], [data], samples=1)


def _perturbed(data: bytes) -> bytes:
    """The float model with one weight changed."""
    from tpu_pipeline.toolchain.tflite import model_to_bytes, read_model

    model = read_model(data)
    for buf in model.buffers:
        if buf.data is not None and len(buf.data) >= 4:
            w = np.frombuffer(bytes(buf.data), dtype=np.float32).copy()
            w[0] += 1.0
            buf.data = np.frombuffer(w.tobytes(), dtype=np.uint8)
            break
    return model_to_bytes(model)


def test_tflm_check_side_by_side_is_the_same_check():
    """Large models run the original in a child process next to the rewritten one: the verdicts
    (and the deviations) are those of the in-process check, for agreeing and for differing models."""
    from helpers.cnn_builder import CnnBuilder, graph_bytes
    from tpu_pipeline.toolchain.execute.compare import verify_models

    def cnn(seed):
        b = CnnBuilder(seed=seed)
        return graph_bytes(b.graph([b.conv(b.dw(b.input((1, 12, 10, 3)), k=3), 5, k=1, act="RELU")]))

    same, other = INT8.read_bytes(), cnn(2)
    for a, b, agree in ((same, same, True), (cnn(1), other, False)):
        here = verify_models(a, b, runs=2, runtimes=("tflm",), side_by_side=False)
        child = verify_models(a, b, runs=2, runtimes=("tflm",), side_by_side=True)
        assert [v.to_json() for v in child] == [v.to_json() for v in here]
        assert child[0].bit_exact is agree and child[0].runs == 2 and not child[0].skipped


def _corrupted_run():
    raise ValueError("Invalid tensor index 2131689472 exceeds max tensor index 62")


def test_a_corrupted_index_from_anywhere_in_a_child_is_a_crash():
    """The corruption shows wherever the child next touches the interpreter (a new interpreter's
    details too): the child's exception becomes the crash, not an internal error (exit 70)."""
    from tpu_pipeline.toolchain.execute.child import RuntimeCrash, call_in_child

    with pytest.raises(RuntimeCrash, match=r"^LiteRT crashed \(it corrupted its own memory: Invalid tensor index"):
        call_in_child(_corrupted_run, runtime="LiteRT", doing="running the model")


# A script for a process whose heap hands out memory it has used: glibc fills every allocation
# with a byte (MALLOC_PERTURB_) and keeps even a 64 MB arena on the heap (MALLOC_MMAP_THRESHOLD_),
# as a long-lived process (a test session) may. Both are read at start-up and dropped from the
# environment before the check's child process starts: that one is a fresh process.
_ARENA_PAST = """
import json, os, sys
from pathlib import Path
from tpu_pipeline.toolchain.execute.tflm import TflmModel, reference_outputs
for k in ("MALLOC_PERTURB_", "MALLOC_MMAP_THRESHOLD_"):
    os.environ.pop(k, None)
data = Path(sys.argv[1]).read_bytes()
host = TflmModel(data, 64 * 1024 * 1024)
x = host.input_sets(data, 1, 4)
print(json.dumps({"dependent": host.arena_dependent, "in_process": host.run(x[0])[0].tolist(),
                  "reference": reference_outputs(host, data, x)[0][0].tolist()}))
"""


def _arena_past(model, perturb: bool) -> dict:
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, **({"MALLOC_PERTURB_": "165", "MALLOC_MMAP_THRESHOLD_": "2000000000"} if perturb else {}))
    out = subprocess.run([sys.executable, "-c", _ARENA_PAST, str(model)], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout)


def test_a_model_whose_tflm_outputs_depend_on_the_arena_is_checked_against_a_fresh_process():
    """TFLite Micro's SPACE_TO_BATCH_ND pads with a value nothing sets: on a heap that hands out
    used memory its outputs change (CI saw a QEMU run of this model differ from the host by up to
    12). The device backends' reference then comes from a fresh process, as a board that boots
    with a zeroed arena computes it."""
    model = FIXTURES / "darts_s2b_int8.tflite"
    fresh, past = _arena_past(model, perturb=False), _arena_past(model, perturb=True)
    assert past["dependent"] == ["SPACE_TO_BATCH_ND"]
    assert fresh["in_process"] == fresh["reference"]
    assert past["in_process"] != fresh["in_process"]  # the arena's past shows in TFLite Micro's outputs
    assert past["reference"] == fresh["reference"]  # ... but not in the reference
    assert _arena_past(INT8, perturb=True)["dependent"] == []  # (others stay in this process)
