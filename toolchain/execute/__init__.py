"""Running models in the real interpreters on the host (compiler side: predictions and checks).

The runtime harness (`runtime/`) may call these; nothing here imports the runtime.
"""
