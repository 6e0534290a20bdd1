"""Running models in the real interpreters on the host: the one room that does it.

- `litert`: the only place a LiteRT interpreter is built (builtin kernels only, or the default
  resolver with delegates); running it by position or by tensor name.
- `tflm`: TFLite Micro in this process, as an MCU runs it (`TflmModel`), or in a child process.
- `tflm_arena`: the arena TFLite Micro really allocates (read from its stderr, in a child).
- `inputs`: the one seeded random-input generator.
- `compare`: output comparison policy (exact / float tolerance / lossy in LSBs), two models on
  the same inputs (`verify_models`), segments chained by tensor name (`verify_chain`).

The compiler's passes and the runtime harness (`tpu_pipeline/runtime/`) call these; nothing here imports the
runtime. A new runtime to run models in gets a module here.
"""
