"""Builtin operator options as plain, frozen records: what a pass reads and a rewrite rule writes.

The flatbuffer's option tables are decoded into these records when a model is read
(`tpu_pipeline.toolchain.ir.convert.from_model`) and encoded back only when one is written (`to_model`), so
no pass needs the schema. Field names are snake_case; enumerations are strings:

- `padding`: "SAME" | "VALID" | "EXPLICIT" (a harness kernel's own leading padding, `pad_top` and
  `pad_left`; see `tpu_pipeline.toolchain.ir.kernels`: no builtin encodes it)
- `fused_activation`: "NONE" | "RELU" | "RELU_N1_TO_1" | "RELU6" | "TANH" | "SIGN_BIT"
- `weights_format`: "DEFAULT" | "SHUFFLED4x16INT8"
- `quantized_bias_type`: a tensor type name as in `Tensor.dtype` ("float32" is the schema's
  default, meaning "not set")

Options the reader does not decode (an unknown builtin, a field this module does not describe, a
nested table) stay an `OpaqueOptions`: the schema object travels inside it untouched and is
written back as it was. Passes must treat it as a black box (copy it, never look inside).
Every record names the schema union member it encodes as `KIND`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

ACTIVATIONS = ("NONE", "RELU", "RELU_N1_TO_1", "RELU6", "TANH", "SIGN_BIT")
PADDINGS = ("SAME", "VALID", "EXPLICIT")  # EXPLICIT: harness kernels only (ir.kernels)


@dataclass(frozen=True)
class Conv2DOptions:
    KIND: ClassVar[str] = "Conv2DOptions"
    padding: str = "SAME"
    stride_w: int = 1
    stride_h: int = 1
    fused_activation: str = "NONE"
    dilation_w: int = 1
    dilation_h: int = 1
    quantized_bias_type: str = "float32"
    pad_top: int = 0  # padding == "EXPLICIT" only
    pad_left: int = 0


@dataclass(frozen=True)
class DepthwiseConv2DOptions:
    KIND: ClassVar[str] = "DepthwiseConv2DOptions"
    padding: str = "SAME"
    stride_w: int = 1
    stride_h: int = 1
    depth_multiplier: int = 1
    fused_activation: str = "NONE"
    dilation_w: int = 1
    dilation_h: int = 1
    pad_top: int = 0  # padding == "EXPLICIT" only
    pad_left: int = 0


@dataclass(frozen=True)
class Pool2DOptions:
    KIND: ClassVar[str] = "Pool2DOptions"
    padding: str = "SAME"
    stride_w: int = 1
    stride_h: int = 1
    filter_width: int = 1
    filter_height: int = 1
    fused_activation: str = "NONE"


@dataclass(frozen=True)
class FullyConnectedOptions:
    KIND: ClassVar[str] = "FullyConnectedOptions"
    fused_activation: str = "NONE"
    weights_format: str = "DEFAULT"
    keep_num_dims: bool = False
    asymmetric_quantize_inputs: bool = False
    quantized_bias_type: str = "float32"


@dataclass(frozen=True)
class AddOptions:
    KIND: ClassVar[str] = "AddOptions"
    fused_activation: str = "NONE"
    pot_scale_int16: bool = True


@dataclass(frozen=True)
class SubOptions:
    KIND: ClassVar[str] = "SubOptions"
    fused_activation: str = "NONE"
    pot_scale_int16: bool = True


@dataclass(frozen=True)
class MulOptions:
    KIND: ClassVar[str] = "MulOptions"
    fused_activation: str = "NONE"


@dataclass(frozen=True)
class DivOptions:
    KIND: ClassVar[str] = "DivOptions"
    fused_activation: str = "NONE"


@dataclass(frozen=True)
class ConcatenationOptions:
    KIND: ClassVar[str] = "ConcatenationOptions"
    axis: int = 0
    fused_activation: str = "NONE"


@dataclass(frozen=True)
class ReshapeOptions:
    KIND: ClassVar[str] = "ReshapeOptions"
    new_shape: tuple[int, ...] | None = None  # None: not stored (the shape comes from input 1)


@dataclass(frozen=True)
class SqueezeOptions:
    KIND: ClassVar[str] = "SqueezeOptions"
    squeeze_dims: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ReducerOptions:
    KIND: ClassVar[str] = "ReducerOptions"
    keep_dims: bool = False


@dataclass(frozen=True)
class SoftmaxOptions:
    KIND: ClassVar[str] = "SoftmaxOptions"
    beta: float = 1.0


@dataclass(frozen=True)
class LeakyReluOptions:
    KIND: ClassVar[str] = "LeakyReluOptions"
    alpha: float = 0.2


@dataclass(frozen=True)
class StridedSliceOptions:
    KIND: ClassVar[str] = "StridedSliceOptions"
    begin_mask: int = 0
    end_mask: int = 0
    ellipsis_mask: int = 0
    new_axis_mask: int = 0
    shrink_axis_mask: int = 0
    offset: bool = False


@dataclass(frozen=True)
class ResizeBilinearOptions:
    KIND: ClassVar[str] = "ResizeBilinearOptions"
    align_corners: bool = False
    half_pixel_centers: bool = False


@dataclass(frozen=True)
class ResizeNearestNeighborOptions:
    KIND: ClassVar[str] = "ResizeNearestNeighborOptions"
    align_corners: bool = False
    half_pixel_centers: bool = False


@dataclass(frozen=True)
class GatherOptions:
    KIND: ClassVar[str] = "GatherOptions"
    axis: int = 0
    batch_dims: int = 0


@dataclass(frozen=True)
class PackOptions:
    KIND: ClassVar[str] = "PackOptions"
    values_count: int = 0
    axis: int = 0


@dataclass(frozen=True)
class UnpackOptions:
    KIND: ClassVar[str] = "UnpackOptions"
    num: int = 0
    axis: int = 0


@dataclass(frozen=True)
class SplitOptions:
    KIND: ClassVar[str] = "SplitOptions"
    num_splits: int = 0


@dataclass(frozen=True)
class SplitVOptions:
    KIND: ClassVar[str] = "SplitVOptions"
    num_splits: int = 0


@dataclass(frozen=True)
class WhileOptions:
    KIND: ClassVar[str] = "WhileOptions"
    cond_subgraph_index: int = 0
    body_subgraph_index: int = 0


@dataclass(frozen=True)
class IfOptions:
    KIND: ClassVar[str] = "IfOptions"
    then_subgraph_index: int = 0
    else_subgraph_index: int = 0


@dataclass(frozen=True)
class FieldlessOptions:
    """The options table of a builtin that has no fields (PAD, TRANSPOSE, QUANTIZE, ...): stored
    as an empty table, which is not the same bytes as no table at all."""
    kind: str  # the schema's union member name, e.g. "PadOptions"

    @property
    def KIND(self) -> str:  # noqa: N802 - same name as the records' class attribute
        return self.kind


@dataclass(frozen=True)
class OpaqueOptions:
    """Options the reader did not decode; `raw` is the schema object, written back unchanged."""
    type_code: int
    raw: Any = field(compare=False, repr=False)
    KIND: ClassVar[str] = ""


RECORDS: tuple[type, ...] = (
    Conv2DOptions, DepthwiseConv2DOptions, Pool2DOptions, FullyConnectedOptions, AddOptions, SubOptions,
    MulOptions, DivOptions, ConcatenationOptions, ReshapeOptions, SqueezeOptions, ReducerOptions,
    SoftmaxOptions, LeakyReluOptions, StridedSliceOptions, ResizeBilinearOptions,
    ResizeNearestNeighborOptions, GatherOptions, PackOptions, UnpackOptions, SplitOptions, SplitVOptions,
    WhileOptions, IfOptions,
)

Options = Any  # one of RECORDS, FieldlessOptions, OpaqueOptions, or None for an op without options


def fused_activation(options) -> str | None:
    """The activation fused into an op with these options: "NONE" when the record has no such
    field (or there are no options), None when unknown (opaque options)."""
    if options is None or isinstance(options, FieldlessOptions):
        return "NONE"
    if isinstance(options, OpaqueOptions):
        return None
    return getattr(options, "fused_activation", "NONE")
