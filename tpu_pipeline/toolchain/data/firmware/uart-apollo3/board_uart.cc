// Ambiq Apollo3 UART0 (an Arm PL011 with Ambiq's clock controls; Apollo3 Blue datasheet, UART
// chapter): DR 0x00, FR 0x18 (RXFE bit 4, TXFF bit 5), IBRD 0x24, FBRD 0x28, LCRH 0x2C (WLEN
// bits 5-6, FEN bit 4), CR 0x30 (UARTEN bit 0, CLKEN bit 3, CLKSEL bits 4-6: 1 = 24 MHz, TXE bit 8,
// RXE bit 9). Power (PWRCTRL DEVPWREN) and the pads' UART function (GPIO PADREG, behind PADKEY)
// are the board's BOARD_INIT_WRITES from its device file. Polled, no interrupt.
// NOT HARDWARE-TESTED: it builds and links against the board's memory map. The SDK version of this
// layer (AmbiqSuite HAL) is ../sparkfun-edge/platform.cc.
#include <stdint.h>

#include "board_config.h"

namespace {
inline volatile uint32_t& reg(uint32_t addr) { return *reinterpret_cast<volatile uint32_t*>(addr); }
constexpr uint32_t kDr = 0x00, kFr = 0x18, kIbrd = 0x24, kFbrd = 0x28, kLcrh = 0x2C, kCr = 0x30;
struct InitWrite { uint32_t addr, bits; };
constexpr InitWrite kInit[] = BOARD_INIT_WRITES;
}  // namespace

void board_clock_init() {
  for (const InitWrite& w : kInit) {
    if (w.addr) reg(w.addr) |= w.bits;
  }
}

void board_uart_init(uint32_t baud) {
  const uint32_t u = BOARD_UART_BASE;
  reg(u + kCr) = (1u << 3) | (1u << 4);  // clock on, 24 MHz, UART still disabled
  // Divisor = clock / (16 * baud) as 16.6 fixed point.
  uint32_t div64 = static_cast<uint32_t>((4ull * BOARD_UART_CLOCK_HZ + baud / 2) / baud);
  reg(u + kIbrd) = div64 >> 6;
  reg(u + kFbrd) = div64 & 63u;
  reg(u + kLcrh) = (3u << 5) | (1u << 4);  // 8 bits, FIFOs on
  reg(u + kCr) = (1u << 3) | (1u << 4) | (1u << 8) | (1u << 9) | 1u;
}

int board_uart_getc() {
  if (reg(BOARD_UART_BASE + kFr) & (1u << 4)) return -1;
  return static_cast<int>(reg(BOARD_UART_BASE + kDr) & 0xFFu);
}

void board_uart_putc(char c) {
  while (reg(BOARD_UART_BASE + kFr) & (1u << 5)) {
  }
  reg(BOARD_UART_BASE + kDr) = static_cast<uint8_t>(c);
}
