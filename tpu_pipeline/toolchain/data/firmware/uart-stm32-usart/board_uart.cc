// STM32 USART/LPUART ("new" register layout of the STM32L4, L4+, G4, H7 families; RM0432 for the
// STM32L4R5, RM0433 for the STM32H743): CR1 0x00 (UE bit 0, RE bit 2, TE bit 3), BRR 0x0C,
// ISR 0x1C (RXNE bit 5, TXE bit 7), RDR 0x24, TDR 0x28. GPIO: MODER 0x00 (2 bits per pin,
// 0b10 = alternate function), AFRL 0x20 / AFRH 0x24 (4 bits per pin).
// Clock and power enables (RCC, PWR) are the board's BOARD_INIT_WRITES from its device file.
// Polled, no interrupt. NOT HARDWARE-TESTED: it builds and links against the board's memory map.
#include <stdint.h>

#include "board_config.h"

namespace {
inline volatile uint32_t& reg(uint32_t addr) { return *reinterpret_cast<volatile uint32_t*>(addr); }
constexpr uint32_t kCr1 = 0x00, kBrr = 0x0C, kIsr = 0x1C, kRdr = 0x24, kTdr = 0x28;
struct InitWrite { uint32_t addr, bits; };
constexpr InitWrite kInit[] = BOARD_INIT_WRITES;

void pin_af(uint32_t pin, uint32_t af) {
  reg(BOARD_GPIO_BASE + 0x00) = (reg(BOARD_GPIO_BASE + 0x00) & ~(3u << (2 * pin))) | (2u << (2 * pin));
  uint32_t afr = BOARD_GPIO_BASE + (pin < 8 ? 0x20 : 0x24);
  uint32_t shift = 4 * (pin & 7);
  reg(afr) = (reg(afr) & ~(0xFu << shift)) | (af << shift);
}
}  // namespace

void board_clock_init() {
  // The core stays on its reset clock (BOARD_CORE_CLOCK_HZ); only the peripherals are switched on.
  for (const InitWrite& w : kInit) {
    if (w.addr) {
      reg(w.addr) |= w.bits;
      (void)reg(w.addr);  // read back: the enable takes effect before the peripheral is touched
    }
  }
}

void board_uart_init(uint32_t baud) {
  pin_af(BOARD_UART_TX_PIN, BOARD_UART_AF);
  pin_af(BOARD_UART_RX_PIN, BOARD_UART_AF);
  reg(BOARD_UART_BASE + kCr1) = 0;
#if BOARD_UART_LPUART
  reg(BOARD_UART_BASE + kBrr) = static_cast<uint32_t>((256ull * BOARD_UART_CLOCK_HZ + baud / 2) / baud);
#else
  reg(BOARD_UART_BASE + kBrr) = (BOARD_UART_CLOCK_HZ + baud / 2) / baud;
#endif
  reg(BOARD_UART_BASE + kCr1) = (1u << 3) | (1u << 2) | 1u;
}

int board_uart_getc() {
  if (reg(BOARD_UART_BASE + kIsr) & (1u << 5)) return static_cast<int>(reg(BOARD_UART_BASE + kRdr) & 0xFFu);
  return -1;
}

void board_uart_putc(char c) {
  while (!(reg(BOARD_UART_BASE + kIsr) & (1u << 7))) {
  }
  reg(BOARD_UART_BASE + kTdr) = static_cast<uint8_t>(c);
}
