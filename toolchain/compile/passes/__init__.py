"""The compile passes, one module each; toolchain/compile/__init__.py lists them in order."""
