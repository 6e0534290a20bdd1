// The harness's int8 depthwise 3x3 kernel for narrow maps (flag "dw3",
// tpu_pipeline/toolchain/ir/kernel_variants/depthwise3x3.py): one output channel per input
// channel, strides 1 and 2 (each direction), any padding. Bit-identical to TFLite Micro's
// DepthwiseConvPerChannel (and CMSIS-NN's): the same exact int32 sums, then
// tflite::MultiplyByQuantizedMultiplier's integers.
//
// Why faster than the four-channel kernels on narrow maps (TinyEngine's approach): one channel at
// a time, its input widened into a small int16 buffer on the stack, transposed where the map is
// taller than wide (kws's 25 x 5 maps: long rows, fewer passes' set-up). The input offset is
// folded into the bias (offset x the channel's weight sum) and the buffer's padding holds the
// input's zero point, written once per call: a padding tap adds w x zp, which the bias's
// offset x w cancels (zero, as TFLite's skipped tap), with no test; each channel writes only its input's positions, two a word. Each
// buffer row is an even number of int16s and 4-aligned, so every window row of an even output
// starts at an aligned word. The buffer's rows are read as one flattened run (ShapeFor), as many
// rows as kChunk sums hold per pass, two outputs side by side a step: per window row one LDRD of
// the row's weights as int16 pairs (w0, w1), (w1, w2), one LDRD of the inputs (stride 2: and one
// LDR), four dual or single multiplies (inline assembly: 21 instructions per two outputs at stride
// 1, 24 at stride 2). The sums go to a small array, then are requantized, two a step:
// RowScaleFast (SMMULR, the output offset in the rounding nudge; tpup_conv.h) where the channel's
// bias and the window's size bound every sum below 2^30 and its shift lies in [-22, -1]
// (checked per channel), else Requant's integers; the clamp one SSAT where the
// activation is the whole int8 range.
//
// Memory: arena scratch (tpup_conv.cc asks for it at Prepare: Depthwise3x3BufferBytes, and
// ir/kernel_variants/depthwise3x3.py `scratch` models it): the sums of a pass (at most kChunk + 1
// int32s), then the int16 buffer (at most kDw3MaxBuffer int16s, which Depthwise3x3Fits checks),
// each as large as the call's plan needs; nothing on the stack.

#include <cstdint>
#include <cstring>

#include "tpup_conv.h"

#if defined(__ARM_FEATURE_DSP) && defined(__ARM_FEATURE_SIMD32)
#define TPUP_DW3_ASM 1
#endif

