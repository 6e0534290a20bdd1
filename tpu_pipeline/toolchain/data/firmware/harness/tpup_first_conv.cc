// The harness's convolution for few input channels (flag "packed", tpu_pipeline/toolchain/ir/kernels.py):
// a model's first layer (3 input channels, 3x3, stride 2) and its like. Bit-identical to TFLite
// Micro's ConvPerChannel (and CMSIS-NN's): the same exact int32 sums, then
// tflite::MultiplyByQuantizedMultiplier's integers (FastRequant's where the layer's weights bound
// every sum small enough, tpup_conv.h).
//
// Why faster than CMSIS-NN's im2col kernel there: that kernel copies each window tap by tap (one
// call per tap of 3 channels) and multiplies in groups of four values, which 27 is not. Here a
// window's kh rows of kw x C contiguous bytes are packed once per output pixel into int16 pairs
// (SXTB16 on whole words: (b0, b2), (b1, b3); the bytes a row has past a multiple of four paired
// at the end), and the weights were packed offline in the same order (input 4, int32
// [out_c, 1 + pairs]: the bias with the input offset folded in, bias + offset x sum(w), then the
// pairs), so every multiply is one SMLAD over two taps, for two pixels and two channels at a time.
// Padding taps hold the input's zero point, which the folded offset cancels: the same sum. No
// buffer in the arena (the windows live on the stack).

#include <cstdint>
#include <cstring>

#include "tpup_conv.h"

#if defined(__ARM_FEATURE_DSP) && defined(__ARM_FEATURE_SIMD32)
#include <arm_acle.h>  // (ACLE: __sxtb16, __smlad)
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
  return static_cast<int32_t>((static_cast<uint32_t>(lo) & 0xFFFF) | static_cast<uint32_t>(hi) << 16);
}

#if defined(TPUP_DSP)
inline int32_t Ror8(int32_t x) {
  const uint32_t u = static_cast<uint32_t>(x);
  return static_cast<int32_t>(u >> 8 | u << 24);
}

inline int32_t Load32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);  // (an unaligned LDR: the cores this runs on allow it)
  return v;
}
#endif

// The window of the output pixel whose top-left tap is input (iy0, ix0) as `pairs` int16 pairs
// (the order ir/kernels.py packs the weights in). Taps outside the input read the zero point.
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
    int j = 0;
#if defined(TPUP_DSP)
    for (; j < whole; j += 4) {
      const int32_t x = Load32(p + j);
      win[n++] = __sxtb16(x);
      win[n++] = __sxtb16(Ror8(x));
    }
#else
    for (; j < whole; j += 4) {
      win[n++] = Pair(p[j], p[j + 2]);
      win[n++] = Pair(p[j + 1], p[j + 3]);
    }
#endif
    for (; j < row; ++j) tail[t++] = p[j];
  }
  for (int k = 0; k < t; k += 2) win[n++] = Pair(tail[k], k + 1 < t ? tail[k + 1] : 0);
}

#if defined(TPUP_DSP)
inline int32_t Dot(int32_t a, int32_t b, int32_t acc) { return __smlad(a, b, acc); }
#else
inline int32_t Dot(int32_t a, int32_t b, int32_t acc) {
  return acc + static_cast<int16_t>(a) * static_cast<int16_t>(b) + (a >> 16) * (b >> 16);
}
#endif

// Channels [oc, oc + 2) (one when `two` is false) of pixels A and B (B when `both`): P pairs, a
// compile-time count where it is one (0: any).
template <int P>
void Block(const int32_t* wa, const int32_t* wb, int pairs, const int32_t* a, const int32_t* b, int32_t* acc) {
  int32_t a0 = wa[0], a1 = wa[0], b0 = wb[0], b1 = wb[0];
  const int n = P > 0 ? P : pairs;
  ++wa, ++wb;
#pragma GCC unroll 2  // (more: the compiler keeps windows in registers over channels, and spills)
  for (int k = 0; k < n; ++k) {
    const int32_t x = a[k], y = b[k], u = wa[k], v = wb[k];
    a0 = Dot(x, u, a0);
    a1 = Dot(y, u, a1);
    b0 = Dot(x, v, b0);
    b1 = Dot(y, v, b1);
  }
  acc[0] = a0, acc[1] = a1, acc[2] = b0, acc[3] = b1;
}

