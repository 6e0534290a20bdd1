"""The target, on the ground floor: boards (device descriptors as typed records), CPU profiles and
TFLite Micro kernel sets. Imports only `errors` and the standard library; every room above takes
a `Device` and a `KernelSet`, resolved once where a command or an API call starts.

    dev = load_device("sparkfun-edge")   # or a path to a descriptor TOML: a new board is one file
    ks = kernel_set("reference")         # or None: the default set
"""

from tpu_pipeline.toolchain.device.cpus import CPU_FLAGS, DEFAULT_CPU, check_cpu
from tpu_pipeline.toolchain.device.descriptor import (OP_CLASSES, Compute, Device, Link, Memory, Power, RamBank,
                                                      Timing)
from tpu_pipeline.toolchain.device.firmware import BoardFirmware
from tpu_pipeline.toolchain.device.kernel_sets import (CMSIS_NN, DEFAULT_KERNEL_SET, KERNEL_SET_NAMES, KERNEL_SETS,
                                                       REFERENCE, KernelSet, kernel_set)
from tpu_pipeline.toolchain.device.load import (DEVICES_DIR, available_devices, device_from_descriptor,
                                               firmware_boards, load_device, require_firmware)

__all__ = ["CPU_FLAGS", "DEFAULT_CPU", "check_cpu", "OP_CLASSES", "Compute", "Device", "Link", "Memory", "Power",
           "RamBank", "Timing", "BoardFirmware", "CMSIS_NN", "DEFAULT_KERNEL_SET", "KERNEL_SET_NAMES", "KERNEL_SETS",
           "REFERENCE", "KernelSet", "kernel_set", "DEVICES_DIR", "available_devices", "device_from_descriptor",
           "firmware_boards", "load_device", "require_firmware"]
