// The harness's direct int8 convolution: custom op TPUP_CONV_2D_DIRECT (tpu_pipeline/toolchain/ir/kernels.py).
// The same computation as CONV_2D (TFLite's reference per-channel convolution, one output at a
// time straight from the input), registered under its own op code so a model can pick, per op,
// this kernel (no scratch in the arena) instead of the kernel set's (CMSIS-NN: an im2col buffer).
// Options: 28 bytes, seven little-endian int32 [CONV_2D version, padding (1 SAME, 2 VALID),
// stride_w, stride_h, dilation_w, dilation_h, activation (0 none, 1 relu, 2 relu_n1_to_1, 3 relu6)].
#pragma once

#include "tensorflow/lite/micro/micro_common.h"

namespace tpup {

constexpr const char* kDirectConvName = "TPUP_CONV_2D_DIRECT";

// The registration to hand to MicroMutableOpResolver::AddCustom(kDirectConvName, ...).
const TFLMRegistration* Register_CONV_2D_DIRECT();

}  // namespace tpup
