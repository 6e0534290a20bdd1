// The harness's int8 ADD arithmetic, shared by TPUP_ADD (tpup_add.cc) and the patch stage's ADD
// step (tpup_stage.cc): reference_integer_ops::AddFunc's integers, each input's scaled term
// tabulated.
//
// AddFunc requantizes both inputs and the sum per element (about 80 instructions). Each input's
// scaled term depends on its own byte only, so from a call size (kAddTableMin for the stage,
// TPUP_ADD's own) both are tabulated once a call (256 int32s each, on the caller's stack) and an
// element takes two loads, an add and the sum's requantization: the same integers.
#pragma once

#include <cstdint>

#include "tensorflow/lite/kernels/internal/common.h"
#include "tensorflow/lite/kernels/internal/reference/integer_ops/add.h"
#include "tpup_conv.h"

namespace tpup {

// The patch stage's call size from which it tabulates: chosen when a fill took about 15 k
// instructions (AddFunc's arithmetic); `AddTable` takes about 5 k, from which TPUP_ADD tabulates
// at 128 elements (tpup_add.cc). The stage's cost rows were fitted at 256: it keeps it.
constexpr int kAddTableMin = 256;

// One input's scaled term for every byte v (index: v + 128), as AddFunc computes it:
// MultiplyByQuantizedMultiplierSmallerThanOneExp((offset + v) << left, m, shift). Where
// |offset + v| <= 256 and left <= 20 (int8 ADD: left 20, offsets -zero points), x = that shifted
// term has |2x| < 2^30, so SaturatingRoundingDoublingHighMul(x, m) = (x m + 2^30) >> 31 (gemmlowp's
// nudge and truncating division are that floor; its saturating case needs x = INT32_MIN) =
// SMMULR(2x, m), and RoundingDivideByPOT(h, e) = (h + 2^(e-1) - (h < 0)) >> e for e >= 1 (h for
// e = 0), as FastRequant (tpup_conv.h) rounds: the same integers at about 8 instructions an entry
// where the reference takes about 30.
__attribute__((always_inline)) inline void AddTable(int32_t offset, int32_t left, int32_t m, int32_t shift,
                                                    int32_t* t) {
  const int32_t e = -shift, half = e > 0 ? 1 << (e - 1) : 0, negative = e > 0 ? -1 : 0;
  for (int v = -128; v < 128; ++v) {
    const int32_t h = FastRequant::MulHighRounded((offset + v) * (1 << (left + 1)), m);
    t[v + 128] = (h + half + ((h >> 31) & negative)) >> e;
  }
}

// Both inputs' tables (`AddTable`; AddFunc's own arithmetic where its bounds do not hold);
// nothing unless `fill`.
__attribute__((always_inline)) inline void AddTables(const tflite::ArithmeticParams& p, int32_t* t1, int32_t* t2,
                                                     bool fill = true) {
  if (!fill) return;
  const bool fits = p.left_shift >= 0 && p.left_shift <= 20 && p.input1_offset >= -128 && p.input1_offset <= 128 &&
                    p.input2_offset >= -128 && p.input2_offset <= 128 && p.input1_shift <= 0 &&
                    p.input1_shift >= -31 && p.input2_shift <= 0 && p.input2_shift >= -31;
  if (fits) {
    AddTable(p.input1_offset, p.left_shift, p.input1_multiplier, p.input1_shift, t1);
    AddTable(p.input2_offset, p.left_shift, p.input2_multiplier, p.input2_shift, t2);
    return;
  }
  for (int v = 0; v < 256; ++v) {
    t1[v] = tflite::MultiplyByQuantizedMultiplierSmallerThanOneExp((p.input1_offset + v - 128) * (1 << p.left_shift),
                                                                   p.input1_multiplier, p.input1_shift);
    t2[v] = tflite::MultiplyByQuantizedMultiplierSmallerThanOneExp((p.input2_offset + v - 128) * (1 << p.left_shift),
                                                                   p.input2_multiplier, p.input2_shift);
  }
}

// Whether FastRequant (tpup_conv.h) requantizes every sum of the two tables exactly: each table is
// monotone in the byte (a non-negative multiplier), so its largest magnitude is at one end.
inline bool AddFastFits(const tflite::ArithmeticParams& p, const int32_t* t1, const int32_t* t2) {
  auto magnitude = [](const int32_t* t) {
    const int64_t lo = t[0] < 0 ? -int64_t{t[0]} : t[0], hi = t[255] < 0 ? -int64_t{t[255]} : t[255];
    return lo > hi ? lo : hi;
  };
  return FastRequant::Fits(magnitude(t1) + magnitude(t2), p.output_shift);
}

// n elements of a and b added from their tables, the sum requantized by `rq` (Requant, or
// FastRequant where AddFastFits), offset and clamped; `out` may be `a` or `b` (each element is
// read, then written).
template <typename R>
inline void AddLoop(const tflite::ArithmeticParams& p, const int32_t* t1, const int32_t* t2, const R& rq,
                    const int8_t* a, const int8_t* b, int n, int8_t* out) {
  const int32_t offset = p.output_offset, lo = p.quantized_activation_min, hi = p.quantized_activation_max;
  t1 += 128, t2 += 128;  // (indexed by the signed byte)
  for (int i = 0; i < n; ++i) {
    const int32_t y = rq(t1[a[i]] + t2[b[i]]) + offset;
    out[i] = static_cast<int8_t>(y < lo ? lo : (y > hi ? hi : y));
  }
}

}  // namespace tpup
