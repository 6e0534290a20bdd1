// The harness's int8 depthwise 3x3 kernel for narrow maps (flag "dw3",
// tpu_pipeline/toolchain/ir/kernel_variants/depthwise3x3.py): one output channel per input
// channel, strides 1 and 2 (each direction), any padding. Bit-identical to TFLite Micro's
// DepthwiseConvPerChannel (and CMSIS-NN's): the same exact int32 sums, then
// tflite::MultiplyByQuantizedMultiplier's integers.
//
// Why faster than the four-channel kernels on narrow maps (TinyEngine's approach): one channel at
// a time, its padded band of input copied once into a small int16 buffer on the stack with the
// input offset added (a padding tap holds 0, so it adds nothing and needs no test), each buffer
// row an even number of int16s and 4-aligned, so every window row starts at an aligned word for
// the even outputs. A pass makes two outputs side by side: per window row it loads two (stride 2:
// three) words and does four multiplies, a pair of taps per SMLAD with the row's weights held as
// two int16 pairs (w0, w1) and (w1, w2) in registers for the whole channel (SMLATB / SMLABT take
// the odd tap). Requantization by FastRequant (tpup_conv.h: SMMULR) where the channel's weights,
// bias and input offset bound every sum small enough, checked per channel, else Requant.
//
// Memory: no arena at all; the stack holds the buffer, at most kDw3MaxBuffer int16s (no more
// than the "fast" kernel's weights on the stack, 648 bytes), which Depthwise3x3Fits checks.

#include <cstdint>
#include <cstring>

#include "tpup_conv.h"

#if defined(__ARM_FEATURE_DSP) && defined(__ARM_FEATURE_SIMD32)
#include <arm_acle.h>  // (ACLE: __smlad, __smlabt, __smlatb)
#endif

