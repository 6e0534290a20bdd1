// The harness's own depthwise kernel (flag "fast", tpu_pipeline/toolchain/ir/kernels.py): int8,
// one output channel per input channel, no dilation, any window up to kFastMaxTaps taps, any
// stride and padding. Bit-identical to TFLite Micro's DepthwiseConvPerChannel (and CMSIS-NN's):
// the same exact int32 sums, then tflite::MultiplyByQuantizedMultiplier's integers.
//
// Why faster than CMSIS-NN's "opt" kernel on 5x5 and 7x7 windows: that kernel copies every
// output's window (all channels, int16, offset added) into a buffer before multiplying; this one
// takes four channels at a time, keeps their weights sign-extended in pairs on the stack, reads
// the int8 input in place (one word = four channels, split by SXTB16) and multiplies with
// SMLABB/SMLATT. The input offset is folded into the accumulators' start where the whole window
// lies inside the input (offset x the window's weight sum); windows over the border add it per
// tap. 3x3 windows at stride 1 go two outputs at a time (the four input columns they share read
// once). Requantization by FastRequant (tpup_conv.h: SMMULR) where the bias, the input offset and
// the window's size bound every sum small enough, checked per four channels. No buffer at all: the
// arena holds nothing for it.

#include <cstdint>
#include <cstring>

#include "tpup_conv.h"

#if defined(__ARM_FEATURE_DSP) && defined(__ARM_FEATURE_SIMD32)
#include <arm_acle.h>  // (ACLE: __sxtb16, __sadd16, __smlabb, __smlatt)
#define TPUP_DSP 1
#endif

namespace tpup {

bool DepthwiseFastFits(const ConvOptions& o, const ConvGeometry& g) {
  return o.depth_multiplier == 1 && o.dilation_h == 1 && o.dilation_w == 1 && g.in_c == g.out_c &&
         g.k_h * g.k_w <= kFastMaxTaps;
}

namespace {

// One output channel, the reference kernel's loop (channels left over from groups of four, and
// cores without the DSP extension).
void OneChannel(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
                const int8_t* filter, const int32_t* bias, const int32_t* requant, int c, int8_t* out) {
  const int C = g.in_c;
  const Requant scale(requant[c], requant[g.out_c + c]);
  for (int oy = 0; oy < out_rows; ++oy) {
    for (int ox = 0; ox < g.out_w; ++ox) {
      const int iy0 = oy * o.stride_h - pad_top, ix0 = ox * o.stride_w - o.pad_left;
      int32_t acc = bias != nullptr ? bias[c] : 0;
      for (int ky = 0; ky < g.k_h; ++ky) {
        const int iy = iy0 + ky;
        if (iy < 0 || iy >= g.in_h) continue;
        for (int kx = 0; kx < g.k_w; ++kx) {
          const int ix = ix0 + kx;
          if (ix < 0 || ix >= g.in_w) continue;
          acc += filter[(ky * g.k_w + kx) * C + c] * (in[(iy * g.in_w + ix) * C + c] + o.input_offset);
        }
      }
      out[(oy * g.out_w + ox) * C + c] =
          Clamp(scale(acc) + o.output_offset, o.act_min, o.act_max);
    }
  }
}

#if defined(TPUP_DSP)
// The odd channels of four int8 lanes sign-extended into two int16 lanes (SXTB16 with its
// rotation: one instruction, which the compiler does not fold from Ror8 by itself).
inline int32_t Sxtb16Ror8(int32_t x) {
  int32_t r;
  __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(x));
  return r;
}

inline int32_t Load32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);  // (an unaligned LDR: the cores this runs on allow it)
  return v;
}

// The four accumulators of a window wholly inside the input: KW taps a row unrolled (0: any).
template <int KW>
inline void FullWindow(const int8_t* p, int C, int row, int k_h, int k_w, const int32_t* w, int32_t* a) {
  int32_t a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
  const int kw = KW > 0 ? KW : k_w;
  for (int ky = 0; ky < k_h; ++ky, p += row) {
    const int8_t* q = p;
#pragma GCC unroll 7
    for (int kx = 0; kx < kw; ++kx, q += C, w += 2) {
      const int32_t x = Load32(q);
      const int32_t x02 = __sxtb16(x), x13 = Sxtb16Ror8(x);
      a0 = __smlabb(x02, w[0], a0);
      a2 = __smlatt(x02, w[0], a2);
      a1 = __smlabb(x13, w[1], a1);
      a3 = __smlatt(x13, w[1], a3);
    }
  }
  a[0] = a0, a[1] = a1, a[2] = a2, a[3] = a3;
}

