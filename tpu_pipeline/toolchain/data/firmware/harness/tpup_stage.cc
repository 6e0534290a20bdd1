// TPUP_PATCH_STAGE: a region of layers run tile by tile inside one op (tpu_pipeline/toolchain/ir/stage.py
// describes it and its options; tpu_pipeline/toolchain/rewrite/patch_stage.py builds the program).
//
// Inputs: the region's input, then every constant its layers read (weights, biases, the
// requantization of each convolution, the re-laid weights of a packed or pointwise16 layer). Output: the region's output. The program copies each
// tile's input box into the scratch buffer, runs the layers on the tile's boxes there (the same
// kernels as TPUP_CONV_2D / TPUP_DEPTHWISE_CONV_2D, an output over its dying input computed row
// by row through a ring, TFLite's int8 ADD arithmetic), and copies the finished tile into the
// output. A 2-D streamed stage also pastes boxes between the tile buffers and its halo caches
// (PASTE). Persistent data: none (the options are read at every invoke); one
// scratch buffer: the tile buffers, then the set-up of each packed layer whose record asks for
// one (SetUpPacked: its requantization, set up once an invoke instead of once a tile), then the
// largest buffer a layer's kernel asks for.

#include <cstdint>
#include <cstring>

#include "tensorflow/lite/c/common.h"
#include "tensorflow/lite/kernels/internal/reference/integer_ops/add.h"
#include "tensorflow/lite/micro/kernels/kernel_util.h"
#include "tensorflow/lite/micro/micro_context.h"
#include "tensorflow/lite/micro/micro_log.h"
#include "tpup_add.h"
#include "tpup_conv.h"

