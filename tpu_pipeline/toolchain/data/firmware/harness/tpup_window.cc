// The harness's own int8 convolution reading windows in place (flag "window",
// tpu_pipeline/toolchain/ir/kernel_variants/window.py): windows of several taps, no dilation, input
// channels in fours, any stride and padding. Bit-identical to TFLite Micro's ConvPerChannel (and
// CMSIS-NN's): the same exact int32 sums, then tflite::MultiplyByQuantizedMultiplier's integers.
//
// Why faster than CMSIS-NN's im2col kernel: no im2col copy. A window row of an output pixel is
// kw x C contiguous input bytes; four output channels per pass read each of its words once, widen it
// by two SXTB16s and multiply it into all four channels' int16 weight pairs, laid out offline in
// that order (input 4): one LDM per pair, one SMLAD per channel, 13 instructions per 16 MACs
// (tpup_conv.h Mac4Rows, the fully connected kernel's loop). The input offset is folded into the
// bias offline, so the input is used as it is; a padding tap adds its channel's precomputed
// zero-point term instead of being read. Channels left over (fewer than four) are summed from the
// int8 weights (input 1). Channel groups outermost: the four scales are set up once per group.
//
// Requantisation: where window.py proved it exact (kFlagWindowFastRequant: every |acc| < 2^30,
// every shift in [-22, -1]) RowScaleFast, else tpup_conv.h's Requant, the general integers.

#include <cstdint>

#include "tpup_conv.h"

