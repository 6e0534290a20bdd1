"""What makes TFLite Micro's outputs depend on memory it never wrote.

Running and comparing the models (`verify_models`, the tolerance policy) is
`tpu_pipeline.toolchain.execute.compare`.
"""

from __future__ import annotations

from tpu_pipeline.toolchain.errors import ModelError


# ---- What TFLite Micro reads without having written it ------------------------------------------

def tflm_hazards(model) -> list[str]:
    """Reasons why TFLite Micro's outputs for `model` (as tflite/ reads it) can depend on memory its kernels
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
    from tpu_pipeline.toolchain.execute.litert import runtime_shapes
    from tpu_pipeline.toolchain.tflite.extract import padding_space_to_batch_zero_points, stale_shapes
    from tpu_pipeline.toolchain.tflite.names import tensor_name

    out = []
    try:
        stale = stale_shapes(model, runtime_shapes(model))
    except ModelError as exc:
        stale = {}
        out.append(f"cannot check the stored shapes: {exc}")
    if stale:
        t, (old, new) = next(iter(stale.items()))
        out.append(f"{len(stale)} tensor(s) are stored with placeholder shapes (e.g. '{tensor_name(model, t)}' "
                   f"stored {list(old)}, allocated {list(new)} by LiteRT): TFLite Micro runs on the stored shapes, "
                   f"writes only part of such tensors and reads arena bytes nothing wrote")
    pads = padding_space_to_batch_zero_points(model)
    if pads:
        wrong = sum(1 for zp in pads if zp != 0)
        out.append(f"{len(pads)} SPACE_TO_BATCH_ND op(s) pad: TFLite Micro's kernel pads with an uninitialised "
                   f"byte from its arena (0 in a fresh arena)"
                   + (f"; {wrong} of them have a non-zero zero point, so even a fresh arena gives other "
                      f"outputs than LiteRT" if wrong else ""))
    return out
