// TPUP_FULLY_CONNECTED: TFLite Micro's int8 FULLY_CONNECTED, faster, bit-identical in both builds
// (tpu_pipeline/toolchain/ir/fully_connected.py describes it, its options and its constant input 3).
//
// Four output rows per pass: each word of input (four int8) is widened once to two int16 pairs by
// two SXTB16s (lanes 0,2 and 1,3) and used by all four rows; the rows' weights for one pair come
// as four int16-pair words laid out offline in that order, one LDM, then one SMLAD per row: 13
// instructions per 16 multiply-accumulates, four groups a loop pass (inline assembly; the compiler
// spills the same C). The
// input offset is folded into the bias offline, so the input is used as it is. Rows and inputs left
// over (fewer than four) are summed from the int8 weights (input 1). No scratch, no persistent data.
//
// Requantisation: where ir/fully_connected.py proved it exact (kFcFastRequant: every accumulator
// |acc| < 2^30, every shift in [-22, -1]) SMMULR(2 acc, m) and one shift with the output offset in
// the rounding nudge (as tpup_pointwise.cc); otherwise tpup_conv.h's Requant, the general integers.

#include <cstdint>
#include <cstring>

#include "tensorflow/lite/c/common.h"
#include "tensorflow/lite/micro/kernels/kernel_util.h"
#include "tensorflow/lite/micro/micro_context.h"
#include "tpup_conv.h"