constexpr int kChannelChunk = 32;  // output channels whose requantization is set up once, on the stack

// Output channels [c0, c1) of output rows [0, out_rows), requantized by `scale` (Requant or
// FastRequant, indexed from c0).
template <int P, class Q>
void Chunk(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
           const int32_t* packed, const Q* scale, int c0, int c1, int8_t* out) {
  const int pairs = PackedPairs(g.k_h, g.k_w, g.in_c), stride = pairs + 1, C = g.out_c;
  const int8_t zero_point = static_cast<int8_t>(-o.input_offset);
  const int32_t oo = o.output_offset, lo = o.act_min, hi = o.act_max;
  int32_t win_a[kPackedMaxPairs], win_b[kPackedMaxPairs];
  for (int oy = 0; oy < out_rows; ++oy) {
    const int iy0 = oy * o.stride_h - pad_top;
    for (int ox = 0; ox < g.out_w; ox += 2) {
      const bool both = ox + 1 < g.out_w;
      const int ix0 = ox * o.stride_w - o.pad_left;
      PackWindow(g, in, iy0, ix0, zero_point, win_a);
      if (both) PackWindow(g, in, iy0, ix0 + o.stride_w, zero_point, win_b);
      int8_t* dst = out + (oy * g.out_w + ox) * C;
      for (int oc = c0; oc < c1; oc += 2) {
        const bool two = oc + 1 < c1;
        const int32_t* wa = packed + oc * stride;
        int32_t acc[4];
        Block<P>(wa, two ? wa + stride : wa, pairs, win_a, both ? win_b : win_a, acc);
        for (int k = 0; k < (two ? 2 : 1); ++k) {
          const Q q = scale[oc - c0 + k];
          dst[oc + k] = Clamp(q(acc[2 * k]) + oo, lo, hi);
          if (both) dst[C + oc + k] = Clamp(q(acc[2 * k + 1]) + oo, lo, hi);
        }
      }
    }
  }
}

// The largest |sum| output channel `oc` can make: its folded bias plus 128 x sum(|w|) (every
// packed input, padding included, is an int8).
int64_t SumBound(const int32_t* w, int pairs) {
  int64_t bound = w[0] < 0 ? -static_cast<int64_t>(w[0]) : w[0];
  for (int k = 1; k <= pairs; ++k) {
    const int32_t l = static_cast<int16_t>(w[k]), h = w[k] >> 16;
    bound += 128 * ((l < 0 ? -l : l) + (h < 0 ? -h : h));
  }
  return bound;
}

// Per chunk of output channels: FastRequant where every channel's sums fit it, Requant otherwise.
template <int P>
void Rows(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
          const int32_t* packed, const int32_t* requant, int8_t* out) {
  const int pairs = PackedPairs(g.k_h, g.k_w, g.in_c), C = g.out_c;
  Requant exact[kChannelChunk];
  FastRequant quick[kChannelChunk];
  for (int c0 = 0; c0 < C; c0 += kChannelChunk) {
    const int c1 = c0 + kChannelChunk < C ? c0 + kChannelChunk : C;
    bool fast = true;
    for (int oc = c0; oc < c1; ++oc) {
      exact[oc - c0] = Requant(requant[oc], requant[C + oc]);
      quick[oc - c0] = FastRequant(requant[oc], requant[C + oc]);
      fast = fast && FastRequant::Fits(SumBound(packed + oc * (pairs + 1), pairs), requant[C + oc]);
    }
    if (fast) {
      Chunk<P>(o, g, pad_top, out_rows, in, packed, quick, c0, c1, out);
    } else {
      Chunk<P>(o, g, pad_top, out_rows, in, packed, exact, c0, c1, out);
    }
  }
}

}  // namespace

void RunConvPacked(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
                   const int32_t* packed, const int32_t* requant, int8_t* out) {
  if (PackedPairs(g.k_h, g.k_w, g.in_c) == 14) {  // 3x3 over 3 channels: a first layer
    Rows<14>(o, g, pad_top, out_rows, in, packed, requant, out);
  } else {
    Rows<0>(o, g, pad_top, out_rows, in, packed, requant, out);
  }
}

}  // namespace tpup