namespace tpup {
namespace {

constexpr int kHeader = 9, kTensorWords = 7, kLayerWords = 28;
constexpr int kCopyIn = 1, kSlice = 2, kConv = 3, kAdd = 4, kCopyOut = 5, kPaste = 6;
constexpr int kStepWords[] = {0, 6, 10, 12, 15, 6, 12};
// The variant bits a conv layer's flags word (layer word 4) may carry: what this op runs. A bit
// outside them makes the options invalid (a newer writer's kernel is refused, not dropped).
constexpr int32_t kLayerFlags = kFlagDirect | kFlagPointwise | kFlagFastRequant | kFlagPacked | kFlagFast |
                                kFlagPointwise16 | kFlagPointwise16FastRequant | kFlagDw3;
// The variants that read a constant of their own, the one layer word 21 names.
constexpr int32_t kOwnConstant = kFlagPacked | kFlagPointwise16;

// A view of the options: little-endian int32 words (the buffer may be unaligned). The targets are
// little-endian and load a word at any address (Cortex-M3/M4/M7): one LDR a word (detection's
// 10x10 stage read its layer words byte by byte for about 10 k more instructions).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "stage options are little-endian words");
struct Words {
  const uint8_t* data;
  int size;
  int32_t operator[](int i) const {
    int32_t v;
    __builtin_memcpy(&v, data + 4 * i, 4);
    return v;
  }
};

struct Stage {
  Words w;
  int n_tensors, n_layers, program_words, scratch;
  int tensors_at() const { return kHeader; }
  int layers_at() const { return kHeader + n_tensors * kTensorWords; }
  int program_at() const { return layers_at() + n_layers * kLayerWords; }
  int32_t tensor(int t, int field) const { return w[tensors_at() + t * kTensorWords + field]; }
  int32_t layer(int k, int field) const { return w[layers_at() + k * kLayerWords + field]; }
};

bool ReadStage(const TfLiteNode* node, Stage* stage) {
  if (node->custom_initial_data == nullptr || node->custom_initial_data_size < 4 * kHeader ||
      node->custom_initial_data_size % 4) {
    return false;
  }
  stage->w = {static_cast<const uint8_t*>(node->custom_initial_data), static_cast<int>(node->custom_initial_data_size / 4)};
  stage->n_tensors = stage->w[3], stage->n_layers = stage->w[4], stage->program_words = stage->w[5], stage->scratch = stage->w[6];
  if (!(stage->w[0] == 1 && stage->n_tensors > 0 && stage->n_layers > 0 && stage->scratch >= 0 &&
        stage->program_at() + stage->program_words == stage->w.size)) {
    return false;
  }
  for (int k = 0; k < stage->n_layers; ++k) {  // a conv layer's flags: only what LayerOptions runs
    const int32_t kind = stage->layer(k, 0), flags = stage->layer(k, 4);
    if ((kind == 1 || kind == 2) && (flags & ~kLayerFlags) != 0) return false;
  }
  return true;
}

// The layer's convolution options and its geometry on a call's boxes.
ConvOptions LayerOptions(const Stage& stage, int k, int pad_top, int pad_left) {
  ConvOptions o = {};
  o.format = 1;
  o.flags = stage.layer(k, 4) & kLayerFlags;
  o.input_offset = stage.layer(k, 5), o.output_offset = stage.layer(k, 6), o.act_min = stage.layer(k, 7);
  o.stride_h = stage.layer(k, 8), o.stride_w = stage.layer(k, 9), o.dilation_h = stage.layer(k, 10);
  o.dilation_w = stage.layer(k, 11), o.depth_multiplier = stage.layer(k, 12), o.act_max = stage.layer(k, 16);
  o.pad_top = pad_top, o.pad_left = pad_left;
  return o;
}

ConvGeometry LayerGeometry(const Stage& stage, int k, int in_h, int in_w, int out_h, int out_w) {
  const int in = stage.layer(k, 1), out = stage.layer(k, 3);
  return {in_h, in_w, stage.tensor(in, 4), out_h, out_w, stage.tensor(out, 4), stage.layer(k, 17), stage.layer(k, 18)};
}

// The largest buffer a layer's kernel asks for, over the layers (their whole tensors: a tile's
// call never asks for more, its padding being no larger).
int KernelBuffer(const Stage& stage) {
  int most = 0;
  for (int k = 0; k < stage.n_layers; ++k) {
    const int kind = stage.layer(k, 0);
    if (kind != 1 && kind != 2) continue;
    const int in = stage.layer(k, 1), out = stage.layer(k, 3);
    const ConvGeometry g = LayerGeometry(stage, k, stage.tensor(in, 2), stage.tensor(in, 3), stage.tensor(out, 2), stage.tensor(out, 3));
    const int size = ConvBufferSize(LayerOptions(stage, k, stage.layer(k, 19), stage.layer(k, 20)), g, kind == 2);
    if (size > most) most = size;
  }
  return most;
}

// A packed layer whose record (word 22) asks for its requantization set up once an invoke.
bool SetUpOnce(const Stage& stage, int k) {
  return stage.layer(k, 0) == 1 && (stage.layer(k, 4) & kFlagPacked) && stage.layer(k, 22) == 1;
}

ConvGeometry WholeGeometry(const Stage& stage, int k) {
  const int in = stage.layer(k, 1), out = stage.layer(k, 3);
  return LayerGeometry(stage, k, stage.tensor(in, 2), stage.tensor(in, 3), stage.tensor(out, 2), stage.tensor(out, 3));
}

// The bytes of the packed layers' set-ups before layer k's (all of them: k = n_layers), each
// PackedSetupBytes (ir/stage.py setup_bytes sizes the same).
int SetupsBefore(const Stage& stage, int k) {
  int bytes = 0;
  for (int j = 0; j < k; ++j) {
    if (SetUpOnce(stage, j)) bytes += PackedSetupBytes(WholeGeometry(stage, j));
  }
  return bytes;
}

// Whether the dw3 kernel's stack buffer holds a call (and, through a ring, each one-row band of it,
// which the kernel may lay out the other way round): a call it does not hold is refused, never
// overrun (rewrite/patch_stage.py keeps dw3 only on layers whose every call it holds).
bool Dw3Fits(const ConvOptions& o, const ConvGeometry& g, bool ring) {
  ConvGeometry row = g;
  row.out_h = 1, row.in_h = g.in_h < g.k_h ? g.in_h : g.k_h;
  return Depthwise3x3Fits(o, g) && (!ring || Depthwise3x3Fits(o, row));
}

// A body constant's data: the op input the tensor table names.
template <typename T>
const T* Constant(TfLiteContext* context, TfLiteNode* node, const Stage& stage, int t) {
  if (t < 0) return nullptr;
  const TfLiteEvalTensor* e = tflite::micro::GetEvalInput(context, node, stage.tensor(t, 1));
  return e != nullptr ? tflite::micro::GetTensorData<T>(e) : nullptr;
}

// A conv layer's constants and set-up, found once an invoke for the first kKnownLayers layers (each
// Constant is a call into TFLite Micro; a layer past them finds its own per call, as before):
// detection's stage from the input calls each of its six layers 96 times.
constexpr int kKnownLayers = 12;
struct LayerConstants {
  const int8_t* filter;
  const int32_t *bias, *requant, *own, *setup;
  ConvOptions o;   // its options, pads 0 (a call sets its own)
  ConvGeometry g;  // its whole geometry (a call sets its boxes' sizes)
};

LayerConstants FindConstants(TfLiteContext* context, TfLiteNode* node, const Stage& stage, int k, const uint8_t* setups) {
  // a packed or pointwise16 layer's re-laid weights: the constant layer word 21 names (none: no such flag)
  const bool own = (stage.layer(k, 4) & kLayerFlags & kOwnConstant) != 0;
  return {Constant<int8_t>(context, node, stage, stage.layer(k, 13)), Constant<int32_t>(context, node, stage, stage.layer(k, 14)),
          Constant<int32_t>(context, node, stage, stage.layer(k, 15)),
          own ? Constant<int32_t>(context, node, stage, stage.layer(k, 21)) : nullptr,
          SetUpOnce(stage, k) && setups != nullptr ? reinterpret_cast<const int32_t*>(setups + SetupsBefore(stage, k)) : nullptr,
          LayerOptions(stage, k, 0, 0), WholeGeometry(stage, k)};
}

#if defined(__ARM_ARCH_7EM__) || defined(__ARM_ARCH_7M__)
// Both word-aligned: 32 bytes a pass by one LDM and one STM of eight registers (ascending, or
// descending from the ends when `down`), each group loaded before it is stored; the bytes past the
// last whole group are left to the caller. The pointers past what was moved.
#define TPUP_MOVE32_LOOP(LOAD, STORE)                          \
  __asm__ volatile("1:\n\t" LOAD " %[s]!, {r4, r5, r6, r8, r9, r10, r11, r12}\n\t" \
                   STORE " %[d]!, {r4, r5, r6, r8, r9, r10, r11, r12}\n\t"          \
                   "subs %[n], %[n], #1\n\t"                                         \
                   "bne 1b\n\t"                                                      \
                   : [s] "+r"(src), [d] "+r"(dst), [n] "+r"(groups)                   \
                   :                                                                  \
                   : "r4", "r5", "r6", "r8", "r9", "r10", "r11", "r12", "cc", "memory")
template <bool kDown>
__attribute__((always_inline)) inline void Move32(int8_t*& dst, const int8_t*& src, int groups) {
  if (groups <= 0) return;
  if (kDown) {
    TPUP_MOVE32_LOOP("ldmdb", "stmdb");
  } else {
    TPUP_MOVE32_LOOP("ldmia", "stmia");
  }
}
#undef TPUP_MOVE32_LOOP

#define TPUP_MOVE32 1
#endif

// n bytes from src to dst as memmove moves them (the two may overlap): both word-aligned, 32 at a
// time by LDM/STM (Move32), then sixteen at a time in words: newlib's memmove moves a byte at a
// time where it runs backwards or a pointer is unaligned (the input's 3-channel rows), copies a box
// onto itself, and its memcpy takes about 0.5 instructions a byte where LDM/STM take 0.125. The
// Cortex-M4/M7 load and store words at any address (LDM/STM only at aligned ones). Each group of
// words is loaded before it is stored, forwards when dst is below src and backwards when above, so
// no store reaches a byte still to be loaded.
__attribute__((optimize("no-tree-loop-distribute-patterns")))  // (not back into a memmove call)
void Move(int8_t* dst, const int8_t* src, int n) {
  if (dst == src) return;
  const bool aligned = ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 3) == 0;
#if !defined(TPUP_MOVE32)
  if (n >= 64 && (dst + n <= src || src + n <= dst) && aligned) {
    std::memcpy(dst, src, n);  // (apart and aligned: newlib's memcpy moves 64 bytes a loop)
    return;
  }
#endif
  uint32_t a, b, c, d;
  if (dst < src) {
    const int8_t* end = src + n;
#if defined(TPUP_MOVE32)
    if (aligned) Move32<false>(dst, src, n / 32);  // (LDM/STM: one instruction a group of registers)
#endif
    for (; end - src >= 16; src += 16, dst += 16) {
      __builtin_memcpy(&a, src, 4), __builtin_memcpy(&b, src + 4, 4);
      __builtin_memcpy(&c, src + 8, 4), __builtin_memcpy(&d, src + 12, 4);
      __builtin_memcpy(dst, &a, 4), __builtin_memcpy(dst + 4, &b, 4);
      __builtin_memcpy(dst + 8, &c, 4), __builtin_memcpy(dst + 12, &d, 4);
    }
    for (; end - src >= 4; src += 4, dst += 4) __builtin_memcpy(&a, src, 4), __builtin_memcpy(dst, &a, 4);
    while (src < end) *dst++ = *src++;
    return;
  }
  const int8_t* begin = src;
  src += n, dst += n;
#if defined(TPUP_MOVE32)
  if (aligned && (n & 3) == 0) Move32<true>(dst, src, n / 32);  // (from the ends: both stay aligned)
#endif
  for (; src - begin >= 16; src -= 16, dst -= 16) {
    __builtin_memcpy(&a, src - 4, 4), __builtin_memcpy(&b, src - 8, 4);
    __builtin_memcpy(&c, src - 12, 4), __builtin_memcpy(&d, src - 16, 4);
    __builtin_memcpy(dst - 4, &a, 4), __builtin_memcpy(dst - 8, &b, 4);
    __builtin_memcpy(dst - 12, &c, 4), __builtin_memcpy(dst - 16, &d, 4);
  }
  for (; src - begin >= 4; src -= 4, dst -= 4) __builtin_memcpy(&a, src - 4, 4), __builtin_memcpy(dst - 4, &a, 4);
  while (src > begin) *--dst = *--src;
}

// Rows in increasing order, each moved (not copied): a slice may land on its source's own first
// bytes, where every row moves to a lower address.
void CopyBox(const int8_t* src, int src_w, int c, int y0, int x0, int h, int w, int8_t* dst) {
  for (int r = 0; r < h; ++r) Move(dst + r * w * c, src + ((y0 + r) * src_w + x0) * c, w * c);
}

// A box into another buffer's box where neither overlaps the other and every row starts on a word
// (a halo cache's rows into a tile's box and back: most of a 2-D streamed stage's pastes): its
// rows moved inline, 32 bytes a pass by LDM/STM then a word at a time, without Move's call, its
// checks and its 16-byte loop (a 16-byte row, a column cache's pixel of 16 channels, took about
// 40 instructions through Move).
__attribute__((optimize("no-tree-loop-distribute-patterns")))  // (not back into a memcpy call)
void PasteApart(const int8_t* from, int from_stride, int8_t* to, int to_stride, int h, int n) {
  for (int r = 0; r < h; ++r, from += from_stride, to += to_stride) {
    const int8_t* s = from;
    int8_t* d = to;
#if defined(TPUP_MOVE32)
    Move32<false>(d, s, n >> 5);
    const int rest = n & 31;
#else
    const int rest = n;
#endif
    uint32_t a, b, c, e;
    for (int k = rest >> 4; k > 0; --k, s += 16, d += 16) {
      __builtin_memcpy(&a, s, 4), __builtin_memcpy(&b, s + 4, 4);
      __builtin_memcpy(&c, s + 8, 4), __builtin_memcpy(&e, s + 12, 4);
      __builtin_memcpy(d, &a, 4), __builtin_memcpy(d + 4, &b, 4);
      __builtin_memcpy(d + 8, &c, 4), __builtin_memcpy(d + 12, &e, 4);
    }
    for (int k = (rest & 15) >> 2; k > 0; --k, s += 4, d += 4) __builtin_memcpy(&a, s, 4), __builtin_memcpy(d, &a, 4);
  }
}

// A box into a box of another buffer (rows of dst_w elements): a 2-D streamed stage's halo
// caches and the input boxes it assembles from them. A box may move within its own bytes, as
// memmove moves: rows last to first when the destination starts after the source, or at it
// with wider rows (a tile's rows moved apart in place), else first to last (a cache's box moving
// to a lower index); apart and word-aligned, by PasteApart.
void PasteBox(const int8_t* src, int src_w, int c, int y0, int x0, int h, int w, int8_t* dst, int dst_w, int dy0,
              int dx0) {
  const int8_t* from = src + (y0 * src_w + x0) * c;
  int8_t* to = dst + (dy0 * dst_w + dx0) * c;
  const int n = w * c, from_stride = src_w * c, to_stride = dst_w * c;
  if (h <= 0 || n <= 0) return;
  const int8_t* from_end = from + (h - 1) * from_stride + n;
  const int8_t* to_end = to + (h - 1) * to_stride + n;
  if (((reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to) | n | from_stride | to_stride) & 3) == 0 &&
      (to_end <= from || from_end <= to)) {
    PasteApart(from, from_stride, to, to_stride, h, n);
    return;
  }
  const bool backwards = to > from || (to == from && dst_w > src_w);
  for (int k = 0; k < h; ++k) {
    const int r = backwards ? h - 1 - k : k;
    Move(to + r * dst_w * c, from + r * src_w * c, w * c);
  }
}

