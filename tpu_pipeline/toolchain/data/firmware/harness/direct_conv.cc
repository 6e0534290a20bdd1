// TPUP_CONV_2D_DIRECT: see direct_conv.h. Init reads the options into a TfLiteConvParams the
// kernel owns (a custom op has no parsed builtin data); Prepare fills TFLite Micro's OpDataConv
// with its public helper CalculateOpDataConv (per-channel multipliers and shifts, activation
// range, padding), allocating the per-channel arrays as CONV_2D's Prepare does; no scratch is
// requested. Eval is TFLite's reference int8 per-channel convolution.

#include "direct_conv.h"

#include <cstdint>
#include <cstring>

#include "tensorflow/lite/c/builtin_op_data.h"
#include "tensorflow/lite/c/common.h"
#include "tensorflow/lite/kernels/internal/reference/integer_ops/conv.h"
#include "tensorflow/lite/micro/kernels/conv.h"
#include "tensorflow/lite/micro/kernels/kernel_util.h"
#include "tensorflow/lite/micro/micro_context.h"
#include "tensorflow/lite/micro/micro_log.h"

namespace tpup {
namespace {

constexpr size_t kOptionWords = 7;

// What Init allocates in the arena's tail (tpu_pipeline/toolchain/memory/tflm_target.py models its size).
struct DirectConvData {
  tflite::OpDataConv conv;
  TfLiteConvParams params;
};

bool ParseOptions(const char* buffer, size_t length, TfLiteConvParams* params) {
  if (buffer == nullptr || length != kOptionWords * sizeof(int32_t)) {
    MicroPrintf("%s: %d bytes of options, expected %d", kDirectConvName, static_cast<int>(length),
                static_cast<int>(kOptionWords * sizeof(int32_t)));
    return false;
  }
  int32_t w[kOptionWords];
  for (size_t i = 0; i < kOptionWords; ++i) {  // little-endian, whatever the buffer's alignment
    const uint8_t* b = reinterpret_cast<const uint8_t*>(buffer) + 4 * i;
    w[i] = static_cast<int32_t>(static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 |
                                static_cast<uint32_t>(b[2]) << 16 | static_cast<uint32_t>(b[3]) << 24);
  }
  const int32_t version = w[0], padding = w[1], activation = w[6];
  const bool ok = version >= 1 && (padding == 1 || padding == 2) && w[2] >= 1 && w[3] >= 1 && w[4] >= 1 &&
                  w[5] >= 1 && activation >= 0 && activation <= 3;
  if (!ok) {
    MicroPrintf("%s: invalid options [%d %d %d %d %d %d %d]", kDirectConvName, static_cast<int>(w[0]),
                static_cast<int>(w[1]), static_cast<int>(w[2]), static_cast<int>(w[3]), static_cast<int>(w[4]),
                static_cast<int>(w[5]), static_cast<int>(w[6]));
    return false;
  }
  params->padding = padding == 1 ? kTfLitePaddingSame : kTfLitePaddingValid;
  params->stride_width = w[2];
  params->stride_height = w[3];
  params->dilation_width_factor = w[4];
  params->dilation_height_factor = w[5];
  static const TfLiteFusedActivation kActivations[] = {kTfLiteActNone, kTfLiteActRelu, kTfLiteActReluN1To1,
                                                       kTfLiteActRelu6};
  params->activation = kActivations[activation];
  params->quantized_bias_type = kTfLiteNoType;
  return true;
}

void* Init(TfLiteContext* context, const char* buffer, size_t length) {
  TfLiteConvParams params;
  if (!ParseOptions(buffer, length, &params)) return nullptr;  // Prepare reports the error
  auto* data = static_cast<DirectConvData*>(context->AllocatePersistentBuffer(context, sizeof(DirectConvData)));
  if (data == nullptr) return nullptr;
  data->params = params;
  return data;
}

// int8 input, filter and output, an int32 bias or none, per-channel (or per-tensor) filter scales.
TfLiteStatus CheckTensors(TfLiteContext* context, const TfLiteTensor* input, const TfLiteTensor* filter,
                          const TfLiteTensor* bias, const TfLiteTensor* output) {
  TF_LITE_ENSURE_MSG(context,
                     input->type == kTfLiteInt8 && filter->type == kTfLiteInt8 && output->type == kTfLiteInt8,
                     "TPUP_CONV_2D_DIRECT runs int8 input, filter and output only");
  TF_LITE_ENSURE_MSG(context, bias == nullptr || bias->type == kTfLiteInt32,
                     "TPUP_CONV_2D_DIRECT needs an int32 bias or none");
  TF_LITE_ENSURE_EQ(context, input->dims->size, 4);
  TF_LITE_ENSURE_EQ(context, filter->dims->size, 4);
  TF_LITE_ENSURE_EQ(context, output->dims->size, 4);
  TF_LITE_ENSURE_EQ(context, filter->quantization.type, kTfLiteAffineQuantization);
  const auto* q = static_cast<const TfLiteAffineQuantization*>(filter->quantization.params);
  TF_LITE_ENSURE(context, q != nullptr && q->scale != nullptr && q->zero_point != nullptr);
  TF_LITE_ENSURE(context, q->scale->size == 1 || q->scale->size == filter->dims->data[0]);
  return kTfLiteOk;
}

TfLiteStatus Prepare(TfLiteContext* context, TfLiteNode* node) {
  auto* data = static_cast<DirectConvData*>(node->user_data);
  if (data == nullptr) {
    MicroPrintf("%s: the op's options were rejected (or the arena is full)", kDirectConvName);
    return kTfLiteError;
  }
  TF_LITE_ENSURE(context, node->inputs->size == 2 || node->inputs->size == 3);
  TF_LITE_ENSURE_EQ(context, node->outputs->size, 1);
  tflite::MicroContext* micro_context = tflite::GetMicroContext(context);
  TfLiteTensor* input = micro_context->AllocateTempInputTensor(node, tflite::kConvInputTensor);
  TfLiteTensor* filter = micro_context->AllocateTempInputTensor(node, tflite::kConvWeightsTensor);
  TfLiteTensor* bias = micro_context->AllocateTempInputTensor(node, tflite::kConvBiasTensor);
  TfLiteTensor* output = micro_context->AllocateTempOutputTensor(node, tflite::kConvOutputTensor);
  TfLiteStatus status = kTfLiteError;
  if (input != nullptr && filter != nullptr && output != nullptr) {
    status = CheckTensors(context, input, filter, bias, output);
  }
  int dims[6] = {0, 0, 0, 0, 0, 0};  // input w, h; filter w, h; output w, h
  int channels = 0;
  if (status == kTfLiteOk) {
    dims[0] = input->dims->data[2], dims[1] = input->dims->data[1];
    dims[2] = filter->dims->data[2], dims[3] = filter->dims->data[1];
    dims[4] = output->dims->data[2], dims[5] = output->dims->data[1];
    channels = filter->dims->data[tflite::kConvQuantizedDimension];
  }
  // Released before CalculateOpDataConv takes its own: no more temporaries at once than CONV_2D holds.
  for (TfLiteTensor* t : {output, input, filter, bias}) {
    if (t != nullptr) micro_context->DeallocateTempTfLiteTensor(t);
  }
  TF_LITE_ENSURE_STATUS(status);
  // One multiplier and one shift per output channel, in the tail, as CONV_2D's Prepare allocates them.
  data->conv.per_channel_output_multiplier =
      static_cast<int32_t*>(context->AllocatePersistentBuffer(context, channels * sizeof(int32_t)));
  data->conv.per_channel_output_shift =
      static_cast<int32_t*>(context->AllocatePersistentBuffer(context, channels * sizeof(int32_t)));
  TF_LITE_ENSURE(context, data->conv.per_channel_output_multiplier != nullptr &&
                              data->conv.per_channel_output_shift != nullptr);
  return tflite::CalculateOpDataConv(context, node, data->params, dims[0], dims[1], dims[2], dims[3], dims[4],
                                     dims[5], kTfLiteInt8, &data->conv);
}

TfLiteStatus Eval(TfLiteContext* context, TfLiteNode* node) {
  const auto& data = *static_cast<const DirectConvData*>(node->user_data);
  const TfLiteEvalTensor* input = tflite::micro::GetEvalInput(context, node, tflite::kConvInputTensor);
  const TfLiteEvalTensor* filter = tflite::micro::GetEvalInput(context, node, tflite::kConvWeightsTensor);
  const TfLiteEvalTensor* bias =
      node->inputs->size == 3 ? tflite::micro::GetEvalInput(context, node, tflite::kConvBiasTensor) : nullptr;
  TfLiteEvalTensor* output = tflite::micro::GetEvalOutput(context, node, tflite::kConvOutputTensor);
  tflite::reference_integer_ops::ConvPerChannel(
      tflite::ConvParamsQuantized(data.params, data.conv), data.conv.per_channel_output_multiplier,
      data.conv.per_channel_output_shift, tflite::micro::GetTensorShape(input),
      tflite::micro::GetTensorData<int8_t>(input), tflite::micro::GetTensorShape(filter),
      tflite::micro::GetTensorData<int8_t>(filter), tflite::micro::GetTensorShape(bias),
      tflite::micro::GetOptionalTensorData<int32_t>(bias), tflite::micro::GetTensorShape(output),
      tflite::micro::GetTensorData<int8_t>(output));
  return kTfLiteOk;
}

}  // namespace

const TFLMRegistration* Register_CONV_2D_DIRECT() {
  static const TFLMRegistration registration = tflite::micro::RegisterOp(Init, Prepare, Eval);
  return &registration;
}

}  // namespace tpup
