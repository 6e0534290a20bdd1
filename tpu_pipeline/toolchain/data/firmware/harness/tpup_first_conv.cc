// The harness's convolution for few input channels (flag "packed", tpu_pipeline/toolchain/ir/kernels.py):
// a model's first layer (3 input channels, 3x3, stride 2) and its like. Bit-identical to TFLite
// Micro's ConvPerChannel (and CMSIS-NN's): the same exact int32 sums, then
// tflite::MultiplyByQuantizedMultiplier's integers (FastRequant's where the layer's weights bound
// every sum small enough, tpup_conv.h).
//
// Why faster than CMSIS-NN's im2col kernel there: that kernel copies each window tap by tap (one
// call per tap of 3 channels) and multiplies in groups of four values, which 27 is not. Here the
// windows of two neighbouring output pixels A and B are packed once into int16 pairs, interleaved
// (word 2k is A's pair k, word 2k + 1 B's): a window's kh rows of kw x C contiguous bytes, SXTB16
// on whole words ((b0, b2), (b1, b3)), the bytes a row has past a multiple of four paired at the
// end. The weights were packed offline in the same order with two output channels interleaved
// (input 4, int32 [out_c, 1 + pairs], ir/kernel_variants/packed.py: per channel pair the two
// biases with the input offset folded in, bias + offset x sum(w), then per pair k the two
// channels' pair k; a last odd channel alone as bias then pairs). So one LDRD gives A's and B's
// pair k, one more the two channels', and four SMLADs use them: two pixels x two channels x two
// taps. Padding taps hold the input's zero point, which the folded offset cancels: the same sum.
// No buffer in the arena (the windows live on the stack).

#include <cstdint>
#include <cstring>

#include "tpup_conv.h"

#if defined(__ARM_FEATURE_DSP) && defined(__ARM_FEATURE_SIMD32)
#include <arm_acle.h>  // (ACLE: __sxtb16, __smlad, __ssat)
#define TPUP_DSP 1
#endif

namespace tpup {

int PackedPairs(int k_h, int k_w, int in_c) {
  const int row = k_w * in_c;
  return k_h * (row / 4) * 2 + (k_h * (row % 4) + 1) / 2;
}

bool PackedFits(const ConvOptions& o, const ConvGeometry& g) {
  return o.dilation_h == 1 && o.dilation_w == 1 && g.k_w * g.in_c <= kPackedMaxRow &&
         PackedPairs(g.k_h, g.k_w, g.in_c) <= kPackedMaxPairs;
}

namespace {

inline int32_t Pair(int32_t lo, int32_t hi) {
#if defined(__ARM_FEATURE_DSP)
  int32_t r;
  __asm__("pkhbt %0, %1, %2, lsl #16" : "=r"(r) : "r"(lo), "r"(hi));  // (one instruction where the compiler takes two)
  return r;
#else
  return static_cast<int32_t>((static_cast<uint32_t>(lo) & 0xFFFF) | static_cast<uint32_t>(hi) << 16);
#endif
}

inline int32_t Load32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);  // (an unaligned LDR: the cores this runs on allow it)
  return v;
}

// A word's bytes as the int16 pairs (b0, b2) and (b1, b3).
inline int32_t Even(int32_t x) {
#if defined(TPUP_DSP)
  return __sxtb16(x);
#else
  return Pair(static_cast<int8_t>(x), static_cast<int8_t>(x >> 16));
#endif
}
inline int32_t Odd(int32_t x) {
#if defined(TPUP_DSP)
  int32_t r;
  __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(x));  // (the compiler rotates in an instruction of its own)
  return r;
#else
  return Pair(static_cast<int8_t>(x >> 8), static_cast<int8_t>(x >> 24));
#endif
}

