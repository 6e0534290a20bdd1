// The harness's int8 convolutions: custom ops TPUP_CONV_2D and TPUP_DEPTHWISE_CONV_2D
// (tpu_pipeline/toolchain/ir/kernels.py describes them and their options).
//
// They compute what CONV_2D / DEPTHWISE_CONV_2D compute, with the same kernels (CMSIS-NN's in a
// CMSIS-NN build, TFLite's reference kernels otherwise), but keep nothing in the arena's
// persistent tail: the per-channel requantization is a constant input (input 3, int32 [2, C]:
// multipliers then shifts), the options are read from the flatbuffer at every invoke. The leading
// padding is explicit (a folded PAD), and with the "overlap" flag the output may be planned over
// the input's bytes: rows are then computed into a ring in the scratch buffer and written out once
// no later row reads the input bytes under them.
#pragma once

#include "tensorflow/lite/micro/micro_common.h"

namespace tpup {

const TFLMRegistration* Register_CONV_2D();
const TFLMRegistration* Register_DEPTHWISE_CONV_2D();

}  // namespace tpup
