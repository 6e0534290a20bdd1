// harness_platform.h on a Cortex-M: the board's UART (board_uart.cc), a 32-bit tick counter (the
// DWT cycle counter on silicon, SysTick extended to 32 bits where DWT is absent, e.g. QEMU) and a
// system reset. Board facts arrive as -D flags from the generated Makefile (board_config.h).
#include <stdint.h>

#include "board_config.h"
#include "harness_platform.h"

void board_clock_init();
void board_uart_init(uint32_t baud);
int board_uart_getc();
void board_uart_putc(char c);

namespace {
inline volatile uint32_t& reg(uint32_t addr) { return *reinterpret_cast<volatile uint32_t*>(addr); }
constexpr uint32_t kSysTickCsr = 0xE000E010, kSysTickRvr = 0xE000E014, kSysTickCvr = 0xE000E018;
constexpr uint32_t kDemcr = 0xE000EDFC, kDwtCtrl = 0xE0001000, kDwtCyccnt = 0xE0001004, kDwtLar = 0xE0001FB0;
constexpr uint32_t kAircr = 0xE000ED0C;
volatile uint32_t g_systick_wraps = 0;
}  // namespace

extern "C" void SysTick_Handler() { g_systick_wraps = g_systick_wraps + 1; }

void harness_platform_init(uint32_t baud) {
  board_clock_init();
  board_uart_init(baud);
#if BOARD_TICKS_DWT
  reg(kDemcr) |= 1u << 24;  // TRCENA
  reg(kDwtLar) = 0xC5ACCE55;  // unlock (Cortex-M7); ignored elsewhere
  reg(kDwtCyccnt) = 0;
  reg(kDwtCtrl) |= 1u;
#else
  // SysTick on the core clock, full 24-bit reload; its interrupt counts the wraps.
  reg(kSysTickRvr) = 0xFFFFFFu;
  reg(kSysTickCvr) = 0;
  reg(kSysTickCsr) = 0x7u;  // CLKSOURCE = core clock, TICKINT, ENABLE
#endif
}

uint32_t harness_platform_ticks() {
#if BOARD_TICKS_DWT
  return reg(kDwtCyccnt);
#else
  uint32_t wraps, value;
  do {  // a wrap between the two reads shows as a changed count: read again
    wraps = g_systick_wraps;
    value = reg(kSysTickCvr);
  } while (wraps != g_systick_wraps);
  return wraps * 0x1000000u + (0xFFFFFFu - value);
#endif
}

// SysTick counts one tick per 40 instructions under QEMU -icount; restarting it here makes every
// RUN start at the same phase, so per-op tick counts repeat exactly from run to run.
void harness_platform_tick_sync() {
#if !BOARD_TICKS_DWT
  reg(kSysTickCvr) = 0;  // any write clears the counter; it reloads on the next clock
  while (reg(kSysTickCvr) == 0) {
  }  // until that reload: reading 0 meanwhile would look like a full 24-bit period
#endif
}

int harness_platform_getc() { return board_uart_getc(); }

void harness_platform_write(const char* data, size_t n) {
  for (size_t i = 0; i < n; ++i) board_uart_putc(data[i]);
}

void harness_platform_reset() {
  __asm volatile("dsb" ::: "memory");
  reg(kAircr) = 0x05FA0004u;  // VECTKEY | SYSRESETREQ
  for (;;) {
  }
}

// Called by the fault handlers in startup.c: one protocol line, then a reset (the host sees BOOT).
extern "C" void harness_platform_fault(const char* what) {
  char line[48] = "ERR fault ";
  size_t n = 10;
  for (const char* p = what; *p && n < sizeof line - 1; ++p) line[n++] = *p;
  line[n] = '\0';
  unsigned cc = 0;
  for (size_t i = 0; i < n; ++i) cc ^= static_cast<unsigned char>(line[i]);
  const char* hex = "0123456789ABCDEF";
  char tail[5] = {'*', hex[cc >> 4], hex[cc & 15], '\n', 0};
  harness_platform_write(line, n);
  harness_platform_write(tail, 4);
  harness_platform_reset();
}
