"""What `tpu-pipeline inspect` reports about a model: structure, parameters, memory."""

from __future__ import annotations

from dataclasses import dataclass, field

from tpu_pipeline.toolchain.ir import Graph, total_param_bytes
from tpu_pipeline.toolchain.memory import (
    TFLITE,
    TFLM,
    lifetimes,
    order_free_lower_bound,
    tflite_arena,
    tflm_greedy,
)


@dataclass(frozen=True)
class HotStep:
    step: int
    op: str  # "<position> <OPCODE>" of the op running at that step, or "inputs"
    live_bytes: int
    live_tensors: tuple[str, ...]


@dataclass(frozen=True)
class ModelSummary:
    path: str
    ops: int
    subgraphs: int
    tensors: int
    opcodes: dict[str, int]
    parameter_bytes: int
    peak_bytes: int  # most live bytes at any step in the stored order (TFLM semantics)
    peak_step: int
    peak_op: str
    tflm_arena_bytes: int | None  # what TFLite Micro's own planner will allocate (its arena head); None: cannot run
    tflite_arena_bytes: int  # what TFLite's ArenaPlanner will allocate
    order_lower_bound: int  # no planner can use less for this order (= peak)
    any_order_lower_bound: int  # no order and no planner can use less
    live_bytes: tuple[int, ...] = field(repr=False, default=())
    hot_steps: tuple[HotStep, ...] = ()
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    tflm_cannot_run: str | None = None  # TFLite Micro's reason when it cannot run the model
    custom_ops: tuple[str, ...] = ()  # tpu-pipeline's own kernels the model needs (stock TFLite Micro has none)
    custom_ops_note: str | None = None  # how to get them (export-mcu --library)

    def to_json(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("live_bytes", "hot_steps")}
        d["hot_steps"] = [h.__dict__ for h in self.hot_steps]
        d["live_bytes_per_step"] = list(self.live_bytes)
        return d


def _op_label(graph: Graph, step: int) -> str:
    if step == 0:
        return "inputs"
    if step > len(graph.ops):  # lifetimes() puts the tensors no operator uses one step after the last
        return "tensors no operator uses (TFLite Micro allocates them)"
    return f"{step - 1} {graph.ops[step - 1].opcode}"


def summarize(graph: Graph, path: str = "", subgraphs: int = 1, hot: int = 5,
              tflm_cannot_run: str | None = None) -> ModelSummary:
    """`tflm_cannot_run`: TFLite Micro's reason for refusing the model (no head is predicted then)."""
    from tpu_pipeline.toolchain.deploy import library  # the MCU library's tables: not loaded by `compile`

    lt_tflm = lifetimes(graph, semantics=TFLM, whole_model=True)
    lt_tflite = lifetimes(graph, semantics=TFLITE)
    live = lt_tflm.live_bytes()
    peak_step = lt_tflm.peak_step
    top = sorted(range(len(live)), key=lambda s: (-live[s], s))[:hot]
    hot_steps = tuple(
        HotStep(s, _op_label(graph, s), live[s],
                tuple(b.name for b in lt_tflm.buffers if b.first <= s <= b.last))
        for s in top
    )
    return ModelSummary(
        path=path,
        ops=len(graph.ops),
        subgraphs=subgraphs,
        tensors=len(graph.tensors),
        opcodes=graph.opcode_histogram(),
        parameter_bytes=total_param_bytes(graph),
        peak_bytes=lt_tflm.peak,
        peak_step=peak_step,
        peak_op=_op_label(graph, peak_step),
        tflm_arena_bytes=None if tflm_cannot_run else tflm_greedy(lt_tflm).size,
        tflm_cannot_run=tflm_cannot_run,
        tflite_arena_bytes=tflite_arena(lt_tflite).size,
        order_lower_bound=lt_tflm.peak,
        any_order_lower_bound=order_free_lower_bound(graph, TFLM, whole_model=True),
        live_bytes=tuple(live),
        hot_steps=hot_steps,
        inputs=tuple(graph.tensors[t].name for t in graph.inputs),
        outputs=tuple(graph.tensors[t].name for t in graph.outputs),
        custom_ops=library.custom_ops(graph),
        custom_ops_note=library.custom_ops_note(graph),
    )
