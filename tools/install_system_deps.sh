#!/usr/bin/env bash
# System packages the test suite needs beyond Python: a host C compiler for the compiled searches
# (tpu_pipeline/toolchain/native.py; the tests check the C and the Python versions against each other), the ARM
# toolchain and QEMU for the firmware tests (tests/test_firmware.py), and Chromium, in which
# tests/test_report_html.py renders the HTML reports headless. Installed with apt when missing and we are root (CI runs as root
# on a bare machine); otherwise those tests skip and say why.
set -euo pipefail
need=()
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v arm-none-eabi-g++ >/dev/null || need+=(gcc-arm-none-eabi libnewlib-arm-none-eabi libstdc++-arm-none-eabi-newlib)
command -v qemu-system-arm >/dev/null || need+=(qemu-system-arm)
command -v chromium >/dev/null || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
else
    echo "not root or no apt-get: the firmware and browser tests will skip (missing: ${need[*]})" >&2
fi