namespace tpup {

bool WindowFits(const ConvOptions& o, const ConvGeometry& g) {
  return g.k_h * g.k_w > 1 && g.in_c % 4 == 0 && o.dilation_h == 1 && o.dilation_w == 1;
}

int WindowWords(const ConvGeometry& g) {
  const int taps = g.k_h * g.k_w;
  return g.out_c * (1 + taps) + (g.out_c / 4 * 4) * taps * g.in_c / 2;
}

namespace {

// Where output pixel (oy, ox)'s window lies: its top-left input position and the taps of each
// window row that are inside the input ([kx0, kx1)).
struct Window {
  int iy0, ix0, kx0, kx1;
  Window(const ConvOptions& o, const ConvGeometry& g, int pad_top, int oy, int ox)
      : iy0(oy * o.stride_h - pad_top), ix0(ox * o.stride_w - o.pad_left) {
    kx0 = ix0 < 0 ? -ix0 : 0;
    kx1 = g.in_w - ix0 < g.k_w ? g.in_w - ix0 : g.k_w;
  }
  bool RowInside(const ConvGeometry& g, int ky) const { return iy0 + ky >= 0 && iy0 + ky < g.in_h; }
};

// The padding terms of window row ky's taps outside [kx0, kx1) (all of them for a padding row).
inline int32_t PadTerms(const int32_t* pads, const ConvGeometry& g, const Window& win, int ky, bool inside) {
  int32_t sum = 0;
  for (int kx = 0; kx < g.k_w; ++kx) {
    if (!inside || kx < win.kx0 || kx >= win.kx1) sum += pads[ky * g.k_w + kx];
  }
  return sum;
}

#if defined(TPUP_HAVE_ROWS4)
// a[0..3] += a whole window inside the input: `rows` rows of 4 x `quads` groups each (Mac4Rows's
// groups), `step` bytes from a row's end to the next row's start; the weights run on. One asm
// statement for the window: the row loop's count and step live in `ctl` (no register is left).
__attribute__((always_inline)) inline void Mac4Window(const int8_t* x, const int32_t* w, int quads, int step, int rows,
                                                      int32_t* a) {
  int32_t ctl[3] = {quads, step, rows};
  const int32_t* c = ctl;
  int32_t t, u, n = 0;
  __asm__ volatile("2:\n\t"
                   "ldr %[n], [%[c]]\n\t"
                   "1:\n\t" TPUP_ROWS4_GROUP TPUP_ROWS4_GROUP TPUP_ROWS4_GROUP TPUP_ROWS4_GROUP
                   "subs %[n], %[n], #1\n\t"
                   "bne 1b\n\t"
                   "ldr %[t], [%[c], #4]\n\t"
                   "add %[x], %[x], %[t]\n\t"
                   "ldr %[t], [%[c], #8]\n\t"
                   "subs %[t], %[t], #1\n\t"
                   "str %[t], [%[c], #8]\n\t"
                   "bne 2b\n\t"
                   : TPUP_ROWS4_OPERANDS
                   : [c] "r"(c)
                   : "r8", "r9", "r10", "r11", "cc", "memory");
}

// a[0..3] += a window partly in the padding: its rows' taps inside the input, and the padding
// terms (`pads`: the four channels' per-tap terms, `taps` apart) of the others.
void Border(const ConvGeometry& g, const Window& win, const int8_t* in, const int32_t* pairs, const int32_t* pads,
            int row_words, int32_t* a) {
  const int taps = g.k_h * g.k_w, C = g.in_c;
  for (int ky = 0; ky < g.k_h; ++ky) {
    const bool inside = win.RowInside(g, ky);
    int lo = g.k_w, hi = g.k_w;  // the taps [lo, hi) read from the input; the others are padding
    if (inside && win.kx1 > win.kx0) {
      lo = win.kx0, hi = win.kx1;
      const int8_t* x = in + ((win.iy0 + ky) * g.in_w + win.ix0 + lo) * C;
      Mac4Rows(x, pairs + ky * row_words + 2 * lo * C, (hi - lo) * C / 4, a);
    }
    for (int kx = 0; kx < g.k_w; ++kx) {
      if (kx >= lo && kx < hi) continue;
      const int32_t* p = pads + ky * g.k_w + kx;
      a[0] += p[0], a[1] += p[taps], a[2] += p[2 * taps], a[3] += p[3 * taps];
    }
  }
}

// The output columns [lo, hi) whose windows lie inside the input's width.
struct InsideColumns {
  int lo, hi;
  InsideColumns(const ConvOptions& o, const ConvGeometry& g) {
    lo = (o.pad_left + o.stride_w - 1) / o.stride_w;
    hi = g.in_w + o.pad_left >= g.k_w ? (g.in_w + o.pad_left - g.k_w) / o.stride_w + 1 : 0;
    if (hi > g.out_w) hi = g.out_w;
    if (hi < lo) hi = lo;
  }
};

// Output pixel `y`'s four channels from their sums (scales s[0..3]).
template <typename Scale, bool kFull>
inline void Store4(const Scale* s, const int32_t* a, int32_t lo, int32_t hi, int8_t* y) {
  y[0] = Narrow8<kFull>(s[0](a[0]), lo, hi);
  y[1] = Narrow8<kFull>(s[1](a[1]), lo, hi);
  y[2] = Narrow8<kFull>(s[2](a[2]), lo, hi);
  y[3] = Narrow8<kFull>(s[3](a[3]), lo, hi);
}

// Channels [c, c + 4) of every output pixel of the band: the pixels whose windows lie inside the
// input on a straight path (pointers stepped, whole windows in one asm statement where a window
// row is a multiple of 16 bytes), the others through Border.
template <typename Scale, bool kFull>
void FourChannels(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in, int c,
                  const int32_t* bias, const int32_t* pads, const int32_t* pairs, const int32_t* requant, int8_t* out) {
  const int taps = g.k_h * g.k_w, C = g.in_c, K = g.out_c;
  Scale s[4];
  for (int j = 0; j < 4; ++j) s[j] = Scale(requant[c + j], requant[K + c + j], o.output_offset);
  const int32_t lo = o.act_min, hi = o.act_max, b0 = bias[c], b1 = bias[c + 1], b2 = bias[c + 2], b3 = bias[c + 3];
  const int row_words = 2 * g.k_w * C;  // one window row's pairs of the four channels
  const int row_groups = g.k_w * C / 4, step = (g.in_w - g.k_w) * C, x_step = o.stride_w * C;
  const bool quads = row_groups % 4 == 0;  // whole windows in one asm statement
  const InsideColumns cols(o, g);
  for (int oy = 0; oy < out_rows; ++oy) {
    const int iy0 = oy * o.stride_h - pad_top;
    const bool rows_inside = iy0 >= 0 && iy0 + g.k_h <= g.in_h;
    int8_t* y = out + oy * g.out_w * K + c;
    for (int ox = 0; ox < g.out_w; ++ox, y += K) {
      if (rows_inside && ox == cols.lo && cols.hi > cols.lo) {  // the row's inside run
        const int8_t* x = in + (iy0 * g.in_w + ox * o.stride_w - o.pad_left) * C;
        for (; ox < cols.hi; ++ox, y += K, x += x_step) {
          int32_t a[4] = {b0, b1, b2, b3};
          if (quads) {
            Mac4Window(x, pairs, row_groups / 4, step, g.k_h, a);
          } else {
            for (int ky = 0; ky < g.k_h; ++ky) Mac4Rows(x + ky * g.in_w * C, pairs + ky * row_words, row_groups, a);
          }
          Store4<Scale, kFull>(s, a, lo, hi, y);
        }
        if (ox >= g.out_w) break;
      }
      int32_t a[4] = {b0, b1, b2, b3};
      Border(g, Window(o, g, pad_top, oy, ox), in, pairs, pads + c * taps, row_words, a);
      Store4<Scale, kFull>(s, a, lo, hi, y);
    }
  }
}
#endif

// Channel c of every output pixel of the band, from the int8 weights.
template <typename Scale>
void OneChannel(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in, int c,
                const int8_t* filter, const int32_t* bias, const int32_t* pads, const int32_t* requant, int8_t* out) {
  const int taps = g.k_h * g.k_w, C = g.in_c, K = g.out_c;
  const Scale s(requant[c], requant[K + c], o.output_offset);
  const int8_t* w = filter + c * taps * C;
  for (int oy = 0; oy < out_rows; ++oy) {
    for (int ox = 0; ox < g.out_w; ++ox) {
      const Window win(o, g, pad_top, oy, ox);
      int32_t acc = bias[c];
      for (int ky = 0; ky < g.k_h; ++ky) {
        const bool inside = win.RowInside(g, ky);
        if (inside && win.kx1 > win.kx0) {
          const int8_t* x = in + ((win.iy0 + ky) * g.in_w + win.ix0 + win.kx0) * C;
          acc = DotInt8(w + (ky * g.k_w + win.kx0) * C, x, (win.kx1 - win.kx0) * C, acc);
        }
        acc += PadTerms(pads + c * taps, g, win, ky, inside);
      }
      out[(oy * g.out_w + ox) * K + c] = Clamp(s(acc), o.act_min, o.act_max);
    }
  }
}

template <typename Scale, bool kFull>
void Run(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in, const int8_t* filter,
         const int32_t* packed, const int32_t* requant, int8_t* out) {
  const int taps = g.k_h * g.k_w, K = g.out_c;
  const int32_t* bias = packed;
  const int32_t* pads = packed + K;
  int c = 0;
#if defined(TPUP_HAVE_ROWS4)
  const int32_t* pairs = packed + K * (1 + taps);
  for (; c + 4 <= K; c += 4, pairs += 2 * taps * g.in_c) {
    FourChannels<Scale, kFull>(o, g, pad_top, out_rows, in, c, bias, pads, pairs, requant, out);
  }
#endif
  for (; c < K; ++c) OneChannel<Scale>(o, g, pad_top, out_rows, in, c, filter, bias, pads, requant, out);
}

}  // namespace

void RunWindow(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
               const int8_t* filter, const int32_t* packed, const int32_t* requant, int8_t* out) {
  const bool full = o.act_min == -128 && o.act_max == 127;
  if (o.flags & kFlagWindowFastRequant) {
    (full ? Run<RowScaleFast, true> : Run<RowScaleFast, false>)(o, g, pad_top, out_rows, in, filter, packed, requant,
                                                                out);
  } else {
    (full ? Run<RowScaleExact, true> : Run<RowScaleExact, false>)(o, g, pad_top, out_rows, in, filter, packed,
                                                                  requant, out);
  }
}

}  // namespace tpup