// The window of the output pixel whose top-left tap is input (iy0, ix0) as int16 pairs into
// win[0], win[2], ... (the order packed.py packs the weights in). Taps outside the input read the
// zero point. A tail pair's high half, where the row bytes run out, is any value: its weight is 0.
void PackWindow(const ConvGeometry& g, const int8_t* in, int iy0, int ix0, int8_t zero_point, int32_t* win) {
  const int row = g.k_w * g.in_c, whole = row / 4 * 4;
  const bool inside = iy0 >= 0 && ix0 >= 0 && iy0 + g.k_h <= g.in_h && ix0 + g.k_w <= g.in_w;
  int8_t tail[4 * kPackedMaxPairs / 2 + 2];
  int8_t copy[kPackedMaxRow];
  int n = 0, t = 0;
  for (int ky = 0; ky < g.k_h; ++ky) {
    const int iy = iy0 + ky;
    const int8_t* p = in + (iy * g.in_w + ix0) * g.in_c;
    if (!inside) {  // the row with its padding, then packed as an inside one
      for (int kx = 0; kx < g.k_w; ++kx) {
        const int ix = ix0 + kx;
        const bool here = iy >= 0 && iy < g.in_h && ix >= 0 && ix < g.in_w;
        for (int c = 0; c < g.in_c; ++c) copy[kx * g.in_c + c] = here ? p[kx * g.in_c + c] : zero_point;
      }
      p = copy;
    }
    for (int j = 0; j < whole; j += 4, n += 4) {
      const int32_t x = Load32(p + j);
      win[n] = Even(x);
      win[n + 2] = Odd(x);
    }
    for (int j = whole; j < row; ++j) tail[t++] = p[j];
  }
  tail[t] = 0;
  for (int k = 0; k < t; k += 2, n += 2) win[n] = Pair(tail[k], tail[k + 1]);
}

// win[K], win[K + 1] = lo, hi: one STRD (the compiler stores the two words one by one)
template <int K>
inline void Store2(int32_t* win, int32_t lo, int32_t hi) {
#if defined(TPUP_DSP)
  __asm__ volatile("strd %1, %2, [%0, %3]" : : "r"(win), "r"(lo), "r"(hi), "i"(4 * K) : "memory");
#else
  win[K] = lo, win[K + 1] = hi;
#endif
}

// Both windows of pixels A (top-left tap at `a`) and B (`b`) of a 3 x 9-byte window (3x3 over 3
// channels), all taps inside the input: per row two words and a byte.
inline void PackRows9(const int8_t* a, const int8_t* b, int row_bytes, int32_t* win) {
#pragma GCC unroll 3
  for (int ky = 0; ky < 3; ++ky, a += row_bytes, b += row_bytes, win += 8) {
    const int32_t a0 = Load32(a), a1 = Load32(a + 4), b0 = Load32(b), b1 = Load32(b + 4);
    Store2<0>(win, Even(a0), Even(b0)), Store2<2>(win, Odd(a0), Odd(b0));
    Store2<4>(win, Even(a1), Even(b1)), Store2<6>(win, Odd(a1), Odd(b1));
  }
  a -= 3 * row_bytes, b -= 3 * row_bytes;
  Store2<0>(win, Pair(a[8], a[row_bytes + 8]), Pair(b[8], b[row_bytes + 8]));
  Store2<2>(win, a[2 * row_bytes + 8], b[2 * row_bytes + 8]);  // (high halves: weight 0)
}

constexpr int kPatchPixels = 8, kPatchBytes = 8 * 9 + 4;  // (a 3 x 9-byte window: in_c <= 9)

// Input rows [iy0, iy0 + 3) x pixels [ix0, ix0 + n) into `patch` (rows kPatchBytes apart), the
// zero point where they lie outside the input.
void Patch(const ConvGeometry& g, const int8_t* in, int iy0, int ix0, int n, int8_t zero_point, int8_t* patch) {
  const int C = g.in_c, bytes = n * C;
  const int first = (ix0 < 0 ? -ix0 : 0) * C;  // the bytes [first, last) of a row lie inside
  const int last = (ix0 + n > g.in_w ? g.in_w - ix0 : n) * C;
  for (int ky = 0; ky < 3; ++ky, patch += kPatchBytes) {
    const int iy = iy0 + ky;
    const int8_t* row = in + (iy * g.in_w + ix0) * C;
    const bool here = iy >= 0 && iy < g.in_h;
    const int from = here && first < bytes ? first : bytes, to = here ? last : bytes;  // (to < from: none)
    int j = 0;
    for (; j < from; ++j) patch[j] = zero_point;
    for (; j < to; ++j) patch[j] = row[j];
    for (; j < bytes; ++j) patch[j] = zero_point;
  }
}

