"""tpu-pipeline: TensorFlow Lite models onto memory-starved edge hardware.

One import package. `toolchain` is the compiler (.tflite in, .tflite out), `runtime` the harness
that runs and measures what it wrote, `cli` / `commands` / `entry` the command line. The compiler
never imports the runtime or the command line.
"""
