// Arm CMSDK APB UART (the UARTs of the MPS2 FPGA images; QEMU's mps2-an385/an386/an500 connect
// UART0 at 0x40004000 to -serial). Registers, from the CMSDK technical reference manual:
// DATA 0x00, STATE 0x04 (bit 0 TX full, bit 1 RX full), CTRL 0x08 (bit 0 TX enable, bit 1 RX
// enable, bit 3 RX interrupt enable), INTSTATUS/INTCLEAR 0x0C (bit 1 RX), BAUDDIV 0x10.
// While no byte is waiting the core sleeps in WFI until the RX interrupt (BOARD_UART_RX_IRQ):
// an emulator then does not spin a host core at 100 %.
#include <stdint.h>

#include "board_config.h"

namespace {
inline volatile uint32_t& uart(uint32_t off) { return *reinterpret_cast<volatile uint32_t*>(BOARD_UART_BASE + off); }
constexpr uint32_t kData = 0x00, kState = 0x04, kCtrl = 0x08, kIntClear = 0x0C, kBaudDiv = 0x10;
}  // namespace

#if BOARD_UART_RX_IRQ >= 0
#define IRQ_NAME_(n) IRQ##n##_Handler
#define IRQ_NAME(n) IRQ_NAME_(n)
extern "C" void IRQ_NAME(BOARD_UART_RX_IRQ)() { uart(kIntClear) = 2u; }
#endif

void board_clock_init() {}  // the FPGA/QEMU core clock is fixed (BOARD_CORE_CLOCK_HZ)

void board_uart_init(uint32_t baud) {
  uint32_t div = BOARD_UART_CLOCK_HZ / baud;
  uart(kBaudDiv) = div < 16 ? 16 : div;
#if BOARD_UART_RX_IRQ >= 0
  uart(kCtrl) = 0x1u | 0x2u | 0x8u;
  *reinterpret_cast<volatile uint32_t*>(0xE000E100u) = 1u << BOARD_UART_RX_IRQ;  // NVIC ISER0
#else
  uart(kCtrl) = 0x1u | 0x2u;
#endif
}

int board_uart_getc() {
  if (uart(kState) & 2u) return static_cast<int>(uart(kData) & 0xFFu);
#if BOARD_UART_RX_IRQ >= 0
  // Interrupts masked between the check and WFI: a byte arriving in between still wakes it.
  __asm volatile("cpsid i" ::: "memory");
  if (!(uart(kState) & 2u)) __asm volatile("wfi");
  __asm volatile("cpsie i" ::: "memory");
  if (uart(kState) & 2u) return static_cast<int>(uart(kData) & 0xFFu);
#endif
  return -1;
}

void board_uart_putc(char c) {
  while (uart(kState) & 1u) {
  }
  uart(kData) = static_cast<uint8_t>(c);
}
