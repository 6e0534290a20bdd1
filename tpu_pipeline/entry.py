"""The `tpu-pipeline` console script. A bare handler goes in before any other import, so a Ctrl-C
while the heavy modules load is one line and exit 130 too, not a traceback; `interrupts.install`
then takes over for the command itself. Signals the shell told us to ignore stay ignored."""

import os
import signal


def _early(signum, frame):  # nothing to clean up yet
    os.write(2, b"interrupted\n")
    os._exit(128 + signum)


for _sig in (signal.SIGINT, signal.SIGTERM):
    if signal.getsignal(_sig) is not signal.SIG_IGN:
        signal.signal(_sig, _early)


def main() -> None:
    import sys

    from tpu_pipeline.toolchain import interrupts

    interrupts.install()
    from tpu_pipeline.cli import main as cli_main

    sys.exit(cli_main())
