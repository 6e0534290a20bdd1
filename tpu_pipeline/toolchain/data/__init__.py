"""Files the toolchain ships inside the package (so a wheel works from any folder): device
descriptors (`devices/<name>.toml`) and the TFLite Micro harness firmware (`firmware/`)."""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
DEVICES_DIR = DATA_DIR / "devices"
FIRMWARE_DIR = DATA_DIR / "firmware"
HARNESS_DIR = FIRMWARE_DIR / "harness"