#if defined(TPUP_DSP)
inline int32_t Dot(int32_t a, int32_t b, int32_t acc) { return __smlad(a, b, acc); }
#else
inline int32_t Dot(int32_t a, int32_t b, int32_t acc) {
  return acc + static_cast<int16_t>(a) * static_cast<int16_t>(b) + (a >> 16) * (b >> 16);
}
#endif

// The sums of channels c, c + 1 (weights `w`: their biases, then pair k of each) over pixels A and
// B (windows `win`, interleaved): acc = {A c, B c, A c+1, B c+1}. (A first layer whose clamp is
// the whole int8 range on Quick runs StreamPairs instead; this is the other clamps' and Exact's.)
template <int P>
__attribute__((always_inline)) inline void Block(const int32_t* w, const int32_t* win, int pairs, int32_t* acc) {
#if defined(TPUP_DSP)
  if (P == 14) {  // 3x3 over 3 channels: unrolled, 2 LDRD + 4 SMLAD a pair of taps
    int32_t a0, a1, b0, b1, x, y, u, v;
#define TPUP_STEP(K)                                 \
  "ldrd %[x], %[y], [%[win], #" #K " * 8]\n\t"        \
  "ldrd %[u], %[v], [%[w], #8 + " #K " * 8]\n\t"      \
  "smlad %[a0], %[x], %[u], %[a0]\n\t"               \
  "smlad %[a1], %[y], %[u], %[a1]\n\t"               \
  "smlad %[b0], %[x], %[v], %[b0]\n\t"               \
  "smlad %[b1], %[y], %[v], %[b1]\n\t"
    __asm__(
        "ldrd %[a0], %[b0], [%[w]]\n\t"
        "ldrd %[x], %[y], [%[win]]\n\t"
        "ldrd %[u], %[v], [%[w], #8]\n\t"
        "smlad %[a1], %[y], %[u], %[a0]\n\t"
        "smlad %[a0], %[x], %[u], %[a0]\n\t"
        "smlad %[b1], %[y], %[v], %[b0]\n\t"
        "smlad %[b0], %[x], %[v], %[b0]\n\t"
        TPUP_STEP(1) TPUP_STEP(2) TPUP_STEP(3) TPUP_STEP(4) TPUP_STEP(5) TPUP_STEP(6) TPUP_STEP(7)
        TPUP_STEP(8) TPUP_STEP(9) TPUP_STEP(10) TPUP_STEP(11) TPUP_STEP(12) TPUP_STEP(13)
        : [a0] "=&r"(a0), [a1] "=&r"(a1), [b0] "=&r"(b0), [b1] "=&r"(b1), [x] "=&r"(x), [y] "=&r"(y),
          [u] "=&r"(u), [v] "=&r"(v)
        : [w] "r"(w), [win] "r"(win)
        : "memory");
#undef TPUP_STEP
    acc[0] = a0, acc[1] = a1, acc[2] = b0, acc[3] = b1;
    return;
  }
#endif
  int32_t a0 = w[0], a1 = w[0], b0 = w[1], b1 = w[1];
  const int n = P > 0 ? P : pairs;
  w += 2;
#pragma GCC unroll 2
  for (int k = 0; k < n; ++k) {
    const int32_t x = win[2 * k], y = win[2 * k + 1], u = w[2 * k], v = w[2 * k + 1];
    a0 = Dot(x, u, a0);
    a1 = Dot(y, u, a1);
    b0 = Dot(x, v, b0);
    b1 = Dot(y, v, b1);
  }
  acc[0] = a0, acc[1] = a1, acc[2] = b0, acc[3] = b1;
}

// A last odd channel (weights: its bias, then its pairs) over pixels A and B: {A, B}.
inline void Lone(const int32_t* w, const int32_t* win, int pairs, int32_t* acc) {
  int32_t a = w[0], b = w[0];
  ++w;
  for (int k = 0; k < pairs; ++k) {
    a = Dot(win[2 * k], w[k], a);
    b = Dot(win[2 * k + 1], w[k], b);
  }
  acc[0] = a, acc[1] = b;
}