namespace tpup {

namespace {

constexpr int kChunk = 64;  // sums a pass stores before they are requantized

// The buffer of one channel: rows of cols int16s, cols even, read as one flattened row: output i
// of a pass reads from position i x stride_b, so output (ra, rb) is i = ra x run + rb, run =
// stride_a x cols / stride_b; the outputs at rb >= cols_out are computed and dropped. A row's
// padding on the right is the next row's on the left (cols: the last window may reach pad_b
// into the next row). elems: the int16s a pass may read (its last pair half-dropped).
struct BufferShape {
  int rows, cols, run, elems;
};

BufferShape ShapeFor(int stride_a, int stride_b, int rows_out, int cols_out, int pad_b, int n_b) {
  const int reach = (cols_out - 1) * stride_b + 3 - pad_b, inner = pad_b + n_b;
  const int cols = ((reach > inner ? reach : inner) + 1) & ~1;
  const int rows = (rows_out - 1) * stride_a + 3, run = stride_a * cols / stride_b;
  const int read = ((rows_out - 1) * run + cols_out - 1) * stride_b + 2 * cols + 6;
  return {rows, cols, run, read > rows * cols ? read : rows * cols};
}

// A call in the buffer's orientation: buffer rows run along the input's rows (or, transposed,
// its columns); a: across buffer rows, b: along them.
struct Plan {
  int stride_a, stride_b, rows_out, cols_out, pad_a, pad_b, n_a, n_b;
  int in_a, in_b, dst_a, dst_b;  // input and output byte steps across and along buffer rows
  bool transposed;
  BufferShape s;
};

Plan PlanFor(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, bool transposed) {
  const int C = g.in_c;
  Plan p;
  if (!transposed) {
    p = {o.stride_h, o.stride_w, out_rows, g.out_w, pad_top, o.pad_left, g.in_h, g.in_w, g.in_w * C, C, g.out_w * C, C,
         false, {}};
  } else {
    p = {o.stride_w, o.stride_h, g.out_w, out_rows, o.pad_left, pad_top, g.in_w, g.in_h, C, g.in_w * C, C, g.out_w * C,
         true, {}};
  }
  p.s = ShapeFor(p.stride_a, p.stride_b, p.rows_out, p.cols_out, p.pad_b, p.n_b);
  return p;
}

bool BufferFits(const Plan& p) { return p.s.elems <= kDw3MaxBuffer && p.s.run <= kChunk; }

// Transposed where the map is taller than wide and that buffer fits, or where only it fits.
Plan ChoosePlan(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows) {
  const Plan plain = PlanFor(o, g, pad_top, out_rows, false), turned = PlanFor(o, g, pad_top, out_rows, true);
  if (BufferFits(turned) && (out_rows > g.out_w || !BufferFits(plain))) return turned;
  return plain;
}

inline int32_t Lo(int32_t v) { return static_cast<int16_t>(v & 0xFFFF); }
inline int32_t Hi(int32_t v) { return static_cast<int16_t>(static_cast<uint32_t>(v) >> 16); }

inline int32_t Word(const int16_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);  // (p is 4-aligned: one LDR)
  return v;
}

inline int32_t Pair(int32_t lo, int32_t hi) {
#if defined(TPUP_DW3_ASM)
  int32_t r;  // (one PKHBT, where GCC emits UXTH and ORR)
  __asm__("pkhbt %0, %1, %2, lsl #16" : "=r"(r) : "r"(lo), "r"(hi));
  return r;
#else
  return static_cast<int32_t>((static_cast<uint32_t>(lo) & 0xFFFF) | (static_cast<uint32_t>(hi) << 16));
#endif
}

// Channel c's input into the buffer's inner positions, as it is (int8 widened; the padding holds
// the input's zero point, and the bias carries offset x the weights' sum).
void Fill(const Plan& p, int c, const int8_t* in, int16_t* buf) {
  const int a1 = p.pad_a + p.n_a < p.s.rows ? p.pad_a + p.n_a : p.s.rows;
  const int n = (p.pad_b + p.n_b < p.s.cols ? p.pad_b + p.n_b : p.s.cols) - p.pad_b;
  const int step = p.in_b;
  for (int a = p.pad_a; a < a1; ++a) {
    const int8_t* x = in + (a - p.pad_a) * p.in_a + c;
    int16_t* d = buf + a * p.s.cols + p.pad_b;
    int k = 0;
#pragma GCC unroll 2
    for (; k + 2 <= n; k += 2, x += 2 * step, d += 2) {  // (an unaligned STR where pad_b is odd: allowed)
      const int32_t v = Pair(x[0], x[step]);
      __builtin_memcpy(d, &v, 4);
    }
    if (k < n) *d = *x;
  }
}

// Sums (from the bias) of `pairs` output pairs of one output row into acc, the window's first row
// at buffer position r: w holds the rows' weight pairs (w0, w1), (w1, w2).
template <int SW>
__attribute__((always_inline)) inline void MacPairs(const int16_t* r, int cols, const int32_t* w, int32_t bias, int pairs,
                                                    int32_t* acc) {
#if defined(TPUP_DW3_ASM)
  const int16_t *q0 = r, *q1 = r + cols, *q2 = r + 2 * cols;
  int32_t wa, wb, x0, x2, u, v;
// The loop over the output pairs: STEPS (a step per window row), then the pair stored.
#define TPUP_DW3_LOOP(STEPS)                                                                                      \
  __asm__ volatile("1:\n\t" STEPS                                                                                 \
                   "strd %[u], %[v], [%[acc]], #8\n\t"                                                            \
                   "subs %[n], %[n], #1\n\t"                                                                      \
                   "bne 1b\n\t"                                                                                   \
                   : [q0] "+r"(q0), [q1] "+r"(q1), [q2] "+r"(q2), [acc] "+r"(acc), [n] "+r"(pairs), [wa] "=&r"(wa), \
                     [wb] "=&r"(wb), [x0] "=&r"(x0), [x2] "=&r"(x2), [u] "=&r"(u), [v] "=&r"(v)                    \
                   : [w] "r"(w), [b] "r"(bias)                                                                    \
                   : "cc", "memory")
  if (SW == 1) {
#define TPUP_DW3_S1(Q, OFF, FIRST_U, FIRST_V)                  \
  "ldrd %[wa], %[wb], [%[w], #" OFF "]\n\t"                    \
  "ldrd %[x0], %[x2], [%[" Q "]], #4\n\t"                      \
  FIRST_U "\n\t" FIRST_V "\n\t"                                \
  "smlabt %[u], %[x2], %[wb], %[u]\n\t"                        \
  "smlad %[v], %[x2], %[wb], %[v]\n\t"
    TPUP_DW3_LOOP(TPUP_DW3_S1("q0", "0", "smlad %[u], %[x0], %[wa], %[b]", "smlatb %[v], %[x0], %[wa], %[b]")
                  TPUP_DW3_S1("q1", "8", "smlad %[u], %[x0], %[wa], %[u]", "smlatb %[v], %[x0], %[wa], %[v]")
                  TPUP_DW3_S1("q2", "16", "smlad %[u], %[x0], %[wa], %[u]", "smlatb %[v], %[x0], %[wa], %[v]"));
#undef TPUP_DW3_S1
  } else {
#define TPUP_DW3_S2(Q, OFF, FIRST_U, FIRST_V)                  \
  "ldrd %[wa], %[wb], [%[w], #" OFF "]\n\t"                    \
  "ldrd %[x0], %[x2], [%[" Q "]], #8\n\t"                      \
  FIRST_U "\n\t"                                               \
  "smlabt %[u], %[x2], %[wb], %[u]\n\t"                        \
  "ldr %[x0], [%[" Q "]]\n\t" FIRST_V "\n\t"                     \
  "smlabt %[v], %[x0], %[wb], %[v]\n\t"
    TPUP_DW3_LOOP(TPUP_DW3_S2("q0", "0", "smlad %[u], %[x0], %[wa], %[b]", "smlad %[v], %[x2], %[wa], %[b]")
                  TPUP_DW3_S2("q1", "8", "smlad %[u], %[x0], %[wa], %[u]", "smlad %[v], %[x2], %[wa], %[v]")
                  TPUP_DW3_S2("q2", "16", "smlad %[u], %[x0], %[wa], %[u]", "smlad %[v], %[x2], %[wa], %[v]"));
#undef TPUP_DW3_S2
  }
#undef TPUP_DW3_LOOP
#else
  for (int k = 0; k < pairs; ++k, r += 2 * SW, acc += 2) {
    acc[0] = acc[1] = bias;
    for (int ky = 0; ky < 3; ++ky) {
      const int32_t x0 = Word(r + ky * cols), x2 = Word(r + ky * cols + 2), x4 = SW == 2 ? Word(r + ky * cols + 4) : 0;
      const int32_t wa = w[2 * ky], wb = w[2 * ky + 1];
      acc[0] += Lo(x0) * Lo(wa) + Hi(x0) * Hi(wa) + Lo(x2) * Hi(wb);
      acc[1] += SW == 1 ? Hi(x0) * Lo(wa) + Lo(x2) * Lo(wb) + Hi(x2) * Hi(wb)
                        : Lo(x2) * Lo(wa) + Hi(x2) * Hi(wa) + Lo(x4) * Hi(wb);
    }
  }
#endif
}

// Channel c's outputs from its buffer, as many buffer rows of outputs at a time as kChunk sums
// hold: one pass of pairs over their flattened run, then their requantization, two a step (Scale:
// RowScaleFast or RowScaleExact; kFull: the clamp is the int8 range).
template <int SB, typename Scale, bool kFull>
void Outputs(const Plan& p, const int16_t* buf, int32_t* acc, const int32_t* w, int32_t bias, const Scale scale, int32_t lo,
             int32_t hi, int8_t* out) {
  const int step = p.dst_b, run = p.s.run, block = kChunk / run;
  for (int ra0 = 0; ra0 < p.rows_out; ra0 += block) {
    const int rows = p.rows_out - ra0 < block ? p.rows_out - ra0 : block;
    MacPairs<SB>(buf + ra0 * run * SB, p.s.cols, w, bias, ((rows - 1) * run + p.cols_out + 1) / 2, acc);
    for (int r = 0; r < rows; ++r) {
      const int32_t* a = acc + r * run;
      int8_t* dst = out + (ra0 + r) * p.dst_a;
      int k = 0;
      for (; k + 2 <= p.cols_out; k += 2, dst += 2 * step) {
        const int32_t a0 = a[k], a1 = a[k + 1];
        dst[0] = Narrow8<kFull>(scale(a0), lo, hi);
        dst[step] = Narrow8<kFull>(scale(a1), lo, hi);
      }
      if (k < p.cols_out) *dst = Narrow8<kFull>(scale(a[k]), lo, hi);
    }
  }
}

// What a call's channels share, set up once a call (a stage calls a layer once a tile, and each
// call sets up every channel again): the Outputs for the cheap requantization and for TFLite's
// integers (the stride along the buffer's rows and the clamp pick them), and the bias below which
// every sum is below 2^30 whatever the weights (|x + offset| x 9 x 128 at most: a bound from the
// window's size, as the fast depthwise kernel's, where a bound from the channel's weight
// magnitudes cost a dozen instructions a channel; both requantizations are exact, so the outputs
// are the same whichever the bound picks).
using FastOutputs = void (*)(const Plan&, const int16_t*, int32_t*, const int32_t*, int32_t, const RowScaleFast,
                             int32_t, int32_t, int8_t*);
using ExactOutputs = void (*)(const Plan&, const int16_t*, int32_t*, const int32_t*, int32_t, const RowScaleExact,
                              int32_t, int32_t, int8_t*);
struct CallSetUp {
  FastOutputs fast;
  ExactOutputs exact;
  uint32_t bias_limit;
};

CallSetUp SetUpCall(const ConvOptions& o, const Plan& p) {
  const bool full = o.act_min <= -128 && o.act_max >= 127, s1 = p.stride_b == 1;
  const int32_t in_max = o.input_offset >= 0 ? 127 + o.input_offset : 128 - o.input_offset;  // |x + offset|
  return {s1 ? (full ? Outputs<1, RowScaleFast, true> : Outputs<1, RowScaleFast, false>)
             : (full ? Outputs<2, RowScaleFast, true> : Outputs<2, RowScaleFast, false>),
          s1 ? (full ? Outputs<1, RowScaleExact, true> : Outputs<1, RowScaleExact, false>)
             : (full ? Outputs<2, RowScaleExact, true> : Outputs<2, RowScaleExact, false>),
          static_cast<uint32_t>((int32_t{1} << 30) - in_max * 9 * 128)};
}

// Channel c: its weights as pairs in the buffer's orientation, its requantization, its buffer,
// its outputs.
void Channel(const ConvOptions& o, const ConvGeometry& g, const Plan& p, const CallSetUp& call, const int8_t* in,
             const int8_t* filter, const int32_t* bias, const int32_t* requant, int c, int16_t* buf, int32_t* acc,
             int8_t* out) {
  const int C = g.in_c;
  int32_t w[6];
  const int32_t b = bias != nullptr ? bias[c] : 0;
  const int step_a = (p.transposed ? 1 : 3) * C, step_b = (p.transposed ? 3 : 1) * C;  // tap steps across / along buffer rows
  int32_t sum = 0;  // (at most 9 x 128)
  const int8_t* f = filter + c;
#pragma GCC unroll 3
  for (int ka = 0; ka < 3; ++ka, f += step_a) {
    const int32_t f0 = f[0], f1 = f[step_b], f2 = f[2 * step_b];
    w[2 * ka] = Pair(f0, f1), w[2 * ka + 1] = Pair(f1, f2);
    sum += f0 + f1 + f2;
  }
  // bias + offset x the weights' sum (wrapping, as the sums do: the final sum is the same int32)
  const int32_t folded = static_cast<int32_t>(static_cast<uint32_t>(b) + static_cast<uint32_t>(o.input_offset * sum));
  const uint32_t magnitude = b < 0 ? 0u - static_cast<uint32_t>(b) : static_cast<uint32_t>(b);
  Fill(p, c, in, buf);
  const int32_t m = requant[c], shift = requant[g.out_c + c];
  out += c;
  if (magnitude < call.bias_limit && shift >= -22 && shift <= -1) {  // RowScaleFast is exact (tpup_conv.h)
    call.fast(p, buf, acc, w, folded, RowScaleFast(m, shift, o.output_offset), o.act_min, o.act_max, out);
  } else {
    call.exact(p, buf, acc, w, folded, RowScaleExact(m, shift, o.output_offset), o.act_min, o.act_max, out);
  }
}

// The sums a pass stores (Outputs: pairs, as many buffer rows as kChunk sums hold), 8-aligned for
// STRD, then the buffer's int16s rounded up to a word (the padding is written a word at a time).
int SumsBytes(const Plan& p) {
  const int block = kChunk / p.s.run, rows = p.rows_out < block ? p.rows_out : block;
  return (((rows - 1) * p.s.run + p.cols_out + 1) / 2 * 2 * 4 + 7) & ~7;
}

}  // namespace