// TFLite's int8 ADD (reference_integer_ops::AddFunc's integers) on a call's boxes: from
// kAddTableMin elements from the tables of tpup_add.h, row by row, the sum requantized as TPUP_ADD
// does it (FastRequant where the tables bound the sums).
// (not inlined: its tables would sit in Eval's frame, and the other steps' code changed with them)
__attribute__((noinline)) TfLiteStatus Add(const Stage& stage, int k, const int32_t* step, uint8_t* scratch) {
  tflite::ArithmeticParams p = {};
  p.left_shift = stage.layer(k, 4), p.input1_offset = stage.layer(k, 5), p.output_offset = stage.layer(k, 6);
  p.quantized_activation_min = stage.layer(k, 7), p.input2_offset = stage.layer(k, 8);
  p.input1_multiplier = stage.layer(k, 9), p.input1_shift = stage.layer(k, 10);
  p.input2_multiplier = stage.layer(k, 11), p.input2_shift = stage.layer(k, 12);
  p.output_multiplier = stage.layer(k, 13), p.output_shift = stage.layer(k, 14);
  p.quantized_activation_max = stage.layer(k, 16);
  const int c = stage.tensor(stage.layer(k, 3), 4);
  const int8_t* a = reinterpret_cast<const int8_t*>(scratch + step[2]);
  const int8_t* b = reinterpret_cast<const int8_t*>(scratch + step[7]);
  int8_t* out = reinterpret_cast<int8_t*>(scratch + step[12]);
  const int a_w = step[4], a_y0 = step[5], a_x0 = step[6], b_w = step[9], b_y0 = step[10], b_x0 = step[11];
  const int h = step[13], w = step[14];
  const bool table = h * w * c >= kAddTableMin;
  int32_t t1[256], t2[256];
  AddTables(p, t1, t2, table);
  const bool fast = table && AddFastFits(p, t1, t2);
  const int n = w * c;  // (a box's row is contiguous in each of the three)
  for (int r = 0; r < h; ++r) {
    const int8_t* pa = a + ((a_y0 + r) * a_w + a_x0) * c;
    const int8_t* pb = b + ((b_y0 + r) * b_w + b_x0) * c;
    int8_t* po = out + r * n;
    if (!table) {
      for (int i = 0; i < n; ++i) po[i] = tflite::reference_integer_ops::AddFunc(pa[i], pb[i], p);
    } else if (fast) {
      AddLoop(p, t1, t2, FastRequant(p.output_multiplier, p.output_shift), pa, pb, n, po);
    } else {
      AddLoop(p, t1, t2, Requant(p.output_multiplier, p.output_shift), pa, pb, n, po);
    }
  }
  return kTfLiteOk;
}

