// TFLite Micro harness firmware: speaks the line protocol of ../PROTOCOL.md.
// Built with the files `tpu-pipeline export-mcu` writes next to it: model_data.cc/.h (the model,
// with our offline arena plan inside), op_resolver.h (only the ops used), harness_config.h, the
// board layer (startup.c, platform.cc, board_uart.cc, link.ld) and a Makefile: `make -C DIR`.

#include <cstdio>
#include <cstring>
#include <new>

#include "harness_config.h"
#include "harness_platform.h"
#include "model_data.h"
#include "op_resolver.h"
#include "tensorflow/lite/micro/arena_allocator/non_persistent_arena_buffer_allocator.h"
#include "tensorflow/lite/micro/arena_allocator/persistent_arena_buffer_allocator.h"
#include "tensorflow/lite/micro/arena_allocator/single_arena_buffer_allocator.h"
#include "tensorflow/lite/micro/cortex_m_generic/debug_log_callback.h"
#include "tensorflow/lite/micro/memory_planner/greedy_memory_planner.h"
#include "tensorflow/lite/micro/micro_allocator.h"
#include "tensorflow/lite/micro/micro_interpreter.h"
#include "tensorflow/lite/micro/micro_profiler_interface.h"
#include "tensorflow/lite/schema/schema_generated.h"

namespace {

// Where the arena lives (harness_config.h, from the placement in the board's RAM banks): one buffer,
// in the first bank or in a bank's section; or the head and the tail apart, in two banks' sections.
#ifndef HARNESS_ARENA_SECTION
#define HARNESS_ARENA_SECTION
#endif
// kHeadBuffer, kTailBuffer: READY's head_at= and tail_at= (the host sees which bank holds each).
#if HARNESS_ARENA_SPLIT
alignas(16) uint8_t g_head_arena[HARNESS_HEAD_ARENA_SIZE] HARNESS_HEAD_SECTION;
alignas(16) uint8_t g_tail_arena[HARNESS_TAIL_ARENA_SIZE] HARNESS_TAIL_SECTION;
const uint8_t* const kHeadBuffer = g_head_arena;
const uint8_t* const kTailBuffer = g_tail_arena;
#else
alignas(16) uint8_t g_arena[HARNESS_ARENA_SIZE] HARNESS_ARENA_SECTION;
const uint8_t* const kHeadBuffer = g_arena;
const uint8_t* const kTailBuffer = g_arena;
#endif
constexpr int kMaxEvents = 1024;
constexpr int kLineMax = 320;  // "SET i off " + 256 hex digits + checksum

// MicroProfiler-style recorder: one event per op invocation, tag = the op's name.
class HarnessProfiler : public tflite::MicroProfilerInterface {
 public:
  uint32_t BeginEvent(const char* tag) override {
    if (n_ >= kMaxEvents) return kMaxEvents - 1;
    tags_[n_] = tag;
    start_[n_] = harness_platform_ticks();
    return n_++;
  }
  void EndEvent(uint32_t h) override { end_[h] = harness_platform_ticks(); }
  void Reset() { n_ = 0; }
  int n_ = 0;
  const char* tags_[kMaxEvents];
  uint32_t start_[kMaxEvents], end_[kMaxEvents];
};

HarnessProfiler g_profiler;
// Our own arena allocators (built exactly as MicroAllocator::Create builds them, from one arena or
// from two buffers), so the head (planned, non-persistent) and tail (persistent) of
// arena_used_bytes() can be reported apart.
tflite::INonPersistentBufferAllocator* g_head = nullptr;
tflite::IPersistentBufferAllocator* g_tail = nullptr;

#if HARNESS_NUM_EXTERNAL > 0
// Tensors the application keeps in its own buffer, outside the arena (a camera frame, a DMA target):
// the offline plan marks them kExternal, and this planner leaves them out of the arena's head and
// places them in g_external (an offset from the arena's start that points there), in the order
// TFLite Micro adds them (by tensor index). tpu_pipeline/toolchain/memory/tflm_target.py models its size.
constexpr int kExternal = -2;
constexpr int kExternalBytes[HARNESS_NUM_EXTERNAL] = HARNESS_EXTERNAL_BYTES;
#ifndef HARNESS_EXTERNAL_SECTION
#define HARNESS_EXTERNAL_SECTION
#endif
alignas(16) uint8_t g_external[HARNESS_EXTERNAL_TOTAL] HARNESS_EXTERNAL_SECTION;  // its bank: harness_config.h

class HarnessPlanner : public tflite::MicroMemoryPlanner {
 public:
  TfLiteStatus AddBuffer(int size, int first, int last) override {
    ++added_;
    return inner_.AddBuffer(size, first, last);
  }
  TfLiteStatus AddBuffer(int size, int first, int last, int offline_offset) override {
    if (offline_offset != kExternal) {
      ++added_;
      return inner_.AddBuffer(size, first, last, offline_offset);
    }
    if (n_external_ >= HARNESS_NUM_EXTERNAL) return kTfLiteError;
    external_[n_external_++] = added_++;
    return kTfLiteOk;
  }
  size_t GetMaximumMemorySize() override { return inner_.GetMaximumMemorySize(); }
  int GetBufferCount() override { return added_; }
  TfLiteStatus GetOffsetForBuffer(int index, int* offset) override {
    int before = 0, at = 0;
    for (int k = 0; k < n_external_; ++k) {
      if (external_[k] == index) {  // TFLite Micro adds the arena's start to it: g_external + at
        *offset = static_cast<int>((g_external + at) - g_head->GetOverlayMemoryAddress());
        return kTfLiteOk;
      }
      before += external_[k] < index;
      at += (kExternalBytes[k] + 15) / 16 * 16;
    }
    return inner_.GetOffsetForBuffer(index - before, offset);
  }
  TfLiteStatus Init(unsigned char* scratch, int size) override { return inner_.Init(scratch, size); }
  bool preserves_all_tensors() const override { return inner_.preserves_all_tensors(); }

