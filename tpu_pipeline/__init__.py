"""tpu-pipeline's command line: `cli` parses arguments and prints, `commands/<name>.py` is one
command each, `entry` is the console script. It may use the runtime and the compiler; the
compiler (`toolchain`) never imports this package or the runtime."""
