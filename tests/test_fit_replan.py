"""fit's replan stage (fit/stages/replan.py, fit/realise.overshoot): where the realised plan of
overlapped ops' rigid groups lands above the selection's peak, the variant that caused it is
re-priced and the selection made again."""

from __future__ import annotations

from helpers.models import overlap_sandwich
from tpu_pipeline.toolchain.device import CMSIS_NN
from tpu_pipeline.toolchain.fit import fit_model
from tpu_pipeline.toolchain.ir.kernels import flags


def test_a_plain_op_between_two_rigid_groups_is_re_priced(tmp_path):
    """Issue 30 (MLPerf vww_96_int8 --budget 40,616 ended infeasible, 46,080 B planned for a
    37,632 B selection). At 5,280 B (5,232 B before the depthwise kernels' new prices
    moved this point's tail and the budget edge with it: 4,352 + 852 B now) the fastest selection
    overlaps the first convolution and the expansion but runs the depthwise between them plain: its
    input is tied to one group's base, its output to the other's, and both groups start at their
    tensors' first byte, so the plan
    reached 5,120 B of head for a 4,352 B promise. Blaming the overlapped neighbours (as
    overshoot did) dropped their variants and the same plain depthwise kept the next selection
    there; re-pricing the op between lets the selection run it in place."""
    fitted = fit_model(overlap_sandwich(tmp_path), budget=5280, kernels=CMSIS_NN, time_limit=20)
    r = fitted.result
    assert r.fits and r.head + r.tail <= 5280
    assert r.head <= r.selection.peak  # the realised plan keeps the selection's promise
    assert fitted.head_measured is not None and fitted.tail_target is not None
    first_dw = next(op for op in r.graph.ops if op.opcode == "DEPTHWISE_CONV_2D")
    assert "overlap" in flags(first_dw)  # the depthwise between the groups runs in place
    assert all(o.ok for v in fitted.verification for o in v.outputs)
