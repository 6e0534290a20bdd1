"""tpu-pipeline's compiler: .tflite in, .tflite out. No hardware, no threads."""

__version__ = "0.1.0"
