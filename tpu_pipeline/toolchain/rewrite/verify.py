"""What makes TFLite Micro's outputs depend on memory it never wrote.

Running and comparing the models (`verify_models`, the tolerance policy) is
`tpu_pipeline.toolchain.execute.compare`.
"""

from __future__ import annotations

import numpy as np

from tpu_pipeline.toolchain.errors import ModelError


# ---- What TFLite Micro reads without having written it ------------------------------------------

def tflm_hazards(model) -> list[str]:
    """Reasons why TFLite Micro's outputs for `model` (a ModelT) can depend on memory its kernels
    never wrote, so that an op order or an arena plan that LiteRT runs bit-identically can change
    TFLite Micro's outputs. Empty when there is none. Two are known (tests/test_real_models.py
    reproduces both):

    - stored shapes that are placeholders (a dynamic-batch model: signature -1, stored 1, and
      LiteRT allocates e.g. 4 between SPACE_TO_BATCH_ND and BATCH_TO_SPACE_ND). TFLite Micro never
      recomputes shapes: BATCH_TO_SPACE_ND then writes a quarter of its output and the ops after
      it read whatever an earlier tensor left at those arena bytes. Fix: write the real shapes
      (`tpu_pipeline.toolchain.tflite.extract.with_static_shapes`) before planning.
    - SPACE_TO_BATCH_ND with padding: TFLite Micro's kernel allocates its parameters in Init and
      never fills them in Prepare, so the pad value is the byte the arena's tail held (0 in a
      fresh arena, which is right only for float32 or a zero point of 0; LiteRT pads with the
      zero point). Nothing the toolchain writes can fix that inside the kernel.
    """
    from tpu_pipeline.toolchain.tflite.names import opcode_name
    from tpu_pipeline.toolchain.execute.litert import runtime_shapes
    from tpu_pipeline.toolchain.tflite.extract import stale_shapes

    out = []
    sg = model.subgraphs[0]
    try:
        stale = stale_shapes(model, runtime_shapes(model))
    except ModelError as exc:
        stale = {}
        out.append(f"cannot check the stored shapes: {exc}")
    if stale:
        t, (old, new) = next(iter(stale.items()))
        name = sg.tensors[t].name
        name = name.decode("utf-8", "replace") if isinstance(name, bytes) else name
        out.append(f"{len(stale)} tensor(s) are stored with placeholder shapes (e.g. '{name}' stored {list(old)}, "
                   f"allocated {list(new)} by LiteRT): TFLite Micro runs on the stored shapes, writes only part "
                   f"of such tensors and reads arena bytes nothing wrote")
    pads = []
    for op in sg.operators or []:
        if opcode_name(model, op.opcodeIndex)[0] != "SPACE_TO_BATCH_ND" or len(op.inputs) < 3:
            continue
        pt = sg.tensors[op.inputs[2]]
        buf = model.buffers[pt.buffer] if pt.buffer else None
        data = np.frombuffer(bytes(buf.data), dtype=np.int32) if buf is not None and buf.data is not None else None
        if data is None or np.any(data != 0):
            q = sg.tensors[op.outputs[0]].quantization
            zp = int(q.zeroPoint[0]) if q is not None and q.zeroPoint is not None and len(q.zeroPoint) else 0
            pads.append(zp)
    if pads:
        wrong = sum(1 for zp in pads if zp != 0)
        out.append(f"{len(pads)} SPACE_TO_BATCH_ND op(s) pad: TFLite Micro's kernel pads with an uninitialised "
                   f"byte from its arena (0 in a fresh arena)"
                   + (f"; {wrong} of them have a non-zero zero point, so even a fresh arena gives other "
                      f"outputs than LiteRT" if wrong else ""))
    return out