// FastRequant's integers (tpup_conv.h, the left shift 0 it needs) with the output offset added
// before the rounding shift, as offset x 2^right: the same value where that sum stays in int32
// (Fits, checked at setup per channel).
struct Quick {
  int32_t multiplier, add, right;
  Quick() = default;
  Quick(int32_t m, int32_t shift, int32_t offset)
      : multiplier(m), add(static_cast<int32_t>(Add(shift, offset))), right(-shift) {}
  // (1 << (right - 1)) + offset x 2^right, in int64 (shift <= -1, as FastRequant::Fits asks)
  static int64_t Add(int32_t shift, int32_t offset) { return (int64_t{1} << (-shift - 1)) + (int64_t{offset} << -shift); }
  // FastRequant fits sums of magnitude `bound`, and high + add + (high >> 31) stays in int32:
  // |high| <= bound x 2 x m / 2^32 + 1.
  static bool Fits(int64_t bound, int32_t m, int32_t shift, int32_t offset) {
    if (!FastRequant::Fits(bound, shift)) return false;
    const int64_t high = ((bound * 2) * m >> 32) + 1, add = Add(shift, offset);
    return high + (add < 0 ? -add : add) + 1 < (int64_t{1} << 31);
  }
  // FastRequant's (high + half + (high >> 31)) >> right + offset, as (SMMLAR's add + high +
  // (x >> 31)) >> right: high = SMMULR(2x, m) with m >= 0 has x's sign except where high is 0 and
  // x < 0, and there (add - 1) >> right = add >> right (add's low `right` bits are 2^(right - 1)).
  int32_t operator()(int32_t x) const {
#if defined(TPUP_DSP)
    int32_t t;
    __asm__("smmlar %0, %1, %2, %3" : "=r"(t) : "r"(x * 2), "r"(multiplier), "r"(add));
#else
    const int32_t t = add + FastRequant::MulHighRounded(x * 2, multiplier);
#endif
    return (t + (x >> 31)) >> right;
  }
};

// Requant's integers plus the output offset.
struct Exact {
  Requant requant;
  int32_t offset;
  int32_t operator()(int32_t x) const { return requant(x) + offset; }
};

// The activation's clamp: any bounds, or the whole int8 range (SSAT).
struct Clip {
  int32_t lo, hi;
  int8_t operator()(int32_t v) const { return Clamp(v, lo, hi); }
};
struct ClipInt8 {
#if defined(TPUP_DSP)
  int8_t operator()(int32_t v) const { return static_cast<int8_t>(__ssat(v, 8)); }
#else
  int8_t operator()(int32_t v) const { return Clamp(v, -128, 127); }
#endif
};

constexpr int kChannelChunk = 32;  // output channels whose requantization is set up once, on the stack

#if defined(TPUP_DSP)
// The unrolled path's stream (a first layer's channels, all on Quick, the clamp the whole int8
// range): per channel pair the two biases and 14 x 2 pairs, doubled (the sums are then 2 x sum:
// Quick's x * 2, exact where Quick fits), then each channel's Quick (multiplier, add, right).
constexpr int kStreamWords = 2 + 2 * 14 + 2 * 3;

// A channel pair's sums over pixels A and B, the loop's head shared by StreamPairs and
// StreamPairsSetUp: the two biases (from w), then the 14 pairs of taps (the first from the biases).
#define TPUP_STEP(K)                                 \
  "ldrd %[x], %[y], [%[win], #" #K " * 8]\n\t"        \
  "ldrd %[u], %[v], [%[w]], #8\n\t"                  \
  "smlad %[a0], %[x], %[u], %[a0]\n\t"               \
  "smlad %[a1], %[y], %[u], %[a1]\n\t"               \
  "smlad %[b0], %[x], %[v], %[b0]\n\t"               \
  "smlad %[b1], %[y], %[v], %[b1]\n\t"
#define TPUP_PAIR_SUMS                                                                            \
  "ldrd %[a0], %[b0], [%[w]], #8\n\t"                                                             \
  "ldrd %[x], %[y], [%[win]]\n\t"                                                                 \
  "ldrd %[u], %[v], [%[w]], #8\n\t"                                                               \
  "smlad %[a1], %[y], %[u], %[a0]\n\t"                                                            \
  "smlad %[a0], %[x], %[u], %[a0]\n\t"                                                            \
  "smlad %[b1], %[y], %[v], %[b0]\n\t"                                                            \
  "smlad %[b0], %[x], %[v], %[b0]\n\t"                                                            \
  TPUP_STEP(1) TPUP_STEP(2) TPUP_STEP(3) TPUP_STEP(4) TPUP_STEP(5) TPUP_STEP(6) TPUP_STEP(7) TPUP_STEP(8) \
  TPUP_STEP(9) TPUP_STEP(10) TPUP_STEP(11) TPUP_STEP(12) TPUP_STEP(13)

