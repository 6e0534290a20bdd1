// TPUP_ADD: TFLite Micro's int8 ADD of two equal-shape tensors (tpu_pipeline/toolchain/ir/add.py
// describes it and its options).
//
// TFLite Micro's ADD requantizes both inputs and the sum per element (reference AddFunc, or
// CMSIS-NN's arm_elementwise_add_s8: the same integers, about 80 instructions an element). From
// kTableMin elements this tabulates each input's scaled term once a call (tpup_add.h) and an
// element takes two loads, an add and the sum's requantization (tpup_conv.h's FastRequant where
// the tables bound the sums, else Requant: MultiplyByQuantizedMultiplierSmallerThanOneExp's
// integers either way). The requantization comes in the
// options, as TFLite Micro's Prepare computes it: no persistent data, no scratch. Each element is
// read before it is written, so the offline plan may lay the output over a dying input (in place).

#include <cstdint>

#include "tensorflow/lite/c/common.h"
#include "tensorflow/lite/kernels/internal/common.h"
#include "tensorflow/lite/kernels/internal/reference/integer_ops/add.h"
#include "tensorflow/lite/micro/kernels/kernel_util.h"
#include "tpup_add.h"
#include "tpup_conv.h"

namespace tpup {
namespace {

constexpr int kAddWords = 15;
// The elements from which the tables pay (tpu_pipeline/toolchain/ir/add.py TABLE_MIN): their fill
// takes about 5 k instructions, AddFunc about 85 an element more than the tabled loop.
constexpr int kTableMin = 128;

// The options in the order tpu_pipeline/toolchain/ir/add.py writes them.
struct AddOptions {
  int32_t format, version, left_shift, input1_offset, input1_multiplier, input1_shift, input2_offset,
      input2_multiplier, input2_shift, output_offset, output_multiplier, output_shift, act_min, act_max, activation;
};
static_assert(sizeof(AddOptions) == kAddWords * 4, "word layout");

bool ReadAdd(const TfLiteNode* node, AddOptions* o) {
  if (!ReadOptionWords(node, kAddWords, reinterpret_cast<int32_t*>(o))) return false;
  // (AddFunc's shifts: each at most 0, as QuantizeMultiplierSmallerThanOneExp gives them)
  return o->format == 1 && o->left_shift >= 0 && o->left_shift <= 20 && o->act_min <= o->act_max &&
         o->input1_shift <= 0 && o->input1_shift >= -31 && o->input2_shift <= 0 && o->input2_shift >= -31 &&
         o->output_shift <= 0 && o->output_shift >= -31;
}

int Elements(const TfLiteEvalTensor* t) {
  int n = 1;
  for (int i = 0; i < t->dims->size; ++i) n *= t->dims->data[i];
  return n;
}

void* Init(TfLiteContext*, const char*, size_t) { return nullptr; }

TfLiteStatus Prepare(TfLiteContext* context, TfLiteNode* node) {
  AddOptions o;
  TF_LITE_ENSURE_MSG(context, ReadAdd(node, &o), "TPUP add: invalid options");
  TF_LITE_ENSURE_EQ(context, node->inputs->size, 2);
  TF_LITE_ENSURE_EQ(context, node->outputs->size, 1);
  node->user_data = nullptr;
  return kTfLiteOk;
}

// n elements; `out` may be `a` or `b` (each element is read, then written).
void Add(const tflite::ArithmeticParams& p, const int8_t* a, const int8_t* b, int n, int8_t* out) {
  if (n < kTableMin) {
    for (int i = 0; i < n; ++i) out[i] = tflite::reference_integer_ops::AddFunc(a[i], b[i], p);
    return;
  }
  int32_t t1[256], t2[256];
  AddTables(p, t1, t2);
  if (AddFastFits(p, t1, t2)) {
    AddLoop(p, t1, t2, FastRequant(p.output_multiplier, p.output_shift), a, b, n, out);
  } else {
    AddLoop(p, t1, t2, Requant(p.output_multiplier, p.output_shift), a, b, n, out);
  }
}

TfLiteStatus Eval(TfLiteContext* context, TfLiteNode* node) {
  AddOptions o;
  TF_LITE_ENSURE(context, ReadAdd(node, &o));
  const TfLiteEvalTensor* in1 = tflite::micro::GetEvalInput(context, node, 0);
  const TfLiteEvalTensor* in2 = tflite::micro::GetEvalInput(context, node, 1);
  TfLiteEvalTensor* output = tflite::micro::GetEvalOutput(context, node, 0);
  const int n = Elements(output);
  TF_LITE_ENSURE_MSG(context, Elements(in1) == n && Elements(in2) == n, "TPUP add: the shapes differ");
  tflite::ArithmeticParams p = {};
  p.left_shift = o.left_shift;
  p.input1_offset = o.input1_offset, p.input1_multiplier = o.input1_multiplier, p.input1_shift = o.input1_shift;
  p.input2_offset = o.input2_offset, p.input2_multiplier = o.input2_multiplier, p.input2_shift = o.input2_shift;
  p.output_offset = o.output_offset, p.output_multiplier = o.output_multiplier, p.output_shift = o.output_shift;
  p.quantized_activation_min = o.act_min, p.quantized_activation_max = o.act_max;
  Add(p, tflite::micro::GetTensorData<int8_t>(in1), tflite::micro::GetTensorData<int8_t>(in2), n,
      tflite::micro::GetTensorData<int8_t>(output));
  return kTfLiteOk;
}

}  // namespace

const TFLMRegistration* Register_ADD() {
  static const TFLMRegistration r = tflite::micro::RegisterOp(Init, Prepare, Eval);
  return &r;
}

}  // namespace tpup
