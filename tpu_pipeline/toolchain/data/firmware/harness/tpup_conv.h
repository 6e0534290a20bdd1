// The harness's int8 convolutions: custom ops TPUP_CONV_2D and TPUP_DEPTHWISE_CONV_2D
// (tpu_pipeline/toolchain/ir/kernels.py describes them and their options).
//
// They compute what CONV_2D / DEPTHWISE_CONV_2D compute, with the same kernels (CMSIS-NN's in a
// CMSIS-NN build, TFLite's reference kernels otherwise), but keep nothing in the arena's
// persistent tail: the per-channel requantization is a constant input (input 3, int32 [2, C]:
// multipliers then shifts), the options are read from the flatbuffer at every invoke. The leading
// padding is explicit (a folded PAD), and with the "overlap" flag the output may be planned over
// the input's bytes: rows are then computed into a ring in the scratch buffer and written out once
// no later row reads the input bytes under them.
#pragma once

#include <cstdint>

#include "tensorflow/lite/c/common.h"
#include "tensorflow/lite/micro/micro_common.h"

#if defined(TFLITE_SINGLE_ROUNDING)
#error "the harness inlines TFLite's double-rounding MultiplyByQuantizedMultiplier (Requant)"
#endif

namespace tpup {

const TFLMRegistration* Register_CONV_2D();
const TFLMRegistration* Register_DEPTHWISE_CONV_2D();
const TFLMRegistration* Register_PATCH_STAGE();  // tpup_stage.cc
const TFLMRegistration* Register_MEAN();  // tpup_mean_mul.cc
const TFLMRegistration* Register_MUL();  // tpup_mean_mul.cc
const TFLMRegistration* Register_FULLY_CONNECTED();  // tpup_fully_connected.cc
const TFLMRegistration* Register_ADD();  // tpup_add.cc

constexpr int32_t kFlagDirect = 1, kFlagOverlap = 2, kFlagFast = 4, kFlagPacked = 8;
// The harness's own 1x1 kernel (flag "pointwise", tpup_pointwise.cc), and whether its cheap
// requantisation is proven exact for the op (ir/kernel_variants/pointwise.py requant_bits).
constexpr int32_t kFlagPointwise = 0x100, kFlagFastRequant = 0x200;
// The same kernel on weights re-laid offline as int16 pairs, three channels a pass (flag
// "pointwise16", its constant input 4), and its proof (ir/kernel_variants/pointwise16.py).
constexpr int32_t kFlagPointwise16 = 0x4000, kFlagPointwise16FastRequant = 0x8000;
// The words of a channel triple's header in its input 4: biases, multipliers, right shifts, nudges.
constexpr int kPointwise16Header = 12;
// Its widened pixel pair lies on the stack up to this many words (16 bytes per four input
// channels: up to 512 channels), else in the output's unwritten bytes as the pointwise kernel's
// (where they hold it; else a 2x2 loop that sums each channel's weights again every call).
constexpr int kPointwise16StackWords = 512;
// The harness's own convolution reading windows in place (flag "window", tpup_window.cc), and
// whether its cheap requantisation is proven exact (ir/kernel_variants/window.py requant_bits).
constexpr int32_t kFlagWindow = 0x400, kFlagWindowFastRequant = 0x800;
// The harness's depthwise 3x3 kernel for narrow maps (flag "dw3", tpup_depthwise3x3.cc) and its
// buffer's largest count of int16s (ir/kernel_variants/depthwise3x3.py MAX_BUFFER).
constexpr int32_t kFlagDw3 = 0x2000;
constexpr int kDw3MaxBuffer = 324;
constexpr int kFastMaxTaps = 81;  // the fast depthwise kernel's largest window (ir/kernels.py FAST_MAX_TAPS)
// the packed convolution's largest window: pairs and bytes a row (ir/kernels.py PACKED_MAX_PAIRS, _ROW)
constexpr int kPackedMaxPairs = 64, kPackedMaxRow = 64;

// A convolution's options, in the order tpu_pipeline/toolchain/ir/kernels.py writes them.
struct ConvOptions {
  int32_t format, version, flags, pad_top, pad_left, stride_h, stride_w, dilation_h, dilation_w,
      depth_multiplier, activation, input_offset, output_offset, act_min, act_max, ring_rows;
};

// The shapes of one call: [1, in_h, in_w, in_c] -> [1, out_h, out_w, out_c], a k_h x k_w window.
struct ConvGeometry {
  int in_h, in_w, in_c, out_h, out_w, out_c, k_h, k_w;
};

// `n` rounded up to 16 bytes (TFLite Micro's arena alignment): where a buffer follows another
// inside one scratch request.
int Align16(int n);

// The op's one scratch buffer of `bytes` (none for 0), requested at Prepare; its index is kept in
// node->user_data (index + 1, 0 = none). GetScratch gives it at Eval, or nullptr.
TfLiteStatus RequestScratch(TfLiteContext* context, TfLiteNode* node, int bytes);
uint8_t* GetScratch(TfLiteContext* context, TfLiteNode* node);

// The kernel's own buffer a whole-op call needs (CMSIS-NN's; dw3's in both builds; none for the
// direct or reference kernels).
int ConvBufferSize(const ConvOptions& o, const ConvGeometry& g, bool depthwise);

// Output rows [r0, r1) into `out` (rows x out_w x out_c, contiguous), reading `in`; `requant`
// holds the multipliers then the shifts; `buffer` the kernel's own buffer; `packed` the packed
// weights of a "packed" convolution (input 4); `setup` its requantization set up once for many
// calls (SetUpPacked; none: each call sets it up).
TfLiteStatus RunConv(const ConvOptions& o, const ConvGeometry& g, bool depthwise, int r0, int r1, const int8_t* in,
                     const int8_t* filter, const int32_t* bias, const int32_t* requant, int8_t* out, void* buffer,
                     const int32_t* packed = nullptr, const int32_t* setup = nullptr);

// The whole call, with `out` possibly lying over `in`: then rows are computed one at a time into
// `ring` (ring_rows x out_w x out_c bytes) and each written out once no later row reads the
// input bytes under it (tpu_pipeline/toolchain/ir/kernels.py ring_rows_for sizes the ring).
TfLiteStatus RunConvOverlapped(const ConvOptions& o, const ConvGeometry& g, bool depthwise, const int8_t* in,
                               const int8_t* filter, const int32_t* bias, const int32_t* requant, int8_t* out,
                               void* buffer, uint8_t* ring, int ring_rows, const int32_t* packed = nullptr,
                               const int32_t* setup = nullptr);

// The harness's own depthwise kernel (flag "fast", tpup_depthwise.cc): whether it runs a call of
// these options and shapes, and output rows [0, out_rows) of a band whose top padding is `pad_top`.
bool DepthwiseFastFits(const ConvOptions& o, const ConvGeometry& g);
void RunDepthwiseFast(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
                      const int8_t* filter, const int32_t* bias, const int32_t* requant, int8_t* out);

// The harness's depthwise 3x3 kernel for narrow maps (flag "dw3", tpup_depthwise3x3.cc): whether it
// runs a call of these options and shapes, the bytes of arena scratch a call of output rows
// [0, out_rows) of a band whose top padding is `pad_top` needs, and that call, with `buffer` (at
// least that many bytes, 8-aligned).
bool Depthwise3x3Fits(const ConvOptions& o, const ConvGeometry& g);
int Depthwise3x3BufferBytes(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows);
void RunDepthwise3x3(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
                     const int8_t* filter, const int32_t* bias, const int32_t* requant, int8_t* out, void* buffer);

// The harness's convolution for few input channels (flag "packed", tpup_first_conv.cc): the int16
// pairs a window packs into, whether it runs a call, and output rows [0, out_rows) of a band.
int PackedPairs(int k_h, int k_w, int in_c);
bool PackedFits(const ConvOptions& o, const ConvGeometry& g);
void RunConvPacked(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
                   const int32_t* packed, const int32_t* requant, int8_t* out, const int32_t* setup = nullptr);
// What every call of a packed layer sets up again (each channel's bound, requantization and, on the
// streamed path, its weight stream: about 9.5 k instructions for 16 channels), set up once in
// `setup` (PackedSetupBytes, word-aligned) for the calls of a patch stage's tiles: each channel's
// requantization, where every channel's sums fit the cheap one. 16 + 12 x out_c bytes, 16-aligned
// (ir/kernel_variants/packed.py stage_setup_bytes).
int PackedSetupBytes(const ConvGeometry& g);
void SetUpPacked(const ConvOptions& o, const ConvGeometry& g, const int32_t* packed, const int32_t* requant,
                 int32_t* setup);

// The harness's own 1x1 kernel (flag "pointwise", tpup_pointwise.cc): whether it runs a call of
// these options and shapes (the filter's depth must equal the input's: Prepare checks it), and
// output rows [0, out_rows) reading `in` (the rows' first input row); with `relaid` (flag
// "pointwise16": the int32 words of its input 4, Pointwise16Words) three channels a pass.
bool PointwiseFits(const ConvOptions& o, const ConvGeometry& g);
void RunPointwise(const ConvOptions& o, const ConvGeometry& g, int out_rows, const int8_t* in, const int8_t* filter,
                  const int32_t* bias, const int32_t* requant, int8_t* out, const int32_t* relaid = nullptr);
int Pointwise16Words(const ConvGeometry& g);

// The harness's own convolution for windows of several taps over input channels in fours (flag
// "window", tpup_window.cc): whether it runs a call, the int32 words of its constant input 4, and
// output rows [0, out_rows) of a band whose top padding is `pad_top`.
bool WindowFits(const ConvOptions& o, const ConvGeometry& g);
int WindowWords(const ConvGeometry& g);
void RunWindow(const ConvOptions& o, const ConvGeometry& g, int pad_top, int out_rows, const int8_t* in,
               const int8_t* filter, const int32_t* packed, const int32_t* requant, int8_t* out);

// tflite::MultiplyByQuantizedMultiplier (int32, gemmlowp's double rounding), inlined, its shift
// split at setup into a left shift and a rounding right shift: the same integers
// (SaturatingRoundingDoublingHighMul's one saturating case, both operands INT32_MIN, cannot
// occur: a multiplier is not negative).
struct Requant {
  int32_t multiplier, left, right, mask;
  Requant() = default;
  Requant(int32_t m, int32_t shift)
      : multiplier(m), left(shift > 0 ? shift : 0), right(shift > 0 ? 0 : -shift),
        mask(static_cast<int32_t>((1ll << (shift > 0 ? 0 : -shift)) - 1)) {}
  int32_t operator()(int32_t x) const {
    const int64_t ab = static_cast<int64_t>(x * (1 << left)) * multiplier;
    const int32_t high = static_cast<int32_t>((ab + (1ll << 30)) >> 31);  // = gemmlowp's truncating nudge
    const int32_t threshold = (mask >> 1) + (high < 0 ? 1 : 0);
    return (high >> right) + ((high & mask) > threshold ? 1 : 0);
  }
};

// Requant's integers, cheaper, for sums of magnitude at most a bound known at setup: where
// bound * 2^(left + 1) < 2^31 and the right shift is at least 1 (Fits), Requant's high word
// (x * 2^left * m + 2^30) >> 31 is SMMULR(x << (left + 1), m) (no overflow), and its rounding
// divide by 2^right is (high + 2^(right - 1) + (high < 0 ? -1 : 0)) >> right (round half away from
// zero; no overflow at that size): 5 instructions where Requant takes about 15.
struct FastRequant {
  int32_t lsh, multiplier, half, right;
  static bool Fits(int64_t bound, int32_t shift) {
    const int left = shift > 0 ? shift : 0;
    return shift <= -1 && shift >= -31 && left <= 29 && (bound << (left + 1)) < (int64_t{1} << 31);
  }
  FastRequant() = default;
  FastRequant(int32_t m, int32_t shift)
      : lsh((shift > 0 ? shift : 0) + 1), multiplier(m), half(shift < 0 ? 1 << (-shift - 1) : 0),
        right(shift < 0 ? -shift : 0) {}
  int32_t operator()(int32_t x) const {
    const int32_t h = MulHighRounded(x << lsh, multiplier);
    return (h + half + (h >> 31)) >> right;
  }
  // (a * b + 2^31) >> 32: SMMULR
  static int32_t MulHighRounded(int32_t a, int32_t b) {
#if defined(__ARM_FEATURE_DSP)
    int32_t r;
    __asm__("smmulr %0, %1, %2" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else
    return static_cast<int32_t>((static_cast<int64_t>(a) * b + (int64_t{1} << 31)) >> 32);
#endif
  }
};

inline int8_t Clamp(int32_t v, int32_t lo, int32_t hi) { return static_cast<int8_t>(v < lo ? lo : (v > hi ? hi : v)); }

// ---- the four-row pass of the fully connected and window kernels (tpup_fully_connected.cc,
// tpup_window.cc): int8 inputs against int16 weight pairs laid out offline (ir/fully_connected.py
// packed_pairs), the input offset folded into the bias.

// acc -> the output before the clamp: TFLite's integers (RowScaleExact), or where proven exact
// (every |acc| < 2^30, shift in [-22, -1]) SMMULR(2 acc, m) and one shift whose rounding nudge
// carries the output offset (RowScaleFast; tpup_pointwise.cc says why it is exact).
struct RowScaleExact {
  Requant q;
  int32_t offset;
  RowScaleExact() = default;
  RowScaleExact(int32_t m, int32_t s, int32_t out_offset) : q(m, s), offset(out_offset) {}
  int32_t operator()(int32_t acc) const { return q(acc) + offset; }
};

struct RowScaleFast {
  int32_t m, right, nudge;
  RowScaleFast() = default;
  RowScaleFast(int32_t mult, int32_t shift, int32_t out_offset)
      : m(mult), right(-shift), nudge((1 << (-shift - 1)) + out_offset * (1 << -shift)) {}
  int32_t operator()(int32_t acc) const {
    const int32_t h = FastRequant::MulHighRounded(acc * 2, m);
    return (h + nudge + (h >> 31)) >> right;
  }
};

// sum_k w[k] x[k] + acc over n int8 pairs (the input offset is in the folded bias).
inline int32_t DotInt8(const int8_t* w, const int8_t* x, int n, int32_t acc) {
  int k = 0;
#if defined(__ARM_FEATURE_DSP) && defined(__ARM_FEATURE_SIMD32)
  for (; k + 4 <= n; k += 4) {
    int32_t a, u, a13, u13, a02, u02;
    __builtin_memcpy(&a, x + k, 4);  // (unaligned LDRs: the cores this runs on allow them)
    __builtin_memcpy(&u, w + k, 4);
    __asm__("sxtb16 %0, %1" : "=r"(a02) : "r"(a));
    __asm__("sxtb16 %0, %1" : "=r"(u02) : "r"(u));
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(a13) : "r"(a));
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(u13) : "r"(u));
    __asm__("smlad %0, %1, %2, %0" : "+r"(acc) : "r"(a02), "r"(u02));
    __asm__("smlad %0, %1, %2, %0" : "+r"(acc) : "r"(a13), "r"(u13));
  }
#endif
  for (; k < n; ++k) acc += w[k] * x[k];
  return acc;
}

