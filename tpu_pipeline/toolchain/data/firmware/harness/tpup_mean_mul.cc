// TPUP_MEAN and TPUP_MUL: TFLite Micro's int8 MEAN and MUL arithmetic in plain loops
// (tpu_pipeline/toolchain/ir/kernels.py, "means and products", describes them and their options).
//
// TFLite Micro's MEAN steps an index vector per input element (its generic reduction) and its
// broadcast MUL runs the 4-D "slow" loop: a squeeze-and-excitation block spends most of its time
// there. These compute the same integers: the requantization comes precomputed in the options
// (as TFLite Micro's Prepare computes it), so there is no persistent data and no scratch buffer.

#include <cstdint>
#include <cstring>

#include "tensorflow/lite/c/common.h"
#include "tensorflow/lite/kernels/internal/common.h"
#include "tensorflow/lite/micro/kernels/kernel_util.h"
#include "tensorflow/lite/micro/micro_log.h"
#include "tpup_conv.h"

#if defined(__ARM_FEATURE_DSP) && defined(__ARM_FEATURE_SIMD32)
#include <arm_acle.h>  // (ACLE: __sxtb16, __sadd16, __ssat)
#define TPUP_DSP 1
#endif

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
  return ReadOptionWords(node, kWords, reinterpret_cast<int32_t*>(o)) && o->format == 1;
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

// MEAN's and MUL's Prepare: the options read (`Read`), two inputs and one output; no persistent
// data, no scratch.
template <typename T, bool (*Read)(const TfLiteNode*, T*)>
TfLiteStatus Prepare(TfLiteContext* context, TfLiteNode* node) {
  T o;
  TF_LITE_ENSURE_MSG(context, Read(node, &o), "TPUP mean/mul: invalid options");
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

// out[i] = requantize((a[i] + a_offset) * (b[i % m] + b_offset)): b has every element (m = n), one
// per channel (m = the last axis) or one (m = 1). Runs in place too (each element read, then
// written). The exact loop, for what the fast one (MulFast) does not take.
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

#if defined(TPUP_DSP)
// The fast loop's requantization, exact where it is taken (MulFastFits): a product v of two int8
// values plus offsets has |v| <= 255 x 255, so with no left shift
//   SaturatingRoundingDoublingHighMul(v, M) == SMMULR(2v, M)          (|2v| < 2^31), and
//   RoundingDivideByPOT(h, e) + z == (h + 2^(e-1) + z x 2^e - (h < 0)) >> e   (e >= 1),
// where (h < 0) may be read as (v < 0): h = 0 whenever they differ, and then both give z. The
// sum stays below 2^30 for e <= 22 (|h| < 2^16), so SMMLAR adds the constant and the sign in one.
bool MulFastFits(const MulOptions& o) { return o.shift <= -1 && o.shift >= -22 && o.multiplier >= 0; }

inline int32_t Smmlar(int32_t a, int32_t b, int32_t acc) {
  int32_t r;
  __asm__("smmlar %0, %1, %2, %3" : "=r"(r) : "r"(a), "r"(b), "r"(acc));
  return r;
}

inline int32_t Load32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);  // (an unaligned LDR: the cores this runs on allow it)
  return v;
}

inline int32_t Pair(int32_t lo, int32_t hi) {
  return static_cast<int32_t>((static_cast<uint32_t>(lo) & 0xFFFF) | static_cast<uint32_t>(hi) << 16);
}

struct FastMul {
  int32_t multiplier, e, rounding, act_min, act_max, a_offset;
  int32_t zero_in, zero_out;  // four a's at their zero point, and the four outputs they give
};