 private:
  tflite::GreedyMemoryPlanner inner_;
  int external_[HARNESS_NUM_EXTERNAL] = {};
  int n_external_ = 0;
  int added_ = 0;
};
using HarnessMemoryPlanner = HarnessPlanner;
#else
using HarnessMemoryPlanner = tflite::GreedyMemoryPlanner;
#endif
tflite::MicroInterpreter* g_interp = nullptr;
const char* g_fatal = nullptr;  // set when the model cannot run: every command answers ERR with it

void send_line(const char* body) {
  uint8_t cc = 0;
  for (const char* p = body; *p; ++p) cc ^= static_cast<uint8_t>(*p);
  char tail[6];
  snprintf(tail, sizeof tail, "*%02X\n", cc);
  harness_platform_write(body, strlen(body));
  harness_platform_write(tail, strlen(tail));
}

void send_ready() {
  char line[kLineMax];
  snprintf(line, sizeof line,
           "READY arena=%d used=%u inputs=%d outputs=%d ticks_per_s=%lu model_crc=%s board=%s head=%u tail=%u "
           "head_at=%08lx tail_at=%08lx",
           HARNESS_ARENA_SIZE, static_cast<unsigned>(g_interp->arena_used_bytes()),
           static_cast<int>(g_interp->inputs_size()), static_cast<int>(g_interp->outputs_size()),
           static_cast<unsigned long>(HARNESS_TICKS_PER_S), HARNESS_MODEL_CRC, HARNESS_BOARD,
           static_cast<unsigned>(g_head->GetNonPersistentUsedBytes()),
           static_cast<unsigned>(g_tail->GetPersistentUsedBytes()),
           static_cast<unsigned long>(reinterpret_cast<uintptr_t>(kHeadBuffer)),
           static_cast<unsigned long>(reinterpret_cast<uintptr_t>(kTailBuffer)));
#if HARNESS_NUM_EXTERNAL > 0
  size_t n = strlen(line);  // the inputs outside the arena: their buffer's address and size
  snprintf(line + n, sizeof line - n, " input_at=%08lx input=%u",
           static_cast<unsigned long>(reinterpret_cast<uintptr_t>(g_external)), static_cast<unsigned>(sizeof g_external));
#endif
  send_line(line);
}

// TFLM's MicroPrintf text, one LOG line per message (non-printable bytes become '?').
char g_log[200];
size_t g_log_n = 0;

void log_flush() {
  if (!g_log_n) return;
  char line[sizeof g_log + 8];
  snprintf(line, sizeof line, "LOG %s", g_log);
  send_line(line);
  g_log_n = 0;
  g_log[0] = '\0';
}

void debug_log(const char* s) {
  for (; *s; ++s) {
    if (*s == '\r' || *s == '\n') {
      log_flush();
      continue;
    }
    if (g_log_n + 1 >= sizeof g_log) log_flush();
    g_log[g_log_n++] = (*s >= 32 && *s < 127 && *s != '*') ? *s : '?';
    g_log[g_log_n] = '\0';
  }
}

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Checks and strips "*CC"; false if the line is garbled.
bool check_line(char* line) {
  char* star = strrchr(line, '*');
  if (!star || strlen(star) != 3) return false;
  uint8_t cc = 0;
  for (char* p = line; p < star; ++p) cc ^= static_cast<uint8_t>(*p);
  // Upper-case digits only: a flipped case bit must not pass as the same checksum.
  if ((star[1] >= 'a' && star[1] <= 'f') || (star[2] >= 'a' && star[2] <= 'f')) return false;
  int hi = hexval(star[1]), lo = hexval(star[2]);
  if (hi < 0 || lo < 0 || cc != (hi << 4 | lo)) return false;
  *star = '\0';
  return true;
}

void handle_set(char* args) {
  int index = 0, offset = 0, consumed = 0;
  if (sscanf(args, "%d %d %n", &index, &offset, &consumed) < 2 || index < 0 ||
      index >= static_cast<int>(g_interp->inputs_size())) {
    send_line("ERR bad SET");
    return;
  }
  TfLiteTensor* t = g_interp->input(index);
  const char* hex = args + consumed;
  size_t n = strlen(hex) / 2;
  if (offset < 0 || offset + n > t->bytes) {
    send_line("ERR SET out of range");
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) { send_line("ERR bad hex"); return; }
    t->data.uint8[offset + i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  char line[64];
  snprintf(line, sizeof line, "OK SET %d %d", index, static_cast<int>(offset + n));
  send_line(line);
}

void handle_run(const char* seq) {
  char line[kLineMax];
  g_profiler.Reset();
  harness_platform_tick_sync();
  uint32_t t0 = harness_platform_ticks();
  TfLiteStatus status = g_interp->Invoke();
  uint32_t ticks = harness_platform_ticks() - t0;
  log_flush();
  if (status != kTfLiteOk) {
    send_line("ERR invoke failed");
    return;
  }
  for (int i = 0; i < g_profiler.n_; ++i) {
    snprintf(line, sizeof line, "PROF %s %d %s %lu", seq, i, g_profiler.tags_[i],
             static_cast<unsigned long>(g_profiler.end_[i] - g_profiler.start_[i]));
    send_line(line);
  }
  for (size_t j = 0; j < g_interp->outputs_size(); ++j) {
    const TfLiteTensor* t = g_interp->output(j);
    for (size_t off = 0; off < t->bytes; off += 128) {
      size_t n = t->bytes - off < 128 ? t->bytes - off : 128;
      int k = snprintf(line, sizeof line, "OUT %s %d %d ", seq, static_cast<int>(j), static_cast<int>(off));
      for (size_t i = 0; i < n; ++i) k += snprintf(line + k, sizeof line - k, "%02X", t->data.uint8[off + i]);
      send_line(line);
    }
  }
  snprintf(line, sizeof line, "DONE %s ticks=%lu arena_used=%u stack_used=%u", seq, static_cast<unsigned long>(ticks),
           static_cast<unsigned>(g_interp->arena_used_bytes()), static_cast<unsigned>(harness_stack_used()));
  send_line(line);
}

void handle(char* line) {
  if (!check_line(line)) {
    send_line("ERR bad line");
    return;
  }
  if (g_fatal != nullptr && strcmp(line, "RESET") != 0) {
    send_line(g_fatal);
    return;
  }
  if (strcmp(line, "HELLO") == 0) {
    send_ready();
  } else if (strncmp(line, "SET ", 4) == 0) {
    handle_set(line + 4);
  } else if (strncmp(line, "RUN ", 4) == 0) {
    handle_run(line + 4);
  } else if (strcmp(line, "RESET") == 0) {
    harness_platform_reset();  // BOOT and READY follow from main()
  } else {
    send_line("ERR unknown command");
  }
}

}  // namespace

// Boards whose tick is one core cycle need no sync; the Cortex-M layer's SysTick does.
__attribute__((weak)) void harness_platform_tick_sync() {}

#if HARNESS_ARENA_SPLIT
// MicroAllocator on two allocators: its constructor is protected; this subclass adds no member.
struct SplitAllocator : tflite::MicroAllocator {
  SplitAllocator(tflite::IPersistentBufferAllocator* tail, tflite::INonPersistentBufferAllocator* head,
                 tflite::MicroMemoryPlanner* planner)
      : tflite::MicroAllocator(tail, head, planner) {}
  ~SplitAllocator() override {}