bool Depthwise3x3Fits(const ConvOptions& o, const ConvGeometry& g) {
  if (!(o.depth_multiplier == 1 && o.dilation_h == 1 && o.dilation_w == 1 && g.in_c == g.out_c && g.k_h == 3 &&
        g.k_w == 3 && (o.stride_h == 1 || o.stride_h == 2) && (o.stride_w == 1 || o.stride_w == 2))) {
    return false;
  }
  return BufferFits(ChoosePlan(o, g, o.pad_top, g.out_h));  // (a band's buffer is no larger in the same orientation)
}

int Depthwise3x3BufferBytes(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows) {
  const Plan p = ChoosePlan(o, g, pad_top, out_rows);
  return SumsBytes(p) + (p.s.elems + 1) / 2 * 4;
}

void RunDepthwise3x3(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
                     const int8_t* filter, const int32_t* bias, const int32_t* requant, int8_t* out, void* buffer) {
  const Plan p = ChoosePlan(o, g, pad_top, out_rows);
  int32_t* acc = static_cast<int32_t*>(buffer);  // (the arena's scratch: 16-aligned)
  int16_t* buf = reinterpret_cast<int16_t*>(static_cast<uint8_t*>(buffer) + SumsBytes(p));
  const int32_t zp2 = static_cast<int32_t>((static_cast<uint32_t>(-o.input_offset) & 0xFFFF) * 0x10001u);
  for (int k = 0; k < p.s.elems; k += 2) __builtin_memcpy(buf + k, &zp2, 4);  // the padding, once
  const CallSetUp call = SetUpCall(o, p);
  for (int c = 0; c < g.in_c; ++c) Channel(o, g, p, call, in, filter, bias, requant, c, buf, acc, out);
}

}  // namespace tpup
