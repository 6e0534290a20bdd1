// The harness's own 1x1 convolution (flag "pointwise", tpu_pipeline/toolchain/ir/kernels.py):
// int8, a 1x1 window, no padding, any stride. Bit-identical to TFLite Micro's ConvPerChannel (and
// CMSIS-NN's): the same exact int32 sums, then tflite::MultiplyByQuantizedMultiplier's integers.
//
// Why faster than CMSIS-NN's 1x1 kernel: two output pixels at a time are widened once to int16
// (input offset added, lanes 0,2 and 1,3 of each word as SXTB16 gives them) and reused by every
// output channel; the inner loop (inline assembly) takes two channels x two pixels per pass: one
// LDM of the widened input and one word of each channel's int8 weights (SXTB16 lanes in the same
// order, so no reordering of the weights), four SMLADs per widened weight word. The widened pair
// lives in the output's own bytes, in the part no pixel has been written to yet (the output never
// overlaps the input here: an overlapped op runs into a ring): no buffer in the arena. The last
// pixels, whose bytes hold it, and outputs too small for it take a 2x2 loop that widens both
// operands in place, the input offset folded into the accumulators as offset x weight sum.
//
// Requantisation: where kernels.py proved it exact for the op (options flag kFlagFastRequant:
// every accumulator |acc| < 2^30, every channel's shift in [-22, -1]),
// SaturatingRoundingDoublingHighMul(acc, m) is SMMULR(2 acc, m) and the rounding right shift by r
// with the output offset added is (h + 2^(r-1) + offset 2^r + (h >> 31)) >> r (round half away
// from zero; no overflow in those bounds). Otherwise tpup_conv.h's Requant, the general integers.
//
// Flag "pointwise16" (ir/kernel_variants/pointwise16.py) runs the same pixel walk on weights
// re-laid offline as int16 pairs (its input 4): no SXTB16 in the loop, three channels x two pixels
// a pass (LDRD of both pixels' widened pair-word, LDM of three channels' weight words, six
// SMLADs), each triple's bias and requantisation constants in its header; the widened pair on the
// stack up to 512 input channels (every pixel a pass, a lone pixel paired with itself), else in
// the output's bytes as above.

#include <cstdint>
#include <cstring>

#include "tpup_conv.h"

#if defined(__ARM_FEATURE_DSP) && defined(__ARM_FEATURE_SIMD32)
#include <arm_acle.h>  // (ACLE: __sxtb16, __sadd16, __smlad)
#define TPUP_DSP 1
#endif

