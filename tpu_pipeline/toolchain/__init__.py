"""tpu-pipeline's compiler: .tflite in, .tflite out. No hardware; no threads but the CLI's interrupt watcher."""

__version__ = "0.1.0"
