"""tpu-pipeline's runtime harness: runs what the toolchain wrote and measures it."""
