// A bare-metal runner for TinyEngine's generated code (tools/bench_mcu_latency.py): the harness
// firmware's board layer (startup.c, platform.cc, board_uart.cc: same UART, same SysTick tick
// counter under QEMU -icount) around TinyEngine's invoke, instead of TFLite Micro's Invoke.
// It copies a host-drawn input (te_input.h) into TinyEngine's input buffer (or, for a patch plan,
// into the application's image buffer that TinyEngine's patch stage reads), runs TE_RUNS
// inferences, and prints per inference the ticks and every output tensor in hex:
//   TE RUN <k> ticks=<n>
//   TE OUT <k> <index> <hex bytes>
//   TE END
// With TinyEngine's profile mode, its per-layer timings arrive as "TE LAYER <ticks> <what>".
#include <stdint.h>
#include <string.h>

#include "harness_platform.h"
#include "te_input.h"  // te_input[], TE_PATCHED, TE_INPUT_OFFSET, TE_OUTPUTS {offset, bytes}..., TE_RUNS

extern "C" {
signed char* getInput();
void invoke(float* labels);
void end2endinference(signed char* img);
uint32_t te_ticks(void) { return harness_platform_ticks(); }
void te_layer(const char* what, uint32_t ticks);
}

namespace {
void put(const char* s) { harness_platform_write(s, strlen(s)); }
void put_u(uint32_t v) {
  char d[11];
  int n = 0;
  do { d[n++] = static_cast<char>('0' + v % 10); v /= 10; } while (v);
  while (n) harness_platform_write(&d[--n], 1);
}
#if TE_PATCHED
signed char g_image[sizeof te_input];  // the application's image: outside TinyEngine's buffer
#endif
const uint32_t kOutputs[][2] = {TE_OUTPUTS};
}  // namespace

// TinyEngine's profile mode reports one layer at a time (profile.h in this folder).
extern "C" void te_layer(const char* what, uint32_t ticks) {
  put("TE LAYER ");
  put_u(ticks);
  put(" ");
  for (const char* p = what; *p && *p != '%'; ++p) harness_platform_write(p, 1);
  put("\n");
}

// TinyEngine's buffer0 is static in its generated header: reached through getInput(), whose offset
// in buffer0 the code generator reports (TE_INPUT_OFFSET).
int main() {
  harness_platform_init(115200);
  put("TE BOOT\n");
  for (int k = 0; k < TE_RUNS; ++k) {
#if TE_PATCHED
    memcpy(g_image, te_input, sizeof te_input);
#else
    memcpy(getInput(), te_input, sizeof te_input);
#endif
    harness_platform_tick_sync();
    uint32_t t0 = harness_platform_ticks();
#if TE_PATCHED
    end2endinference(g_image);
#else
    invoke(nullptr);
#endif
    uint32_t ticks = harness_platform_ticks() - t0;
    put("TE RUN ");
    put_u(k);
    put(" ticks=");
    put_u(ticks);
    put(" stack_used=");  // (the high-water mark of the board layer's painted stack, startup.c)
    put_u(harness_stack_used());
    put("\n");
    static const char hex[] = "0123456789abcdef";
    for (uint32_t j = 0; j < sizeof kOutputs / sizeof kOutputs[0]; ++j) {
      put("TE OUT ");
      put_u(k);
      put(" ");
      put_u(j);
      put(" ");
      const uint8_t* p = reinterpret_cast<const uint8_t*>(getInput() - TE_INPUT_OFFSET) + kOutputs[j][0];
      for (uint32_t i = 0; i < kOutputs[j][1]; ++i) {
        char h[2] = {hex[p[i] >> 4], hex[p[i] & 15]};
        harness_platform_write(h, 2);
      }
      put("\n");
    }
  }
  put("TE END\n");
  for (;;) {
  }
}