#if defined(__ARM_FEATURE_DSP) && defined(__ARM_FEATURE_SIMD32)
// a[0..3] += the `groups` words of int8 input at x times four rows' pairs at w (8 words a group:
// (x0, x2) of rows 0..3, then (x1, x3)). Inline assembly: 13 instructions per group (LDR, two
// SXTB16, two LDMs, eight SMLADs), four groups a loop pass; the compiler spills the same C.
#define TPUP_ROWS4_GROUP                \
  "ldr %[t], [%[x]], #4\n\t"          \
  "sxtb16 %[u], %[t]\n\t"             \
  "sxtb16 %[t], %[t], ror #8\n\t"     \
  "ldmia %[w]!, {r8-r11}\n\t"         \
  "smlad %[a0], %[u], r8, %[a0]\n\t"  \
  "smlad %[a1], %[u], r9, %[a1]\n\t"  \
  "smlad %[a2], %[u], r10, %[a2]\n\t" \
  "smlad %[a3], %[u], r11, %[a3]\n\t" \
  "ldmia %[w]!, {r8-r11}\n\t"         \
  "smlad %[a0], %[t], r8, %[a0]\n\t"  \
  "smlad %[a1], %[t], r9, %[a1]\n\t"  \
  "smlad %[a2], %[t], r10, %[a2]\n\t" \
  "smlad %[a3], %[t], r11, %[a3]\n\t"
