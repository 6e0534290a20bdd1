"""Firmware projects for the TFLite Micro harness: the cached TFLM library (library.py), project
generation for a board (project.py), building and sizing the ELF (build.py)."""
