"""The graph IR every pass shares: tensors, ops in execution order, graph inputs and outputs.

Values only: a pass makes a new Graph (`reordered`, `dataclasses.replace`) rather than editing one.
Ops are identified by their position in `Graph.ops`; an order is a permutation of those positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
import numpy as np

from tpu_pipeline.toolchain.errors import ModelError
from tpu_pipeline.toolchain.ir.options import Options

# Bytes per element; None where a byte size is not defined by the shape alone.
DTYPE_SIZES: dict[str, float | None] = {
    "float32": 4, "float16": 2, "int32": 4, "uint8": 1, "int64": 8, "string": None, "bool": 1,
    "int16": 2, "complex64": 8, "int8": 1, "float64": 8, "complex128": 16, "uint64": 8,
    "resource": None, "variant": None, "uint32": 4, "uint16": 2, "int4": 0.5, "bfloat16": 2,
    "int2": 0.25, "uint4": 0.5, "float8_e4m3fn": 1, "float8_e5m2": 1,
}
# numpy types of the dtypes whose constants passes read (`Tensor.values`).
NP_DTYPES = {"float32": np.float32, "int8": np.int8, "uint8": np.uint8, "int32": np.int32,
             "int16": np.int16, "int64": np.int64, "float16": np.float16}


@dataclass(frozen=True)
class Quantization:
    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int = 0


@dataclass(frozen=True)
class Tensor:
    index: int
    name: str
    dtype: str
    shape: tuple[int, ...]
    buffer: int = 0
    is_variable: bool = False
    quant: Quantization | None = None
    signature: tuple[int, ...] | None = None
    # Constant bytes (a read-only view of the model's buffer), None for activations.
    data: np.ndarray | None = field(default=None, compare=False, repr=False)
    # Index of the tensor this came from in the source subgraph; None for tensors a pass created.
    source: int | None = None

    @property
    def is_constant(self) -> bool:
        return self.data is not None and len(self.data) > 0

    def values(self) -> np.ndarray:
        """A constant tensor's values as a numpy array of its shape (read-only)."""
        if self.data is None:
            raise ValueError(f"tensor '{self.name}' is not a constant")
        return np.frombuffer(np.asarray(self.data, dtype=np.uint8).tobytes(),
                             dtype=NP_DTYPES[self.dtype]).reshape(self.shape)

    @property
    def kind(self) -> str:
        if self.is_constant:
            return "constant"
        if self.is_variable:
            return "variable"
        return "activation"

    @property
    def is_dynamic(self) -> bool:
        # A -1 batch dimension is what every Keras conversion writes; the runtimes allocate the
        # stored shape (batch 1) unless the model is resized, so only other -1s are dynamic.
        if any(d < 0 for d in self.shape):
            return True
        return self.signature is not None and any(d < 0 for d in self.signature[1:])

    @property
    def num_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Bytes the runtime allocates for it; raises ModelError where that is undefined."""
        if self.is_dynamic or any(d < 0 for d in self.shape):
            raise ModelError(f"tensor '{self.name}' has a dynamic shape {list(self.signature or self.shape)}; "
                             "its size is unknown until run time")
        size = DTYPE_SIZES.get(self.dtype)
        if size is None:
            raise ModelError(f"tensor '{self.name}' has type {self.dtype}, whose byte size is not fixed")
        return int(np.ceil(self.num_elements * size))


@dataclass(frozen=True)
class Op:
    opcode: str  # builtin name ("CONV_2D") or "CUSTOM:<custom code>"
    inputs: tuple[int, ...]  # tensor indices; -1 marks an omitted optional input
    outputs: tuple[int, ...]
    # Index of the operator this came from (or is modelled on) in the source subgraph.
    source: int | None = None
    # Builtin options: a record of tpu_pipeline.toolchain.ir.options (None for an op without options).
    options: Options = field(default=None, compare=False, repr=False)
    builtin_code: int = 0
    version: int = 1
    intermediates: tuple[int, ...] = ()
    # The implementation the deployment runs, where it offers a choice ("" = the kernel set's own;
    # "direct": see tpu_pipeline.toolchain.ir.kernels). Written as a distinct op code.
    kernel: str = ""

    @property
    def is_custom(self) -> bool:
        return self.opcode.startswith("CUSTOM")


@dataclass(frozen=True)
class Graph:
    tensors: tuple[Tensor, ...]
    ops: tuple[Op, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    name: str = ""
    # Graph inputs the application keeps in its own buffer (outside TFLite Micro's arena): written
    # in the offline plan as EXTERNAL, which the harness firmware honours (rewrite.interface).
    external: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.ops)

    # ---- structure ------------------------------------------------------------------------
    @cached_property
    def producer(self) -> dict[int, int]:
        """Tensor index -> position of the op that writes it."""
        out: dict[int, int] = {}
        for i, op in enumerate(self.ops):
            for t in op.outputs:
                if t >= 0:
                    out[t] = i
        return out

    @cached_property
    def consumers(self) -> dict[int, tuple[int, ...]]:
        """Tensor index -> positions of the ops that read it (each op once, in order)."""
        acc: dict[int, list[int]] = {}
        for i, op in enumerate(self.ops):
            for t in dict.fromkeys(op.inputs):
                if t >= 0:
                    acc.setdefault(t, []).append(i)
        return {t: tuple(v) for t, v in acc.items()}

    @cached_property
    def preds(self) -> tuple[frozenset[int], ...]:
        """For each op, the ops whose outputs it reads."""
        prod = self.producer
        return tuple(
            frozenset(prod[t] for t in op.inputs if t >= 0 and t in prod) for op in self.ops
        )

    @cached_property
    def succs(self) -> tuple[frozenset[int], ...]:
        acc: list[set[int]] = [set() for _ in self.ops]
        for i, ps in enumerate(self.preds):
            for p in ps:
                acc[p].add(i)
        return tuple(frozenset(s) for s in acc)

    def is_activation(self, t: int) -> bool:
        return t >= 0 and self.tensors[t].kind == "activation"

    def reads_last(self, i: int, t: int) -> bool:
        """Whether op i reads tensor t after every other reader in every order: each other reader
        is an ancestor of op i (as a squeeze-and-excitation block's pooling is of its scaling)."""
        others = set(self.consumers.get(t, ())) - {i}
        if i not in self.consumers.get(t, ()):
            return False
        seen, todo = set(), list(self.preds[i])
        while others and todo:
            p = todo.pop()
            if p not in seen:
                seen.add(p)
                others.discard(p)
                todo.extend(self.preds[p])
        return not others

    def activation_inputs(self, i: int) -> tuple[int, ...]:
        return tuple(t for t in dict.fromkeys(self.ops[i].inputs) if self.is_activation(t))

    def activation_outputs(self, i: int) -> tuple[int, ...]:
        return tuple(t for t in dict.fromkeys(self.ops[i].outputs) if self.is_activation(t))

    # ---- orders ---------------------------------------------------------------------------
    def is_topological(self, order) -> bool:
        order = list(order)
        if sorted(order) != list(range(len(self.ops))):
            return False
        pos = {op: k for k, op in enumerate(order)}
        return all(pos[p] < pos[i] for i in range(len(self.ops)) for p in self.preds[i])

    def reordered(self, order) -> "Graph":
        """The same graph with its ops executed in `order` (positions into the current ops)."""
        order = list(order)
        if not self.is_topological(order):
            raise ValueError("order is not a topological order of the graph's ops")
        return Graph(self.tensors, tuple(self.ops[i] for i in order), self.inputs, self.outputs, self.name,
                     self.external)

    def with_unique_tensor_names(self) -> tuple["Graph", int]:
        """The graph with empty or repeated tensor names given a unique '#<index>' suffix (pipeline
        segments exchange tensors by name), and how many were renamed."""
        seen: set[str] = set()
        tensors, renamed = [], 0
        for t in self.tensors:
            name = t.name
            if not name or name in seen:
                name = f"{name or 'tensor'}#{t.index}"
                while name in seen:
                    name += "_"
                t, renamed = replace(t, name=name), renamed + 1
            seen.add(name)
            tensors.append(t)
        return replace(self, tensors=tuple(tensors)), renamed

    def lint(self) -> list[str]:
        """What is structurally wrong with the graph (empty when nothing is): indices out of range,
        a tensor written twice, an op reading an activation no earlier op wrote, an output nobody
        writes. The compile driver runs it after every pass."""
        n = len(self.tensors)
        problems: list[str] = []
        written: set[int] = set(self.inputs)
        for t in (*self.inputs, *self.outputs):
            if not 0 <= t < n:
                problems.append(f"graph input/output tensor {t} out of range")
        producers: set[int] = set()
        for i, op in enumerate(self.ops):
            for t in op.inputs:
                if t < -1 or t >= n:
                    problems.append(f"op {i} ({op.opcode}) reads tensor {t}, out of range")
                elif (t >= 0 and self.tensors[t].kind == "activation" and t not in written
                      and all(d != 0 for d in self.tensors[t].shape)):  # an empty tensor needs no data,
                    # as `ir.convert.from_model` accepts it (a 0-element shape operand of BROADCAST_ARGS)
                    problems.append(f"op {i} ({op.opcode}) reads '{self.tensors[t].name}' before any op writes it")
            for t in op.outputs:
                if not 0 <= t < n:
                    problems.append(f"op {i} ({op.opcode}) writes tensor {t}, out of range")
                elif t in producers:
                    problems.append(f"tensor '{self.tensors[t].name}' is written by two ops")
                else:
                    producers.add(t)
                    written.add(t)
        for t in self.outputs:
            if 0 <= t < n and t not in written and self.tensors[t].kind == "activation":
                problems.append(f"graph output '{self.tensors[t].name}' is written by no op")
        return problems

    def opcode_histogram(self) -> dict[str, int]:
        hist: dict[str, int] = {}
        for op in self.ops:
            hist[op.opcode] = hist.get(op.opcode, 0) + 1
        return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))
