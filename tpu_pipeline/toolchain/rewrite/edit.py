"""A small editor that turns a Graph into a new Graph: replace ops, add tensors, drop orphans.

Values in, values out: `GraphEditor(graph)` copies what it needs; `finish()` returns a new Graph
whose tensor `index` equals its position. Tensors that an edit left unreferenced (they were read
or written by a removed op and nothing uses them any more) are dropped and the rest renumbered;
tensors the source model already left unreferenced are kept, so a rewrite never touches what it
did not change. New tensors have `source=None`; new constants carry their bytes in `data`.
New ops come from the constructors of `tpu_pipeline.toolchain.ir.ops`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tpu_pipeline.toolchain.ir import Graph, Op, Quantization, Tensor
from tpu_pipeline.toolchain.ir.graph import NP_DTYPES

class GraphEditor:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.tensors: list[Tensor] = list(graph.tensors)
        # Each original op position maps to the ops that replace it (itself by default).
        self.slots: list[list[Op]] = [[op] for op in graph.ops]
        self._names = {t.name for t in graph.tensors}
        self._touched: set[int] = set()

    # ---- tensors --------------------------------------------------------------------------
    def unique_name(self, base: str) -> str:
        name, k = base, 1
        while name in self._names:
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        return name

    def add_activation(self, name: str, dtype: str, shape, quant: Quantization | None) -> int:
        idx = len(self.tensors)
        self.tensors.append(Tensor(index=idx, name=self.unique_name(name), dtype=dtype,
                                   shape=tuple(int(d) for d in shape), quant=quant))
        return idx

    def add_constant(self, name: str, values: np.ndarray, dtype: str, quant: Quantization | None) -> int:
        arr = np.ascontiguousarray(np.asarray(values, dtype=NP_DTYPES[dtype]))
        data = np.frombuffer(arr.tobytes(), dtype=np.uint8).copy()
        data.flags.writeable = False
        idx = len(self.tensors)
        self.tensors.append(Tensor(index=idx, name=self.unique_name(name), dtype=dtype,
                                   shape=tuple(int(d) for d in arr.shape), quant=quant, data=data))
        return idx

    # ---- ops ------------------------------------------------------------------------------
    def replace(self, pos: int, new_ops: list[Op]) -> None:
        """Op `pos` of the source graph is replaced by `new_ops`, run where it ran, in order."""
        old = self.graph.ops[pos]
        self._touched.update(t for t in (*old.inputs, *old.outputs, *old.intermediates) if t >= 0)
        self.slots[pos] = list(new_ops)

    def remove(self, pos: int) -> None:
        self.replace(pos, [])

    # ---- result ---------------------------------------------------------------------------
    def finish(self) -> Graph:
        ops = [op for slot in self.slots for op in slot]
        used = set(self.graph.inputs) | set(self.graph.outputs)
        for op in ops:
            used.update(t for t in (*op.inputs, *op.outputs, *op.intermediates) if t >= 0)
        n_old = len(self.graph.tensors)
        keep = [t for t in self.tensors
                if t.index in used or (t.index < n_old and t.index not in self._touched)]
        new_index = {t.index: k for k, t in enumerate(keep)}
        self.index_map = new_index  # old (or new-tensor) index -> index in the finished graph

        def m(ts):
            return tuple(new_index[t] if t >= 0 else t for t in ts)

        tensors = tuple(dataclasses.replace(t, index=k) for k, t in enumerate(keep))
        new_ops = tuple(dataclasses.replace(op, inputs=m(op.inputs), outputs=m(op.outputs),
                                            intermediates=m(op.intermediates)) for op in ops)
        external = tuple(new_index[t] for t in self.graph.external if t in new_index)
        return Graph(tensors, new_ops, m(self.graph.inputs), m(self.graph.outputs), self.graph.name, external)