// A window over the border: its taps inside the input, the offset added to each.
inline void PartWindow(const int8_t* in, const ConvGeometry& g, int iy0, int ix0, int ky0, int ky1, int kx0,
                       int kx1, int32_t offset2, const int32_t* w, int32_t* a) {
  int32_t a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
  const int C = g.in_c;
  for (int ky = ky0; ky < ky1; ++ky) {
    const int8_t* q = in + ((iy0 + ky) * g.in_w + ix0 + kx0) * C;
    const int32_t* t = w + 2 * (ky * g.k_w + kx0);
    for (int kx = kx0; kx < kx1; ++kx, q += C, t += 2) {
      const int32_t x = Load32(q);
      const int32_t x02 = __sadd16(__sxtb16(x), offset2), x13 = __sadd16(Sxtb16Ror8(x), offset2);
      a0 = __smlabb(x02, t[0], a0);
      a2 = __smlatt(x02, t[0], a2);
      a1 = __smlabb(x13, t[1], a1);
      a3 = __smlatt(x13, t[1], a3);
    }
  }
  a[0] = a0, a[1] = a1, a[2] = a2, a[3] = a3;
}

// Two outputs side by side of a 3x3 window at stride 1, wholly inside the input, for channels
// c + H and c + H + 2 (H = 0: even lanes, 1: odd): the four input columns they share are loaded
// and split once (TinyEngine's two-output loop). Half the channels a pass keeps the eight
// accumulators' worth of work in registers: no spills.
template <int H>
inline void PairHalf3x3(const int8_t* p, int C, int row, const int32_t* w, int32_t* a, int32_t* b) {
  int32_t a0 = a[H], a2 = a[H + 2], b0 = b[H], b2 = b[H + 2];
#pragma GCC unroll 3
  for (int ky = 0; ky < 3; ++ky, p += row, w += 6) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const int32_t x = H ? Sxtb16Ror8(Load32(p + j * C)) : __sxtb16(Load32(p + j * C));
      if (j < 3) a0 = __smlabb(x, w[2 * j + H], a0), a2 = __smlatt(x, w[2 * j + H], a2);
      if (j > 0) b0 = __smlabb(x, w[2 * j - 2 + H], b0), b2 = __smlatt(x, w[2 * j - 2 + H], b2);
    }
  }
  a[H] = a0, a[H + 2] = a2, b[H] = b0, b[H + 2] = b2;
}

// Four channels' requantization: FastRequant where every sum the window can make fits it (bounded
// at setup from the bias, the input offset and the window's size), Requant otherwise; only the
// one in use is built.
struct FourRequant {
  bool fast;
  Requant exact[4];
  FastRequant quick[4];
  // Outputs `a` to `dst` and, with `b`, outputs `b` to `dst_b` (each channel's constants read once).
  void Store(const int32_t* a, int32_t out_offset, int32_t lo, int32_t hi, int8_t* dst, const int32_t* b = nullptr,
             int8_t* dst_b = nullptr) const {
    if (!fast) {
      for (int k = 0; k < 4; ++k) dst[k] = Clamp(exact[k](a[k]) + out_offset, lo, hi);
      for (int k = 0; b != nullptr && k < 4; ++k) dst_b[k] = Clamp(exact[k](b[k]) + out_offset, lo, hi);
      return;
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const FastRequant q = quick[k];
      dst[k] = Clamp(q(a[k]) + out_offset, lo, hi);
      if (b != nullptr) dst_b[k] = Clamp(q(b[k]) + out_offset, lo, hi);
    }
  }
};

// Channels [c, c + 4): weights sign-extended in pairs (0 and 2, 1 and 3) per tap, the sums at a
// window's start (`start`: bias; `full`: plus offset x the window's weight sum), the requantization.
// A call runs this once per four channels, and an output through a ring (tpup_conv.cc
// RunConvOverlapped) calls once per row, so it is kept to the widening: the weight sums in the
// same SIMD lanes (|sum| <= 81 x 128 fits an int16), and FastRequant's bound from the window's
// size (|w| <= 128) instead of the weights' magnitudes (about 7 instructions a tap, where the
// per-channel scalar loop took about 85; both requantizations are exact, so the outputs are the
// same whichever the bound picks).
void SetUpFour(const ConvOptions& o, const ConvGeometry& g, const int8_t* filter, const int32_t* bias,
               const int32_t* requant, int c, int32_t* w, int32_t* start, int32_t* full, FourRequant& r) {
  const int C = g.in_c, taps = g.k_h * g.k_w;
  int32_t s02 = 0, s13 = 0;
  const int8_t* f = filter + c;
  for (int t = 0; t < taps; ++t, f += C) {
    const int32_t f4 = Load32(f);
    const int32_t e = __sxtb16(f4), d = Sxtb16Ror8(f4);
    w[2 * t] = e, w[2 * t + 1] = d;
    s02 = __sadd16(s02, e), s13 = __sadd16(s13, d);
  }
  const int32_t sum[4] = {static_cast<int16_t>(s02 & 0xFFFF), static_cast<int16_t>(s13 & 0xFFFF),
                          static_cast<int16_t>(static_cast<uint32_t>(s02) >> 16),
                          static_cast<int16_t>(static_cast<uint32_t>(s13) >> 16)};
  const int64_t in_max = o.input_offset >= 0 ? 127 + o.input_offset : 128 - o.input_offset;  // |x + offset|
  const int64_t window = in_max * 128 * taps;
  r.fast = true;
  for (int k = 0; k < 4; ++k) {
    start[k] = bias != nullptr ? bias[c + k] : 0;
    // (wrapping, as the kernel's sums do: the final sum is the same int32)
    full[k] = static_cast<int32_t>(static_cast<uint32_t>(start[k]) + static_cast<uint32_t>(o.input_offset * sum[k]));
    const int64_t bound = (start[k] < 0 ? -static_cast<int64_t>(start[k]) : start[k]) + window;
    r.fast = r.fast && FastRequant::Fits(bound, requant[g.out_c + c + k]);
  }
  for (int k = 0; k < 4; ++k) {
    const int32_t m = requant[c + k], shift = requant[g.out_c + c + k];
    if (r.fast) {
      r.quick[k] = FastRequant(m, shift);
    } else {
      r.exact[k] = Requant(m, shift);
    }
  }
}

