"""Changes to a model's interface, opt-in because they are not identities.

- `int8_io`: drop the float QUANTIZE at each input and the DEQUANTIZE at each output, so the
  application hands the model int8 data and reads int8 results, with the same scales and zero
  points (what the converter gives with `inference_input_type=tf.int8`). The float input buffer
  and its quantized copy are then one int8 buffer: a quarter of the input's bytes, and no op.
  Feeding `dequantize(x)` to the original gives the same outputs as feeding `x` to the result
  (quantize(dequantize(x)) == x), so the two are checked against each other in the tests.
- `external_inputs`: the graph inputs the application keeps in its own buffer (a camera frame, a
  DMA target): TFLite Micro then plans the arena without them (`Graph.external`, written in the
  offline plan as `EXTERNAL`, which only the harness firmware reads; tpu_pipeline.toolchain.tflite.metadata).
"""

from __future__ import annotations

import dataclasses

from tpu_pipeline.toolchain.errors import UsageError
from tpu_pipeline.toolchain.ir import Graph
from tpu_pipeline.toolchain.rewrite.edit import GraphEditor

INTEGER = ("int8", "uint8", "int16")


def int8_io(graph: Graph, label: str = "") -> tuple[Graph, list[str]]:
    """The graph with its boundary QUANTIZE / DEQUANTIZE ops dropped; (graph, one note per change).
    Inputs and outputs keep their positions. UsageError (naming `label`, the model) when there is
    nothing to drop."""
    inputs, outputs, notes, removed = list(graph.inputs), list(graph.outputs), [], []
    for k, t in enumerate(graph.inputs):
        readers = graph.consumers.get(t, ())
        if graph.tensors[t].dtype != "float32" or len(readers) != 1:
            continue
        q = graph.ops[readers[0]]
        inner = q.outputs[0] if q.outputs else -1
        if q.opcode != "QUANTIZE" or q.inputs[0] != t or inner < 0 or graph.tensors[inner].dtype not in INTEGER \
                or inner in graph.outputs:
            continue
        removed.append(readers[0])
        inputs[k] = inner
        notes.append(f"input {k}: the float QUANTIZE dropped; the model takes {graph.tensors[inner].dtype} "
                     f"'{graph.tensors[inner].name}' (scale {graph.tensors[inner].quant.scale[0]:g}, "
                     f"zero point {graph.tensors[inner].quant.zero_point[0]})")
    for k, t in enumerate(graph.outputs):
        d_pos = graph.producer.get(t)
        if d_pos is None or graph.tensors[t].dtype != "float32" or graph.consumers.get(t):
            continue
        d = graph.ops[d_pos]
        inner = d.inputs[0] if d.inputs else -1
        if d.opcode != "DEQUANTIZE" or inner < 0 or graph.tensors[inner].dtype not in INTEGER or inner in graph.inputs:
            continue
        removed.append(d_pos)
        outputs[k] = inner
        notes.append(f"output {k}: the DEQUANTIZE dropped; the model gives {graph.tensors[inner].dtype} "
                     f"'{graph.tensors[inner].name}' (scale {graph.tensors[inner].quant.scale[0]:g}, "
                     f"zero point {graph.tensors[inner].quant.zero_point[0]})")
    if not notes:
        raise UsageError(f"{label or graph.name or 'the model'}: --int8-io found no float QUANTIZE at an input nor "
                         "DEQUANTIZE at an output to drop (the interface is integer already)")
    editor = GraphEditor(dataclasses.replace(graph, inputs=tuple(inputs), outputs=tuple(outputs)))
    for pos in removed:
        editor.remove(pos)
    return editor.finish(), notes


def external_inputs(graph: Graph) -> Graph:
    """The graph with every activation input kept outside the arena."""
    return dataclasses.replace(graph, external=tuple(t for t in graph.inputs if graph.is_activation(t)))