// Every packed or pointwise16 layer's re-laid weights (the op input layer word 21 names): int32,
// as many words as its kernel reads, word-aligned (the kernels load them by LDRD / LDM).
bool OwnConstantsFit(TfLiteContext* context, TfLiteNode* node, const Stage& stage) {
  tflite::MicroContext* micro_context = tflite::GetMicroContext(context);
  for (int k = 0; k < stage.n_layers; ++k) {
    const int32_t flags = stage.layer(k, 0) == 1 ? stage.layer(k, 4) & kOwnConstant : 0;
    if (flags == 0) continue;
    const int t = stage.layer(k, 21);
    if (t < 0 || t >= stage.n_tensors || stage.tensor(t, 0) != 1) return false;
    const ConvGeometry g = WholeGeometry(stage, k);
    TfLiteTensor* w = micro_context->AllocateTempInputTensor(node, stage.tensor(t, 1));
    if (w == nullptr) return false;
    int words = 1;
    for (int d = 0; d < w->dims->size; ++d) words *= w->dims->data[d];
    const int need = (flags & kFlagPacked) ? g.out_c * (1 + PackedPairs(g.k_h, g.k_w, g.in_c)) : Pointwise16Words(g);
    const bool ok = w->type == kTfLiteInt32 && words == need && (reinterpret_cast<uintptr_t>(w->data.data) & 3) == 0 &&
                    ((flags & kFlagPacked) ? PackedFits(LayerOptions(stage, k, 0, 0), g)
                                           : PointwiseFits(LayerOptions(stage, k, 0, 0), g) && g.out_c >= 3);
    micro_context->DeallocateTempTfLiteTensor(w);
    if (!ok) return false;
  }
  return true;
}