namespace tpup {

namespace {

// The buffer of one channel for `out_rows` x `out_w` outputs: rows x cols int16, cols even and
// wide enough for the last pass's loads (stride 1: a pass at even x reads x .. x + 3; stride 2:
// x .. x + 5 for two outputs, x .. x + 3 for one).
struct BufferShape {
  int rows, cols;
};

BufferShape ShapeFor(const ConvOptions& o, int out_rows, int out_w) {
  return {(out_rows - 1) * o.stride_h + 3, o.stride_w == 1 ? (out_w + 3) & ~1 : 2 * out_w + 2};
}

#if defined(__ARM_FEATURE_DSP) && defined(__ARM_FEATURE_SIMD32)
inline int32_t Smlad(int32_t x, int32_t y, int32_t acc) { return __smlad(x, y, acc); }
inline int32_t Smlabt(int32_t x, int32_t y, int32_t acc) { return __smlabt(x, y, acc); }
inline int32_t Smlatb(int32_t x, int32_t y, int32_t acc) { return __smlatb(x, y, acc); }
#else
inline int32_t Lo(int32_t v) { return static_cast<int16_t>(v & 0xFFFF); }
inline int32_t Hi(int32_t v) { return static_cast<int16_t>(static_cast<uint32_t>(v) >> 16); }
inline int32_t Smlad(int32_t x, int32_t y, int32_t acc) { return acc + Lo(x) * Lo(y) + Hi(x) * Hi(y); }
inline int32_t Smlabt(int32_t x, int32_t y, int32_t acc) { return acc + Lo(x) * Hi(y); }
inline int32_t Smlatb(int32_t x, int32_t y, int32_t acc) { return acc + Hi(x) * Lo(y); }
#endif

inline int32_t Word(const int16_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);  // (p is 4-aligned: one LDR)
  return v;
}

inline int32_t Pair(int32_t lo, int32_t hi) {
  return static_cast<int32_t>((static_cast<uint32_t>(lo) & 0xFFFF) | (static_cast<uint32_t>(hi) << 16));
}

// Channel c's band of input, offset added, into buf (rows x cols); padding and columns past the
// input hold 0.
void Fill(const ConvGeometry& g, int c, int pad_top, int pad_left, int32_t offset, BufferShape s, const int8_t* in,
          int16_t* buf) {
  const int C = g.in_c;
  const int x0 = pad_left < s.cols ? pad_left : s.cols;
  const int x1 = pad_left + g.in_w < s.cols ? pad_left + g.in_w : s.cols;
  for (int j = 0; j < s.rows; ++j, buf += s.cols) {
    const int iy = j - pad_top;
    if (iy < 0 || iy >= g.in_h) {
      for (int k = 0; k < s.cols; k += 2) __builtin_memset(buf + k, 0, 4);
      continue;
    }
    int k = 0;
    for (; k < x0; ++k) buf[k] = 0;
    const int8_t* p = in + iy * g.in_w * C + c;
#pragma GCC unroll 4
    for (; k < x1; ++k, p += C) buf[k] = static_cast<int16_t>(*p + offset);
    for (; k < s.cols; ++k) buf[k] = 0;
  }
}

// One channel's requantization and clamp: FastRequant where proven for its sums, else Requant.
template <bool kFast>
struct Scale {
  Requant exact;
  FastRequant quick;
  int32_t offset, lo, hi;
  int8_t operator()(int32_t acc) const { return Clamp((kFast ? quick(acc) : exact(acc)) + offset, lo, hi); }
};

// Output rows [0, out_rows) of channel c from its buffer: two outputs a pass, a last odd one alone.
template <int SW, bool kFast>
void Outputs(const ConvOptions& o, const ConvGeometry& g, int out_rows, BufferShape s, const int16_t* buf,
             const int32_t* w01, const int32_t* w12, int32_t bias, const Scale<kFast>& scale, int c, int8_t* out) {
  const int C = g.out_c, cols = s.cols;
  const int32_t a01 = w01[0], a12 = w12[0], b01 = w01[1], b12 = w12[1], c01 = w01[2], c12 = w12[2];
  for (int oy = 0; oy < out_rows; ++oy) {
    const int16_t* r = buf + oy * o.stride_h * cols;
    int8_t* dst = out + oy * g.out_w * C + c;
    int ox = 0;
    for (; ox + 2 <= g.out_w; ox += 2, r += 2 * SW, dst += 2 * C) {
      int32_t u = bias, v = bias;
      const int16_t* q = r;
#define TPUP_DW3_ROW(W01, W12)                                              \
  {                                                                       \
    const int32_t x0 = Word(q), x2 = Word(q + 2);                         \
    u = Smlabt(x2, W12, Smlad(x0, W01, u));                               \
    if (SW == 1) {                                                        \
      v = Smlad(x2, W12, Smlatb(x0, W01, v));                             \
    } else {                                                              \
      v = Smlabt(Word(q + 4), W12, Smlad(x2, W01, v));                    \
    }                                                                     \
    q += cols;                                                            \
  }
      TPUP_DW3_ROW(a01, a12)
      TPUP_DW3_ROW(b01, b12)
      TPUP_DW3_ROW(c01, c12)
#undef TPUP_DW3_ROW
      dst[0] = scale(u);
      dst[C] = scale(v);
    }
    if (ox < g.out_w) {
      int32_t u = bias;
      u = Smlabt(Word(r + 2), a12, Smlad(Word(r), a01, u));
      u = Smlabt(Word(r + cols + 2), b12, Smlad(Word(r + cols), b01, u));
      u = Smlabt(Word(r + 2 * cols + 2), c12, Smlad(Word(r + 2 * cols), c01, u));
      dst[0] = scale(u);
    }
  }
}

// Channel c: its weights as pairs, its requantization, its buffer, its outputs.
template <int SW>
void Channel(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
             const int8_t* filter, const int32_t* bias, const int32_t* requant, int c, int16_t* buf, int8_t* out) {
  const int C = g.in_c;
  int32_t w01[3], w12[3];
  const int32_t b = bias != nullptr ? bias[c] : 0;
  const int64_t in_max = o.input_offset >= 0 ? 127 + o.input_offset : 128 - o.input_offset;  // |x + offset|
  int64_t bound = b < 0 ? -static_cast<int64_t>(b) : b;
  for (int ky = 0; ky < 3; ++ky) {
    const int32_t f0 = filter[(ky * 3) * C + c], f1 = filter[(ky * 3 + 1) * C + c], f2 = filter[(ky * 3 + 2) * C + c];
    w01[ky] = Pair(f0, f1), w12[ky] = Pair(f1, f2);
    bound += in_max * ((f0 < 0 ? -f0 : f0) + (f1 < 0 ? -f1 : f1) + (f2 < 0 ? -f2 : f2));
  }
  const BufferShape s = ShapeFor(o, out_rows, g.out_w);
  Fill(g, c, pad_top, o.pad_left, o.input_offset, s, in, buf);
  const int32_t m = requant[c], shift = requant[g.out_c + c];
  if (FastRequant::Fits(bound, shift)) {
    const Scale<true> scale{Requant(m, shift), FastRequant(m, shift), o.output_offset, o.act_min, o.act_max};
    Outputs<SW, true>(o, g, out_rows, s, buf, w01, w12, b, scale, c, out);
  } else {
    const Scale<false> scale{Requant(m, shift), FastRequant(m, shift), o.output_offset, o.act_min, o.act_max};
    Outputs<SW, false>(o, g, out_rows, s, buf, w01, w12, b, scale, c, out);
  }
}

}  // namespace

bool Depthwise3x3Fits(const ConvOptions& o, const ConvGeometry& g) {
  if (!(o.depth_multiplier == 1 && o.dilation_h == 1 && o.dilation_w == 1 && g.in_c == g.out_c && g.k_h == 3 &&
        g.k_w == 3 && (o.stride_h == 1 || o.stride_h == 2) && (o.stride_w == 1 || o.stride_w == 2))) {
    return false;
  }
  const BufferShape s = ShapeFor(o, g.out_h, g.out_w);
  return s.rows * s.cols <= kDw3MaxBuffer;
}

void RunDepthwise3x3(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
                     const int8_t* filter, const int32_t* bias, const int32_t* requant, int8_t* out) {
  alignas(4) int16_t buf[kDw3MaxBuffer];
  for (int c = 0; c < g.in_c; ++c) {
    if (o.stride_w == 1) {
      Channel<1>(o, g, pad_top, out_rows, in, filter, bias, requant, c, buf, out);
    } else {
      Channel<2>(o, g, pad_top, out_rows, in, filter, bias, requant, c, buf, out);
    }
  }
}

}  // namespace tpup