// One channel's sums over pixel A (S) and pixel B (T), requantized by its Quick's three words
// (loaded into x, y, u) and stored: A's at p (p then steps on), B's at p + gap. StreamPairs and
// StreamPairsSetUp differ only in where the Quick comes from and whether the sums are doubled first.
#define TPUP_QUICK_OUT(S, T)                         \
  "smmlar %[v], %[" #S "], %[x], %[y]\n\t"           \
  "add %[v], %[v], %[" #S "], asr #31\n\t"           \
  "asr %[v], %[v], %[u]\n\t"                         \
  "ssat %[v], #8, %[v]\n\t"                          \
  "smmlar %[" #S "], %[" #T "], %[x], %[y]\n\t"      \
  "add %[" #S "], %[" #S "], %[" #T "], asr #31\n\t" \
  "asr %[" #S "], %[" #S "], %[u]\n\t"               \
  "ssat %[" #S "], #8, %[" #S "]\n\t"                \
  "strb %[" #S "], [%[p], %[gap]]\n\t"               \
  "strb %[v], [%[p]], #1\n\t"

// The sums 2 x sum of every channel pair of `stream` (up to `end`) over pixels A and B (windows
// `win`), requantized, out through `p` (A's) and p + gap (B's): per pair of taps 2 LDRD + 4 SMLAD,
// per output SMMLAR + ADD + ASR + SSAT + STRB (registers fixed: LDM loads a Quick in order).
void StreamPairs(const int32_t* stream, const int32_t* end, const int32_t* win, int8_t* p, int gap) {
  register int32_t x asm("r0"), y asm("r1"), u asm("r2"), v asm("r3");
  register int32_t a0 asm("r4"), a1 asm("r5"), b0 asm("r6"), b1 asm("r8");
  register const int32_t* w asm("r9") = stream;
  register const int32_t* wn asm("r10") = win;
  register int8_t* out asm("r11") = p;
  register int32_t gp asm("r12") = gap;
  register const int32_t* e asm("lr") = end;
#define TPUP_OUT(S, T) "ldmia %[w]!, {%[x], %[y], %[u]}\n\t" TPUP_QUICK_OUT(S, T)
  __asm__ volatile(
      "1:\n\t" TPUP_PAIR_SUMS
      TPUP_OUT(a0, a1) TPUP_OUT(b0, b1)
      "cmp %[w], %[end]\n\t"
      "bne 1b\n\t"
      : [x] "=&r"(x), [y] "=&r"(y), [u] "=&r"(u), [v] "=&r"(v), [a0] "=&r"(a0), [a1] "=&r"(a1), [b0] "=&r"(b0),
        [b1] "=&r"(b1), [w] "+r"(w), [p] "+r"(out)
      : [win] "r"(wn), [gap] "r"(gp), [end] "r"(e)
      : "memory", "cc");
#undef TPUP_OUT
}

// The high bit of a set-up's last channel pair's right shift: where StreamPairsSetUp stops (ASR by
// a register shifts by its low byte only, so the bit leaves the shift as it is).
constexpr int32_t kLastPair = 0x100;

// StreamPairs on a layer set up once (SetUpPacked): the weights straight from the packed constant
// (per channel pair the two biases, then the 14 x 2 pairs; not doubled, so each sum is doubled
// before Quick, four LSLs a channel pair) and each channel's Quick from `quick`, every channel pair
// up to the one whose second right shift carries kLastPair.
void StreamPairsSetUp(const int32_t* packed, const int32_t* quick, const int32_t* win, int8_t* p, int gap) {
  register int32_t x asm("r0"), y asm("r1"), u asm("r2"), v asm("r3");
  register int32_t a0 asm("r4"), a1 asm("r5"), b0 asm("r6"), b1 asm("r8");
  register const int32_t* w asm("r9") = packed;
  register const int32_t* wn asm("r10") = win;
  register int8_t* out asm("r11") = p;
  register int32_t gp asm("r12") = gap;
  register const int32_t* q asm("lr") = quick;
#define TPUP_OUT(S, T)                  \
  "ldmia %[q]!, {%[x], %[y], %[u]}\n\t" \
  "lsl %[" #S "], %[" #S "], #1\n\t"    \
  "lsl %[" #T "], %[" #T "], #1\n\t" TPUP_QUICK_OUT(S, T)
  __asm__ volatile(
      "1:\n\t" TPUP_PAIR_SUMS
      TPUP_OUT(a0, a1) TPUP_OUT(b0, b1)
      "tst %[u], #256\n\t"  // (kLastPair)
      "beq 1b\n\t"
      : [x] "=&r"(x), [y] "=&r"(y), [u] "=&r"(u), [v] "=&r"(v), [a0] "=&r"(a0), [a1] "=&r"(a1), [b0] "=&r"(b0),
        [b1] "=&r"(b1), [w] "+r"(w), [p] "+r"(out), [q] "+r"(q)
      : [win] "r"(wn), [gap] "r"(gp)
      : "memory", "cc");
#undef TPUP_OUT
}
#undef TPUP_QUICK_OUT
#undef TPUP_PAIR_SUMS
#undef TPUP_STEP
#endif

