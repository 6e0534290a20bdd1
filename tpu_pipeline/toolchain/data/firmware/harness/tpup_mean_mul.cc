// TPUP_MEAN and TPUP_MUL: TFLite Micro's int8 MEAN and MUL arithmetic in plain loops
// (tpu_pipeline/toolchain/ir/kernels.py, "means and products", describes them and their options).
//
// TFLite Micro's MEAN steps an index vector per input element (its generic reduction) and its
// broadcast MUL runs the 4-D "slow" loop: a squeeze-and-excitation block spends most of its time
// there. These compute the same integers: the requantization comes precomputed in the options
// (as TFLite Micro's Prepare computes it), so there is no persistent data and no scratch buffer.

#include <cstdint>

#include "tensorflow/lite/c/common.h"
#include "tensorflow/lite/kernels/internal/common.h"
#include "tensorflow/lite/micro/kernels/kernel_util.h"
#include "tensorflow/lite/micro/micro_log.h"
#include "tpup_conv.h"

namespace tpup {
namespace {

constexpr int kMeanWords = 10, kMulWords = 11;

struct MeanOptions {
  int32_t format, version, outer, reduced, inner, input_zp, output_zp, multiplier, shift, keep_dims;
};
struct MulOptions {
  int32_t format, version, broadcast, input1_offset, input2_offset, output_offset, multiplier, shift, act_min,
      act_max, activation;
};
static_assert(sizeof(MeanOptions) == kMeanWords * 4 && sizeof(MulOptions) == kMulWords * 4, "word layouts");

template <typename T, int kWords>
bool ReadWords(const TfLiteNode* node, T* o) {
  if (node->custom_initial_data == nullptr || node->custom_initial_data_size != kWords * 4) return false;
  int32_t* w = reinterpret_cast<int32_t*>(o);
  const uint8_t* b = static_cast<const uint8_t*>(node->custom_initial_data);
  for (int i = 0; i < kWords; ++i, b += 4) {  // little-endian, whatever the buffer's alignment
    w[i] = static_cast<int32_t>(static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 |
                                static_cast<uint32_t>(b[2]) << 16 | static_cast<uint32_t>(b[3]) << 24);
  }
  return w[0] == 1;
}

bool ReadMean(const TfLiteNode* node, MeanOptions* o) {
  return ReadWords<MeanOptions, kMeanWords>(node, o) && o->outer >= 1 && o->reduced >= 1 && o->inner >= 1 &&
         o->shift >= -31 && o->shift <= 30;
}

bool ReadMul(const TfLiteNode* node, MulOptions* o) {
  return ReadWords<MulOptions, kMulWords>(node, o) && o->broadcast >= 0 && o->broadcast <= 2 &&
         o->act_min <= o->act_max && o->shift >= -31 && o->shift <= 30;
}

void* Init(TfLiteContext*, const char*, size_t) { return nullptr; }

// The flat element counts of a node's first input and output.
int Elements(const TfLiteEvalTensor* t) {
  int n = 1;
  for (int i = 0; i < t->dims->size; ++i) n *= t->dims->data[i];
  return n;
}

TfLiteStatus PrepareMean(TfLiteContext* context, TfLiteNode* node) {
  MeanOptions o;
  TF_LITE_ENSURE_MSG(context, ReadMean(node, &o), "TPUP mean: invalid options");
  TF_LITE_ENSURE_EQ(context, node->inputs->size, 2);
  TF_LITE_ENSURE_EQ(context, node->outputs->size, 1);
  node->user_data = nullptr;
  return kTfLiteOk;
}

// One output per (outer, inner) position: the sum over `reduced` elements `inner` apart. Four
// channels at a time in registers, the rows walked with one pointer.
TfLiteStatus EvalMean(TfLiteContext* context, TfLiteNode* node) {
  MeanOptions o;
  TF_LITE_ENSURE(context, ReadMean(node, &o));
  const TfLiteEvalTensor* input = tflite::micro::GetEvalInput(context, node, 0);
  TfLiteEvalTensor* output = tflite::micro::GetEvalOutput(context, node, 0);
  TF_LITE_ENSURE_MSG(context, Elements(input) == o.outer * o.reduced * o.inner &&
                     Elements(output) == o.outer * o.inner, "TPUP mean: options do not fit the tensors");
  const int8_t* in = tflite::micro::GetTensorData<int8_t>(input);
  int8_t* out = tflite::micro::GetTensorData<int8_t>(output);
  const int32_t bias = -o.input_zp * o.reduced;
  for (int q = 0; q < o.outer; ++q) {
    const int8_t* base = in + q * o.reduced * o.inner;
    int8_t* dst = out + q * o.inner;
    int c = 0;
    for (; c + 4 <= o.inner; c += 4) {
      int32_t a0 = bias, a1 = bias, a2 = bias, a3 = bias;
      const int8_t* p = base + c;
      for (int r = 0; r < o.reduced; ++r, p += o.inner) {
        a0 += p[0], a1 += p[1], a2 += p[2], a3 += p[3];
      }
      const int32_t sums[4] = {a0, a1, a2, a3};
      for (int k = 0; k < 4; ++k) {
        dst[c + k] = Clamp(tflite::MultiplyByQuantizedMultiplier(sums[k], o.multiplier, o.shift) + o.output_zp,
                           -128, 127);
      }
    }
    for (; c < o.inner; ++c) {
      int32_t a = bias;
      const int8_t* p = base + c;
      for (int r = 0; r < o.reduced; ++r, p += o.inner) a += *p;
      dst[c] = Clamp(tflite::MultiplyByQuantizedMultiplier(a, o.multiplier, o.shift) + o.output_zp, -128, 127);
    }
  }
  return kTfLiteOk;
}

TfLiteStatus PrepareMul(TfLiteContext* context, TfLiteNode* node) {
  MulOptions o;
  TF_LITE_ENSURE_MSG(context, ReadMul(node, &o), "TPUP mul: invalid options");
  TF_LITE_ENSURE_EQ(context, node->inputs->size, 2);
  TF_LITE_ENSURE_EQ(context, node->outputs->size, 1);
  node->user_data = nullptr;
  return kTfLiteOk;
}

// out[i] = requantize((a[i] + a_offset) * (b[i % m] + b_offset)): b has every element (m = n), one
// per channel (m = the last axis) or one (m = 1). Runs in place too (each element read, then
// written).
void MulLoop(const MulOptions& o, const int8_t* a, int32_t a_offset, const int8_t* b, int32_t b_offset, int n, int m,
             int8_t* out) {
  const Requant requant(o.multiplier, o.shift);
  if (m == 1) {
    const int32_t bv = b[0] + b_offset;
    for (int i = 0; i < n; ++i) {
      out[i] = Clamp(requant((a[i] + a_offset) * bv) + o.output_offset, o.act_min, o.act_max);
    }
    return;
  }
  for (int i = 0; i < n; i += m) {
    const int8_t* pa = a + i;
    int8_t* po = out + i;
    const int8_t* pb = m == n ? b + i : b;
    for (int j = 0; j < m; ++j) {
      const int32_t v = (pa[j] + a_offset) * (pb[j] + b_offset);
      po[j] = Clamp(requant(v) + o.output_offset, o.act_min, o.act_max);
    }
  }
}

TfLiteStatus EvalMul(TfLiteContext* context, TfLiteNode* node) {
  MulOptions o;
  TF_LITE_ENSURE(context, ReadMul(node, &o));
  const TfLiteEvalTensor* in1 = tflite::micro::GetEvalInput(context, node, 0);
  const TfLiteEvalTensor* in2 = tflite::micro::GetEvalInput(context, node, 1);
  TfLiteEvalTensor* output = tflite::micro::GetEvalOutput(context, node, 0);
  const bool swap = o.broadcast == 2;  // (the product commutes: the broadcast operand goes second)
  const TfLiteEvalTensor* big = swap ? in2 : in1;
  const TfLiteEvalTensor* small = swap ? in1 : in2;
  const int n = Elements(big), m = Elements(small);
  TF_LITE_ENSURE_MSG(context, Elements(output) == n && m >= 1 && n % m == 0 && (o.broadcast == 0) == (m == n),
                     "TPUP mul: options do not fit the tensors");
  MulLoop(o, tflite::micro::GetTensorData<int8_t>(big), swap ? o.input2_offset : o.input1_offset,
          tflite::micro::GetTensorData<int8_t>(small), swap ? o.input1_offset : o.input2_offset, n, m, tflite::micro::GetTensorData<int8_t>(output));
  return kTfLiteOk;
}

}  // namespace

const TFLMRegistration* Register_MEAN() {
  static const TFLMRegistration r = tflite::micro::RegisterOp(Init, PrepareMean, EvalMean);
  return &r;
}

const TFLMRegistration* Register_MUL() {
  static const TFLMRegistration r = tflite::micro::RegisterOp(Init, PrepareMul, EvalMul);
  return &r;
}

}  // namespace tpup