void* Init(TfLiteContext*, const char*, size_t) { return nullptr; }

TfLiteStatus Prepare(TfLiteContext* context, TfLiteNode* node) {
  Stage stage;
  TF_LITE_ENSURE_MSG(context, ReadStage(node, &stage), "TPUP stage: invalid options");
  TF_LITE_ENSURE_EQ(context, node->outputs->size, 1);
  TF_LITE_ENSURE_MSG(context, OwnConstantsFit(context, node, stage), "TPUP stage: re-laid weights that do not fit their layer");
  return RequestScratch(context, node, Align16(stage.scratch) + SetupsBefore(stage, stage.n_layers) + KernelBuffer(stage));
}

TfLiteStatus Eval(TfLiteContext* context, TfLiteNode* node) {
  Stage stage;
  TF_LITE_ENSURE(context, ReadStage(node, &stage));
  const TfLiteEvalTensor* input = tflite::micro::GetEvalInput(context, node, 0);
  TfLiteEvalTensor* output = tflite::micro::GetEvalOutput(context, node, 0);
  const int8_t* x = tflite::micro::GetTensorData<int8_t>(input);
  int8_t* y = tflite::micro::GetTensorData<int8_t>(output);
  const int x_w = input->dims->data[2], x_c = input->dims->data[3];
  const int y_w = output->dims->data[2], y_c = output->dims->data[3];
  uint8_t* scratch = GetScratch(context, node);
  uint8_t* setups = scratch != nullptr ? scratch + Align16(stage.scratch) : nullptr;
  uint8_t* kernel_buffer = setups != nullptr ? setups + SetupsBefore(stage, stage.n_layers) : nullptr;
  for (int k = 0; k < stage.n_layers && setups != nullptr; ++k) {  // (Prepare checked their re-laid weights)
    if (!SetUpOnce(stage, k)) continue;
    SetUpPacked(LayerOptions(stage, k, 0, 0), WholeGeometry(stage, k), Constant<int32_t>(context, node, stage, stage.layer(k, 21)),
                Constant<int32_t>(context, node, stage, stage.layer(k, 15)),
                reinterpret_cast<int32_t*>(setups + SetupsBefore(stage, k)));
  }
  LayerConstants known[kKnownLayers];
  for (int k = 0; k < stage.n_layers && k < kKnownLayers; ++k) {
    const int kind = stage.layer(k, 0);
    if (kind == 1 || kind == 2) known[k] = FindConstants(context, node, stage, k, setups);  // (an ADD has none)
  }
  int32_t copy[15];
  // word-aligned options (the usual case): each step read where it lies, not copied word by word
  const int32_t* words = (reinterpret_cast<uintptr_t>(stage.w.data) & 3) == 0
                             ? reinterpret_cast<const int32_t*>(stage.w.data) : nullptr;
  for (int at = stage.program_at(), end = stage.program_at() + stage.program_words; at < end;) {
    const int code = stage.w[at];
    TF_LITE_ENSURE_MSG(context, code >= kCopyIn && code <= kPaste && at + kStepWords[code] <= end,
                       "TPUP stage: malformed program");
    const int32_t* step = words != nullptr ? words + at : copy;
    if (words == nullptr) {
      for (int i = 0; i < kStepWords[code]; ++i) copy[i] = stage.w[at + i];
    }
    at += kStepWords[code];
    if (code == kCopyIn) {  // [code, dst, y0, x0, h, w]
      CopyBox(x, x_w, x_c, step[2], step[3], step[4], step[5], reinterpret_cast<int8_t*>(scratch + step[1]));
    } else if (code == kSlice) {  // [code, src, src_h, src_w, c, y0, x0, h, w, dst]
      CopyBox(reinterpret_cast<const int8_t*>(scratch + step[1]), step[3], step[4], step[5], step[6], step[7],
              step[8], reinterpret_cast<int8_t*>(scratch + step[9]));
    } else if (code == kConv) {
      // [code, layer, in, in_h, in_w, pad_top, pad_left, out, out_h, out_w, ring, ring_rows]
      const int k = step[1];
      const LayerConstants c = k < kKnownLayers ? known[k] : FindConstants(context, node, stage, k, setups);
      ConvOptions o = c.o;
      o.pad_top = step[5], o.pad_left = step[6];
      ConvGeometry g = c.g;
      g.in_h = step[3], g.in_w = step[4], g.out_h = step[8], g.out_w = step[9];
      TF_LITE_ENSURE_MSG(context, c.own != nullptr || !(o.flags & kOwnConstant), "TPUP stage: a layer without its re-laid weights");
      TF_LITE_ENSURE_MSG(context, !(o.flags & kFlagDw3) || Dw3Fits(o, g, step[11] > 0), "TPUP stage: dw3 does not fit a call");
      TF_LITE_ENSURE_STATUS(RunConvOverlapped(o, g, stage.layer(k, 0) == 2,
                                              reinterpret_cast<const int8_t*>(scratch + step[2]), c.filter, c.bias,
                                              c.requant, reinterpret_cast<int8_t*>(scratch + step[7]), kernel_buffer,
                                              step[11] > 0 ? scratch + step[10] : nullptr, step[11], c.own, c.setup));
    } else if (code == kPaste) {  // [code, src, src_w, c, y0, x0, h, w, dst, dst_w, dst_y0, dst_x0]
      PasteBox(reinterpret_cast<const int8_t*>(scratch + step[1]), step[2], step[3], step[4], step[5], step[6],
               step[7], reinterpret_cast<int8_t*>(scratch + step[8]), step[9], step[10], step[11]);
    } else if (code == kAdd) {
      TF_LITE_ENSURE_STATUS(Add(stage, step[1], step, scratch));
    } else {  // kCopyOut: [code, src, y0, x0, h, w]
      const int8_t* src = reinterpret_cast<const int8_t*>(scratch + step[1]);
      for (int r = 0; r < step[4]; ++r) {
        std::memcpy(y + ((step[2] + r) * y_w + step[3]) * y_c, src + r * step[5] * y_c, step[5] * y_c);
      }
    }
  }
  return kTfLiteOk;
}

}  // namespace

const TFLMRegistration* Register_PATCH_STAGE() {
  static const TFLMRegistration r = tflite::micro::RegisterOp(Init, Prepare, Eval);
  return &r;
}

}  // namespace tpup