// How Chunk runs its channel pairs: Block and Q in C, StreamPairs on a stream built per call, or
// StreamPairsSetUp on a layer's set-up.
enum PairPath { kInC, kStream, kSetUp };

// Output channels [c0, c1) (c0 even) of output rows [0, out_rows), requantized by `scale` (Exact
// or Quick, indexed from c0), two pixels at a time; the channel pairs as kPath says (kStream: from
// `stream`; kSetUp: `scale` a set-up's Quicks, c0 = 0, its last pair marked).
template <int P, PairPath kPath, class Q, class C>
void Chunk(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
           const int32_t* packed, const int32_t* stream, const Q* scale, C clip, int c0, int c1, int8_t* out) {
  const int pairs = PackedPairs(g.k_h, g.k_w, g.in_c), stride = pairs + 1, OC = g.out_c;
  const bool rows9 = g.k_h == 3 && g.k_w * g.in_c == 9;
  const int8_t zero_point = static_cast<int8_t>(-o.input_offset);
  const int row_bytes = g.in_w * g.in_c, step = o.stride_w * g.in_c, two = (c1 - c0) / 2 * 2;
  int32_t win[2 * kPackedMaxPairs];
  const int32_t* const lone = two < c1 - c0 ? packed + (c1 - 1) * stride : nullptr;
  for (int oy = 0; oy < out_rows; ++oy) {
    const int iy0 = oy * o.stride_h - pad_top;
    for (int ox = 0; ox < g.out_w; ox += 2) {
      const bool both = ox + 1 < g.out_w;
      const int ix0 = ox * o.stride_w - o.pad_left, ix1 = both ? ix0 + o.stride_w : ix0;
      if (rows9 && iy0 >= 0 && ix0 >= 0 && iy0 + 3 <= g.in_h && ix1 + g.k_w <= g.in_w) {
        const int8_t* a = in + iy0 * row_bytes + ix0 * g.in_c;
        PackRows9(a, both ? a + step : a, row_bytes, win);
      } else if (rows9 && ix1 - ix0 + g.k_w <= kPatchPixels) {  // padding: through a patch of the input
        int8_t patch[3 * kPatchBytes];
        Patch(g, in, iy0, ix0, ix1 - ix0 + g.k_w, zero_point, patch);
        PackRows9(patch, patch + (ix1 - ix0) * g.in_c, kPatchBytes, win);
      } else {
        PackWindow(g, in, iy0, ix0, zero_point, win);
        PackWindow(g, in, iy0, ix1, zero_point, win + 1);
      }
      int8_t* p = out + (oy * g.out_w + ox) * OC + c0;
      const int gap = both ? OC : 0;  // B's outputs from A's (a lone last pixel: B = A, written twice)
#if defined(TPUP_DSP)
      if (kPath == kStream) {
        if (two > 0) StreamPairs(stream, stream + two / 2 * kStreamWords, win, p, gap);
      } else if (kPath == kSetUp) {
        if (two > 0) StreamPairsSetUp(packed, reinterpret_cast<const int32_t*>(scale), win, p, gap);
      } else  // NOLINT(readability/braces)
#endif
      {
        const int32_t* w = packed + c0 * stride;
        const Q* q = scale;
        for (int k = 0; k < two; k += 2, w += 2 * stride, q += 2) {
          int32_t acc[4];
          Block<P>(w, win, pairs, acc);
          p[k] = clip(q[0](acc[0]));
          p[gap + k] = clip(q[0](acc[1]));
          p[k + 1] = clip(q[1](acc[2]));
          p[gap + k + 1] = clip(q[1](acc[3]));
        }
      }
      if (lone != nullptr) {
        int32_t acc[2];
        Lone(lone, win, pairs, acc);
        p[two] = clip(scale[two](acc[0]));
        p[gap + two] = clip(scale[two](acc[1]));
      }
    }
  }
}

