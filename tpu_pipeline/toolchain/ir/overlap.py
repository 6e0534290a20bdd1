"""Overlapped execution: where an op's output sits over its input in one buffer, and the ring of
output rows the kernel holds so that it never overwrites input rows still to be read (the same
rule runs in the harness firmware, tpup_conv.cc RunConvOverlapped)."""

from __future__ import annotations

import functools

from tpu_pipeline.toolchain.ir.geometry import window
from tpu_pipeline.toolchain.ir.graph import Graph, Op


def _aligned(n: int) -> int:
    return -(-n // 16) * 16


def overlap_layout(graph: Graph, op: Op) -> tuple[int, int, int]:
    """(input offset, output offset, extent) of an overlapped op's two tensors in one buffer: both
    start at its first byte (a depthwise convolution runs in place; a larger output runs its rows
    last to first, each landing on input bytes already read: `ring_rows_for`), so a chain of
    overlapped ops shares one start instead of drifting apart."""
    x = _aligned(graph.tensors[op.inputs[0]].nbytes)
    y = _aligned(graph.tensors[op.outputs[0]].nbytes)
    return 0, 0, max(x, y)


def ring_rows(graph: Graph, op: Op, input_offset: int | None = None, output_offset: int | None = None) -> int:
    """Output rows an overlapped op holds at once (`ring_rows_for` on its whole tensors). Offsets
    default to `overlap_layout`; with no overlap at all the answer is 1."""
    if input_offset is None or output_offset is None:
        input_offset, output_offset, _ = overlap_layout(graph, op)
    x, y = graph.tensors[op.inputs[0]].shape, graph.tensors[op.outputs[0]].shape
    rows, _ = window(graph, op)
    return ring_rows_for(x[1], x[2] * x[3], y[1], y[2] * y[3], rows.pad_before, rows.stride,
                         (rows.kernel - 1) * rows.dilation + 1, input_offset, output_offset)


@functools.lru_cache(maxsize=4096)
def ring_rows_for(in_rows: int, row_in: int, out_rows: int, row_out: int, pad_top: int, stride: int, span: int,
                  input_offset: int, output_offset: int) -> int:
    """Output rows a convolution holds at once when its output (`out_rows` rows of `row_out`
    bytes, at `output_offset`) may lie over its input (at `input_offset`; `span` input rows per
    window). It computes rows into a ring and writes out, in order, every held row whose bytes
    cover only input rows no row still to compute reads. Rows run first to last, or last to first
    when the output reaches past the input's end (a larger output sharing the input's start). The
    same rule runs in the harness (tpup_conv.cc RunConvOverlapped), on the real pointers, for
    whole ops and for a patch stage's tiles."""
    in_end = input_offset + in_rows * row_in
    backwards = output_offset + out_rows * row_out > in_end

    def under(p: int) -> tuple[int, int] | None:  # the input rows under output row p's bytes
        a = output_offset + p * row_out
        b = a + row_out
        if b <= input_offset or a >= in_end:
            return None
        return max(0, (a - input_offset) // row_in), min(in_rows - 1, (b - 1 - input_offset) // row_in)

    def free(p: int, r: int) -> bool:  # output row p may be written once row r is computed
        rows = under(p)
        if rows is None:
            return True
        if backwards:  # rows r.. are done: the lowest input row's first reader must be among them
            return max(0, -(-(rows[0] + pad_top - span + 1) // stride)) >= r
        return min(out_rows - 1, (rows[1] + pad_top) // stride) <= r  # the highest's last reader

    order = range(out_rows - 1, -1, -1) if backwards else range(out_rows)
    held = most = flushed = 0  # (flushed: how many rows of `order` are written out)
    for k, r in enumerate(order):
        held += 1
        most = max(most, held)
        while flushed <= k and free(order[flushed], r):
            flushed += 1
            held -= 1
    return most


def overlap_schedule(in_rows: int, row_in: int, out_rows: int, row_out: int, pad_top: int, stride: int, span: int,
                     input_offset: int, output_offset: int, runs: bool = True, channelwise: bool = False) -> list[tuple]:
    """The steps of an overlapped convolution as the harness runs them (tpup_conv.cc
    RunConvOverlapped): ("run", r0, r1) one kernel call writing output rows [r0, r1) in place,
    ("ring", r) a call computing row r into the ring, ("flush", p) row p copied out of it. Rows go
    in `ring_rows_for`'s order; with the ring empty, the longest run of next rows whose bytes
    cover no input row still to be read is one call straight into the output; else the next row
    goes into the ring, and held rows are written out, in order, once free. `runs` False (dw3):
    every row through the ring. Never holds more rows than `ring_rows_for` (a run's rows are ones
    the ring would have held one at a time, each written out at once). Not overlapped: one run;
    nor `channelwise` (dw3: it reads all of a channel's input before writing that channel) with
    the output laid exactly over the input (same start and row bytes). (The cost model still
    prices an overlapped op a call per row, [K.overlap] as fitted before runs: it over-prices
    them; tests/test_harness_kernels.py checks this order against a byte map of the buffer.)"""
    in_end = input_offset + in_rows * row_in
    if output_offset + out_rows * row_out <= input_offset or output_offset >= in_end \
            or (channelwise and output_offset == input_offset and row_out == row_in):
        return [("run", 0, out_rows)]
    backwards = output_offset + out_rows * row_out > in_end

    def row(k: int) -> int:
        return out_rows - 1 - k if backwards else k

    def free(p: int, done: int) -> bool:  # output row p may be written once `done` rows of the order are
        a = output_offset + p * row_out
        b = a + row_out
        if b <= input_offset or a >= in_end:
            return True
        j0, j1 = max(0, (a - input_offset) // row_in), min(in_rows - 1, (b - 1 - input_offset) // row_in)
        if backwards:
            return max(0, -(-(j0 + pad_top - span + 1) // stride)) >= out_rows - done
        return min(out_rows - 1, (j1 + pad_top) // stride) < done

    steps, done, flushed = [], 0, 0
    while done < out_rows:
        n = 0
        while runs and flushed == done and done + n < out_rows and free(row(done + n), done):
            n += 1
        if n:
            r0 = out_rows - done - n if backwards else done
            steps.append(("run", r0, r0 + n))
            done, flushed = done + n, flushed + n
            continue
        steps.append(("ring", row(done)))
        done += 1
        while flushed < done and free(row(flushed), done):
            steps.append(("flush", row(flushed)))
            flushed += 1
    return steps