namespace tpup {
namespace {

constexpr int kFcWords = 9, kInput = 0, kWeights = 1, kPacked = 3, kOutput = 0;
// The cheap requantisation proven exact; every row has the same multiplier and shift (per-tensor
// weights: the scale is set up once). Both derived from the op's constants by ir/fully_connected.py.
constexpr int32_t kFcFastRequant = 1, kFcOneScale = 2;

struct FcOptions {
  int32_t format, version, flags, input_offset, output_offset, act_min, act_max, activation, keep_num_dims;
};
static_assert(sizeof(FcOptions) == kFcWords * 4, "the options' word layout");

bool ReadFc(const TfLiteNode* node, FcOptions* o) {
  if (!ReadOptionWords(node, kFcWords, reinterpret_cast<int32_t*>(o))) return false;
  return o->format == 1 && (o->flags & ~(kFcFastRequant | kFcOneScale)) == 0 && o->act_min <= o->act_max;
}

// Words of input 3 for M rows of N inputs: per row bias, multiplier, shift; then the int16 pairs.
int PackedWords(int M, int N) { return 3 * M + (M / 4 * 4) * (N / 4 * 4) / 2; }

int Elements(const TfLiteIntArray* dims) {
  int n = 1;
  for (int i = 0; i < dims->size; ++i) n *= dims->data[i];
  return n;
}

// Row r's scale: its own, or (kOne) the first row's, which the caller set up once.
template <bool kOne, typename Scale>
inline Scale ScaleOf(const Scale& first, const int32_t* mult, const int32_t* shift, int r, int32_t out_offset) {
  return kOne ? first : Scale(mult[r], shift[r], out_offset);
}

// One batch row: M outputs from N inputs. `packed` is input 3 (ir/fully_connected.py
// packed_constant), 4-aligned (Prepare checks it: LDM needs it).
template <typename Scale, bool kOne, bool kFull>
void Row(const FcOptions& o, int M, int N, const int8_t* x, const int8_t* w8, const int32_t* packed, int8_t* out) {
  const int32_t* bias = packed;
  const int32_t* mult = packed + M;
  const int32_t* shift = packed + 2 * M;
  const Scale first(mult[0], shift[0], o.output_offset);
  const int32_t lo = o.act_min, hi = o.act_max;
  int r = 0;
#if defined(TPUP_HAVE_ROWS4)
  const int32_t* pairs = packed + 3 * M;
  const int N4 = N / 4 * 4;
  for (; r + 4 <= M; r += 4, pairs += 2 * N4) {
    int32_t a[4] = {bias[r], bias[r + 1], bias[r + 2], bias[r + 3]};
    Mac4Rows(x, pairs, N4 / 4, a);
    for (int k = N4; k < N; ++k) {
      const int32_t v = x[k];
      for (int j = 0; j < 4; ++j) a[j] += w8[(r + j) * N + k] * v;
    }
    for (int j = 0; j < 4; ++j) {
      out[r + j] = Narrow8<kFull>(ScaleOf<kOne>(first, mult, shift, r + j, o.output_offset)(a[j]), lo, hi);
    }
  }
#endif
  for (; r < M; ++r) {
    const int32_t acc = DotInt8(w8 + r * N, x, N, bias[r]);
    out[r] = Narrow8<kFull>(ScaleOf<kOne>(first, mult, shift, r, o.output_offset)(acc), lo, hi);
  }
}

template <typename Scale>
void Rows(const FcOptions& o, int batches, int M, int N, const int8_t* x, const int8_t* w8, const int32_t* packed,
          int8_t* out) {
  const bool one = (o.flags & kFcOneScale) != 0, full = o.act_min == -128 && o.act_max == 127;
  for (int b = 0; b < batches; ++b, x += N, out += M) {
    if (one) {
      full ? Row<Scale, true, true>(o, M, N, x, w8, packed, out) : Row<Scale, true, false>(o, M, N, x, w8, packed, out);
    } else {
      full ? Row<Scale, false, true>(o, M, N, x, w8, packed, out)
           : Row<Scale, false, false>(o, M, N, x, w8, packed, out);
    }
  }
}

void* Init(TfLiteContext*, const char*, size_t) { return nullptr; }

TfLiteStatus Prepare(TfLiteContext* context, TfLiteNode* node) {
  FcOptions o;
  TF_LITE_ENSURE_MSG(context, ReadFc(node, &o), "TPUP fully connected: invalid options");
  TF_LITE_ENSURE_EQ(context, node->inputs->size, 4);
  TF_LITE_ENSURE_EQ(context, node->outputs->size, 1);
  tflite::MicroContext* mc = tflite::GetMicroContext(context);
  TfLiteTensor* input = mc->AllocateTempInputTensor(node, kInput);
  TfLiteTensor* weights = mc->AllocateTempInputTensor(node, kWeights);
  TfLiteTensor* packed = mc->AllocateTempInputTensor(node, kPacked);
  TfLiteTensor* output = mc->AllocateTempOutputTensor(node, kOutput);
  bool ok = input != nullptr && weights != nullptr && packed != nullptr && output != nullptr &&
            input->type == kTfLiteInt8 && weights->type == kTfLiteInt8 && output->type == kTfLiteInt8 &&
            packed->type == kTfLiteInt32 && weights->dims->size == 2 && packed->dims->size == 1;
  if (ok) {
    const int M = weights->dims->data[0], N = weights->dims->data[1];
    const int batches = N > 0 ? Elements(input->dims) / N : 0;
    ok = N > 0 && batches * N == Elements(input->dims) && Elements(output->dims) == batches * M &&
         packed->dims->data[0] == PackedWords(M, N) && (reinterpret_cast<uintptr_t>(packed->data.data) & 3) == 0;
  }
  for (TfLiteTensor* t : {output, packed, weights, input}) {
    if (t != nullptr) mc->DeallocateTempTfLiteTensor(t);
  }
  TF_LITE_ENSURE_MSG(context, ok,
                     "TPUP fully connected: needs int8 [batches, N] -> [batches, M], int8 [M, N] weights and "
                     "their packed int32 constant, 4-aligned");
  node->user_data = nullptr;
  return kTfLiteOk;
}

TfLiteStatus Eval(TfLiteContext* context, TfLiteNode* node) {
  FcOptions o;
  TF_LITE_ENSURE(context, ReadFc(node, &o));
  const TfLiteEvalTensor* input = tflite::micro::GetEvalInput(context, node, kInput);
  const TfLiteEvalTensor* weights = tflite::micro::GetEvalInput(context, node, kWeights);
  const TfLiteEvalTensor* packed = tflite::micro::GetEvalInput(context, node, kPacked);
  TfLiteEvalTensor* output = tflite::micro::GetEvalOutput(context, node, kOutput);
  const int M = weights->dims->data[0], N = weights->dims->data[1], batches = Elements(input->dims) / N;
  const int8_t* x = tflite::micro::GetTensorData<int8_t>(input);
  const int8_t* w = tflite::micro::GetTensorData<int8_t>(weights);
  const int32_t* p = tflite::micro::GetTensorData<int32_t>(packed);
  int8_t* y = tflite::micro::GetTensorData<int8_t>(output);
  if (o.flags & kFcFastRequant) {
    Rows<RowScaleFast>(o, batches, M, N, x, w, p, y);
  } else {
    Rows<RowScaleExact>(o, batches, M, N, x, w, p, y);
  }
  return kTfLiteOk;
}

}  // namespace

const TFLMRegistration* Register_FULLY_CONNECTED() {
  static const TFLMRegistration r = tflite::micro::RegisterOp(Init, Prepare, Eval);
  return &r;
}

}  // namespace tpup