// The largest |sum| channel `oc` can make: its folded bias plus 128 x sum(|w|) (every packed
// input, padding included, is an int8). `oc` in a channel pair when `pair`: its bias at w[half],
// its taps at w[2 + 2k + half]; else alone: bias w[0], taps w[1 + k].
int64_t SumBound(const int32_t* w, int pairs, bool pair, int half) {
  const int32_t bias = w[pair ? half : 0];
  int64_t bound = bias < 0 ? -static_cast<int64_t>(bias) : bias;
  for (int k = 0; k < pairs; ++k) {
    const int32_t t = pair ? w[2 + 2 * k + half] : w[1 + k];
    const int32_t l = static_cast<int16_t>(t), h = t >> 16;
    bound += 128 * ((l < 0 ? -l : l) + (h < 0 ? -h : h));
  }
  return bound;
}

template <int P, class Q>
void ChunkClipped(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
                  const int32_t* packed, const Q* scale, int c0, int c1, int8_t* out) {
  if (o.act_min == -128 && o.act_max == 127) {
    Chunk<P, kInC>(o, g, pad_top, out_rows, in, packed, nullptr, scale, ClipInt8{}, c0, c1, out);
  } else {
    Chunk<P, kInC>(o, g, pad_top, out_rows, in, packed, nullptr, scale, Clip{o.act_min, o.act_max}, c0, c1, out);
  }
}

#if defined(TPUP_DSP)
inline int32_t Doubled(int32_t t) { return Pair(2 * static_cast<int16_t>(t), 2 * (t >> 16)); }

// Channels [c0, c1) of a 3x3 over 3 channels, all on Quick, clamped to the whole int8 range:
// their pairs through StreamPairs (the stream built here, on the stack), a lone last one in C.
void ChunkStreamed(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
                   const int32_t* packed, const Quick* quick, int c0, int c1, int8_t* out) {
  constexpr int kPairs = 14, kStride = kPairs + 1;
  int32_t stream[kChannelChunk / 2 * kStreamWords];
  int32_t* s = stream;
  for (int oc = c0; oc + 1 < c1; oc += 2) {
    const int32_t* w = packed + oc * kStride;  // (|sum| < 2^30, Quick::Fits: doubled, in int32)
    *s++ = 2 * w[0], *s++ = 2 * w[1];
    for (int k = 2; k < 2 * kStride; ++k) *s++ = Doubled(w[k]);
    for (const Quick& q : {quick[oc - c0], quick[oc - c0 + 1]}) *s++ = q.multiplier, *s++ = q.add, *s++ = q.right;
  }
  Chunk<kPairs, kStream>(o, g, pad_top, out_rows, in, packed, stream, quick, ClipInt8{}, c0, c1, out);
}
#endif

// A 3x3 over 3 channels clamped to the whole int8 range: on the DSP cores its channel pairs run
// StreamPairs (or StreamPairsSetUp).
bool Streamed(const ConvOptions& o, const ConvGeometry& g) {
  return g.k_h == 3 && g.k_w * g.in_c == 9 && o.act_min == -128 && o.act_max == 127;
}

// Whether channel `oc`'s sums fit Quick (packed: the layer's weights, `pairs` a channel).
bool QuickFits(const ConvOptions& o, const ConvGeometry& g, const int32_t* packed, const int32_t* requant, int oc) {
  const int pairs = PackedPairs(g.k_h, g.k_w, g.in_c), C = g.out_c;
  const bool pair = oc + 1 < C || oc % 2;
  const int64_t bound = SumBound(packed + (oc - oc % 2) * (pairs + 1), pairs, pair, oc % 2);
  return Quick::Fits(bound, requant[oc], requant[C + oc], o.output_offset);
}

