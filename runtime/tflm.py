"""TFLite Micro on the host: run a model with a given arena, as an MCU would."""

from __future__ import annotations

import numpy as np

from toolchain.errors import InfeasibleError, ModelError


class TflmModel:
    """A TFLite Micro interpreter over `model_bytes` with an arena of `arena_size` bytes.

    Raises InfeasibleError when the model does not fit the arena, ModelError when TFLM cannot
    run it at all (an unsupported op, say)."""

    def __init__(self, model_bytes: bytes, arena_size: int, label: str = "model"):
        from tflite_micro.python.tflite_micro import runtime

        try:
            self._interp = runtime.Interpreter.from_bytes(bytes(model_bytes), arena_size=int(arena_size))
        except RuntimeError as exc:
            text = " ".join(str(exc).split())
            if "allocate" in text.lower() or "memory" in text.lower():
                raise InfeasibleError(f"{label}: does not fit a {arena_size:,}-byte TFLite Micro arena ({text[:160]})") from None
            raise ModelError(f"{label}: TFLite Micro cannot load it ({text[:160]})") from None
        from toolchain.tflite import read_model

        sg = read_model(bytes(model_bytes), name=label).subgraphs[0]
        self.input_names, self.output_names = _names(sg)
        self.inputs = []
        for i in range(len(sg.inputs)):
            d = self._interp.get_input_details(i)
            self.inputs.append((np.dtype(d["dtype"]), tuple(int(x) for x in d["shape"])))
        self.outputs = []
        for i in range(len(sg.outputs)):
            d = self._interp.get_output_details(i)
            self.outputs.append((np.dtype(d["dtype"]), tuple(int(x) for x in d["shape"])))

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        for k, x in enumerate(inputs):
            dtype, shape = self.inputs[k]
            self._interp.set_input(np.asarray(x, dtype=dtype).reshape(shape), k)
        self._interp.invoke()
        return [np.array(self._interp.get_output(k)) for k in range(len(self.outputs))]


def _names(sg):
    def name(i):
        n = sg.tensors[i].name
        return n.decode() if isinstance(n, bytes) else n

    return tuple(name(i) for i in sg.inputs), tuple(name(i) for i in sg.outputs)
