"""The compile passes, one module each; tpu_pipeline/toolchain/compile/__init__.py lists them in order."""