// Every channel on the set-up's Quicks (SetUpPacked), in one chunk.
template <int P>
void RowsSetUp(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
               const int32_t* packed, const Quick* quick, int8_t* out) {
#if defined(TPUP_DSP)
  if (P == 14 && Streamed(o, g)) {
    Chunk<14, kSetUp>(o, g, pad_top, out_rows, in, packed, nullptr, quick, ClipInt8{}, 0, g.out_c, out);
    return;
  }
#endif
  ChunkClipped<P>(o, g, pad_top, out_rows, in, packed, quick, 0, g.out_c, out);
}

// Per chunk of output channels: Quick where every channel's sums fit it, Exact otherwise.
template <int P>
void Rows(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
          const int32_t* packed, const int32_t* requant, int8_t* out) {
  const int C = g.out_c;
  const int32_t* multiplier = requant;
  const int32_t* shift = requant + C;
  for (int c0 = 0; c0 < C; c0 += kChannelChunk) {
    const int c1 = c0 + kChannelChunk < C ? c0 + kChannelChunk : C;
    bool fast = true;
    for (int oc = c0; oc < c1 && fast; ++oc) fast = QuickFits(o, g, packed, requant, oc);
    if (fast) {
      Quick quick[kChannelChunk];
      for (int oc = c0; oc < c1; ++oc) quick[oc - c0] = Quick(multiplier[oc], shift[oc], o.output_offset);
#if defined(TPUP_DSP)
      if (P == 14 && Streamed(o, g)) {
        ChunkStreamed(o, g, pad_top, out_rows, in, packed, quick, c0, c1, out);
        continue;
      }
#endif
      ChunkClipped<P>(o, g, pad_top, out_rows, in, packed, quick, c0, c1, out);
    } else {
      Exact exact[kChannelChunk];
      for (int oc = c0; oc < c1; ++oc) exact[oc - c0] = Exact{Requant(multiplier[oc], shift[oc]), o.output_offset};
      ChunkClipped<P>(o, g, pad_top, out_rows, in, packed, exact, c0, c1, out);
    }
  }
}

}  // namespace

int PackedSetupBytes(const ConvGeometry& g) { return Align16(16 + static_cast<int>(sizeof(Quick)) * g.out_c); }

// setup[0]: 1 where every channel's sums fit Quick, then (from word 4) each channel's Quick, the
// streamed path's last pair marked; 0 (Quick not for all): calls set themselves up as without one.
void SetUpPacked(const ConvOptions& o, const ConvGeometry& g, const int32_t* packed, const int32_t* requant,
                 int32_t* setup) {
  static_assert(sizeof(Quick) == 12, "a Quick is three words (StreamPairsSetUp loads it by LDM)");
  setup[0] = 0;
  for (int oc = 0; oc < g.out_c; ++oc) {
    if (!QuickFits(o, g, packed, requant, oc)) return;
  }
  Quick* quick = reinterpret_cast<Quick*>(setup + 4);
  for (int oc = 0; oc < g.out_c; ++oc) quick[oc] = Quick(requant[oc], requant[g.out_c + oc], o.output_offset);
#if defined(TPUP_DSP)
  if (PackedPairs(g.k_h, g.k_w, g.in_c) == 14 && Streamed(o, g) && g.out_c >= 2) quick[g.out_c / 2 * 2 - 1].right |= kLastPair;
#endif
  setup[0] = 1;
}

void RunConvPacked(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
                   const int32_t* packed, const int32_t* requant, int8_t* out, const int32_t* setup) {
  if (setup != nullptr && setup[0] == 1) {  // (SetUpPacked)
    const Quick* quick = reinterpret_cast<const Quick*>(setup + 4);
    if (PackedPairs(g.k_h, g.k_w, g.in_c) == 14) {
      RowsSetUp<14>(o, g, pad_top, out_rows, in, packed, quick, out);
    } else {
      RowsSetUp<0>(o, g, pad_top, out_rows, in, packed, quick, out);
    }
    return;
  }
  if (PackedPairs(g.k_h, g.k_w, g.in_c) == 14) {  // 3x3 over 3 channels: a first layer
    Rows<14>(o, g, pad_top, out_rows, in, packed, requant, out);
  } else {
    Rows<0>(o, g, pad_top, out_rows, in, packed, requant, out);
  }
}

}  // namespace tpup
