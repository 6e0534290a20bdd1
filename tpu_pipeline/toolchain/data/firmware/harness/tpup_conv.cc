// TPUP_CONV_2D and TPUP_DEPTHWISE_CONV_2D: see tpup_conv.h and tpu_pipeline/toolchain/ir/kernels.py.
//
// Persistent data: none. Init returns nothing; Prepare checks the tensors and asks for at most one
// scratch buffer (the kernel's own buffer, as the builtin asks for it, then the ring of output rows
// of an overlapped op), whose index it keeps in node->user_data (index + 1, 0 = none).

#include "tpup_conv.h"

#include <cstdint>
#include <cstring>

#include "tensorflow/lite/c/common.h"
#include "tensorflow/lite/kernels/internal/reference/integer_ops/conv.h"
#include "tensorflow/lite/kernels/internal/reference/integer_ops/depthwise_conv.h"
#include "tensorflow/lite/micro/kernels/kernel_util.h"
#include "tensorflow/lite/micro/micro_context.h"
#include "tensorflow/lite/micro/micro_log.h"
#if defined(CMSIS_NN)
#include "Include/arm_nnfunctions.h"
#endif

namespace tpup {
namespace {

constexpr int kInput = 0, kFilter = 1, kBias = 2, kRequant = 3, kPacked = 4, kOutput = 0;
constexpr int kWords = 16;
using Options = ConvOptions;
using Geometry = ConvGeometry;
static_assert(sizeof(Options) == kWords * sizeof(int32_t), "Options is the options' word layout");

bool ReadOptions(const TfLiteNode* node, Options* o) {
  if (!ReadOptionWords(node, kWords, reinterpret_cast<int32_t*>(o))) return false;
  const bool flags_ok = (o->flags & ~0xEF3F) == 0 && (!(o->flags & kFlagFastRequant) || (o->flags & kFlagPointwise)) &&
                        (!(o->flags & kFlagPointwise16FastRequant) || (o->flags & kFlagPointwise16)) &&
                        (!(o->flags & kFlagWindowFastRequant) || (o->flags & kFlagWindow));
  return o->format == 1 && flags_ok && o->stride_h >= 1 && o->stride_w >= 1 && o->dilation_h >= 1 && o->dilation_w >= 1 &&
         o->depth_multiplier >= 1 && o->pad_top >= 0 && o->pad_left >= 0 && o->act_min <= o->act_max &&
         (!(o->flags & kFlagOverlap) || o->ring_rows >= 1);
}

}  // namespace

int Align16(int n) { return (n + 15) / 16 * 16; }

TfLiteStatus RequestScratch(TfLiteContext* context, TfLiteNode* node, int bytes) {
  node->user_data = nullptr;
  if (bytes > 0) {
    int index = -1;
    TF_LITE_ENSURE_STATUS(context->RequestScratchBufferInArena(context, bytes, &index));
    node->user_data = reinterpret_cast<void*>(static_cast<intptr_t>(index) + 1);
  }
  return kTfLiteOk;
}

uint8_t* GetScratch(TfLiteContext* context, TfLiteNode* node) {
  const intptr_t index = reinterpret_cast<intptr_t>(node->user_data) - 1;
  return index >= 0 ? static_cast<uint8_t*>(context->GetScratchBuffer(context, index)) : nullptr;
}

namespace {

// The quantized parameters CONV_2D and DEPTHWISE_CONV_2D share, for a band whose top padding is
// `pad_top`.
template <typename Params>
Params QuantizedParams(const ConvOptions& o, int pad_top) {
  Params p = {};
  p.padding_values.height = static_cast<int16_t>(pad_top);
  p.padding_values.width = static_cast<int16_t>(o.pad_left);
  p.stride_height = static_cast<int16_t>(o.stride_h);
  p.stride_width = static_cast<int16_t>(o.stride_w);
  p.dilation_height_factor = static_cast<int16_t>(o.dilation_h);
  p.dilation_width_factor = static_cast<int16_t>(o.dilation_w);
  p.input_offset = o.input_offset;
  p.output_offset = o.output_offset;
  p.quantized_activation_min = o.act_min;
  p.quantized_activation_max = o.act_max;
  return p;
}

#if defined(CMSIS_NN)
void Dims(const Geometry& g, int in_h, int out_h, bool depthwise, cmsis_nn_dims* in, cmsis_nn_dims* filter,
          cmsis_nn_dims* bias, cmsis_nn_dims* out) {
  *in = {1, in_h, g.in_w, g.in_c};
  *filter = depthwise ? cmsis_nn_dims{1, g.k_h, g.k_w, g.out_c} : cmsis_nn_dims{1, g.k_h, g.k_w, g.in_c};
  *bias = {1, 1, 1, g.out_c};
  *out = {1, out_h, g.out_w, g.out_c};
}

void ConvParams(const Options& o, int pad_top, cmsis_nn_conv_params* p) {
  p->input_offset = o.input_offset;
  p->output_offset = o.output_offset;
  p->stride = {o.stride_w, o.stride_h};
  p->padding = {o.pad_left, pad_top};
  p->dilation = {o.dilation_w, o.dilation_h};
  p->activation = {o.act_min, o.act_max};
}

void DwParams(const Options& o, int pad_top, cmsis_nn_dw_conv_params* p) {
  p->input_offset = o.input_offset;
  p->output_offset = o.output_offset;
  p->ch_mult = o.depth_multiplier;
  p->stride = {o.stride_w, o.stride_h};
  p->padding = {o.pad_left, pad_top};
  p->dilation = {o.dilation_w, o.dilation_h};
  p->activation = {o.act_min, o.act_max};
}

// The kernel's own buffer for a call of `in_h` input rows and `out_h` output rows.
int OwnBuffer(const Options& o, const Geometry& g, int in_h, int out_h, bool depthwise) {
  if (o.flags & (kFlagDirect | kFlagFast | kFlagPacked | kFlagPointwise | kFlagPointwise16 | kFlagWindow | kFlagDw3)) return 0;
  cmsis_nn_dims in, filter, bias, out;
  Dims(g, in_h, out_h, depthwise, &in, &filter, &bias, &out);
  if (depthwise) {
    cmsis_nn_dw_conv_params p;
    DwParams(o, o.pad_top, &p);
    return arm_depthwise_conv_wrapper_s8_get_buffer_size(&p, &in, &filter, &out);
  }
  cmsis_nn_conv_params p;
  ConvParams(o, o.pad_top, &p);
  return arm_convolve_wrapper_s8_get_buffer_size(&p, &in, &filter, &out);
}
#else
int OwnBuffer(const Options&, const Geometry&, int, int, bool) { return 0; }  // reference kernels ask for none
#endif

// Input rows [top, top + rows) that output rows [r0, r1) read, and the padding above them.
struct Band {
  int top, rows, pad_top;
};

Band BandFor(const Options& o, const Geometry& g, int r0, int r1) {
  const int first = r0 * o.stride_h - o.pad_top;
  const int last = (r1 - 1) * o.stride_h - o.pad_top + (g.k_h - 1) * o.dilation_h;
  const int top = first < 0 ? 0 : first;
  const int bottom = last >= g.in_h ? g.in_h - 1 : last;
  return {top, bottom - top + 1, top - first};
}

}  // namespace

int ConvBufferSize(const Options& o, const Geometry& g, bool depthwise) {
  if (o.flags & kFlagDw3) return Depthwise3x3BufferBytes(o, g, o.pad_top, g.out_h);
  return OwnBuffer(o, g, g.in_h, g.out_h, depthwise);
}

namespace {

// The op's own buffer: the largest any call asks for (a whole-op call, or a one-row band; dw3's
// in both builds).
int OwnBufferSize(const Options& o, const Geometry& g, bool depthwise) {
  const int whole = ConvBufferSize(o, g, depthwise);
  if (!(o.flags & kFlagOverlap)) return whole;
  const Band band = BandFor(o, g, 0, 1);
  Geometry in_band = g;
  in_band.in_h = band.rows;
  const int row = (o.flags & kFlagDw3) ? Depthwise3x3BufferBytes(o, in_band, band.pad_top, 1)
                                       : OwnBuffer(o, g, band.rows, 1, depthwise);
  return whole > row ? whole : row;
}

}  // namespace

// Output rows [r0, r1) of the op into `out` (rows x out_w x out_c, contiguous), reading `in`.
TfLiteStatus RunConv(const Options& o, const Geometry& g, bool depthwise, int r0, int r1, const int8_t* in,
                 const int8_t* filter, const int32_t* bias, const int32_t* requant, int8_t* out, void* buffer,
                 const int32_t* packed, const int32_t* setup) {
  const Band band = BandFor(o, g, r0, r1);
  if (band.rows <= 0) {
    MicroPrintf("TPUP conv: output rows %d..%d read only padding", r0, r1 - 1);
    return kTfLiteError;
  }
  const int8_t* band_in = in + band.top * g.in_w * g.in_c;
  const int32_t* multiplier = requant;
  const int32_t* shift = requant + g.out_c;
  if (o.flags & kFlagFast) {  // the harness's own depthwise kernel, in both builds (Prepare checked it fits)
    Geometry in_band = g;
    in_band.in_h = band.rows;
    RunDepthwiseFast(o, in_band, band.pad_top, r1 - r0, band_in, filter, bias, requant, out);
    return kTfLiteOk;
  }
  if (o.flags & kFlagDw3) {  // the depthwise 3x3 kernel for narrow maps, in both builds (Prepare checked it fits)
    Geometry in_band = g;
    in_band.in_h = band.rows;
    if (buffer == nullptr) return kTfLiteError;  // (Prepare asked for its buffer)
    RunDepthwise3x3(o, in_band, band.pad_top, r1 - r0, band_in, filter, bias, requant, out, buffer);
    return kTfLiteOk;
  }
  if (o.flags & kFlagPointwise) {  // the harness's own 1x1 kernel, in both builds (Prepare checked it fits)
    RunPointwise(o, g, r1 - r0, band_in, filter, bias, requant, out);
    return kTfLiteOk;
  }
  if ((o.flags & kFlagPointwise16) && packed != nullptr) {  // the same on re-laid weights (Prepare checked it)
    RunPointwise(o, g, r1 - r0, band_in, filter, bias, requant, out, packed);
    return kTfLiteOk;
  }
  if ((o.flags & kFlagWindow) && packed != nullptr) {  // the window kernel, in both builds (Prepare checked it)
    Geometry in_band = g;
    in_band.in_h = band.rows;
    RunWindow(o, in_band, band.pad_top, r1 - r0, band_in, filter, packed, requant, out);
    return kTfLiteOk;
  }
  if ((o.flags & kFlagPacked) && packed != nullptr) {  // the packed kernel, in both builds (Prepare checked it)
    Geometry in_band = g;
    in_band.in_h = band.rows;
    RunConvPacked(o, in_band, band.pad_top, r1 - r0, band_in, packed, requant, out, setup);
    return kTfLiteOk;
  }
#if defined(CMSIS_NN)
  cmsis_nn_dims in_dims, filter_dims, bias_dims, out_dims;
  Dims(g, band.rows, r1 - r0, depthwise, &in_dims, &filter_dims, &bias_dims, &out_dims);
  cmsis_nn_per_channel_quant_params quant = {const_cast<int32_t*>(multiplier), const_cast<int32_t*>(shift)};
  cmsis_nn_context ctx = {buffer, 0};
  if (depthwise) {
    cmsis_nn_dw_conv_params p;
    DwParams(o, band.pad_top, &p);
    // direct: CMSIS-NN's generic depthwise kernel, which needs no buffer (the wrapper's "opt"
    // kernel asks for an int16 copy of a window over all channels)
    const arm_cmsis_nn_status status =
        (o.flags & kFlagDirect)
            ? arm_depthwise_conv_s8(&ctx, &p, &quant, &in_dims, band_in, &filter_dims, filter, &bias_dims, bias,
                                    &out_dims, out)
            : arm_depthwise_conv_wrapper_s8(&ctx, &p, &quant, &in_dims, band_in, &filter_dims, filter, &bias_dims,
                                            bias, &out_dims, out);
    return status == ARM_CMSIS_NN_SUCCESS ? kTfLiteOk : kTfLiteError;
  }
  if (!(o.flags & kFlagDirect)) {
    cmsis_nn_conv_params p;
    ConvParams(o, band.pad_top, &p);
    return arm_convolve_wrapper_s8(&ctx, &p, &quant, &in_dims, band_in, &filter_dims, filter, &bias_dims, bias,
                                   &out_dims, out) == ARM_CMSIS_NN_SUCCESS
               ? kTfLiteOk
               : kTfLiteError;
  }
#else
  (void)buffer;
#endif
  const int32_t in_d[4] = {1, band.rows, g.in_w, g.in_c}, out_d[4] = {1, r1 - r0, g.out_w, g.out_c};
  const int32_t dw_filter_d[4] = {1, g.k_h, g.k_w, g.out_c}, filter_d[4] = {g.out_c, g.k_h, g.k_w, g.in_c};
  const tflite::RuntimeShape in_shape(4, in_d), out_shape(4, out_d), bias_shape(1, &out_d[3]);
  if (depthwise) {
    auto p = QuantizedParams<tflite::DepthwiseParams>(o, band.pad_top);
    p.depth_multiplier = static_cast<int16_t>(o.depth_multiplier);
    tflite::reference_integer_ops::DepthwiseConvPerChannel(
        p, multiplier, shift, in_shape, band_in, tflite::RuntimeShape(4, dw_filter_d), filter,
        bias_shape, bias, out_shape, out);
    return kTfLiteOk;
  }
  const auto p = QuantizedParams<tflite::ConvParams>(o, band.pad_top);
  tflite::reference_integer_ops::ConvPerChannel(p, multiplier, shift, in_shape, band_in,
                                                tflite::RuntimeShape(4, filter_d), filter,
                                                bias_shape, bias, out_shape, out);
  return kTfLiteOk;
}

namespace {

// An overlapped call's rows: whether output row p may be written once `done` rows of the order are
// computed (its bytes cover only input rows no row still to compute reads: the rule of
// ir/overlap.py `overlap_schedule`, which mirrors this).
struct Overlap {
  uintptr_t in_lo, in_hi, out_lo;
  size_t row_in, row_out;
  int in_h, out_h, pad_top, stride, span;
  bool backwards;
  int Row(int k) const { return backwards ? out_h - 1 - k : k; }
  bool Free(int p, int done) const {
    const uintptr_t a = out_lo + p * row_out, e = a + row_out;
    if (!(e > in_lo && a < in_hi)) return true;
    const int j0 = a > in_lo ? static_cast<int>((a - in_lo) / row_in) : 0;
    int j1 = static_cast<int>((e - 1 - in_lo) / row_in);
    if (j1 > in_h - 1) j1 = in_h - 1;
    if (backwards) {  // rows out_h - done.. are done: j0's first reader must be among them
      const int n = j0 + pad_top - span + 1;
      return (n <= 0 ? 0 : (n + stride - 1) / stride) >= out_h - done;
    }
    int last_reader = (j1 + pad_top) / stride;  // rows ..done - 1 are done: j1's last reader must be among them
    if (last_reader > out_h - 1) last_reader = out_h - 1;
    return last_reader < done;
  }
};

}  // namespace

TfLiteStatus RunConvOverlapped(const ConvOptions& o, const ConvGeometry& g, bool depthwise, const int8_t* in,
                               const int8_t* filter, const int32_t* bias, const int32_t* requant, int8_t* out,
                               void* buffer, uint8_t* ring, int ring_rows, const int32_t* packed,
                               const int32_t* setup) {
  const size_t row_in = static_cast<size_t>(g.in_w) * g.in_c, row_out = static_cast<size_t>(g.out_w) * g.out_c;
  const uintptr_t in_lo = reinterpret_cast<uintptr_t>(in), in_hi = in_lo + g.in_h * row_in;
  const uintptr_t out_lo = reinterpret_cast<uintptr_t>(out), out_hi = out_lo + g.out_h * row_out;
  if (!(out_hi > in_lo && out_lo < in_hi)) {  // not overlapped: one call
    return RunConv(o, g, depthwise, 0, g.out_h, in, filter, bias, requant, out, buffer, packed, setup);
  }
  if (ring == nullptr || ring_rows < 1) {
    MicroPrintf("TPUP conv: output over the input without a ring");
    return kTfLiteError;
  }
  // dw3 reads all of a channel's input rows (into its buffer) before it writes that channel's
  // outputs, and writes no other byte: an output laid exactly over its input (the same start and
  // row bytes, so each output byte is its own pixel's and channel's input byte) is one call.
  if ((o.flags & kFlagDw3) && out_lo == in_lo && row_out == row_in) {
    return RunConv(o, g, depthwise, 0, g.out_h, in, filter, bias, requant, out, buffer, packed, setup);
  }
  // Rows run in order (first to last, or last to first when the output reaches past the input's
  // end: a larger output sharing its start). With the ring empty, the longest run of next rows
  // whose bytes cover no input row still to be read is one call straight into the output (its
  // writes touch nothing a row of the call or after it reads); else the next row goes into the
  // ring, and each held row is written out, in order, once no row still to compute reads the
  // input under it (the same rule as overlap.ring_rows_for). dw3 otherwise runs a row per call: its
  // buffer is sized for a row and the whole op, not every run between.
  const Overlap v = {in_lo, in_hi, out_lo, row_in, row_out, g.in_h, g.out_h, o.pad_top, o.stride_h,
                     (g.k_h - 1) * o.dilation_h + 1, out_hi > in_hi};
  const bool runs = !(o.flags & kFlagDw3);
  int done = 0, flushed = 0;  // rows of the order computed, and written out
  while (done < g.out_h) {
    int n = 0;
    while (runs && flushed == done && done + n < g.out_h && v.Free(v.Row(done + n), done)) ++n;
    if (n > 0) {
      const int r0 = v.backwards ? g.out_h - done - n : done;
      const TfLiteStatus status = RunConv(o, g, depthwise, r0, r0 + n, in, filter, bias, requant,
                                          out + r0 * row_out, buffer, packed, setup);
      if (status != kTfLiteOk) return status;
      done += n, flushed += n;
      continue;
    }
    if (done - flushed >= ring_rows) {
      MicroPrintf("TPUP conv: the ring is too small for this overlap");
      return kTfLiteError;
    }
    const int r = v.Row(done);
    int8_t* slot = reinterpret_cast<int8_t*>(ring + (r % ring_rows) * row_out);
    const TfLiteStatus status = RunConv(o, g, depthwise, r, r + 1, in, filter, bias, requant, slot, buffer, packed,
                                        setup);
    if (status != kTfLiteOk) return status;
    ++done;
    for (int p = v.Row(flushed); flushed < done && v.Free(p, done); p = v.Row(++flushed)) {
      std::memcpy(out + p * row_out, ring + (p % ring_rows) * row_out, row_out);
    }
  }
  return kTfLiteOk;
}

namespace {

void* Init(TfLiteContext*, const char*, size_t) { return nullptr; }

template <bool kDepthwise>
TfLiteStatus Prepare(TfLiteContext* context, TfLiteNode* node) {
  Options o;
  TF_LITE_ENSURE_MSG(context, ReadOptions(node, &o), "TPUP conv: invalid options");
  const bool packed = (o.flags & kFlagPacked) != 0, window = (o.flags & kFlagWindow) != 0;
  const bool pw16 = (o.flags & kFlagPointwise16) != 0;
  TF_LITE_ENSURE_EQ(context, node->inputs->size, packed || window || pw16 ? 5 : 4);
  TF_LITE_ENSURE_EQ(context, node->outputs->size, 1);
  tflite::MicroContext* micro_context = tflite::GetMicroContext(context);
  TfLiteTensor* input = micro_context->AllocateTempInputTensor(node, kInput);
  TfLiteTensor* filter = micro_context->AllocateTempInputTensor(node, kFilter);
  TfLiteTensor* requant = micro_context->AllocateTempInputTensor(node, kRequant);
  TfLiteTensor* output = micro_context->AllocateTempOutputTensor(node, kOutput);
  bool ok = input != nullptr && filter != nullptr && requant != nullptr && output != nullptr &&
            input->type == kTfLiteInt8 && filter->type == kTfLiteInt8 && output->type == kTfLiteInt8 &&
            requant->type == kTfLiteInt32 && input->dims->size == 4 && filter->dims->size == 4 &&
            output->dims->size == 4 && requant->dims->size == 2 && requant->dims->data[0] == 2 &&
            requant->dims->data[1] == output->dims->data[3];
  Geometry g = {};
  int filter_depth = 0;
  if (ok) {
    filter_depth = filter->dims->data[3];
    g = {input->dims->data[1], input->dims->data[2], input->dims->data[3], output->dims->data[1],
         output->dims->data[2], output->dims->data[3], filter->dims->data[1], filter->dims->data[2]};
  }
  for (TfLiteTensor* t : {output, requant, filter, input}) {
    if (t != nullptr) micro_context->DeallocateTempTfLiteTensor(t);
  }
  TF_LITE_ENSURE_MSG(context, ok, "TPUP conv: needs int8 input, filter and output and an int32 [2, C] requantization");
  TF_LITE_ENSURE_MSG(context, !(o.flags & kFlagFast) || (kDepthwise && DepthwiseFastFits(o, g)),
                     "TPUP conv: the fast kernel does not run this convolution");
  TF_LITE_ENSURE_MSG(context, !(o.flags & kFlagDw3) || (kDepthwise && Depthwise3x3Fits(o, g)),
                     "TPUP conv: the depthwise 3x3 kernel does not run this convolution");
  TF_LITE_ENSURE_MSG(context, !(o.flags & kFlagPointwise) || (!kDepthwise && PointwiseFits(o, g) && filter_depth == g.in_c),
                     "TPUP conv: the 1x1 kernel does not run this convolution");
  if (packed) {
    TF_LITE_ENSURE_MSG(context, !kDepthwise && PackedFits(o, g), "TPUP conv: the packed kernel does not run this convolution");
    TfLiteTensor* w = micro_context->AllocateTempInputTensor(node, kPacked);
    const bool fits = w != nullptr && w->type == kTfLiteInt32 && w->dims->size == 2 && w->dims->data[0] == g.out_c &&
                      w->dims->data[1] == 1 + PackedPairs(g.k_h, g.k_w, g.in_c);
    if (w != nullptr) micro_context->DeallocateTempTfLiteTensor(w);
    TF_LITE_ENSURE_MSG(context, fits, "TPUP conv: the packed weights do not fit the filter");
  }
  if (window) {
    TF_LITE_ENSURE_MSG(context, !kDepthwise && WindowFits(o, g) && filter_depth == g.in_c,
                       "TPUP conv: the window kernel does not run this convolution");
    TfLiteTensor* w = micro_context->AllocateTempInputTensor(node, kPacked);
    const bool fits = w != nullptr && w->type == kTfLiteInt32 && w->dims->size == 1 &&
                      w->dims->data[0] == WindowWords(g) && (reinterpret_cast<uintptr_t>(w->data.data) & 3) == 0;
    if (w != nullptr) micro_context->DeallocateTempTfLiteTensor(w);
    TF_LITE_ENSURE_MSG(context, fits, "TPUP conv: the window kernel's weights do not fit the filter (or lie unaligned)");
  }
  if (pw16) {
    TF_LITE_ENSURE_MSG(context, !kDepthwise && PointwiseFits(o, g) && filter_depth == g.in_c && g.out_c >= 3,
                       "TPUP conv: the pointwise16 kernel does not run this convolution");
    TfLiteTensor* w = micro_context->AllocateTempInputTensor(node, kPacked);
    const bool fits = w != nullptr && w->type == kTfLiteInt32 && w->dims->size == 1 &&
                      w->dims->data[0] == Pointwise16Words(g) && (reinterpret_cast<uintptr_t>(w->data.data) & 3) == 0;
    if (w != nullptr) micro_context->DeallocateTempTfLiteTensor(w);
    TF_LITE_ENSURE_MSG(context, fits, "TPUP conv: the pointwise16 weights do not fit the filter (or lie unaligned)");
  }
  const int own = OwnBufferSize(o, g, kDepthwise);
  const int ring = (o.flags & kFlagOverlap) ? o.ring_rows * g.out_w * g.out_c : 0;
  return RequestScratch(context, node, ring ? Align16(own) + ring : own);
}

template <bool kDepthwise>
TfLiteStatus Eval(TfLiteContext* context, TfLiteNode* node) {
  Options o;
  TF_LITE_ENSURE(context, ReadOptions(node, &o));
  const TfLiteEvalTensor* input = tflite::micro::GetEvalInput(context, node, kInput);
  const TfLiteEvalTensor* filter = tflite::micro::GetEvalInput(context, node, kFilter);
  const TfLiteEvalTensor* bias = tflite::micro::GetEvalInput(context, node, kBias);
  const TfLiteEvalTensor* requant = tflite::micro::GetEvalInput(context, node, kRequant);
  TfLiteEvalTensor* output = tflite::micro::GetEvalOutput(context, node, kOutput);
  const Geometry g = {input->dims->data[1], input->dims->data[2], input->dims->data[3], output->dims->data[1],
                      output->dims->data[2], output->dims->data[3], filter->dims->data[1], filter->dims->data[2]};
  const int8_t* in = tflite::micro::GetTensorData<int8_t>(input);
  int8_t* out = tflite::micro::GetTensorData<int8_t>(output);
  const int8_t* w = tflite::micro::GetTensorData<int8_t>(filter);
  const int32_t* b = bias != nullptr ? tflite::micro::GetTensorData<int32_t>(bias) : nullptr;
  const int32_t* q = tflite::micro::GetTensorData<int32_t>(requant);
  const int32_t* packed =
      (o.flags & (kFlagPacked | kFlagWindow | kFlagPointwise16))
          ? tflite::micro::GetTensorData<int32_t>(tflite::micro::GetEvalInput(context, node, kPacked))
          : nullptr;
  uint8_t* scratch = GetScratch(context, node);

  const uintptr_t in_lo = reinterpret_cast<uintptr_t>(in), in_hi = in_lo + g.in_h * g.in_w * g.in_c;
  const uintptr_t out_lo = reinterpret_cast<uintptr_t>(out), out_hi = out_lo + g.out_h * g.out_w * g.out_c;
  const bool overlapped = out_hi > in_lo && out_lo < in_hi;
  TF_LITE_ENSURE_MSG(context, !overlapped || ((o.flags & kFlagOverlap) && scratch != nullptr),
                     "TPUP conv: output planned over the input without the overlap flag");
  uint8_t* ring = overlapped ? scratch + Align16(OwnBufferSize(o, g, kDepthwise)) : nullptr;
  return RunConvOverlapped(o, g, kDepthwise, in, w, b, q, out, scratch, ring, o.ring_rows, packed);
}

}  // namespace

const TFLMRegistration* Register_CONV_2D() {
  static const TFLMRegistration r = tflite::micro::RegisterOp(Init, Prepare<false>, Eval<false>);
  return &r;
}

const TFLMRegistration* Register_DEPTHWISE_CONV_2D() {
  static const TFLMRegistration r = tflite::micro::RegisterOp(Init, Prepare<true>, Eval<true>);
  return &r;
}

}  // namespace tpup
