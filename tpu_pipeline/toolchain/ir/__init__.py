"""The graph IR and its conversion to and from the flatbuffer object API.

`options` holds the typed records of builtin operator options, `ops` the constructors of new ops;
only `convert` knows the flatbuffer schema."""

from tpu_pipeline.toolchain.ir.graph import DTYPE_SIZES, Graph, Op, Quantization, Tensor
from tpu_pipeline.toolchain.ir.convert import BUILTIN_CODES, from_model, to_model
from tpu_pipeline.toolchain.ir.semantics import macs, param_bytes, total_param_bytes
from tpu_pipeline.toolchain.ir import ops, options

__all__ = ["DTYPE_SIZES", "Graph", "Op", "Quantization", "Tensor", "BUILTIN_CODES",
           "from_model", "to_model", "macs", "param_bytes", "total_param_bytes", "ops", "options"]