 private:
  void operator delete(void*) {}  // lives in the tail and is never deleted (TF_LITE_REMOVE_VIRTUAL_DELETE)
};

// As MicroAllocator::Create(persistent, size, non_persistent, size) builds it: the same objects in
// the same order in the tail (tflm_target.split_tail models it), the head a buffer of its own.
tflite::MicroAllocator* make_allocator() {
  tflite::PersistentArenaBufferAllocator first(g_tail_arena, HARNESS_TAIL_ARENA_SIZE);
  uint8_t* mem = first.AllocatePersistentBuffer(sizeof(tflite::PersistentArenaBufferAllocator),
                                                alignof(tflite::PersistentArenaBufferAllocator));
  auto* tail = new (mem) tflite::PersistentArenaBufferAllocator(first);
  mem = tail->AllocatePersistentBuffer(sizeof(tflite::NonPersistentArenaBufferAllocator),
                                       alignof(tflite::NonPersistentArenaBufferAllocator));
  auto* head = new (mem) tflite::NonPersistentArenaBufferAllocator(g_head_arena, HARNESS_HEAD_ARENA_SIZE);
  g_head = head;
  g_tail = tail;
  mem = tail->AllocatePersistentBuffer(sizeof(HarnessMemoryPlanner), alignof(HarnessMemoryPlanner));
  auto* planner = new (mem) HarnessMemoryPlanner();
  mem = tail->AllocatePersistentBuffer(sizeof(SplitAllocator), alignof(SplitAllocator));
  return new (mem) SplitAllocator(tail, head, planner);
}
#else
tflite::MicroAllocator* make_allocator() {
  auto* buffers = tflite::SingleArenaBufferAllocator::Create(g_arena, HARNESS_ARENA_SIZE);
  g_head = buffers;
  g_tail = buffers;
  // The greedy planner lives in the arena's tail, as MicroAllocator::Create places it.
  uint8_t* planner_mem = buffers->AllocatePersistentBuffer(sizeof(HarnessMemoryPlanner),
                                                           alignof(HarnessMemoryPlanner));
  return tflite::MicroAllocator::Create(buffers, new (planner_mem) HarnessMemoryPlanner());
}
#endif

int main() {
  harness_platform_init(HARNESS_BAUD);
  char line[kLineMax];
  snprintf(line, sizeof line, "BOOT tpu-pipeline-harness 1 %s", HARNESS_BOARD);
  send_line(line);

  RegisterDebugLogCallback(debug_log);

  static HarnessOpResolver resolver;
  static char fatal[96];
  if (RegisterHarnessOps(resolver) != kTfLiteOk) {
    g_fatal = "ERR op registration failed";
  }
  const tflite::Model* model = tflite::GetModel(g_model_data);
  static tflite::MicroInterpreter interp(model, resolver, make_allocator(), nullptr, &g_profiler);
  g_interp = &interp;
  if (g_fatal == nullptr && interp.AllocateTensors() != kTfLiteOk) {
    log_flush();
    snprintf(fatal, sizeof fatal, "ERR AllocateTensors failed: the %d-byte arena is too small or an op is missing",
             HARNESS_ARENA_SIZE);
    g_fatal = fatal;
  }
  log_flush();
  if (g_fatal != nullptr) {
    send_line(g_fatal);
  } else {
    send_ready();
  }

  size_t n = 0;
  for (;;) {
    int c = harness_platform_getc();
    if (c < 0) continue;
    if (c == '\r') continue;
    if (c == '\n') {
      line[n] = '\0';
      if (n) handle(line);
      n = 0;
    } else if (n + 1 < sizeof line) {
      line[n++] = static_cast<char>(c);
    } else {
      n = 0;  // overlong: drop it; the checksum of the remainder will not match
    }
  }
}
