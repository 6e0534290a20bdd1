"""Off-chip traffic under Belady's replacement: hand-computed cases and invariants on real models."""

from __future__ import annotations

from conftest import tflm_models
from tpu_pipeline.toolchain.ir import Graph, Op, Tensor
from tpu_pipeline.toolchain.loader import load
from tpu_pipeline.toolchain.memory import lifetimes, offchip_traffic, order_free_lower_bound
from tpu_pipeline.toolchain.memory.semantics import align


def _graph():
    # X -> A -> B -> C -> E; D = f(A, E). A and D are 160 bytes, the rest 320 (int8).
    sizes = {"X": 160, "A": 160, "B": 320, "C": 320, "E": 320, "D": 160}
    names = list(sizes)
    tensors = tuple(Tensor(i, n, "int8", (sizes[n],)) for i, n in enumerate(names))
    t = {n: i for i, n in enumerate(names)}
    ops = (
        Op("RELU", (t["X"],), (t["A"],)),
        Op("RELU", (t["A"],), (t["B"],)),
        Op("RELU", (t["B"],), (t["C"],)),
        Op("RELU", (t["C"],), (t["E"],)),
        Op("ADD", (t["A"], t["E"]), (t["D"],)),
    )
    return Graph(tensors, ops, (t["X"],), (t["D"],))


def test_belady_spills_the_tensor_used_farthest_away():
    g = _graph()
    # Steps 3 and 4 hold A while two 320-byte tensors are live: 800 bytes. With 640 on chip, A is
    # written out once (160) and read back for the ADD (160).
    tr = offchip_traffic(g, None, 640)
    assert tr.feasible and tr.min_onchip_bytes == 640
    assert (tr.spill_bytes, tr.reload_bytes, tr.total_bytes) == (160, 160, 320)
    assert offchip_traffic(g, None, 800).total_bytes == 0
    assert lifetimes(g).peak == 800
    assert not offchip_traffic(g, None, 639).feasible


# At the smallest capacity that runs the model: nothing moves in the chain (each op's working set is
# all that is ever live); in the concat cell, one 32x32x16 branch output (float32 65,536 B, int8
# 16,384 B) waits off chip for the concatenation: written once, read back once.
_TIGHT_TRAFFIC = {"chain_int8.tflite": (0, 0), "concat_conv_float32.tflite": (65536, 65536),
                  "concat_conv_int8.tflite": (16384, 16384)}


def test_no_traffic_when_the_peak_fits_and_infeasible_below_the_largest_op():
    for path in tflm_models()[:3]:
        _, g = load(path)
        peak = lifetimes(g).peak
        assert offchip_traffic(g, None, peak).total_bytes == 0
        need = offchip_traffic(g, None, 0).min_onchip_bytes
        assert need <= order_free_lower_bound(g) or need <= peak
        tight = offchip_traffic(g, None, need)
        assert tight.feasible
        # a tensor is spilled at most once (its off-chip copy is then clean) and only while it
        # still has a reader, so every spilled byte is reloaded, unless its last reader is the
        # graph's output (read off chip after the last op)
        out_bytes = sum(align(g.tensors[t].nbytes, 16) for t in set(g.outputs) if g.is_activation(t))
        assert tight.spill_bytes <= tight.reload_bytes + out_bytes
        if path.name in _TIGHT_TRAFFIC:
            assert (tight.spill_bytes, tight.reload_bytes) == _TIGHT_TRAFFIC[path.name]
        assert not offchip_traffic(g, None, need - 1).feasible