inline int32_t Smulbb(int32_t a, int32_t b) {
  int32_t r;
  __asm__("smulbb %0, %1, %2" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

inline int32_t Smultt(int32_t a, int32_t b) {
  int32_t r;
  __asm__("smultt %0, %1, %2" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

inline int32_t Sxtb16Ror8(int32_t x) {
  int32_t r;
  __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(x));
  return r;
}

// `count` words of four lanes `stride` bytes apart, lane k multiplied by bv[k]: the a's sign-
// extended in pairs (0 and 2, 1 and 3) with the offset added (SADD16: |a + offset| <= 255), times
// the lanes' 2 x bv. A word of four zero points (ReLU's zeros) gives four known outputs.
// (Everything in locals: the int8 stores may alias any memory the compiler would reload.)
template <bool kFullRange>
void Lanes(const FastMul& f, const int8_t* a, int8_t* out, int stride, int count, const int32_t* bv) {
  const int32_t p02 = Pair(2 * bv[0], 2 * bv[2]), p13 = Pair(2 * bv[1], 2 * bv[3]);
  const int32_t offset2 = Pair(f.a_offset, f.a_offset), zero_in = f.zero_in, zero_out = f.zero_out;
  const int32_t m = f.multiplier, e = f.e, k = f.rounding, lo = f.act_min, hi = f.act_max;
  auto finish = [=](int32_t v2) -> int8_t {
    const int32_t r = Smmlar(v2, m, k + (v2 >> 31)) >> e;
    if (kFullRange) return static_cast<int8_t>(__ssat(r, 8));
    return static_cast<int8_t>(r < lo ? lo : (r > hi ? hi : r));
  };
  for (const int8_t* end = a + count * stride; a != end; a += stride, out += stride) {
    const int32_t x = Load32(a);
    if (x == zero_in) {
      std::memcpy(out, &zero_out, 4);
      continue;
    }
    const int32_t x02 = __sadd16(__sxtb16(x), offset2), x13 = __sadd16(Sxtb16Ror8(x), offset2);
    out[0] = finish(Smulbb(x02, p02));
    out[2] = finish(Smultt(x02, p02));
    out[1] = finish(Smulbb(x13, p13));
    out[3] = finish(Smultt(x13, p13));
  }
}

// The broadcast products (m = 1, or one b per channel, m = the last axis) four lanes at a time;
// channels left over from groups of four, and equal shapes, on the exact loop.
template <bool kFullRange>
void MulFast(const MulOptions& o, const int8_t* a, int32_t a_offset, const int8_t* b, int32_t b_offset, int n, int m,
             int8_t* out) {
  FastMul f;
  f.multiplier = o.multiplier, f.e = -o.shift, f.act_min = o.act_min, f.act_max = o.act_max, f.a_offset = a_offset;
  f.rounding = (1 << (f.e - 1)) + o.output_offset * (1 << f.e);
  const uint32_t zero = static_cast<uint8_t>(-a_offset), z = static_cast<uint8_t>(Clamp(o.output_offset, o.act_min, o.act_max));
  f.zero_in = static_cast<int32_t>(zero * 0x01010101u), f.zero_out = static_cast<int32_t>(z * 0x01010101u);
  if (m == 1) {
    const int32_t v = b[0] + b_offset, bv[4] = {v, v, v, v};
    Lanes<kFullRange>(f, a, out, 4, n / 4, bv);
    const int done = n / 4 * 4;
    MulLoop(o, a + done, a_offset, b, b_offset, n - done, 1, out + done);
    return;
  }
  const int rows = n / m;
  int c = 0;
  for (; c + 4 <= m; c += 4) {
    const int32_t bv[4] = {b[c] + b_offset, b[c + 1] + b_offset, b[c + 2] + b_offset, b[c + 3] + b_offset};
    Lanes<kFullRange>(f, a + c, out + c, m, rows, bv);
  }
  const Requant requant(o.multiplier, o.shift);
  for (; c < m; ++c) {  // (a column each, exact)
    const int32_t bv = b[c] + b_offset;
    for (int r = 0, i = c; r < rows; ++r, i += m) {
      out[i] = Clamp(requant((a[i] + a_offset) * bv) + o.output_offset, o.act_min, o.act_max);
    }
  }
}
#endif

void Mul(const MulOptions& o, const int8_t* a, int32_t a_offset, const int8_t* b, int32_t b_offset, int n, int m,
         int8_t* out) {
#if defined(TPUP_DSP)
  if (m != n && MulFastFits(o)) {
    if (o.act_min == -128 && o.act_max == 127) {
      MulFast<true>(o, a, a_offset, b, b_offset, n, m, out);
    } else {
      MulFast<false>(o, a, a_offset, b, b_offset, n, m, out);
    }
    return;
  }
#endif
  MulLoop(o, a, a_offset, b, b_offset, n, m, out);
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
  Mul(o, tflite::micro::GetTensorData<int8_t>(big), swap ? o.input2_offset : o.input1_offset,
          tflite::micro::GetTensorData<int8_t>(small), swap ? o.input1_offset : o.input2_offset, n, m, tflite::micro::GetTensorData<int8_t>(output));
  return kTfLiteOk;
}

}  // namespace

const TFLMRegistration* Register_MEAN() {
  static const TFLMRegistration r = tflite::micro::RegisterOp(Init, Prepare<MeanOptions, ReadMean>, EvalMean);
  return &r;
}

const TFLMRegistration* Register_MUL() {
  static const TFLMRegistration r = tflite::micro::RegisterOp(Init, Prepare<MulOptions, ReadMul>, EvalMul);
  return &r;
}

}  // namespace tpup