#define TPUP_ROWS4_OPERANDS                                                                      \
  [a0] "+r"(a[0]), [a1] "+r"(a[1]), [a2] "+r"(a[2]), [a3] "+r"(a[3]), [x] "+r"(x), [w] "+r"(w), \
      [n] "+r"(n), [t] "=&r"(t), [u] "=&r"(u)
__attribute__((always_inline)) inline void Mac4Rows(const int8_t* x, const int32_t* w, int groups, int32_t* a) {
  int32_t t, u, n = groups & 3;
  if (n > 0) {
    __asm__ volatile("1:\n\t" TPUP_ROWS4_GROUP "subs %[n], %[n], #1\n\t"
                     "bne 1b\n\t"
                     : TPUP_ROWS4_OPERANDS
                     :
                     : "r8", "r9", "r10", "r11", "cc", "memory");
  }
  n = groups >> 2;
  if (n > 0) {
    __asm__ volatile("1:\n\t" TPUP_ROWS4_GROUP TPUP_ROWS4_GROUP TPUP_ROWS4_GROUP TPUP_ROWS4_GROUP
                     "subs %[n], %[n], #1\n\t"
                     "bne 1b\n\t"
                     : TPUP_ROWS4_OPERANDS
                     :
                     : "r8", "r9", "r10", "r11", "cc", "memory");
  }
}
#define TPUP_HAVE_ROWS4 1  // (TPUP_ROWS4_GROUP and TPUP_ROWS4_OPERANDS stay defined for tpup_window.cc)
#endif

// The clamp: the int8 range alone (kFull: no activation) is one SSAT on the DSP cores.
template <bool kFull>
inline int8_t Narrow8(int32_t v, int32_t lo, int32_t hi) {
#if defined(__ARM_FEATURE_DSP) && defined(__ARM_FEATURE_SIMD32)
  if (kFull) {
    int32_t r;
    __asm__("ssat %0, #8, %1" : "=r"(r) : "r"(v));
    return static_cast<int8_t>(r);
  }
#endif
  return Clamp(v, lo, hi);
}

// A custom op's options: its `n` little-endian int32 words into `w`, whatever the buffer's
// alignment; false where the op carries another number of bytes.
inline bool ReadOptionWords(const TfLiteNode* node, int n, int32_t* w) {
  if (node->custom_initial_data == nullptr || node->custom_initial_data_size != static_cast<size_t>(n) * 4) return false;
  const uint8_t* b = static_cast<const uint8_t*>(node->custom_initial_data);
  for (int i = 0; i < n; ++i, b += 4) {
    w[i] = static_cast<int32_t>(static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 |
                                static_cast<uint32_t>(b[2]) << 16 | static_cast<uint32_t>(b[3]) << 24);
  }
  return true;
}

}  // namespace tpup