namespace tpup {

bool PointwiseFits(const ConvOptions& o, const ConvGeometry& g) {
  return g.k_h == 1 && g.k_w == 1 && o.pad_top == 0 && o.pad_left == 0;
}

namespace {

// One channel's requantisation with the output offset (before the activation clamp).
struct ExactScale {
  Requant q;
  int32_t offset;
  ExactScale(const ConvOptions& o, int32_t m, int32_t s) : q(m, s), offset(o.output_offset) {}
  int32_t operator()(int32_t acc) const { return q(acc) + offset; }
};

#if defined(TPUP_DSP)
inline int32_t Smmulr(int32_t a, int32_t b) {
  int32_t r;
  __asm__("smmulr %0, %1, %2" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

struct FastScale {
  int32_t m, right, nudge;
  FastScale(const ConvOptions& o, int32_t mult, int32_t shift)
      : m(mult), right(-shift), nudge((1 << (-shift - 1)) + o.output_offset * (1 << -shift)) {}
  int32_t operator()(int32_t acc) const {
    const int32_t h = Smmulr(acc * 2, m);
    return (h + nudge + (h >> 31)) >> right;
  }
};

// The activation clamp: the int8 range alone (kFull: no activation) is one SSAT.
template <bool kFull>
inline int8_t Narrow(int32_t v, int32_t lo, int32_t hi) {
  if (kFull) return static_cast<int8_t>(__ssat(v, 8));
  return Clamp(v, lo, hi);
}
#endif

#if defined(TPUP_DSP)
// (the compiler folds the rotation into SXTB16's operand)
inline int32_t Ror8(int32_t x) {
  const uint32_t u = static_cast<uint32_t>(x);
  return static_cast<int32_t>(u >> 8 | u << 24);
}
#endif

inline int32_t Load32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);  // (an unaligned LDR: the cores this runs on allow it)
  return v;
}

// Where output pixel p's input lies: pixels step through rows of out_w, strided.
struct PixelWalk {
  const int8_t* in;
  int out_w, step_x, step_y;
  PixelWalk(const ConvOptions& o, const ConvGeometry& g, const int8_t* input)
      : in(input), out_w(g.out_w), step_x(o.stride_w * g.in_c), step_y(o.stride_h * g.in_w * g.in_c) {}
  const int8_t* At(int p) const { return in + (p / out_w) * step_y + (p % out_w) * step_x; }
};

// One pixel, all channels, no buffer: the reference kernel's integers, one MAC at a time on cores
// without the DSP extension, else four at a time.
template <typename Scale>
void OnePixel(const ConvOptions& o, const ConvGeometry& g, const int8_t* x, const int8_t* filter,
              const int32_t* bias, const int32_t* requant, int8_t* out) {
  const int C = g.in_c;
  for (int c = 0; c < g.out_c; ++c) {
    const int8_t* w = filter + c * C;
    int32_t acc = bias != nullptr ? bias[c] : 0;
    int k = 0;
#if defined(TPUP_DSP)
    const int32_t offset2 = static_cast<int32_t>((static_cast<uint32_t>(o.input_offset) & 0xFFFF) * 0x10001u);
    for (; k + 4 <= C; k += 4) {
      const int32_t a = Load32(x + k), u = Load32(w + k);
      acc = __smlad(__sadd16(__sxtb16(a), offset2), __sxtb16(u), acc);
      acc = __smlad(__sadd16(__sxtb16(Ror8(a)), offset2), __sxtb16(Ror8(u)), acc);
    }
#endif
    for (; k < C; ++k) acc += w[k] * (x[k] + o.input_offset);
    out[c] = Clamp(Scale(o, requant[c], requant[g.out_c + c])(acc), o.act_min, o.act_max);
  }
}

#if defined(TPUP_DSP)
// Two pixels' channels as int16 with the input offset added, per four channels the words
// [a 0,2][a 1,3][b 0,2][b 1,3] (the pointwise pass), or with kInterleaved [a 0,2][b 0,2][a 1,3][b 1,3]
// (the pointwise16 pass, flag "pointwise16", ir/kernel_variants/pointwise16.py: one LDRD gives a
// pair-word of both pixels); a last group of fewer than four zero-padded.
template <bool kInterleaved>
void WidenPair(const int8_t* a, const int8_t* b, int C, int32_t input_offset, int32_t* buf) {
  constexpr int kOdd = kInterleaved ? 2 : 1, kB = kInterleaved ? 1 : 2;  // words of a's 1,3 and of b's 0,2
  const int32_t offset2 = static_cast<int32_t>((static_cast<uint32_t>(input_offset) & 0xFFFF) * 0x10001u);
  int k = 0;
  for (; k + 4 <= C; k += 4, buf += 4) {
    const int32_t x = Load32(a + k), y = Load32(b + k);
    buf[0] = __sadd16(__sxtb16(x), offset2);  // (stored in this order: both passes' code as before)
    buf[1] = __sadd16(__sxtb16(kInterleaved ? y : Ror8(x)), offset2);
    buf[2] = __sadd16(__sxtb16(kInterleaved ? Ror8(x) : y), offset2);
    buf[3] = __sadd16(__sxtb16(Ror8(y)), offset2);
  }
  if (k < C) {
    int16_t lanes[8] = {};  // the same words' int16 lanes
    static const int kLane[4] = {0, 2 * kOdd, 1, 2 * kOdd + 1};
    for (int j = 0; k + j < C; ++j) {
      lanes[kLane[j]] = static_cast<int16_t>(a[k + j] + input_offset);
      lanes[2 * kB + kLane[j]] = static_cast<int16_t>(b[k + j] + input_offset);
    }
    std::memcpy(buf, lanes, sizeof(lanes));
  }
}

// A channel's weights [k, C) (fewer than four) as one zero-padded word.
inline int32_t TailWord(const int8_t* w, int k, int C) {
  uint32_t v = 0;
  for (int j = 0; k + j < C; ++j) v |= static_cast<uint32_t>(static_cast<uint8_t>(w[k + j])) << (8 * j);
  return static_cast<int32_t>(v);
}

// Accumulators [pixel a, pixel b] of channel c0 (a0, b0), then of c1 (a1, b1).
struct Acc4 {
  int32_t a0, b0, a1, b1;
};

// Acc4 += the widened pair `x` (`groups` groups of four input channels) times channels c0, c1's
// int8 weights (w0, w1). Inline assembly: the loop needs 14 registers (4 accumulators, the 4
// widened input words one LDM loads, a weight word's two SXTB16 halves, 3 pointers and the
// count), which the compiler does not find for the same C (it spills accumulators in the loop).
#define TPUP_PW_GROUP                              \
  "ldmia %[x]!, {r8-r11}\n\t"                      \
  "ldr %[t], [%[w0]], #4\n\t"                      \
  "sxtb16 %[u], %[t]\n\t"                          \
  "sxtb16 %[t], %[t], ror #8\n\t"                  \
  "smlad %[a0], r8, %[u], %[a0]\n\t"               \
  "smlad %[a0], r9, %[t], %[a0]\n\t"               \
  "smlad %[b0], r10, %[u], %[b0]\n\t"              \
  "smlad %[b0], r11, %[t], %[b0]\n\t"              \
  "ldr %[t], [%[w1]], #4\n\t"                      \
  "sxtb16 %[u], %[t]\n\t"                          \
  "sxtb16 %[t], %[t], ror #8\n\t"                  \
  "smlad %[a1], r8, %[u], %[a1]\n\t"               \
  "smlad %[a1], r9, %[t], %[a1]\n\t"               \
  "smlad %[b1], r10, %[u], %[b1]\n\t"              \
  "smlad %[b1], r11, %[t], %[b1]\n\t"
#define TPUP_PW_OPERANDS                                                                                    \
  [a0] "+r"(a.a0), [b0] "+r"(a.b0), [a1] "+r"(a.a1), [b1] "+r"(a.b1), [x] "+r"(x), [w0] "+r"(w0), \
      [w1] "+r"(w1), [n] "+r"(n), [t] "=&r"(t), [u] "=&r"(u)

inline void MacPair(const int32_t* x, const int8_t* w0, const int8_t* w1, int groups, Acc4& a) {
  int32_t t, u, n = groups >> 1;
  if (groups & 1) {
    __asm__ volatile(TPUP_PW_GROUP : TPUP_PW_OPERANDS : : "r8", "r9", "r10", "r11", "memory");
  }
  if (n > 0) {
    __asm__ volatile("1:\n\t" TPUP_PW_GROUP TPUP_PW_GROUP "subs %[n], %[n], #1\n\t"
                     "bne 1b\n\t"
                     : TPUP_PW_OPERANDS
                     :
                     : "r8", "r9", "r10", "r11", "cc", "memory");
  }
}
#undef TPUP_PW_GROUP
#undef TPUP_PW_OPERANDS

// The last group of fewer than four input channels (`tail`: its widened words, zero-padded).
inline void MacTail(const int32_t* tail, int32_t u, int32_t v, Acc4& a) {
  const int32_t u02 = __sxtb16(u), u13 = __sxtb16(Ror8(u)), v02 = __sxtb16(v), v13 = __sxtb16(Ror8(v));
  a.a0 = __smlad(tail[1], u13, __smlad(tail[0], u02, a.a0));
  a.b0 = __smlad(tail[3], u13, __smlad(tail[2], u02, a.b0));
  a.a1 = __smlad(tail[1], v13, __smlad(tail[0], v02, a.a1));
  a.b1 = __smlad(tail[3], v13, __smlad(tail[2], v02, a.b1));
}

// Output pixels a and b (at `oa`, `ob`) from the widened pair `buf`; an odd last channel is
// computed as the pair (K - 2, K - 1), channel K - 2's bytes written again (the same).
template <typename Scale, bool kFull>
void PixelPair(const ConvOptions& o, const ConvGeometry& g, const int32_t* buf, const int8_t* filter,
               const int32_t* bias, const int32_t* requant, int8_t* oa, int8_t* ob) {
  const int C = g.in_c, K = g.out_c, full = C / 4;
  const int32_t* tail = buf + 4 * full;
  const int32_t lo = o.act_min, hi = o.act_max;
  for (int c = 0; c < K; c += 2) {
    if (c + 2 > K) c = K - 2;
    const int8_t* w0 = filter + c * C;
    const int8_t* w1 = w0 + C;
    const int32_t b0 = bias != nullptr ? bias[c] : 0, b1 = bias != nullptr ? bias[c + 1] : 0;
    Acc4 a = {b0, b0, b1, b1};
    MacPair(buf, w0, w1, full, a);
    if (full * 4 < C) MacTail(tail, TailWord(w0, full * 4, C), TailWord(w1, full * 4, C), a);
    const Scale s0(o, requant[c], requant[K + c]), s1(o, requant[c + 1], requant[K + c + 1]);
    oa[c] = Narrow<kFull>(s0(a.a0), lo, hi);
    ob[c] = Narrow<kFull>(s0(a.b0), lo, hi);
    oa[c + 1] = Narrow<kFull>(s1(a.a1), lo, hi);
    ob[c + 1] = Narrow<kFull>(s1(a.b1), lo, hi);
  }
}

// Acc4 += the same products without the widened pair: pixels a at `x` and b at x + C (adjacent),
// channels c0 at `w` and c1 at w + C, both widened in the loop, no input offset (the caller folds
// offset x the weights' sum into the accumulators' start).
#define TPUP_PW_DIRECT_GROUP                 \
  "ldr %[t], [%[x], %[C]]\n\t"               \
  "sxtb16 %[p2], %[t]\n\t"                   \
  "sxtb16 %[p3], %[t], ror #8\n\t"           \
  "ldr %[t], [%[x]], #4\n\t"                 \
  "sxtb16 %[p0], %[t]\n\t"                   \
  "sxtb16 %[p1], %[t], ror #8\n\t"           \
  "ldr %[t], [%[w], %[C]]\n\t"               \
  "sxtb16 %[u], %[t]\n\t"                    \
  "sxtb16 %[t], %[t], ror #8\n\t"            \
  "smlad %[a1], %[p0], %[u], %[a1]\n\t"      \
  "smlad %[a1], %[p1], %[t], %[a1]\n\t"      \
  "smlad %[b1], %[p2], %[u], %[b1]\n\t"      \
  "smlad %[b1], %[p3], %[t], %[b1]\n\t"      \
  "ldr %[t], [%[w]], #4\n\t"                 \
  "sxtb16 %[u], %[t]\n\t"                    \
  "sxtb16 %[t], %[t], ror #8\n\t"            \
  "smlad %[a0], %[p0], %[u], %[a0]\n\t"      \
  "smlad %[a0], %[p1], %[t], %[a0]\n\t"      \
  "smlad %[b0], %[p2], %[u], %[b0]\n\t"      \
  "smlad %[b0], %[p3], %[t], %[b0]\n\t"
#define TPUP_PW_DIRECT_OPERANDS                                                                               \
  [a0] "+r"(a.a0), [b0] "+r"(a.b0), [a1] "+r"(a.a1), [b1] "+r"(a.b1), [x] "+r"(x), [w] "+r"(w), [n] "+r"(n), \
      [t] "=&r"(t), [u] "=&r"(u), [p0] "=&r"(p0), [p1] "=&r"(p1), [p2] "=&r"(p2), [p3] "=&r"(p3)

inline void MacDirect(const int8_t* x, const int8_t* w, int C, int groups, Acc4& a) {
  int32_t t, u, p0, p1, p2, p3, n = groups >> 1;
  if (groups & 1) {
    __asm__ volatile(TPUP_PW_DIRECT_GROUP : TPUP_PW_DIRECT_OPERANDS : [C] "r"(C) : "memory");
  }
  if (n > 0) {
    __asm__ volatile("1:\n\t" TPUP_PW_DIRECT_GROUP TPUP_PW_DIRECT_GROUP "subs %[n], %[n], #1\n\t"
                     "bne 1b\n\t"
                     : TPUP_PW_DIRECT_OPERANDS
                     : [C] "r"(C)
                     : "cc", "memory");
  }
}
#undef TPUP_PW_DIRECT_GROUP
#undef TPUP_PW_DIRECT_OPERANDS

// The sum of a channel's C weights.
int32_t WeightSum(const int8_t* w, int C) {
  int32_t sum = 0;
  int k = 0;
  for (; k + 4 <= C; k += 4) {
    const int32_t u = Load32(w + k);
    sum = __smlad(__sxtb16(u), 0x00010001, __smlad(__sxtb16(Ror8(u)), 0x00010001, sum));
  }
  for (; k < C; ++k) sum += w[k];
  return sum;
}

// Output pixels [p0, n) of a stride-1 call (adjacent pixels) without the widened pair: channel
// pairs outermost, so each channel's weight sum and scale are set up once. An odd last pixel is
// computed with the one before it, an odd last channel with the one before it (bytes written
// again, the same).
template <typename Scale, bool kFull>
void DirectPixels(const ConvOptions& o, const ConvGeometry& g, int p0, int n, const int8_t* in, const int8_t* filter,
                  const int32_t* bias, const int32_t* requant, int8_t* out) {
  const int C = g.in_c, K = g.out_c, groups = C / 4, rest = groups * 4;
  const int32_t lo = o.act_min, hi = o.act_max;
  for (int c = 0; c < K; c += 2) {
    if (c + 2 > K) c = K - 2;
    const int8_t* w0 = filter + c * C;
    const int8_t* w1 = w0 + C;
    const int32_t s0 = (bias != nullptr ? bias[c] : 0) + o.input_offset * WeightSum(w0, C);
    const int32_t s1 = (bias != nullptr ? bias[c + 1] : 0) + o.input_offset * WeightSum(w1, C);
    const Scale q0(o, requant[c], requant[K + c]), q1(o, requant[c + 1], requant[K + c + 1]);
    for (int p = p0; p < n; p += 2) {
      const int pa = p + 2 <= n ? p : n - 2;
      const int8_t* xa = in + pa * C;
      Acc4 a = {s0, s0, s1, s1};
      MacDirect(xa, w0, C, groups, a);
      for (int k = rest; k < C; ++k) {
        a.a0 += w0[k] * xa[k], a.b0 += w0[k] * xa[C + k];
        a.a1 += w1[k] * xa[k], a.b1 += w1[k] * xa[C + k];
      }
      int8_t* oa = out + pa * K;
      oa[c] = Narrow<kFull>(q0(a.a0), lo, hi);
      oa[K + c] = Narrow<kFull>(q0(a.b0), lo, hi);
      oa[c + 1] = Narrow<kFull>(q1(a.a1), lo, hi);
      oa[K + c + 1] = Narrow<kFull>(q1(a.b1), lo, hi);
    }
  }
}

// Accumulators [pixel a, pixel b] of channels c, c + 1, c + 2.
struct Acc6 {
  int32_t a0, b0, a1, b1, a2, b2;
};

// Acc6 += the interleaved pair `x` times three channels' int16 weight pairs at `w` (per pair-word
// the three channels' words: one LDM). Inline assembly: 8 instructions per 12 MACs (LDRD, LDM,
// six SMLADs), two groups of four input channels a loop pass; 14 registers, which the compiler
// does not find for the same C.
#define TPUP_PW3_STEP                     \
  "ldrd %[xa], %[xb], [%[x]], #8\n\t"     \
  "ldmia %[w]!, {r8, r9, r10}\n\t"        \
  "smlad %[a0], %[xa], r8, %[a0]\n\t"     \
  "smlad %[b0], %[xb], r8, %[b0]\n\t"     \
  "smlad %[a1], %[xa], r9, %[a1]\n\t"     \
  "smlad %[b1], %[xb], r9, %[b1]\n\t"     \
  "smlad %[a2], %[xa], r10, %[a2]\n\t"    \
  "smlad %[b2], %[xb], r10, %[b2]\n\t"
#define TPUP_PW3_OPERANDS                                                                                  \
  [a0] "+r"(a.a0), [b0] "+r"(a.b0), [a1] "+r"(a.a1), [b1] "+r"(a.b1), [a2] "+r"(a.a2), [b2] "+r"(a.b2), \
      [x] "+r"(x), [w] "+r"(w), [n] "+r"(n), [xa] "=&r"(xa), [xb] "=&r"(xb)

inline void Mac3(const int32_t* x, const int32_t* w, int groups, Acc6& a) {
  int32_t xa, xb, n = groups >> 1;
  if (groups & 1) {
    __asm__ volatile(TPUP_PW3_STEP TPUP_PW3_STEP : TPUP_PW3_OPERANDS : : "r8", "r9", "r10", "memory");
  }
  if (n > 0) {
    __asm__ volatile("1:\n\t" TPUP_PW3_STEP TPUP_PW3_STEP TPUP_PW3_STEP TPUP_PW3_STEP "subs %[n], %[n], #1\n\t"
                     "bne 1b\n\t"
                     : TPUP_PW3_OPERANDS
                     :
                     : "r8", "r9", "r10", "cc", "memory");
  }
}
#undef TPUP_PW3_STEP
#undef TPUP_PW3_OPERANDS

// One output of the pointwise16 pass: acc requantised with its channel's multiplier m and right
// shift r (and, for FastScale, the rounding nudge with the output offset, precomputed offline), clamped.
template <typename Scale, bool kFull>
inline int8_t Out3(const ConvOptions& o, int32_t acc, int32_t m, int32_t r, int32_t nudge, int32_t lo, int32_t hi);

template <>
inline int8_t Out3<FastScale, true>(const ConvOptions&, int32_t acc, int32_t m, int32_t r, int32_t nudge, int32_t,
                                    int32_t) {
  const int32_t h = Smmulr(acc * 2, m);
  return static_cast<int8_t>(__ssat((h + nudge + (h >> 31)) >> r, 8));
}

template <>
inline int8_t Out3<FastScale, false>(const ConvOptions&, int32_t acc, int32_t m, int32_t r, int32_t nudge, int32_t lo,
                                     int32_t hi) {
  const int32_t h = Smmulr(acc * 2, m);
  return Clamp((h + nudge + (h >> 31)) >> r, lo, hi);
}

template <>
inline int8_t Out3<ExactScale, true>(const ConvOptions& o, int32_t acc, int32_t m, int32_t r, int32_t, int32_t,
                                     int32_t) {
  return static_cast<int8_t>(__ssat(Requant(m, -r)(acc) + o.output_offset, 8));
}

template <>
inline int8_t Out3<ExactScale, false>(const ConvOptions& o, int32_t acc, int32_t m, int32_t r, int32_t, int32_t lo,
                                      int32_t hi) {
  return Clamp(Requant(m, -r)(acc) + o.output_offset, lo, hi);
}

// Output pixels a and b from the interleaved pair `buf`, three channels a pass from the re-laid
// weights (per triple: its biases, multipliers, right shifts and rounding nudges, then its
// pair-words); the last triple is channels K - 3 .. K - 1 (bytes written before written again,
// the same).
template <typename Scale, bool kFull>
void PixelPair3(const ConvOptions& o, const ConvGeometry& g, const int32_t* buf, const int32_t* relaid, int8_t* oa,
                int8_t* ob) {
  const int K = g.out_c, groups = (g.in_c + 3) / 4, stride = kPointwise16Header + 6 * groups;
  const int32_t lo = o.act_min, hi = o.act_max;
  const int32_t* w = relaid;
  for (int c = 0; c < K; c += 3, w += stride) {
    if (c + 3 > K) c = K - 3;
    Acc6 a = {w[0], w[0], w[1], w[1], w[2], w[2]};
    Mac3(buf, w + kPointwise16Header, groups, a);
    const int32_t acc[6] = {a.a0, a.b0, a.a1, a.b1, a.a2, a.b2};
    for (int j = 0; j < 3; ++j) {
      const int32_t m = w[3 + j], r = w[6 + j], nudge = w[9 + j];
      oa[c + j] = Out3<Scale, kFull>(o, acc[2 * j], m, r, nudge, lo, hi);
      ob[c + j] = Out3<Scale, kFull>(o, acc[2 * j + 1], m, r, nudge, lo, hi);
    }
  }
}

// Pixels [0, stop) two at a time through the widened pair at `buf` (the output's last bytes):
// the pointwise pass, or with `relaid` weights the pointwise16 pass.
template <typename Scale, bool kFull>
void PairsThroughBuffer(const ConvOptions& o, const ConvGeometry& g, const PixelWalk& walk, int stop, int32_t* buf,
                        const int8_t* filter, const int32_t* bias, const int32_t* relaid, const int32_t* requant,
                        int8_t* out) {
  const int K = g.out_c;
  for (int p = 0; p + 2 <= stop; p += 2) {
    if (relaid != nullptr) {
      WidenPair<true>(walk.At(p), walk.At(p + 1), g.in_c, o.input_offset, buf);
      PixelPair3<Scale, kFull>(o, g, buf, relaid, out + p * K, out + (p + 1) * K);
    } else {
      WidenPair<false>(walk.At(p), walk.At(p + 1), g.in_c, o.input_offset, buf);
      PixelPair<Scale, kFull>(o, g, buf, filter, bias, requant, out + p * K, out + (p + 1) * K);
    }
  }
}

template <typename Scale, bool kFull>
void Run(const ConvOptions& o, const ConvGeometry& g, int n, const int8_t* in, const int8_t* filter,
         const int32_t* bias, const int32_t* relaid, const int32_t* requant, int8_t* out) {
  const PixelWalk walk(o, g, in);
  const int K = g.out_c, bytes = 16 * ((g.in_c + 3) / 4);  // the widened pair
  if (relaid != nullptr && K >= 3 && bytes <= 4 * kPointwise16StackWords) {  // the pair on the stack: every pixel a pass
    // (an odd last pixel with the one before it, written again the same; a lone pixel with itself:
    // a patch stage's one-pixel tiles, where OnePixel would sum every channel's weights again)
    int32_t pair[kPointwise16StackWords];
    for (int p = 0; p < n; p += 2) {
      const int a = p + 2 <= n ? p : (n >= 2 ? n - 2 : 0), b = n >= 2 ? a + 1 : a;
      WidenPair<true>(walk.At(a), walk.At(b), g.in_c, o.input_offset, pair);
      PixelPair3<Scale, kFull>(o, g, pair, relaid, out + a * K, out + b * K);
    }
    return;
  }
  if (K < (relaid != nullptr ? 3 : 2) || n < 2) {  // (the passes' channel blocks need two, three; a pair two pixels)
    for (int p = 0; p < n; ++p) OnePixel<Scale>(o, g, walk.At(p), filter, bias, requant, out + p * K);
    return;
  }
  // The pair lives in the output's last bytes (4-aligned); pixels [0, stop) are written before
  // any of them.
  const uintptr_t end = reinterpret_cast<uintptr_t>(out) + static_cast<uintptr_t>(n) * K;
  const uintptr_t at = (end - bytes) & ~static_cast<uintptr_t>(3);
  int p = 0;
  if (end >= reinterpret_cast<uintptr_t>(out) + bytes + 3) {
    const int stop = static_cast<int>((at - reinterpret_cast<uintptr_t>(out)) / K);
    PairsThroughBuffer<Scale, kFull>(o, g, walk, stop, reinterpret_cast<int32_t*>(at), filter, bias, relaid, requant,
                                     out);
    p = stop & ~1;
  }
  const bool adjacent = o.stride_w == 1 && (o.stride_h == 1 || g.out_h == 1) && g.in_w == g.out_w;
  if (adjacent && n >= 2 && p < n) {
    DirectPixels<Scale, kFull>(o, g, p, n, walk.At(0), filter, bias, requant, out);
    return;
  }
  for (; p < n; ++p) OnePixel<Scale>(o, g, walk.At(p), filter, bias, requant, out + p * K);
}
#endif

}  // namespace

void RunPointwise(const ConvOptions& o, const ConvGeometry& g, int out_rows, const int8_t* in, const int8_t* filter,
                  const int32_t* bias, const int32_t* requant, int8_t* out, const int32_t* relaid) {
  const int n = out_rows * g.out_w;
#if defined(TPUP_DSP)
  const bool full = o.act_min == -128 && o.act_max == 127;
  if (o.flags & (kFlagFastRequant | kFlagPointwise16FastRequant)) {
    (full ? Run<FastScale, true> : Run<FastScale, false>)(o, g, n, in, filter, bias, relaid, requant, out);
  } else {
    (full ? Run<ExactScale, true> : Run<ExactScale, false>)(o, g, n, in, filter, bias, relaid, requant, out);
  }
#else
  (void)relaid;  // (the re-laid weights need the DSP extension; the int8 filter gives the same sums)
  const PixelWalk walk(o, g, in);
  for (int p = 0; p < n; ++p) OnePixel<ExactScale>(o, g, walk.At(p), filter, bias, requant, out + p * g.out_c);
#endif
}

int Pointwise16Words(const ConvGeometry& g) { return (g.out_c + 2) / 3 * (kPointwise16Header + 6 * ((g.in_c + 3) / 4)); }

}  // namespace tpup