// Channels [c, c + 4), every output; 3x3 windows at stride 1 two outputs at a time where both lie inside.
template <int KW>
void FourChannels(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
                  const int8_t* filter, const int32_t* bias, const int32_t* requant, int c, int8_t* out) {
  const int C = g.in_c, row = g.in_w * C;
  int32_t w[2 * kFastMaxTaps], full[4], start[4];
  FourRequant r;
  SetUpFour(o, g, filter, bias, requant, c, w, start, full, r);
  const bool pairs = KW == 3 && g.k_h == 3 && o.stride_w == 1;
  const int32_t offset2 = static_cast<int32_t>((static_cast<uint32_t>(o.input_offset) & 0xFFFF) * 0x10001u);
  for (int oy = 0; oy < out_rows; ++oy) {
    const int iy0 = oy * o.stride_h - pad_top;
    const int ky0 = iy0 < 0 ? -iy0 : 0, ky1 = g.in_h - iy0 < g.k_h ? g.in_h - iy0 : g.k_h;
    const bool rows_inside = ky0 == 0 && ky1 == g.k_h;
    int8_t* dst = out + oy * g.out_w * C + c;
    for (int ox = 0; ox < g.out_w; ++ox, dst += C) {
      const int ix0 = ox * o.stride_w - o.pad_left;
      const int kx0 = ix0 < 0 ? -ix0 : 0, kx1 = g.in_w - ix0 < g.k_w ? g.in_w - ix0 : g.k_w;
      int32_t a[4], b[4];
      if (pairs && rows_inside && ix0 >= 0 && ix0 + 4 <= g.in_w && ox + 1 < g.out_w) {
        a[0] = b[0] = full[0], a[1] = b[1] = full[1], a[2] = b[2] = full[2], a[3] = b[3] = full[3];
        PairHalf3x3<0>(in + (iy0 * g.in_w + ix0) * C + c, C, row, w, a, b);
        __asm__ volatile("" ::: "memory");  // (two passes: merged, the compiler spills their registers)
        PairHalf3x3<1>(in + (iy0 * g.in_w + ix0) * C + c, C, row, w, a, b);
        r.Store(a, o.output_offset, o.act_min, o.act_max, dst, b, dst + C);
        ++ox, dst += C;
        continue;
      }
      if (rows_inside && kx0 == 0 && kx1 == g.k_w) {
        a[0] = full[0], a[1] = full[1], a[2] = full[2], a[3] = full[3];
        FullWindow<KW>(in + (iy0 * g.in_w + ix0) * C + c, C, row, g.k_h, g.k_w, w, a);
      } else {
        a[0] = start[0], a[1] = start[1], a[2] = start[2], a[3] = start[3];
        PartWindow(in + c, g, iy0, ix0, ky0, ky1, kx0, kx1, offset2, w, a);
      }
      r.Store(a, o.output_offset, o.act_min, o.act_max, dst);
    }
  }
}
#endif

}  // namespace

void RunDepthwiseFast(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
                      const int8_t* filter, const int32_t* bias, const int32_t* requant, int8_t* out) {
  int c = 0;
#if defined(TPUP_DSP)
  for (; c + 4 <= g.in_c; c += 4) {
    if (g.k_w == 3) {
      FourChannels<3>(o, g, pad_top, out_rows, in, filter, bias, requant, c, out);
    } else if (g.k_w == 5) {
      FourChannels<5>(o, g, pad_top, out_rows, in, filter, bias, requant, c, out);
    } else if (g.k_w == 7) {
      FourChannels<7>(o, g, pad_top, out_rows, in, filter, bias, requant, c, out);
    } else {
      FourChannels<0>(o, g, pad_top, out_rows, in, filter, bias, requant, c, out);
    }
  }
#endif
  for (; c < g.in_c; ++c) OneChannel(o, g, pad_top, out_rows, in, filter, bias, requant, c, out);
}

}  // namespace tpup
