"""Option checks shared by the command modules, all done before any work starts.

The argparse types turn a bad value into argparse's one-line error (exit 2). `check_output`
(tpu_pipeline.toolchain.tflite.io's, re-exported for the commands) refuses an output path the
writer would refuse anyway (an input model: exit 2; a directory, a device, a fifo, a folder
nobody can write into: exit 4), so no minutes of solving are lost to it.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from tpu_pipeline.toolchain.tflite.io import check_output, check_output_folder, check_output_path  # noqa: F401 (re-exported)

# What matplotlib's Agg canvas writes (FigureCanvasBase.get_supported_filetypes()), without
# importing matplotlib just to parse the options.
PLOT_FORMATS = ("eps", "jpeg", "jpg", "pdf", "pgf", "png", "ps", "raw", "rgba", "svg", "svgz", "tif", "tiff",
                "webp")


def seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    """argparse type: a tolerance as a fraction (0.01) or a percentage (1%), in [0, 1)."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction like 0.01 or a percentage like 1%, got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1 (100%), got {text!r}")
    return value


def _integer(text: str, lowest: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < lowest:
        raise argparse.ArgumentTypeError(f"must be >= {lowest}, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: a whole number >= 0 (seeds, counts that may be zero, byte sizes)."""
    return _integer(text, 0)


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1."""
    return _integer(text, 1)


def plot_path(text: str) -> str:
    """argparse type: a file name whose suffix is a format matplotlib writes."""
    suffix = Path(text).suffix.lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the plot format is taken from the suffix; use one of "
            + ", ".join(f".{s}" for s in PLOT_FORMATS))
    return text


def html_path(text: str) -> str:
    """argparse type: the HTML report's file name (.html or .htm)."""
    if Path(text).suffix.lower() not in (".html", ".htm"):
        raise argparse.ArgumentTypeError(f"{text!r}: the report is an HTML page; name it .html")
    return text


def add_interface_arguments(p, int8_note: str, input_note: str) -> None:
    """--int8-io and --input-outside-arena (fit, compile and export-mcu), each with what it means
    for the command at hand."""
    p.add_argument("--int8-io", action="store_true",
                   help="drop the float QUANTIZE at each input and DEQUANTIZE at each output: the interface becomes "
                        f"int8 with the same scales ({int8_note})")
    p.add_argument("--input-outside-arena", action="store_true",
                   help="the application keeps the inputs in its own buffer (a camera frame, a DMA target) and the "
                        f"arena is planned without them ({input_note})")


def add_report_argument(p) -> None:
    p.add_argument("--report", metavar="FILE.html", type=html_path,
                   help="also write a self-contained HTML report (memory timeline, arena layout, ...; docs/cli.md)")
